"""PLN-PCA's block Newton rounds (``optimizer="newton"``, pca's default: plnexp.core.pca_newton.pca_newton_step).

Checked against independent float64 references: the batched Cholesky solve against NumPy's solve
and with I + D, |D| < 1, and a matrix of right-hand sides (1e-10 relative); the exact centring (M C' + XB unchanged to 1e-12, the ELBO up by the prior's
n |mean|^2 / 2, as NumPy computes it, to 1e-9 relative); the gauge step against one Newton step of
the ELBO along G (M G, C G^-T) by autodiff of the float64 reference-equivalent ELBO (1e-8 on G);
each column's Gauss-Newton step after it against NumPy's, column by column (1e-9 relative);
and a fit whose ELBO curve never goes down by more than float64 rounding (1e-9 relative) and ends
above rprop's at the same iterations. Choices refused with one line: newton for another model,
with block_rows, with gradient=autodiff.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import plnexp
from plnexp.core.arrays import Arrays
from plnexp.core import pca_elbo
from plnexp.core import pca_newton
from plnexp.core import model as pm
from plnexp.core import reference

RANK = 3


@pytest.fixture(scope="module")
def data():
    return plnexp.simulate_pca(n=80, p=12, q=RANK, zero_fraction=0.3, d=2, seed=3)


def _arrays(data):
    return Arrays(*(jnp.asarray(a, jnp.float64) for a in (data.Y, data.O, data.X)))


def _point(data, seed=0):
    rng = np.random.default_rng(seed)
    return (
        0.2 * rng.normal(size=(data.d, data.p)),
        0.4 * rng.normal(size=(data.p, RANK)),
        rng.normal(size=(data.n, RANK)) + 0.3,
        rng.uniform(0.2, 1.0, size=(data.n, RANK)),
    )


# jitted as a fit runs it: one program each (called op by op, each of their primitives compiled apart)
_gauge_columns = jax.jit(pca_newton._pca_gauge_columns)


def _elbo(data, B, C, M, S):
    return reference.pca_elbo(data.Y, data.O, data.X, B, C, M, S, log_factorial=False)


def test_spd_solve_matches_numpy():
    rng = np.random.default_rng(0)
    for k in (1, 4, 11):
        F = rng.normal(size=(50, k, k))
        H = F @ np.swapaxes(F, 1, 2) + 0.1 * np.eye(k)
        g = rng.normal(size=(50, k))
        with jax.enable_x64(True):
            got = np.asarray(pca_newton._spd_solve(jnp.asarray(H), jnp.asarray(g)))
        want = np.linalg.solve(H, g[..., None])[..., 0]
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())


def test_spd_solve_takes_i_plus_small_d_and_many_right_hand_sides():
    """The gauge's G = I + D (not symmetric, |D| < 1) against C' (k, m): NumPy's solve, 1e-10."""
    rng = np.random.default_rng(1)
    k = 6
    D = rng.normal(size=(k, k))
    G = np.eye(k) + 0.9 * D / np.linalg.norm(D)
    R = rng.normal(size=(k, 40))
    with jax.enable_x64(True):
        got = np.asarray(pca_newton._spd_solve(jnp.asarray(G), jnp.asarray(R)))
    np.testing.assert_allclose(got, np.linalg.solve(G, R), rtol=1e-10, atol=1e-10)


def test_centring_is_exact_and_gains_the_prior(data):
    B, C, M, S = _point(data)
    with jax.enable_x64(True):
        M2, B2 = (np.asarray(a) for a in pca_newton._pca_centre(*(jnp.asarray(a) for a in (data.X, B, C, M)), None))
    np.testing.assert_allclose(M2 @ C.T + data.X @ B2, M @ C.T + data.X @ B, atol=1e-12)
    gamma = np.linalg.lstsq(data.X, M, rcond=None)[0]
    gain = 0.5 * (np.sum(M * M) - np.sum((M - data.X @ gamma) ** 2))
    assert gain > 0
    np.testing.assert_allclose(_elbo(data, B2, C, M2, S) - _elbo(data, B, C, M, S), gain, rtol=1e-9)


@pytest.mark.slow
def test_gauge_step_is_newtons_along_g(data):
    B, C, M, S = _point(data, 1)
    q = RANK
    with jax.enable_x64(True):
        arrays = _arrays(data)
        args = [jnp.asarray(a) for a in (B, C, M, S)]
        _, _, M3 = _gauge_columns(arrays.Y, arrays.O, arrays.X, *args, None)

        def along(delta):  # the exact ELBO along the gauge, by autodiff
            G = jnp.eye(q) + delta.reshape(q, q)
            return pca_elbo._pca_block_elbo(
                arrays.Y, arrays.O, arrays.X, args[0], jnp.linalg.solve(G, args[1].T).T, args[2] @ G, args[3], None
            )

        zero = jnp.zeros(q * q)
        hessian, grad = jax.jit(jax.hessian(along))(zero), jax.jit(jax.grad(along))(zero)
        step = -np.linalg.solve(np.asarray(hessian), np.asarray(grad))
    assert np.linalg.norm(step) < pca_newton.PCA_GAUGE_CLIP  # not clipped: the step is Newton's own
    G = np.linalg.lstsq(M, np.asarray(M3), rcond=None)[0]
    np.testing.assert_allclose(G, np.eye(q) + step.reshape(q, q), atol=1e-8)


def test_columns_step_is_gauss_newtons_after_the_gauge(data):
    """Each column's (B_j, C_j) step against a NumPy float64 reference, column by column: the
    Gauss-Newton system at (X, M G), C G^-T with the A of the pass before the gauge step."""
    B, C, M, S = _point(data, 2)
    with jax.enable_x64(True):
        arrays = _arrays(data)
        B4, C4, M3 = (
            np.asarray(a)
            for a in _gauge_columns(arrays.Y, arrays.O, arrays.X, *(jnp.asarray(a) for a in (B, C, M, S)), None)
        )
    G = np.linalg.lstsq(M, M3, rcond=None)[0]
    np.testing.assert_allclose(M @ G, M3, atol=1e-10)
    C3 = C @ np.linalg.inv(G).T
    Y, O, X = data.Y, data.O, data.X
    d = X.shape[1]
    A = np.exp(O + X @ B + M @ C.T + 0.5 * (S * S) @ (C * C).T)
    U = np.concatenate([X, M3], axis=1)
    for j in range(data.p):
        H = (U * A[:, j : j + 1]).T @ U
        W = (S * S).T @ A[:, j]
        H[d:, d:] += np.diag(W)
        g = U.T @ (Y[:, j] - A[:, j])
        g[d:] -= W * C3[j]
        step = np.clip(np.linalg.solve(H, g), -pca_newton.PCA_NEWTON_CLIP, pca_newton.PCA_NEWTON_CLIP)
        np.testing.assert_allclose(B4[:, j], B[:, j] + step[:d], rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(C4[j], C3[j] + step[d:], rtol=1e-9, atol=1e-10)


def test_newton_is_pcas_default_and_climbs(data):
    res = plnexp.fit(data, model="pca", rank=RANK, n_iter=15, precision="float64", timed=False)
    assert res.optimizer == "newton"
    curve = res.elbo
    assert np.all(np.diff(curve) >= -1e-9 * np.abs(curve[1:]))
    rprop = plnexp.fit(data, model="pca", rank=RANK, optimizer="rprop", n_iter=15, precision="float64", timed=False)
    assert res.loglik > rprop.loglik
    # the float64 host reference at the reported parameters (as every fit is checked)
    p = res.params
    np.testing.assert_allclose(res.loglik, reference.pca_elbo(data.Y, data.O, data.X, p["B"], p["C"], p["M"], p["S"]))


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(model="full", optimizer="newton"), "only model=pca"),
        (dict(model="pca", rank=2, optimizer="newton", block_rows=10), "block_rows=10 with optimizer=newton"),
        (dict(model="pca", rank=2, optimizer="newton", gradient="autodiff"), "gradient='autodiff'"),
    ],
)
def test_newton_refused_with_one_line(data, kwargs, words):
    with pytest.raises(ValueError, match=words) as info:
        plnexp.fit(data, n_iter=2, timed=False, **kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_block_rows_keeps_rprop(data):
    res = plnexp.fit(data, model="pca", rank=2, block_rows=40, n_iter=2, timed=False)
    assert res.optimizer == "rprop"


@pytest.mark.slow
def test_newton_model_has_no_rotation_and_steps_as_with_r_zero(data):
    """The Newton model's parameters carry no R (its rounds never turn the latent axes): its step
    and ELBO are those of the same parameters with R = 0 (Q = I) to float64 rounding (1e-12
    relative), and its state's R is 0."""
    model = pm.pca_model(RANK, newton=True)
    B, C, M, S = _point(data)
    with jax.enable_x64(True):
        arrays = _arrays(data)
        params = {k: jnp.asarray(v) for k, v in zip("BCMS", (B, C, M, S))}
        assert set(model.free(model.complete(params, arrays))) == {"B", "C", "M", "S"}
        np.testing.assert_array_equal(np.asarray(model.complete(params, arrays).Omega), np.zeros((RANK, RANK)))
        newton_step = jax.jit(pca_newton.pca_newton_step)  # one program (op by op, each primitive compiles apart)
        value, step = newton_step(params, None, arrays)
        value_r, step_r = newton_step({**params, "R": jnp.zeros((RANK, RANK))}, None, arrays)
        assert set(step) == {"B", "C", "M", "S"} and np.all(np.asarray(step_r["R"]) == 0)
        np.testing.assert_allclose(float(value), float(value_r), rtol=1e-12)
        for k in step:
            np.testing.assert_allclose(np.asarray(step[k]), np.asarray(step_r[k]), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(
            float(model.elbo(params, None, arrays)),
            float(pca_elbo.pca_elbo({**params, "R": jnp.zeros((RANK, RANK))}, None, arrays)),
            rtol=1e-12,
        )
