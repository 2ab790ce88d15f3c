"""The PLN maths: ELBOs through the *jitted* code path against an independent float64 numpy
implementation (tests/reference_np.py), gradients, and stationarity of the closed forms.

Tolerances: float64 rtol 1e-10 (only summation order differs); float32 rtol 2e-5 (a sum of
n*p = 13224 terms of size up to ~1e4 each rounded at 6e-8 relative, measured ~1e-6).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from reference_np import elbo_np, profiled_closed_forms, profiled_elbo_and_grad

from plnexp.core.arrays import Arrays
from plnexp.core import initial_state
from plnexp.core import pln_elbo
from plnexp.core import model as pm
from plnexp.core import reference

RTOL = {np.float64: 1e-10, np.float32: 2e-5}


def _random_point(data, seed):
    """Random, well-conditioned parameters around a plausible fit of the data."""
    rng = np.random.default_rng(seed)
    n, p, d = data.n, data.p, data.d
    M = np.log1p(data.Y) - data.O - 0.3 + 0.3 * rng.normal(size=(n, p))
    B = 0.2 * rng.normal(size=(d, p))
    S = rng.uniform(0.2, 1.0, size=(n, p))
    A = rng.normal(size=(p, p)) / np.sqrt(p)
    Sigma = A @ A.T + np.eye(p)
    return B, M, S, Sigma


def _arrays(data, dtype):
    return Arrays(*(jnp.asarray(a, dtype) for a in (data.Y, data.O, data.X)))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_full_elbo_jitted_matches_numpy(oaks, dtype):
    B, M, S, _ = _random_point(oaks, 0)
    with jax.enable_x64(dtype == np.float64):
        data = _arrays(oaks, dtype)
        # Omega at the closed form of (M, S): exactly what the fit loop evaluates
        Sigma = pln_elbo.closed_form_sigma(jnp.asarray(M, dtype), jnp.asarray(S, dtype))
        pln = pln_elbo.PLNState(*(jnp.asarray(a, dtype) for a in (B, M, S)), Sigma, jnp.linalg.inv(Sigma))
        got = float(jax.jit(pln_elbo.full_elbo)(pm.FULL.free(pln), pln, data))
    want = elbo_np(oaks.Y, oaks.O, oaks.X, B, M, S, np.asarray(Sigma, np.float64)) + reference.log_factorial_sum(oaks.Y)
    np.testing.assert_allclose(got, want, rtol=RTOL[dtype])


def test_full_elbo_trace_term_keeps_omega_on_mtm(oaks):
    """Regression for the seed's precedence bug: with a non-identity Omega, tr(Omega M'M) matters."""
    B, M, S, Sigma = _random_point(oaks, 1)
    with jax.enable_x64(True):
        data = _arrays(oaks, np.float64)
        pln = pln_elbo.PLNState(*(jnp.asarray(a) for a in (B, M, S, Sigma)), jnp.asarray(np.linalg.inv(Sigma)))
        got = float(jax.jit(pln_elbo.full_elbo)(pm.FULL.free(pln), pln, data))
    want = elbo_np(oaks.Y, oaks.O, oaks.X, B, M, S, Sigma) + reference.log_factorial_sum(oaks.Y)
    seed_trace = np.trace(M.T @ M + np.diag((S**2).sum(0)) @ np.linalg.inv(Sigma))
    right_trace = np.trace(np.linalg.inv(Sigma) @ (M.T @ M + np.diag((S**2).sum(0))))
    assert abs(seed_trace - right_trace) > 1.0  # the bug would be visible at this point
    np.testing.assert_allclose(got, want, rtol=1e-10)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_profiled_elbo_jitted_matches_numpy(oaks, dtype):
    _, M, S, _ = _random_point(oaks, 2)
    M_full = M + 0.5  # uncentred latent mean
    with jax.enable_x64(dtype == np.float64):
        data = _arrays(oaks, dtype)
        params = {"M": jnp.asarray(M_full, dtype), "S": jnp.asarray(S, dtype)}
        got = float(jax.jit(pln_elbo.profiled_elbo)(params, None, data))
    B, R, Sigma = profiled_closed_forms(oaks.X, M_full, S)
    want = elbo_np(oaks.Y, oaks.O, oaks.X, B, R, S, Sigma) + reference.log_factorial_sum(oaks.Y)
    np.testing.assert_allclose(got, want, rtol=RTOL[dtype])


def test_host_reference_matches_independent_numpy(oaks):
    B, M, S, Sigma = _random_point(oaks, 3)
    np.testing.assert_allclose(
        reference.elbo(oaks.Y, oaks.O, oaks.X, B, M, S, Sigma),
        elbo_np(oaks.Y, oaks.O, oaks.X, B, M, S, Sigma),
        rtol=1e-12,
    )


def test_known_miscompiled_reduction_is_correct_under_plnexp(oaks):
    """jaxlib 0.10.2 returns 1113766.9 for this jitted Stirling sum over oaks without the XLA
    flag plnexp sets at import; the exact float64 value is 1285968.25."""
    k = np.where(oaks.Y == 0, 1.0, oaks.Y).astype(np.float32)
    stirling = lambda k: jnp.sum(jnp.log(jnp.sqrt(2 * jnp.pi * k)) + k * jnp.log(k / jnp.e))
    want = np.sum(np.log(np.sqrt(2 * np.pi * k.astype(np.float64))) + k * np.log(k / np.e))
    np.testing.assert_allclose(float(jax.jit(stirling)(k)), want, rtol=2e-5)


def _small(seed=0):
    import plnexp

    return plnexp.simulate(n=25, p=4, d=2, seed=seed)


@pytest.mark.slow
def test_gradients_full_and_profiled():
    data = _small()
    B, M, S, Sigma = _random_point(data, 4)
    with jax.enable_x64(True):
        arrays = _arrays(data, np.float64)
        pln = pln_elbo.PLNState(*(jnp.asarray(a) for a in (B, M, S, Sigma)), jnp.asarray(np.linalg.inv(Sigma)))
        check_grads(
            lambda q: pln_elbo.full_elbo(q, pln, arrays), (pm.FULL.free(pln),), order=1, modes=["fwd", "rev"], rtol=1e-6
        )
        check_grads(
            lambda q: pln_elbo.profiled_elbo(q, None, arrays),
            ({"M": pln.M, "S": pln.S},),
            order=1,
            modes=["fwd", "rev"],
            rtol=1e-6,
        )


def _elbo_given_sigma(B, M, S, Sigma, data):
    """Partial ELBO at any (B, centred M, S, Sigma): the general formula, with pln_elbo's own pieces."""
    from jax.scipy.linalg import cho_solve

    n, p = M.shape
    L = jnp.linalg.cholesky(Sigma)
    Omega = cho_solve((L, True), jnp.eye(p, dtype=Sigma.dtype))
    second_moment = M.T @ M + jnp.diag(jnp.sum(S * S, axis=0))
    gauss = -0.5 * n * pln_elbo.logdet_from_cholesky(L) - 0.5 * jnp.sum(Omega * second_moment)
    return pln_elbo._poisson_part(data, data.O + data.X @ B + M, S) + gauss + 0.5 * n * p


@pytest.mark.slow
def test_closed_forms_are_stationary_points():
    data = _small(1)
    _, M, S, _ = _random_point(data, 5)
    with jax.enable_x64(True):
        arrays = _arrays(data, np.float64)
        M, S = jnp.asarray(M), jnp.asarray(S)
        B = jnp.zeros((data.d, data.p))
        # full model: Sigma = (M'M + diag(sum S^2)) / n maximises the ELBO over Sigma
        sigma_hat = pln_elbo.closed_form_sigma(M, S)
        g_sigma = jax.grad(lambda Sg: _elbo_given_sigma(B, M, S, Sg, arrays))(sigma_hat)
        g_random = jax.grad(lambda Sg: _elbo_given_sigma(B, M, S, Sg, arrays))(sigma_hat + 0.1 * jnp.eye(data.p))
        assert float(jnp.max(jnp.abs(g_sigma))) < 1e-8 * float(jnp.max(jnp.abs(g_random)))
        # profiled model: B_hat and Sigma_hat maximise the ELBO given the uncentred M
        b_hat = pln_elbo.closed_form_b(arrays.X, M)
        sigma_p = pln_elbo.closed_form_sigma(M - arrays.X @ b_hat, S)
        g_b = jax.grad(lambda b: _elbo_given_sigma(b, M - arrays.X @ b, S, sigma_p, arrays))(b_hat)
        g_b_off = jax.grad(lambda b: _elbo_given_sigma(b, M - arrays.X @ b, S, sigma_p, arrays))(b_hat + 0.1)
        assert float(jnp.max(jnp.abs(g_b))) < 1e-8 * float(jnp.max(jnp.abs(g_b_off)))
        g_sp = jax.grad(lambda Sg: _elbo_given_sigma(b_hat, M - arrays.X @ b_hat, S, Sg, arrays))(sigma_p)
        assert float(jnp.max(jnp.abs(g_sp))) < 1e-8 * float(jnp.max(jnp.abs(g_random)))
        # and the profiled ELBO is the general ELBO at those closed forms
        np.testing.assert_allclose(
            float(pln_elbo.profiled_elbo({"M": M, "S": S}, None, arrays)),
            float(_elbo_given_sigma(b_hat, M - arrays.X @ b_hat, S, sigma_p, arrays)),
            rtol=1e-12,
        )


@pytest.mark.parametrize("model", ["full", "profiled"])
@pytest.mark.parametrize("init", ["seed", "data"])
def test_init_states_are_complete_and_finite(oaks, model, init):
    with jax.enable_x64(True):
        arrays = _arrays(oaks, np.float64)
        st = initial_state.init_state(pm.MODELS[model], arrays, init)
        for name, a in st._asdict().items():
            assert np.all(np.isfinite(np.asarray(a))), name
        np.testing.assert_allclose(np.asarray(st.Sigma @ st.Omega), np.eye(oaks.p), atol=1e-8)
    if init == "seed":
        np.testing.assert_array_equal(np.asarray(st.Sigma), np.eye(oaks.p))  # M=0, S=1 gives Sigma=I


# ------------------------------------------------------------------ the hand-written gradient
def _complete_random_state(model, data, dtype, seed):
    """A random point made *complete* (closed forms filled in): what every fit step sees."""
    B, M, S, _ = _random_point(data, seed)
    if model is pm.PROFILED:
        M = M + 0.5  # uncentred latent mean
    state = pln_elbo.PLNState(*(jnp.asarray(a, dtype) for a in (B, M, S)), None, None)
    return model.complete(model.free(state), _arrays(data, dtype))


@pytest.mark.parametrize("dtype", [np.float64, pytest.param(np.float32, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", ["full", "profiled"])
def test_analytic_value_and_gradient_equal_autodiff(oaks, name, dtype):
    """At random complete states of oaks: the same ELBO and gradient as jax.value_and_grad.
    float64: rtol 1e-10 (summation order only); float32: 1e-5 on the value, 1e-4 of the largest
    gradient entry (entries are differences of terms up to ~1e4, rounded at 6e-8 relative)."""
    model = pm.MODELS[name]
    with jax.enable_x64(dtype == np.float64):
        data = _arrays(oaks, dtype)
        for seed in (10, 11):
            state = _complete_random_state(model, oaks, dtype, seed)
            params = model.free(state)
            want_v, want_g = jax.jit(jax.value_and_grad(lambda q: model.elbo(q, state, data)))(params)  # noqa: B023 - called here
            got_v, got_g = jax.jit(lambda q: model.value_and_grad(q, state, data))(params)  # noqa: B023 - called here
            tol = 1e-10 if dtype == np.float64 else 1e-4
            np.testing.assert_allclose(float(got_v), float(want_v), rtol=1e-10 if dtype == np.float64 else 1e-5)
            assert set(got_g) == set(want_g)
            for key in want_g:
                want = np.asarray(want_g[key], np.float64)
                err = np.max(np.abs(np.asarray(got_g[key], np.float64) - want)) / np.max(np.abs(want))
                assert err <= tol, f"{name} d{key}: relative difference {err:.2e} > {tol:g}"


@pytest.mark.parametrize("name", ["full", "profiled"])
def test_analytic_gradient_matches_finite_differences(name):
    """check_grads on a function whose reverse mode *is* the hand-written gradient (custom_vjp):
    it is compared with central differences of the ELBO itself, float64, rtol 1e-6."""
    model = pm.MODELS[name]
    data = _small(2)
    with jax.enable_x64(True):
        arrays = _arrays(data, np.float64)
        state = _complete_random_state(model, data, np.float64, 12)

        @jax.custom_vjp
        def elbo(q):
            return model.elbo(q, state, arrays)

        def fwd(q):
            return model.value_and_grad(q, state, arrays)

        def bwd(grads, g):
            return (jax.tree.map(lambda a: g * a, grads),)

        elbo.defvjp(fwd, bwd)
        check_grads(elbo, (model.free(state),), order=1, modes=["rev"], rtol=1e-6)


def test_analytic_profiled_gradient_matches_independent_numpy(oaks):
    """Against tests/reference_np.profiled_elbo_and_grad (plain numpy inverse, lstsq), float64."""
    model = pm.PROFILED
    with jax.enable_x64(True):
        data = _arrays(oaks, np.float64)
        state = _complete_random_state(model, oaks, np.float64, 13)
        value, grads = model.value_and_grad(model.free(state), state, data)
    want_v, want_m, want_s = profiled_elbo_and_grad(oaks.Y, oaks.O, oaks.X, np.asarray(state.M), np.asarray(state.S))
    np.testing.assert_allclose(float(value) - reference.log_factorial_sum(oaks.Y), want_v, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(grads["M"]), want_m, rtol=1e-8, atol=1e-8 * np.max(np.abs(want_m)))
    np.testing.assert_allclose(np.asarray(grads["S"]), want_s, rtol=1e-8, atol=1e-8 * np.max(np.abs(want_s)))


def test_init_is_one_compiled_program_and_matches_numpy():
    """init_state compiles one program per (model, init, shapes), not one per operation (eagerly it
    was ~30 compiles, 1.2 s of a one-off oaks fit), and a second init of those shapes compiles
    nothing; its data init is least squares on log(Y + 1) - O (numpy float64, 1e-10)."""
    import plnexp

    data = plnexp.simulate(n=37, p=6, d=2, seed=4)  # shapes no other test uses: the first init compiles
    compiles = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        with jax.enable_x64(True):
            arrays = _arrays(data, np.float64)
            first = initial_state.init_state(pm.FULL, arrays, "random", seed=1)
            n_first = len(compiles)
            second = initial_state.init_state(pm.FULL, arrays, "random", seed=2)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert n_first == 1 and len(compiles) == 1, compiles
    Z = np.log1p(data.Y) - data.O
    B = np.linalg.lstsq(data.X, Z, rcond=None)[0]
    np.testing.assert_allclose(np.asarray(first.B), B, rtol=1e-10, atol=1e-12)
    noise = np.asarray(first.M) - (Z - data.X @ B)  # seed 1's noise, N(0, 0.5^2)
    assert 0.4 < noise.std() < 0.6 and not np.allclose(np.asarray(second.M), np.asarray(first.M))
