"""Pure PLN maths: ELBOs, closed forms and initial states. No jit, no I/O, no global state.

Model (Chiquet et al.): Y_ij ~ Poisson(exp(O_ij + X_i B_j + W_ij)), W_i ~ N(0, Sigma).
Variational family: W_i ~ N(M_i, diag(S_i^2)). With Omega = Sigma^-1 the ELBO is

    sum_ij [Y_ij (O + XB + M)_ij - exp(O + XB + M + S^2/2)_ij - log(Y_ij!)] + 1/2 sum_ij log S_ij^2
    + n/2 log|Omega| - 1/2 tr(Omega (M'M + diag(sum_i S_i^2))) + n p / 2.

The seed tutorial wrote the trace as ``trace(M.T @ M + diag(...) @ Omega)`` which, by operator
precedence, leaves Omega off M'M; here Omega multiplies the whole bracket.

Two parametrisations (a :class:`~plnexp.core.model.Model` each, :data:`plnexp.core.model.FULL` and
:data:`~plnexp.core.model.PROFILED`):

- ``full``: B, M, S by gradient; Sigma = (M'M + diag(sum S^2)) / n and Omega in closed form after
  every step (the seed's scheme). M is the centred residual W.
- ``profiled``: M, S by gradient, with B = (X'X)^-1 X'M and Sigma in closed form *inside* the ELBO
  (as pyPLNmodels / PLNmodels do). M is the mean of the uncentred latent Z = XB + W.

The log-factorial term depends on the data only: the functions here leave it out (``partial``
ELBO); :mod:`plnexp.core.reference` adds it on the host in float64.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import cho_solve

from .arrays import Arrays, Rows
from .row_sums import _data_rows, _n, _total


class PLNState(NamedTuple):
    """Every parameter of a fit. ``M`` is in the model's own parametrisation (see module doc)."""

    B: jax.Array  # (d, p)
    M: jax.Array  # (n, p)
    S: jax.Array  # (n, p)
    Sigma: jax.Array  # (p, p)
    Omega: jax.Array  # (p, p)


Params = dict  # the pytree the optimizer sees: {"B", "M", "S"} or {"M", "S"}


def logdet_from_cholesky(L: jax.Array) -> jax.Array:
    """log det of the matrix whose lower Cholesky factor is ``L``: twice the sum of the logs of its diagonal."""
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(L)))


def inverse_spd(Sigma: jax.Array) -> jax.Array:
    """Sigma^-1 through its Cholesky factor (no general-purpose inverse)."""
    L = jnp.linalg.cholesky(Sigma)
    return cho_solve((L, True), jnp.eye(Sigma.shape[0], dtype=Sigma.dtype))


def closed_form_sigma(M: jax.Array, S: jax.Array, rows: Rows | None = None) -> jax.Array:
    """argmax over Sigma of the ELBO: (M'M + diag(sum_i S_i^2)) / n, for centred M (zero on padding rows)."""
    second_moment = _total(rows, M.T @ M + jnp.diag(jnp.sum(_data_rows(rows, S * S), axis=0)))
    return second_moment / _n(rows, M)


def closed_form_b(X: jax.Array, M: jax.Array, rows: Rows | None = None) -> jax.Array:
    """argmax over B of the ELBO for uncentred M: the least-squares fit (X'X)^-1 X'M."""
    L = jnp.linalg.cholesky(_total(rows, X.T @ X))
    return cho_solve((L, True), _total(rows, X.T @ M))


def _poisson_part(data: Arrays, Z: jax.Array, S: jax.Array) -> jax.Array:
    """sum_ij [Y Z - exp(Z + S^2/2) + log|S|] with Z = O + XB + M (log|S| = 1/2 log S^2)."""
    per_entry = data.Y * Z + _data_rows(data.rows, -jnp.exp(Z + 0.5 * S * S) + jnp.log(jnp.abs(S)))
    return _total(data.rows, jnp.sum(per_entry))


def full_elbo(params: Params, state: PLNState, data: Arrays) -> jax.Array:
    """Partial ELBO of the ``full`` model at (B, M, S) with Omega held at ``state.Omega``.

    tr(Omega (M'M + D)) is computed as sum(Omega * M'M) + sum(diag(Omega) * D): Omega multiplies
    *both* terms (the seed's precedence bug dropped it from M'M).
    """
    B, M, S = params["B"], params["M"], params["S"]
    rows = data.rows
    n, p = _n(rows, M), M.shape[1]
    logdet_omega = -logdet_from_cholesky(jnp.linalg.cholesky(state.Sigma))  # state is not differentiated
    Omega = state.Omega
    trace = jnp.sum(Omega * _total(rows, M.T @ M)) + jnp.sum(
        jnp.diagonal(Omega) * _total(rows, jnp.sum(_data_rows(rows, S * S), axis=0))
    )
    return _poisson_part(data, data.O + data.X @ B + M, S) + 0.5 * n * logdet_omega - 0.5 * trace + 0.5 * n * p


def profiled_elbo(params: Params, state: PLNState, data: Arrays) -> jax.Array:
    """Partial ELBO of the ``profiled`` model: B and Sigma at their closed forms given (M, S).

    With Sigma at its optimum the trace term equals n p and cancels the entropy's n p / 2 + the
    prior's, leaving -n/2 log|Sigma| (log-determinant from the Cholesky factor).
    """
    del state  # everything but (M, S) is profiled out
    M, S = params["M"], params["S"]
    n = _n(data.rows, M)
    R = M - data.X @ closed_form_b(data.X, M, data.rows)
    L = jnp.linalg.cholesky(closed_form_sigma(R, S, data.rows))
    return _poisson_part(data, data.O + M, S) - 0.5 * n * logdet_from_cholesky(L)


def _value_and_grad_given_omega(data: Arrays, M, B, M_res, S, Sigma, Omega, logdet_sigma):
    """Partial ELBO and its gradient in (Z, S), Z = O + XB + M, with Sigma and its inverse Omega
    held fixed, for ``Sigma`` the closed form of (the centred residual ``M_res``, S).

    With A = exp(Z + S^2/2): d/dZ = Y - A - M_res Omega and d/dS = 1/S - S (A + diag(Omega)).
    Because Sigma = (M_res'M_res + diag(sum S^2)) / n, the trace term tr(Omega (M'M + D)) equals
    n sum(Omega o Sigma): the value needs no second pass over M. One exp and one n x p x p product
    per call. ``B`` is None for Z = O + M. Returns (value, dZ, dS, A).
    """
    rows = data.rows
    n, p = _n(rows, S), S.shape[1]
    Z = data.O + M if B is None else data.O + data.X @ B + M
    A = _data_rows(rows, jnp.exp(Z + 0.5 * S * S))  # zero on padding rows, as everything below
    # sum(Y Z) = sum(Y M) + sum(Y O) + sum((X'Y) o B): Z is then only read by the exp's own fusion
    # and never written to memory; sum(Y O) and X'Y are loop-invariant (XLA hoists them).
    yz_rest = _total(rows, jnp.sum(data.Y * data.O)) + (
        0.0 if B is None else jnp.sum(_total(rows, data.X.T @ data.Y) * B)
    )
    # Column sums, then the p-vector. The barrier stops XLA from merging the two into one full
    # reduction, which XLA:CPU runs slower than the column sums (profiled on oaks x100; the figure is
    # in docs/results.md, "Where the time goes, and other figures").
    per_column = jax.lax.optimization_barrier(jnp.sum(data.Y * M - A + _data_rows(rows, jnp.log(jnp.abs(S))), axis=0))
    trace = n * jnp.sum(Omega * Sigma)
    value = jnp.sum(_total(rows, per_column)) + yz_rest - 0.5 * n * logdet_sigma - 0.5 * trace + 0.5 * n * p
    dS = _data_rows(rows, 1.0 / S - S * (A + jnp.diagonal(Omega)))
    return value, data.Y - A - M_res @ Omega, dS, A


def full_value_and_grad(params: Params, state: PLNState, data: Arrays) -> tuple[jax.Array, Params]:
    """:func:`full_elbo` and its gradient in closed form (no autodiff), for a *complete* state.

    dB = X'(Y - A), dM = Y - A - M Omega, dS = 1/S - S (A + diag(Omega)); see
    :func:`_value_and_grad_given_omega`. Requires ``state.Sigma`` to be the closed form of
    ``params`` (as :func:`_complete_full` makes it; every state of a fit is complete).
    """
    B, M, S = params["B"], params["M"], params["S"]
    logdet_sigma = logdet_from_cholesky(jnp.linalg.cholesky(state.Sigma))
    value, dM, dS, A = _value_and_grad_given_omega(data, M, B, M, S, state.Sigma, state.Omega, logdet_sigma)
    # X'(Y - A) as X'Y - X'A: X'Y is loop-invariant (XLA hoists it) and A is already in memory
    return value, {"B": _total(data.rows, data.X.T @ data.Y - data.X.T @ A), "M": dM, "S": dS}


def profiled_value_and_grad(params: Params, state: PLNState, data: Arrays) -> tuple[jax.Array, Params]:
    """:func:`profiled_elbo` and its gradient in closed form, for a *complete* state.

    Requires ``state`` to hold the closed forms of ``params`` (B, Sigma, Omega as
    :func:`_complete_profiled` makes them; every state of a fit is complete). Envelope theorem:
    d/dM [-n/2 log|Sigma(M, S)|] = -R Omega with R = M - XB, and d/dS = -S diag(Omega), so the
    gradient is that of :func:`full_elbo` with M_res = R.
    """
    M, S = params["M"], params["S"]
    R = M - data.X @ state.B
    logdet_sigma = logdet_from_cholesky(jnp.linalg.cholesky(state.Sigma))
    value, dM, dS, _ = _value_and_grad_given_omega(data, M, None, R, S, state.Sigma, state.Omega, logdet_sigma)
    return value, {"M": dM, "S": dS}


def _complete_full(params: Params, data: Arrays) -> PLNState:
    Sigma = closed_form_sigma(params["M"], params["S"], data.rows)
    return PLNState(params["B"], params["M"], params["S"], Sigma, inverse_spd(Sigma))


def _complete_profiled(params: Params, data: Arrays) -> PLNState:
    M, S = params["M"], params["S"]
    B = closed_form_b(data.X, M, data.rows)
    Sigma = closed_form_sigma(M - data.X @ B, S, data.rows)
    return PLNState(B, M, S, Sigma, inverse_spd(Sigma))
