"""PLN-PCA's rows in blocks (``block_rows``, issue #34 "Memory that scales"): the blocked value and
gradient are the unblocked ones, padding rows included; XLA's temp memory with blocks is O(b p), not
O(n p) (compile only, from shapes: :mod:`plnexp.fitting.memory`); the option's way in from ``plnexp.fit`` and
from the config.

Tolerances: blocked vs unblocked, float64, 1e-10 relative per parameter (measured <= 1e-15: only the
order of the sums over rows differs). Memory bounds: see :func:`test_temp_memory_is_blocks_not_rows`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import plnexp
from plnexp.fitting import memory
from plnexp.core.arrays import Arrays, Rows
from plnexp.core import model as pm

RANK = 3
TOL = 1e-10
# adam: a smooth optimizer, so that fits summed in another order (blocks, devices) stay within 1e-9.
# A sign-driven one (rprop, radam_clip's clip) steps by the sign of a gradient component, and where one
# crosses 0, as the rotation R's does within a few iterations on data this small, rounding picks it.
# init="seed", named: from pca's default start (init="data": plnexp.fitting.spec.DEFAULT_INIT) such fits drift
# apart by ~2e-9 within 20 adam steps (tests/test_pca.py's KW says the same)
KW = dict(model="pca", rank=RANK, optimizer="adam", lr=1e-2, n_iter=20, precision="float64", init="seed", timed=False)


@pytest.fixture(scope="module")
def odd():
    return plnexp.simulate(n=103, p=7, d=2, seed=1)  # 103: a multiple of no block size below


def _point(n, p, d, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "B": 0.2 * rng.normal(size=(d, p)),
        "C": 0.4 * rng.normal(size=(p, RANK)),
        "M": rng.normal(size=(n, RANK)),
        "S": rng.uniform(0.2, 1.0, size=(n, RANK)),
        "R": 0.5 * rng.normal(size=(RANK, RANK)),  # the latent axes' rotation (its gradient sums the blocks' too)
    }


def _rel(got, want) -> float:
    got, want = np.asarray(got), np.asarray(want)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300))


def _evaluate(model, params, arrays):
    """(value, grads) analytic, the ELBO alone, and autodiff's (value, grads), all jitted, float64."""
    state = model.complete(params, arrays)
    analytic = jax.jit(model.value_and_grad)(params, state, arrays)
    elbo = jax.jit(model.elbo)(params, state, arrays)
    autodiff = jax.jit(jax.value_and_grad(model.elbo))(params, state, arrays)
    return analytic, elbo, autodiff


@pytest.mark.parametrize(
    "block_rows", [103, *(pytest.param(b, marks=pytest.mark.slow) for b in (1, 10, 16, 50, 102, 500))]
)
def test_blocks_give_the_unblocked_value_and_gradient(odd, block_rows):
    with jax.enable_x64(True):
        arrays = Arrays(*(jnp.asarray(a) for a in (odd.Y, odd.O, odd.X)))
        params = {k: jnp.asarray(v) for k, v in _point(odd.n, odd.p, odd.d).items()}
        (v0, g0), _, _ = _evaluate(pm.pca_model(RANK), params, arrays)
        (v, g), elbo, (va, ga) = _evaluate(pm.pca_model(RANK, block_rows), params, arrays)
    for value in (v, elbo, va):
        assert abs(float(value) - float(v0)) <= TOL * abs(float(v0))
    for name in ("B", "C", "M", "S", "R"):
        assert _rel(g[name], g0[name]) <= TOL, (name, "analytic")
        assert _rel(ga[name], g0[name]) <= TOL, (name, "autodiff")


@pytest.mark.parametrize("block_rows", [9, *(pytest.param(b, marks=pytest.mark.slow) for b in (None, 4, 64))])
def test_blocks_skip_padding_rows(odd, block_rows):
    """Rows as a row-sharded fit pads them (Y = O = X = 0, M = 0, weight 0: data.rows): the value and
    the sums over rows are those of the data rows alone, dM and dS are 0 on the padding rows."""
    pad = 5
    with jax.enable_x64(True):
        raw = _point(odd.n + pad, odd.p, odd.d, seed=4)
        raw["M"][odd.n :] = 0.0
        data_rows = {k: (v[: odd.n] if k in ("M", "S") else v) for k, v in raw.items()}
        plain = Arrays(*(jnp.asarray(a) for a in (odd.Y, odd.O, odd.X)))
        padded = Arrays(
            *(jnp.asarray(np.vstack([a, np.zeros((pad, a.shape[1]))])) for a in (odd.Y, odd.O, odd.X)),
            rows=Rows(jnp.asarray(np.r_[np.ones(odd.n), np.zeros(pad)][:, None]), jnp.asarray(float(odd.n))),
        )
        model = pm.pca_model(RANK, block_rows)
        want = pm.pca_model(RANK)
        (v0, g0), e0, _ = _evaluate(want, {k: jnp.asarray(v) for k, v in data_rows.items()}, plain)
        (v, g), e, (va, ga) = _evaluate(model, {k: jnp.asarray(v) for k, v in raw.items()}, padded)
    for value in (v, e, va):
        assert abs(float(value) - float(v0)) <= TOL * abs(float(v0))
    for grads in (g, ga):
        for name in ("B", "C", "R"):
            assert _rel(grads[name], g0[name]) <= TOL, name
        for name in ("M", "S"):
            assert _rel(grads[name][: odd.n], g0[name]) <= TOL, name
            assert not np.any(np.asarray(grads[name][odd.n :])), name


@pytest.mark.slow
def test_temp_memory_is_blocks_not_rows():
    """XLA's temp bytes at n x p = 4,000 x 500, q = 5, float32 (compiled from shapes, nothing run).
    Measured here (plnexp's XLA flags, jaxlib 0.10.2, CPU): without blocks the value and gradient
    holds 1.09 n x p arrays (1.11 with autodiff; A, the one b x p temporary of model._pca_rows, and
    the small arrays) and a whole scan fit 1.10 (1.13); with b = 250 rows a block, 1.1 to 1.8 b x p,
    i.e. 0.07 to 0.11 n x p. Bounds: unblocked within [0.9, 1.5] n x p (A, and no second n x p
    array: R = Y - A, Z and Y o (O + XB) are never written with per-row offsets), blocked <= 3 b x p
    and <= 0.2 n x p (b / n = 1/16)."""
    n, p, b = 4000, 500, 250
    for gradient, what in (("analytic", memory.WHAT), ("autodiff", ("fit",))):
        whole = memory.measure(n, p, rank=5, gradient=gradient, what=what)
        blocked = memory.measure(n, p, rank=5, block_rows=b, gradient=gradient, what=what)
        for name in what:
            assert 0.9 <= whole[name].in_arrays(whole[name].temp) <= 1.5, (gradient, name, whole[name])
            m = blocked[name]
            assert m.in_arrays(m.temp, b) <= 3 and m.in_arrays(m.temp) <= 0.2, (gradient, name, m)
            assert m.argument == whole[name].argument  # Y and O as they are: no copy, no padding


def test_memory_report_names_the_arrays():
    found = memory.measure(400, 50, rank=2, block_rows=100, what=("value_and_grad",))
    (line,) = memory.report(found)
    assert line.startswith("value_and_grad") and "n x p" in line and "b x p" in line
    with pytest.raises(ValueError, match="what='loop': allowed values are value_and_grad, step, fit"):
        memory.measure(400, 50, what=("loop",))


@pytest.mark.parametrize("gradient", ["analytic", pytest.param("autodiff", marks=pytest.mark.slow)])
def test_a_blocked_fit_is_the_unblocked_fit(odd, gradient):
    want = plnexp.fit(odd, gradient=gradient, **KW)
    got = plnexp.fit(odd, gradient=gradient, block_rows=10, **KW)
    assert _rel(got.elbo, want.elbo) <= 1e-9
    for name in ("B", "C", "M", "S"):
        assert _rel(got.params[name], want.params[name]) <= 1e-8, name


def test_models_are_one_per_rank_and_block_size():
    assert pm.pca_model(4) is pm.pca_model(4, None) is pm.pca_model(4, block_rows=None)
    assert pm.pca_model(4, 100) is pm.pca_model(4, block_rows=100) and pm.pca_model(4, 100) is not pm.pca_model(4)
    assert pm.pca_model(4, 100).block_rows == 100 and pm.pca_model(4).block_rows is None


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(block_rows=0), "block_rows=0: allowed values are integers >= 1 (rows per block) or None"),
        (dict(block_rows=2.5), "block_rows=2.5: allowed values are integers >= 1"),
        (dict(block_rows=True), "block_rows=True: allowed values are integers >= 1"),
        (
            dict(model="full", rank=None, block_rows=10),
            "block_rows=10 with model=full: only model=pca has a block_rows",
        ),
    ],
)
def test_a_bad_block_rows_is_one_line(odd, kwargs, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")) as info:
        plnexp.fit(odd, **{**KW, **kwargs})
    assert "\n" not in str(info.value)


def test_config_model_block_rows():
    """``model=pca model.block_rows=b``: the model's section gains block_rows (only when set, so that
    a fit without keeps its config hash); a bad value is one line naming model.block_rows."""
    from hydra import compose, initialize_config_dir

    from plnexp.jobs import config as C
    from plnexp.jobs import config_load
    from plnexp.system.paths import CONF_DIR

    def load(*overrides):
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            return config_load.load(compose("config", ["dataset=synthetic", "dataset.p=20", "model=pca", *overrides]))

    cfg = load("model.rank=3", "model.block_rows=500")
    assert cfg.as_dict()["model"] == {"name": "pca", "rank": 3, "block_rows": 500}
    assert config_load.load(config_load.loadable(cfg)) == cfg
    assert cfg.fit_spec().model is pm.pca_model(3, 500)
    assert load("model.rank=3").as_dict()["model"] == {"name": "pca", "rank": 3}
    for value, shown in (("0", "0"), ("-3", "-3"), ("1.5", "1.5"), ("many", "'many'")):
        with pytest.raises(
            C.ConfigError, match=f"model.block_rows={shown}: allowed values are integers >= 1 .* or null"
        ) as info:
            load(f"model.block_rows={value}")
        assert "\n" not in str(info.value)


@pytest.mark.slow
@pytest.mark.multidevice
@pytest.mark.parametrize("via", ["jit", "shard_map"])
def test_blocks_in_a_row_sharded_fit(via):
    """Under shard_map each device walks its own rows in blocks (its padding row included); under jit
    XLA partitions the blocked loop over the sharded rows itself."""
    odd = plnexp.simulate(n=61, p=8, d=2, seed=3)  # one padding row on 2 devices
    want = plnexp.fit(odd, strategy="scan", **KW)
    got = plnexp.fit(odd, strategy="scan_sharded", via=via, devices=2, block_rows=8, **KW)
    assert got.params["M"].shape == (61, RANK)
    assert _rel(got.elbo, want.elbo) <= 1e-9
