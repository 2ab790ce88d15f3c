"""``scan_sharded`` across two simulated CPU devices: the same fit as ``scan``.

The device count must be set before JAX starts: ``.ci/run`` runs the whole suite with
``JAX_NUM_CPU_DEVICES=2`` (every other test uses the first device); a plain ``python -m pytest``
skips these saying so.

Tolerances (relative, max |x - ref| <= tol * max |ref|): float64 1e-9 (measured <= 8e-15 over
curves and parameters: the sums over rows are split in two and added, another order than one
device's); float32 1e-5 with adam (measured <= 3e-7, as for the other fusions of the step, see
tests/test_strategies.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import store_client

import plnexp
from plnexp.fitting.engine import make_problem
from plnexp.core.model import MODELS
from plnexp.core.optim import OptimizerSpec
from plnexp.core.device import resolve_device
from plnexp.strategies import RowSharded

pytestmark = pytest.mark.multidevice
N_ITER = 50
RTOL = {"float64": 1e-9, "float32": 1e-5}
OPTIMIZER = {"float64": "radam_clip", "float32": "adam"}


@pytest.fixture(scope="module")
def odd():
    return plnexp.simulate(n=61, p=8, d=2, seed=3)  # 61 rows on 2 devices: one padding row


def close(a, b, tol):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return np.max(np.abs(a - b)) <= tol * np.max(np.abs(b))


def test_two_devices_are_visible():
    import jax

    assert len(jax.devices("cpu")) == 2


@pytest.mark.parametrize("via", ["jit", "shard_map"])
@pytest.mark.parametrize("gradient", ["analytic", "autodiff"])
@pytest.mark.parametrize("model", ["full", "profiled"])
def test_sharded_fit_is_scans_fit(model, gradient, via, odd):
    kw = dict(model=model, optimizer="radam_clip", n_iter=N_ITER, precision="float64", gradient=gradient, timed=False)
    want = plnexp.fit(odd, strategy="scan", **kw)
    got = plnexp.fit(odd, strategy="scan_sharded", via=via, devices=2, **kw)
    assert got.n_iter == want.n_iter and got.params["M"].shape == (61, 8)  # padding row dropped
    assert close(got.elbo, want.elbo, RTOL["float64"]), np.max(np.abs(got.elbo - want.elbo))
    for name in ("B", "M", "S", "Sigma"):
        assert close(got.params[name], want.params[name], RTOL["float64"]), name
    assert got.loglik == pytest.approx(want.loglik, rel=RTOL["float64"])


@pytest.mark.parametrize("via", ["jit", "shard_map"])
def test_sharded_fit_is_scans_fit_in_float32(via, odd):
    kw = dict(model="full", optimizer="adam", lr=1e-2, n_iter=N_ITER, precision="float32", timed=False)
    want = plnexp.fit(odd, strategy="scan", **kw)
    got = plnexp.fit(odd, strategy="scan_sharded", via=via, **kw)
    assert close(got.elbo, want.elbo, RTOL["float32"]), np.max(np.abs(got.elbo - want.elbo))


def test_sharded_fit_on_oaks(oaks):
    """The shipped data (d=1, an intercept), timed as a run times it."""
    kw = dict(model="profiled", optimizer="rprop", n_iter=N_ITER, precision="float64")
    want = plnexp.fit(oaks, strategy="scan", timed=False, **kw)
    got = plnexp.fit(oaks, strategy="scan_sharded", via="shard_map", **kw)
    assert close(got.elbo, want.elbo, RTOL["float64"])
    assert got.timing.compile_s > 0 and got.timing.run_s > 0


def test_rows_are_split_and_padded(odd):
    """Each device holds half the (padded) rows, and the padding rows weigh nothing."""
    import jax

    problem = make_problem(MODELS["full"], OptimizerSpec("adam", 1e-2), "analytic")
    program = RowSharded(problem, 5, devices=2)
    with jax.enable_x64(True):
        arrays = program.place([odd], np.float64, resolve_device("cpu"))
        assert [s.data.shape for s in arrays.Y.addressable_shards] == [(31, 8), (31, 8)]
        assert {s.device for s in arrays.Y.addressable_shards} == set(jax.devices("cpu"))
        assert np.asarray(arrays.rows.weight)[:, 0].tolist() == [1.0] * 61 + [0.0]
        state = program.initial(problem, arrays, "seed", [0])
        assert [s.data.shape for s in state.pln.M.addressable_shards] == [(31, 8), (31, 8)]


def test_command_line_run_on_two_devices(outputs, capsys):
    from plnexp.__main__ import main

    assert main(["run", "strategy=scan_sharded", "dataset.replication=1", "n_iter=30", "experiment=two"]) == 0
    cl = store_client(outputs)
    (run,) = cl.search_runs([cl.get_experiment_by_name("two").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["strategy.name"] == "scan_sharded"
    assert run.data.params["strategy.devices"] == "0" and "final_elbo" in run.data.metrics
    assert main(["run", "strategy=scan_sharded", "strategy.devices=3"]) == 2
    assert "strategy.devices=3: only 2 cpu device(s)" in capsys.readouterr().err
