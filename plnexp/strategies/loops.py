"""fori_loop and while_loop: the ELBO curve is written into a preallocated array in the carry.

``while_loop`` stops *inside* the compiled program once the relative change of the ELBO
(|e_i - e_{i-1}| / |e_{i-1}|, on the full ELBO) has stayed below ``tol`` for ``patience``
consecutive iterations, or at ``n_iter``. Counting consecutive iterations (not one) matters: optax's
``rprop`` makes an exactly zero first step, so e_1 == e_0 and a one-shot rule would stop at once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..core.problem import FitState, Output, Problem, relative_change
from .base import SingleProgram


def _empty_curve(state: FitState, n_iter: int) -> jax.Array:
    return jnp.full((n_iter,), jnp.nan, dtype=state.pln.M.dtype)


def fori_program(problem: Problem, n_iter: int) -> SingleProgram:
    def fit(state: FitState, data) -> Output:
        def body(i, carry):
            state, curve = carry
            state, elbo = problem.step(state, data)
            return state, curve.at[i].set(elbo)

        state, curve = jax.lax.fori_loop(0, n_iter, body, (state, _empty_curve(state, n_iter)))
        return Output(state, curve, jnp.asarray(n_iter, jnp.int32), problem.elbo(state, data))

    return SingleProgram(fit, label="fori_loop")


def while_program(problem: Problem, n_iter: int, tol: float, patience: int) -> SingleProgram:
    def fit(state: FitState, data) -> Output:
        def cond(carry):
            i, _, _, _, calm = carry
            return (i < n_iter) & (calm < patience)

        def body(carry):
            i, state, curve, previous, calm = carry
            state, elbo = problem.step(state, data)
            small = (i > 0) & (relative_change(elbo, previous, data.log_factorial) < tol)
            calm = jnp.where(small, calm + 1, 0)
            return i + 1, state, curve.at[i].set(elbo), elbo, calm

        curve = _empty_curve(state, n_iter)
        start = (jnp.asarray(0, jnp.int32), state, curve, jnp.asarray(jnp.nan, curve.dtype), jnp.asarray(0, jnp.int32))
        n_run, state, curve, _, _ = jax.lax.while_loop(cond, body, start)
        return Output(state, curve, n_run, problem.elbo(state, data))

    return SingleProgram(fit, label="while_loop")
