"""``scan_sharded`` across two simulated CPU devices: the same fit as ``scan``.

The device count must be set before JAX starts: ``.ci/run`` runs the whole suite with
``JAX_NUM_CPU_DEVICES=2`` (every other test uses the first device); a plain ``python -m pytest``
skips these saying so.

Tolerances (relative, max |x - ref| <= tol * max |ref|): float64 1e-9 (measured <= 8e-15 over
curves and parameters: the sums over rows are split in two and added, another order than one
device's); float32 1e-5 with adam (measured <= 3e-7, as for the other fusions of the step, see
tests/test_strategies.py). Sparse counts (PLN-PCA, ``via=shard_map``), float64: 1e-10 (each
device densifies the blocks of its rows: the same numbers as dense rows, the sums split in two).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import store_client

import plnexp
from plnexp.fitting.engine import make_problem
from plnexp.core.model import MODELS, pca_model
from plnexp.core.optim import OptimizerSpec
from plnexp.core.arrays import SparseCounts
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


@pytest.mark.parametrize("via", ["jit", pytest.param("shard_map", marks=pytest.mark.slow)])
@pytest.mark.parametrize("gradient", ["analytic", pytest.param("autodiff", marks=pytest.mark.slow)])
@pytest.mark.parametrize("model", ["full", pytest.param("profiled", marks=pytest.mark.slow)])
def test_sharded_fit_is_scans_fit(model, gradient, via, odd):
    kw = dict(model=model, optimizer="radam_clip", n_iter=N_ITER, precision="float64", gradient=gradient, timed=False)
    want = plnexp.fit(odd, strategy="scan", **kw)
    got = plnexp.fit(odd, strategy="scan_sharded", via=via, devices=2, **kw)
    assert got.n_iter == want.n_iter and got.params["M"].shape == (61, 8)  # padding row dropped
    assert close(got.elbo, want.elbo, RTOL["float64"]), np.max(np.abs(got.elbo - want.elbo))
    for name in ("B", "M", "S", "Sigma"):
        assert close(got.params[name], want.params[name], RTOL["float64"]), name
    assert got.loglik == pytest.approx(want.loglik, rel=RTOL["float64"])


@pytest.mark.slow
@pytest.mark.parametrize("via", ["jit", "shard_map"])
def test_sharded_fit_is_scans_fit_in_float32(via, odd):
    kw = dict(model="full", optimizer="adam", lr=1e-2, n_iter=N_ITER, precision="float32", timed=False)
    want = plnexp.fit(odd, strategy="scan", **kw)
    got = plnexp.fit(odd, strategy="scan_sharded", via=via, **kw)
    assert close(got.elbo, want.elbo, RTOL["float32"]), np.max(np.abs(got.elbo - want.elbo))


@pytest.mark.slow
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


@pytest.mark.slow
def test_command_line_run_on_two_devices(outputs, capsys):
    from plnexp.__main__ import main

    assert main(["run", "strategy=scan_sharded", "dataset.replication=1", "n_iter=30", "experiment=two"]) == 0
    cl = store_client(outputs)
    (run,) = cl.search_runs([cl.get_experiment_by_name("two").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["strategy.name"] == "scan_sharded"
    assert run.data.params["strategy.devices"] == "0" and "final_elbo" in run.data.metrics
    assert main(["run", "strategy=scan_sharded", "strategy.devices=3"]) == 2
    assert "strategy.devices=3: only 2 cpu device(s)" in capsys.readouterr().err


@pytest.fixture(scope="module")
def sparse_odd():
    """61 rows (one padding row on 2 devices), 90% zeros, some rows without counts; dense and sparse."""
    args = dict(n=61, p=12, q=2, zero_fraction=0.9, d=2, seed=5)
    dense, sparse = plnexp.simulate_pca(**args), plnexp.simulate_pca(**args, sparse=True)
    assert (np.diff(sparse.Y.indptr) == 0).sum() > 0
    return dense, sparse


SPARSE_KW = dict(model="pca", rank=2, block_rows=8, n_iter=15, precision="float64", timed=False)  # 4 blocks a device


def test_sparse_rows_give_each_device_the_csr_of_its_rows(sparse_odd):
    """Each device holds its rows' CSR: row starts rebased to 0, non-zeros padded with zeros to the
    fullest device's; together the dense counts and one empty padding row."""
    import jax
    from scipy import sparse as sp

    dense, sparse = sparse_odd
    problem = make_problem(pca_model(2, 8), OptimizerSpec("rprop"), "analytic")
    program = RowSharded(problem, 5, devices=2, via="shard_map")
    with jax.enable_x64(True):
        Y = program.place([sparse], np.float64, resolve_device("cpu")).Y
    assert isinstance(Y, SparseCounts) and Y.shape == (62, 12)
    assert Y.row_nnz_max == np.diff(sparse.Y.indptr).max()
    local = lambda a: [np.asarray(s.data) for s in sorted(a.addressable_shards, key=lambda s: s.index[0].start)]
    parts = list(zip(local(Y.indptr), local(Y.indices), local(Y.values)))
    assert len({values.shape for _, _, values in parts}) == 1
    rows = []
    for indptr, indices, values in parts:
        assert indptr.shape == (32,) and indptr[0] == 0
        assert not values[indptr[-1] :].any()  # the padding entries add nothing
        rows.append(sp.csr_array((values, indices, indptr), shape=(31, 12)).toarray())
    np.testing.assert_array_equal(np.vstack(rows), np.vstack([dense.Y, np.zeros((1, 12))]))


@pytest.mark.slow
@pytest.mark.parametrize("init, optimizer", [("seed", "rprop"), ("data", "adam")])
def test_sparse_sharded_fit_is_dense_scans_fit(init, optimizer, sparse_odd):
    """The blocks each device densifies are the dense rows: scan's float64 curve on the dense counts
    (the data init: sparse scan's, whose init takes the same blocked sums)."""
    dense, sparse = sparse_odd
    kw = dict(SPARSE_KW, init=init, optimizer=optimizer) | ({"lr": 1e-2} if optimizer == "adam" else {})
    want = plnexp.fit(dense if init == "seed" else sparse, strategy="scan", **kw)
    got = plnexp.fit(sparse, strategy="scan_sharded", via="shard_map", devices=2, **kw)
    assert got.params["M"].shape == (61, 2)  # padding row dropped
    np.testing.assert_allclose(got.elbo, want.elbo, rtol=1e-10)
    assert got.loglik == pytest.approx(want.loglik, rel=1e-10)


def test_sparse_counts_with_via_jit_are_one_line(sparse_odd):
    _, sparse = sparse_odd
    with pytest.raises(ValueError) as e:
        plnexp.fit(sparse, strategy="scan_sharded", via="jit", devices=2, init="seed", **SPARSE_KW)
    assert str(e.value) == (
        "sparse counts with strategy='scan_sharded' and strategy.via='jit': it places the dense counts; "
        "allowed value with sparse counts is strategy.via='shard_map'"
    )
