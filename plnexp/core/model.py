"""Pure PLN maths: ELBOs, closed forms and initial states. No jit, no I/O, no global state.

Model (Chiquet et al.): Y_ij ~ Poisson(exp(O_ij + X_i B_j + W_ij)), W_i ~ N(0, Sigma).
Variational family: W_i ~ N(M_i, diag(S_i^2)). With Omega = Sigma^-1 the ELBO is

    sum_ij [Y_ij (O + XB + M)_ij - exp(O + XB + M + S^2/2)_ij - log(Y_ij!)] + 1/2 sum_ij log S_ij^2
    + n/2 log|Omega| - 1/2 tr(Omega (M'M + diag(sum_i S_i^2))) + n p / 2.

The seed tutorial wrote the trace as ``trace(M.T @ M + diag(...) @ Omega)`` which, by operator
precedence, leaves Omega off M'M; here Omega multiplies the whole bracket.

Two parametrisations (a :class:`Model` each):

- ``full``: B, M, S by gradient; Sigma = (M'M + diag(sum S^2)) / n and Omega in closed form after
  every step (the seed's scheme). M is the centred residual W.
- ``profiled``: M, S by gradient, with B = (X'X)^-1 X'M and Sigma in closed form *inside* the ELBO
  (as pyPLNmodels / PLNmodels do). M is the mean of the uncentred latent Z = XB + W.

The log-factorial term depends on the data only: the functions here leave it out (``partial``
ELBO); :mod:`plnexp.core.reference` adds it on the host in float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial, cache
from typing import TYPE_CHECKING, NamedTuple, cast
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve

from . import reference
from .arrays import Arrays, Rows, SparseCounts, dense_rows

if TYPE_CHECKING:
    from .data import Data


# The only quantities that mix rows: sums over rows (the ELBO's, M'M, sum S^2, X'M, X'(Y - A)) and
# the number of rows. They go through these three, so that padding rows and rows on other devices
# are accounted for in one place.
def _total(rows: Rows | None, x):
    """A sum over this device's rows -> the sum over every row (``psum`` under ``shard_map``)."""
    return x if rows is None or rows.axis is None else jax.lax.psum(x, rows.axis)


def _n(rows: Rows | None, M: jax.Array):
    """The number of data rows (static when there is no padding)."""
    return M.shape[0] if rows is None else rows.n


def _data_rows(rows: Rows | None, x: jax.Array) -> jax.Array:
    """``x`` (n, .) with its padding rows zeroed."""
    return x if rows is None else x * rows.weight


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


def elbo_given_sigma(B, M, S, Sigma, data: Arrays) -> jax.Array:
    """Partial ELBO at any (B, centred M, S, Sigma): the general formula, used for checks."""
    n, p = _n(data.rows, M), M.shape[1]
    L = jnp.linalg.cholesky(Sigma)
    Omega = cho_solve((L, True), jnp.eye(p, dtype=Sigma.dtype))
    second_moment = _total(data.rows, M.T @ M + jnp.diag(jnp.sum(_data_rows(data.rows, S * S), axis=0)))
    gauss = -0.5 * n * logdet_from_cholesky(L) - 0.5 * jnp.sum(Omega * second_moment)
    return _poisson_part(data, data.O + data.X @ B + M, S) + gauss + 0.5 * n * p


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


def _pln_params(centred_m: Callable[[PLNState, Arrays | Data], jax.Array]) -> Callable[[PLNState, Data], dict]:
    """What a fit of ``full`` or ``profiled`` reports: B, M (the centred residual), S, Sigma."""
    return lambda s, data: {"B": s.B, "M": centred_m(s, data), "S": s.S, "Sigma": s.Sigma}


def _pln_host_elbo(params: dict, data: Data) -> float:
    return reference.elbo(data.Y, data.O, data.X, params["B"], params["M"], params["S"], params["Sigma"])


@dataclass(frozen=True)
class Model:
    """A PLN parametrisation as plain functions (pure, jit-able).

    - ``free(state)``: the pytree the optimizer updates;
    - ``elbo(params, state, data)``: partial ELBO (no log-factorial) at those params;
    - ``value_and_grad(params, state, data)``: (elbo, its gradient), written out by hand; valid for
      a complete ``state`` whose free part is ``params`` (what every fit step has);
    - ``complete(params, data)``: the full :class:`PLNState`, closed forms filled in;
    - ``centred_m(state, data)``: M as the centred residual W (the reporting convention); it reads
      ``data.X`` only, so the host's :class:`~plnexp.core.data.Data` does as well;
    - ``params(state, data)``: what a :class:`~plnexp.fitting.engine.FitResult` reports, by name (B, centred
      M, S, Sigma for ``full`` and ``profiled``; B, C, M, S for ``pca``), arrays of the state's kind;
    - ``host_elbo(params, data)``: the ELBO (exact log y!) at those params, by :mod:`plnexp.core.reference`
      in float64 on the host: what every compiled ELBO is checked against;
    - ``work``: the least traffic and products of one iteration, in n x p data arrays, n x q latent
      arrays (q: ``rank``, or p where it is 0) and n x p x q products (:class:`Work`).
    """

    name: str
    free: Callable[[PLNState], Params]
    elbo: Callable[[Params, PLNState, Arrays], jax.Array]
    value_and_grad: Callable[[Params, PLNState, Arrays], tuple[jax.Array, Params]]
    complete: Callable[[Params, Arrays], PLNState]
    centred_m: Callable[[PLNState, Arrays | Data], jax.Array]
    params: Callable[[PLNState, Data], dict]
    host_elbo: Callable[[dict, Data], float]
    work: Work  # what one iteration must do at least (plnexp.measure.floor: the machine's floor for the fit)
    rank: int = 0  # the latent dimension q of ``pca``; 0: the models whose latent is p-dimensional
    block_rows: int | None = None  # ``pca``: rows per block inside a step (None: every row at once)
    newton: bool = False  # ``pca`` for optimizer="newton": value_and_grad gives the block Newton step

    def state_elbo(self, state: PLNState, data: Arrays) -> jax.Array:
        """Partial ELBO at a complete state (what the host reference re-computes)."""
        return self.elbo(self.free(state), state, data)


@dataclass(frozen=True)
class Work:
    """What one iteration of a model must do at least, whatever the data's shape (each
    :class:`plnexp.core.model.Model` declares its own): ``data_arrays`` n x p arrays read (Y, O),
    ``latent_arrays`` n x q arrays read and written (M, S and the optimizer's two moments of each),
    ``dots`` n x p x q products, q the model's latent width, and ``factorizations`` p x p Cholesky
    factors with the inverse they give (Sigma's, for the closed-form Omega: :func:`inverse_spd`)."""

    data_arrays: int
    latent_arrays: int
    dots: int
    factorizations: int = 0

    def __post_init__(self):
        for key in ("data_arrays", "latent_arrays", "dots", "factorizations"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key}={value!r}: allowed values are integers >= 0")


# One iteration of full or profiled, at least: read Y, O (n x p); read and write M, S and the
# optimizer's two moments of each (n x p); two n x p x p products (M Omega for the gradient, M'M for
# Sigma); Sigma's Cholesky factor and the Omega it gives (p x p: what the floor's n-independent part
# is at small n). X'A and XB are n x d x p: d is small, not counted.
PLN_WORK = Work(data_arrays=2, latent_arrays=6, dots=2, factorizations=1)


def _full_centred_m(s: PLNState, data: Arrays | Data) -> jax.Array:
    return s.M


def _profiled_centred_m(s: PLNState, data: Arrays | Data) -> jax.Array:
    return s.M - data.X @ s.B


FULL = Model(
    name="full",
    free=lambda s: {"B": s.B, "M": s.M, "S": s.S},
    elbo=full_elbo,
    value_and_grad=full_value_and_grad,
    complete=_complete_full,
    centred_m=_full_centred_m,
    params=_pln_params(_full_centred_m),
    host_elbo=_pln_host_elbo,
    work=PLN_WORK,
)
PROFILED = Model(
    name="profiled",
    free=lambda s: {"M": s.M, "S": s.S},
    elbo=profiled_elbo,
    value_and_grad=profiled_value_and_grad,
    complete=_complete_profiled,
    centred_m=_profiled_centred_m,
    params=_pln_params(_profiled_centred_m),
    host_elbo=_pln_host_elbo,
    work=PLN_WORK,
)
MODELS: dict[str, Model] = {m.name: m for m in (FULL, PROFILED)}


# --- PLN-PCA ------------------------------------------------------------------------------------
# Chiquet, Mariadassou and Robin's variational Poisson PCA: Z = O + XB + W C', W_i ~ N(0, I_q),
# q(W_i) = N(M_i, diag(S_i^2)) with M, S (n, q) and C (p, q). Its state is a PLNState whose fields
# mean: B (d, p), M (n, q), S (n, q), Sigma := C (p, q), Omega := R (q, q), the rotation of the latent
# axes (no closed form: every parameter is free). The strategies carry the fields by name, whatever
# they hold.
#
# The rotation. The ELBO sees the latent axes through (C Q, M Q) for Q orthogonal, the Cayley
# transform of W = R - R' (:func:`_rotation`):
# their product M C' is the same for every Q, and the prior's |M|^2 too, so Q moves the ELBO only
# through the diagonal S, S^2 ((CQ) o (CQ))'. That direction is nearly flat for the steps on C and M
# (each coordinate of C and M must move in concert to rotate them), and a fit that follows it by
# those steps alone crept along it for thousands of iterations: still short of pyPLNmodels' final
# ELBO after 1,000 iterations at 5,000 x 2,000, where the same optimizer with R among its parameters
# (R = 0 at the start: Q = I) passed it (docs/results.md, "PLN-PCA against pyPLNmodels' PlnPCA"
# measures both). The fit reports C Q and
# M Q as its C and M.
# ``pca_model(q, block_rows=b)`` walks the rows in blocks of b inside each step: O(b p) temporaries
# instead of O(n p), same value and gradient (docs/concepts/memory.md).
PCA_NAME = "pca"
PCA_INIT_C = 0.1  # init="seed": C = PCA_INIT_C times the first q columns of the p x p identity
# One iteration, at least: read Y, O (n x p); read and write M, S and their two moments each (n x q);
# six n x p x q products: MC' and S^2 (C o C)' for the exponent, RC and A (C o C) for dM and dS,
# R'M and A'S^2 for dC (pca_value_and_grad does two more, as it never forms R = Y - A: AC and M'A,
# taking RC = YC - AC and R'M = Y'M - A'M; see _pca_block_value_and_grad).
PCA_WORK = Work(data_arrays=2, latent_arrays=6, dots=6)


def _weighted(w: jax.Array | None, x: jax.Array) -> jax.Array:
    """``x`` (b, .) with each row times its weight ``w`` (b, 1); None: every weight is 1."""
    return x if w is None else x * w


def _rotation(R: jax.Array) -> jax.Array:
    """Q = (I - W)^-1 (I + W), W = R - R' (q, q): the Cayley transform of the skew W, orthogonal for
    any R (every rotation but those turning an axis by pi); Q = I at R = 0. One q x q solve, where
    the matrix exponential (the same rotations, a longer compile: docs/results.md, "PLN-PCA against
    pyPLNmodels' PlnPCA") takes a Pade approximant per norm range and squarings in a loop, forward
    and backward."""
    xp = jnp if isinstance(R, jax.Array) else np  # a host state's (float64, reported params): NumPy's
    W = R - R.T
    eye = xp.eye(R.shape[0], dtype=R.dtype)
    return xp.linalg.solve(eye - W, eye + W)


def _rotated(params: Params) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """(C Q, M Q, Q): the C and M the ELBO sees, Q = :func:`_rotation` of ``params["R"]``; without
    an R (the Newton model's parameters: its rounds never turn the axes, so R stays 0 and Q = I),
    (C, M, None)."""
    if "R" not in params:
        return params["C"], params["M"], None
    Q = _rotation(params["R"])
    return params["C"] @ Q, params["M"] @ Q, Q


def _pca_exponent(O, X, B, C, M, S) -> jax.Array:
    """Z + S^2 (C o C)'/2 = O + XB + MC' + S^2 (C o C)'/2 for a block of rows, its two (b, q) x (q, p)
    products as one (b, 2q) x (2q, p) product: one b x p array before the exp, no b x p x q tensor."""
    return O + X @ B + jnp.concatenate([M, 0.5 * (S * S)], axis=1) @ jnp.concatenate([C, C * C], axis=1).T


def _pca_rows(Y, O, X, B, C, M, S) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A block of rows' partial ELBO, one per row (b, 1): sum_j [Y Z - A] - 1/2 sum_k (M^2 + S^2 -
    log S^2 - 1) with Z = O + XB + MC' and A = exp(Z + S^2 (C o C)'/2); and A and YC, which the
    gradient takes on from here.

    Z is never written: sum_j Y Z = sum_j Y (O + XB) + sum_k M (YC), and with per-row offsets (O of
    shape (b, 1)) sum_j Y (O + XB) is O sum_j Y + sum_k X (Y B')_k, from the one product
    Y [C, B', 1]: A is then the only b x p array written (an (n, p) O adds Y o (O + XB), the operand
    of a row sum, as XLA:CPU writes it out under plnexp's flags)."""
    A = jnp.exp(_pca_exponent(O, X, B, C, M, S))
    q, d = C.shape[1], X.shape[1]
    if O.shape[1] == 1:
        on_y = Y @ jnp.concatenate([C, B.T, jnp.ones((C.shape[0], 1), C.dtype)], axis=1)
        YC = on_y[:, :q]
        yz_fixed = jnp.sum(X * on_y[:, q : q + d], axis=1, keepdims=True) + O * on_y[:, q + d :]
    else:
        YC = Y @ C
        yz_fixed = jnp.sum(Y * (O + X @ B), axis=1, keepdims=True)
    prior = M * M + S * S - 2.0 * jnp.log(jnp.abs(S)) - 1.0
    per_row = yz_fixed + jnp.sum(M * YC - 0.5 * prior, axis=1, keepdims=True) - jnp.sum(A, axis=1, keepdims=True)
    return per_row, A, YC


def _pca_block_elbo(Y, O, X, B, C, M, S, count: jax.Array | None) -> jax.Array:
    """The partial ELBO's share of a block of rows (:func:`_pca_rows`). ``count`` (b, 1): each row's
    weight in the sums (0: a padding row or, in a clamped last block, a row an earlier block
    counted); None: every row counts once."""
    per_row, _, _ = _pca_rows(Y, O, X, B, C, M, S)
    return jnp.sum(per_row) if count is None else jnp.sum(per_row * count)


def _pca_block_value_and_grad(Y, O, X, B, C, M, S, count: jax.Array | None, keep: jax.Array | None):
    """:func:`_pca_block_elbo` and its gradient for a block of rows: (value, dB, R'M, A'S^2) as the
    block's shares of sums over rows, and the block's own rows of dM, dS. With R = Y - A:
    dB = X'R, dC = R'M - (A'S^2) o C, dM = RC - M, dS = 1/S - S - S o (A (C o C)); dC is returned
    in its two parts, the second (through S^2 (C o C)' alone) being what the rotation sees.

    R itself is never formed: every product of it is one of Y less the same of A, and the products
    share their reads, five in all (the exponent's, Y [C, B', 1] in :func:`_pca_rows`, then
    A [C, C o C], [X, M, S^2]' A and [X, M]' Y, the last two with their wide side out, as XLA:CPU
    runs a skinny product faster that way). Against writing out R = Y - A and taking R C, X'R, R'M
    from it, this takes fewer seconds a step; the float32 gradient's error against float64 grows a
    little at a converged point (differences of two sums), far below what moves the fit: both
    measured in docs/results.md, "PLN-PCA against pyPLNmodels' PlnPCA" ("The step"). The row weights ``count``
    multiply the (b, d) and (b, q) sides of the products, never a (b, p) array; ``keep`` (b, 1)
    zeroes dM, dS on padding rows (None: none)."""
    per_row, A, YC = _pca_rows(Y, O, X, B, C, M, S)
    value = jnp.sum(per_row) if count is None else jnp.sum(per_row * count)
    q, d = C.shape[1], X.shape[1]
    AC = A @ jnp.concatenate([C, C * C], axis=1)  # A C and A (C o C), (b, 2q)
    XM = _weighted(count, jnp.concatenate([X, M], axis=1))
    on_a = jnp.concatenate([XM, _weighted(count, S * S)], axis=1).T @ A  # (d + 2q, p): X'A, M'A, (S^2)'A
    on_y = XM.T @ Y  # (d + q, p): X'Y, M'Y
    dB = on_y[:d] - on_a[:d]
    RM = (on_y[d:] - on_a[d : d + q]).T
    AS2 = on_a[d + q :].T
    dM = _weighted(keep, YC - AC[:, :q] - M)
    dS = _weighted(keep, 1.0 / S - S - S * AC[:, q:])
    return value, dB, RM, AS2, dM, dS


def _row_blocks(data: Arrays, block_rows: int, body, init, checkpoint: bool = False):
    """``lax.fori_loop`` over the rows of ``data`` in ceil(n / b) blocks of b = ``block_rows`` rows:
    ``body(start, take, count, keep, carry) -> carry`` for each, where ``take(a)`` is a's rows
    [start, start + b) (a ``dynamic_slice``: no copy nor padding of Y, O), ``keep`` the block's
    padding weights (None without padding) and ``count`` its weights in sums over rows. The last
    block is clamped to end at row n: its rows an earlier block already counted have a ``count``
    of 0 (when b divides n, ``count`` is ``keep``). ``checkpoint``: the body is rematerialised in
    reverse-mode autodiff, so that the backward pass keeps no b x p array per block."""
    n = data.Y.shape[0]
    b = block_rows
    blocks = -(-n // b)
    weight = None if data.rows is None else data.rows.weight

    def step(k, carry):
        lo = k * b
        start = jnp.minimum(lo, n - b)

        def take(a):  # sparse counts: the block densified, only while it is used
            return dense_rows(a, start, b)

        keep = None if weight is None else take(weight)
        count = keep
        if n % b:  # the clamped last block: rows below lo were counted by the block before
            fresh = (start + jnp.arange(b) >= lo)[:, None].astype(data.Y.dtype)
            count = fresh if keep is None else fresh * keep
        return body(start, take, count, keep, carry)

    return jax.lax.fori_loop(0, blocks, jax.checkpoint(step) if checkpoint else step, init)


def _own_sums(rows: Rows | None, zeros):
    """Zeros (replicated: a constant, B's or C's shape) to start sums over this device's rows: under
    ``shard_map`` they vary over the rows' axis (each device's sums are its own until :func:`_total`),
    as a loop's carry must say."""
    if rows is None or rows.axis is None:
        return zeros
    return jax.lax.pcast(zeros, (rows.axis,), to="varying")


def _blocks_of(block_rows: int | None, n: int) -> int | None:
    """The block size that runs: None (one block: every row at once) when there is none or it is >= n."""
    return None if block_rows is None or block_rows >= n else block_rows


def pca_elbo(params: Params, state: PLNState, data: Arrays, block_rows: int | None = None) -> jax.Array:
    """Partial ELBO (no log y!) of PLN-PCA at (B, C Q, M Q, S), Q the rotation of R (:func:`_rotation`):
    sum_ij [Y Z - A] - 1/2 sum_ik (M^2 + S^2 - log S^2 - 1) (see :func:`_pca_block_elbo`).
    ``block_rows``: sum over blocks of that many rows (see :func:`_row_blocks`; rematerialised under
    autodiff, so ``gradient=autodiff`` keeps O(b p) memory too); None: every row at once."""
    del state  # every parameter is free
    B, S = params["B"], params["S"]
    C, M, _ = _rotated(params)
    weight = None if data.rows is None else data.rows.weight
    b = _blocks_of(block_rows, data.Y.shape[0])
    if b is None:
        value = _pca_block_elbo(dense_rows(data.Y, 0, data.Y.shape[0]), data.O, data.X, B, C, M, S, weight)
    else:

        def body(start, take, count, keep, total):
            return total + _pca_block_elbo(take(data.Y), take(data.O), take(data.X), B, C, take(M), take(S), count)

        value = _row_blocks(data, b, body, _own_sums(data.rows, jnp.zeros((), data.Y.dtype)), checkpoint=True)
    return _total(data.rows, value)


def pca_value_and_grad(
    params: Params, state: PLNState, data: Arrays, block_rows: int | None = None
) -> tuple[jax.Array, Params]:
    """:func:`pca_elbo` and its gradient in closed form (autodiff only for the q x q Cayley transform
    of the rotation). At C~ = C Q, M~ = M Q, with R = Y - A: dB = X'R, dC~ = R'M~ - (A'S^2) o C~,
    dM~ = RC~ - M~, dS = 1/S - S - S o (A (C~ o C~)); then dC = dC~ Q', dM = dM~ Q', and for the
    rotation dQ = -C' ((A'S^2) o C~) through :func:`_rotation`. The rest of dC~ and dM~ adds C'R'M~ +
    M'RC~ - M'M~ to dQ, symmetric times Q: nothing along a rotation, so it is left out (its two
    large sums would cancel to rounding noise, which a sign-driven optimizer would follow).

    ``block_rows`` = b: the rows go in blocks of b inside one ``lax.fori_loop`` (:func:`_row_blocks`):
    value, dB and dC accumulate, dM and dS are written block by block, so that the step's b x p
    temporaries replace its n x p ones (docs/concepts/memory.md). None: every row at once."""
    del state
    B, S = params["B"], params["S"]
    C, M, Q = _rotated(params)
    if Q is None:  # the Newton model's parameters: its own step, no gradient (pca_newton_step)
        raise ValueError(
            "pca_value_and_grad: parameters without R (the Newton model's) have no rotation to differentiate"
        )
    rows = data.rows
    weight = None if rows is None else rows.weight
    b = _blocks_of(block_rows, data.Y.shape[0])
    if b is None:
        Y = dense_rows(data.Y, 0, data.Y.shape[0])  # sparse counts: all of them densified (b >= n)
        value, dB, RM, AS2, dM, dS = _pca_block_value_and_grad(Y, data.O, data.X, B, C, M, S, weight, weight)
    else:

        def body(start, take, count, keep, carry):
            value, dB, RM, AS2, dM, dS = carry
            v, gB, gRM, gAS2, gM, gS = _pca_block_value_and_grad(
                take(data.Y), take(data.O), take(data.X), B, C, take(M), take(S), count, keep
            )
            put = partial(jax.lax.dynamic_update_slice_in_dim, start_index=start, axis=0)
            return value + v, dB + gB, RM + gRM, AS2 + gAS2, put(dM, gM), put(dS, gS)

        zeros = (jnp.zeros((), data.Y.dtype), jnp.zeros_like(B), jnp.zeros_like(C), jnp.zeros_like(C))
        init = (*_own_sums(rows, zeros), jnp.zeros_like(M), jnp.zeros_like(S))  # dM, dS: a device's own rows
        value, dB, RM, AS2, dM, dS = _row_blocks(data, b, body, init)
    AS2 = _total(rows, AS2)
    dC = (_total(rows, RM) - AS2 * C) @ Q.T
    # the rotation: dQ = -C'((A'S^2) o C~), through Q = _rotation(R). Only Q'dQ's skew part moves R
    # (its symmetric part times Q gives nothing along a rotation), so Q times half of it goes back
    # through the transform, written entry by entry, sum_j C~_jk C~_jl ((A'S^2)_jk - (A'S^2)_jl):
    # exactly 0 where S is the same along the axes (the data init's S: no rotation, not rounding's).
    skew = jnp.einsum("jk,jl,jkl->kl", C, C, AS2[:, :, None] - AS2[:, None, :])
    _, rotation_vjp = jax.vjp(_rotation, params["R"])
    (dR,) = rotation_vjp(Q @ (0.5 * skew))
    grads = {"B": _total(rows, dB), "C": dC, "M": dM @ Q.T, "S": dS, "R": dR}
    return _total(rows, value), grads


# --- PLN-PCA by block Newton (optimizer="newton", the default for model="pca") ------------------
# Why a gradient step is slow on denser counts: the ELBO is nearly flat along the gauge of the latent
# axes, M -> M G, C -> C G^-T (q x q, G invertible: the rotation R handles its orthogonal part only,
# not the scales and shears) and M -> M - X Gamma, B -> B + Gamma C' (the latent means against the
# covariates' coefficients): both leave M C' + XB, hence Y's terms, as they are, and only the prior
# |M|^2 and S^2 (C o C)' pin them, whose curvature is O(1) a row against the likelihood's O(A C^2):
# the larger the counts, the flatter the gauge against every other direction, and every step along
# single coordinates (rprop's, adam's, a block's own Newton step) creeps along it. One round here
# takes each block to its own optimum and the gauge in closed form or by Newton (measured in
# docs/results.md, "PLN-PCA against pyPLNmodels' PlnPCA", "Why denser counts were slower").
PCA_NEWTON_CLIP = 1.0  # the most one Newton step moves a coordinate of M, B or C (far from the optimum only)
PCA_GAUGE_CLIP = 0.5  # the largest Frobenius norm of G - I in one gauge step


def _pairs(k: int) -> tuple[tuple[int, int], ...]:
    """The (a, b), a <= b, of a symmetric k x k matrix's upper triangle, row after row."""
    return tuple((a, b) for a in range(k) for b in range(a, k))


def _pair_products(U: jax.Array, V: jax.Array, pairs) -> jax.Array:
    """(n, len(pairs)): U[:, a] * V[:, b] for each (a, b) of ``pairs``."""
    a = np.array([i for i, _ in pairs])
    b = np.array([j for _, j in pairs])
    return U[:, a] * V[:, b]


def _symmetric(values: jax.Array, k: int) -> jax.Array:
    """(..., k, k) from the upper triangles (..., k (k + 1) / 2) in :func:`_pairs`'s order."""
    index = np.zeros((k, k), dtype=np.int32)
    for t, (a, b) in enumerate(_pairs(k)):
        index[a, b] = index[b, a] = t
    return values[..., index]


def _spd_solve(H: jax.Array, g: jax.Array) -> jax.Array:
    """Batched H^-1 g for H (..., k, k) symmetric positive definite and g (..., k) or (..., k, m), by
    Gauss-Jordan elimination without pivoting (H's pivots are the Schur complements' diagonals:
    positive), one ``lax.fori_loop`` of k rounds over the whole batch at once. Its body compiles to a
    few small kernels whatever k is, where a factor written out entry by entry (O(k^3) elementwise
    ops) or a batched LAPACK call per matrix took XLA:CPU seconds to compile or milliseconds to run
    (docs/results.md, "The Newton round's compile"). Also for I + D with |D| < 1 (the gauge)."""
    k = H.shape[-1]
    vector = g.ndim == H.ndim - 1
    rhs = g[..., None] if vector else g
    tiny = jnp.finfo(H.dtype).tiny
    eye = np.arange(k)  # NumPy's: a constant (jnp's is an iota, which XLA:CPU may make a kernel of its own)

    # j runs from 0 to k - 1: no negative index to wrap (that check is a kernel of its own per index)
    index = partial(jax.lax.dynamic_index_in_dim, allow_negative_indices=False)

    def eliminate(j, aug):
        row = index(aug, j, axis=-2, keepdims=False)  # row j, (..., k + m)
        col = index(aug, j, axis=-1, keepdims=False)  # column j, (..., k)
        pivot = index(row, j, axis=-1, keepdims=True)
        row = row / jnp.maximum(pivot, tiny)
        return aug - (col - (eye == j))[..., :, None] * row[..., None, :]

    aug = jax.lax.fori_loop(0, k, eliminate, jnp.concatenate([H, rhs.astype(H.dtype)], axis=-1))
    x = aug[..., k:]
    return x[..., 0] if vector else x


def _newton_solve(H: jax.Array, g: jax.Array) -> jax.Array:
    """Batched H^-1 g (:func:`_spd_solve`), each entry clipped at :data:`PCA_NEWTON_CLIP`."""
    return jnp.clip(_spd_solve(H, g), -PCA_NEWTON_CLIP, PCA_NEWTON_CLIP)


def _pca_row_newton(Y, O, X, B, C, M, S, weight):
    """(value, M, S): the ELBO at (B, C, M, S) and each row's (M_i, S_i) moved to its optimum given
    C, B: one Newton step on M_i (its Hessian -(C' diag(A_i) C + I), q x q) and the fixed point of
    dS = 0, S_i^2 = 1 / (1 + A_i (C o C)), both from the one A at the current state. Padding rows
    (``weight`` 0) keep theirs."""
    q = C.shape[1]
    per_row, A, YC = _pca_rows(Y, O, X, B, C, M, S)
    value = jnp.sum(per_row) if weight is None else jnp.sum(per_row * weight)
    on_a = A @ jnp.concatenate([C, C * C, _pair_products(C, C, _pairs(q))], axis=1)
    hessian = _symmetric(on_a[:, 2 * q :], q) + np.eye(q, dtype=C.dtype)
    new_m = M + _newton_solve(hessian, YC - on_a[:, :q] - M)
    new_s = jax.lax.rsqrt(1.0 + on_a[:, q : 2 * q])
    if weight is not None:
        keep = weight > 0
        new_m, new_s = jnp.where(keep, new_m, M), jnp.where(keep, new_s, S)
    return value, new_m, new_s


def _pca_centre(X, B, C, M, rows):
    """M - X Gamma, B + Gamma C' with Gamma = (X'X)^-1 X'M: the same M C' + XB (so the same A and
    Y terms) at the least |M|^2: the ELBO's exact maximum along that gauge."""
    XW = _data_rows(rows, X)
    gamma = _spd_solve(_total(rows, XW.T @ X), _total(rows, XW.T @ M))
    return M - _data_rows(rows, X @ gamma), B + gamma @ C.T


def _pca_gauge(W, P, MM, C):
    """G = I + D (q x q): one Newton step on the gauge (M, C) -> (M G, C G^-T), which leaves M C' and
    the Y terms as they are. Along it the ELBO is -1/2 |M G|^2 - sum_ij A_ij exp(u_ij) + const, u_ij =
    1/2 sum_k S_ik^2 ((C G^-T)_jk^2 - C_jk^2); its expansion to second order in D needs only
    W = A'S^2 (p, q), the p symmetric q x q P_j = sum_i A_ij S_i^2 S_i^2' and M'M = ``MM``. With
    C G^-T = C - C D' + C D'D' + O(D^3), the expansion is g.D - 1/2 D.K D, g = (W o C)'C - M'M, and
    K (q^2 x q^2, entry (kl, mn) for D_kl, D_mn) the sum of M'M_km d_ln, d_km T_k,ln
    (T_k = sum_j W_jk C_j C_j'), d_lm V_kn + d_nk V_ml (V = (W o C)'C) and Z_kl,mn = sum_j P_j,km
    C_jk C_jm C_jl C_jn: the step D = K^-1 g, written out (no autodiff), its norm clipped at
    :data:`PCA_GAUGE_CLIP`."""
    q = C.shape[1]
    eye = np.eye(q, dtype=C.dtype)  # NumPy's, as every identity of the Newton round: a constant, not a kernel
    CC = (C[:, :, None] * C[:, None, :]).reshape(-1, q * q)  # (p, q^2): C_ja C_jb
    T = (W.T @ CC).reshape(q, q, q)  # T[k, l, m] = sum_j W_jk C_jl C_jm
    V = (W * C).T @ C  # V[k, l] = sum_j W_jk C_jk C_jl
    Z = ((P.reshape(-1, q * q) * CC).T @ CC).reshape(q, q, q, q)  # [k, m, l, n] = sum_j P_jkm C_jk C_jm C_jl C_jn
    e = eye[:, None, :, None]  # d_km on axes (k, m) of K[k, l, m, n], as each term broadcasts
    K = (
        MM[:, None, :, None] * eye[None, :, None, :]  # M'M_km d_ln
        + e * T[:, :, None, :]  # d_km T_k,ln
        + jnp.swapaxes(e, 0, 1) * V[:, None, None, :]  # d_lm V_kn
        + eye[:, None, None, :] * V.T[None, :, :, None]  # d_nk V_ml
        + jnp.transpose(Z, (0, 2, 1, 3))
    ).reshape(q * q, q * q)
    g = (V - MM).reshape(-1)  # the gradient at D = 0: (W o C)'C - M'M
    D = jnp.linalg.solve(K, g).reshape(q, q)
    D = D * jnp.minimum(1.0, PCA_GAUGE_CLIP / jnp.maximum(jnp.sqrt(jnp.sum(D * D)), jnp.finfo(C.dtype).tiny))
    return eye + D


def _pca_gauge_columns(Y, O, X, B, C, M, S, rows):
    """(B, C, M) after the gauge step (:func:`_pca_gauge`: M G, C G^-T) and then one Newton step on each
    column's (B_j, C_j) given M G, S, both from one pass over the rows at (B, C, M, S): its A gives
    the gauge's sums (exact) and the columns' Hessians sum_i A_ij u_i u_i' + diag(0, (A'S^2)_j), u_i =
    (X_i, M_i G) (Gauss-Newton: the S^2 o C_j part of u is left out), (d + q) x (d + q), and
    gradients X'(Y - A), G'M'(Y - A) - (A'S^2) o C G^-T, where the A after the gauge step (which moves
    S^2 (C o C)' only) would take a pass of its own: the same at D = 0, so the same fixed points."""
    d, q = X.shape[1], C.shape[1]
    k = d + q
    S2 = S * S
    A = jnp.exp(_pca_exponent(O, X, B, C, M, S))
    U = jnp.concatenate([X, M], axis=1)
    Uw, S2w = _data_rows(rows, U), _data_rows(rows, S2)
    pairs_u, pairs_s = _pair_products(Uw, U, _pairs(k)), _pair_products(S2w, S2, _pairs(q))
    on_a = _total(rows, (jnp.concatenate([Uw, S2w, pairs_u, pairs_s], axis=1).T @ A).T)  # (p, .)
    on_y = _total(rows, (Uw.T @ Y).T)  # (p, k): X'Y, M'Y
    W = on_a[:, k : k + q]  # A'S^2, (p, q)
    n_u = pairs_u.shape[1]
    uu = _symmetric(on_a[:, k + q : k + q + n_u], k)  # (p, k, k): sum_i A_ij u_i u_i'
    G = _pca_gauge(W, _symmetric(on_a[:, k + q + n_u :], q), _total(rows, _data_rows(rows, M).T @ M), C)
    C3 = _spd_solve(G, C.T).T
    zeros = np.zeros((d, q), C.dtype)
    T = jnp.concatenate([jnp.concatenate([np.eye(d, dtype=C.dtype), zeros], 1), jnp.concatenate([zeros.T, G], 1)])
    g = (on_y - on_a[:, :k]) @ T  # u_i -> T'u_i = (X_i, G'M_i)
    g = g.at[:, d:].add(-C3 * W)
    curvature = jnp.concatenate([jnp.zeros((C.shape[0], d), C.dtype), W], axis=1)
    H = T.T @ uu @ T + curvature[:, :, None] * np.eye(k, dtype=C.dtype)
    step = _newton_solve(H, g)
    return B + step[:, :d].T, C3 + step[:, d:], M @ G


def pca_newton_step(params: Params, state: PLNState, data: Arrays) -> tuple[jax.Array, Params]:
    """(ELBO at ``params``, the step): one round of block updates of PLN-PCA, each from the state the
    one before left: every row's (M_i, S_i) given C, B (:func:`_pca_row_newton`); the latent means
    against the covariates (:func:`_pca_centre`, exact); the gauge of the latent axes
    (:func:`_pca_gauge`) and every column's (B_j, C_j) given M, S (:func:`_pca_gauge_columns`). The step
    is the new parameters less the old (R's: 0; the rounds work on C Q, M Q, Q :func:`_rotation`'s);
    :func:`newton` adds it, as it is, to the parameters. Two passes over the rows, one exp each."""
    del state
    rows = data.rows
    weight = None if rows is None else rows.weight
    Y, O, X = data.Y, data.O, data.X
    B, S = params["B"], params["S"]
    C, M, Q = _rotated(params)
    value, M1, S1 = _pca_row_newton(Y, O, X, B, C, M, S, weight)
    M2, B2 = _pca_centre(X, B, C, M1, rows)
    B4, C4, M3 = _pca_gauge_columns(Y, O, X, B2, C, M2, S1, rows)
    if Q is not None:  # parameters with a rotation: back to its axes, and R kept
        C4, M3 = C4 @ Q.T, M3 @ Q.T
    step = {"B": B4 - B, "C": C4 - params["C"], "M": M3 - params["M"], "S": S1 - S}
    if Q is not None:
        step["R"] = jnp.zeros_like(params["R"])
    return _total(rows, value), step


def _pca_complete(params: Params, data: Arrays) -> PLNState:
    """The state of ``params``; without an R (the Newton model's), R = 0: a NumPy constant in a
    compiled fit, not a kernel."""
    R = params.get("R")
    if R is None:
        q = params["C"].shape[1]
        R = np.zeros((q, q), params["C"].dtype)
    return PLNState(params["B"], params["M"], params["S"], params["C"], cast(jax.Array, R))


def _pca_params(state: PLNState, data: Data) -> dict:
    """What a PLN-PCA fit reports: B (d, p), C (p, q), M (n, q), S (n, q), C and M on the axes the
    ELBO sees (rotated by the state's R: :func:`_rotated`); the latent mean is O + XB + MC'."""
    C, M, _ = _rotated({"C": state.Sigma, "M": state.M, "R": state.Omega})
    return {"B": state.B, "C": C, "M": M, "S": state.S}


def _pca_host_elbo(params: dict, data: Data) -> float:
    return reference.pca_elbo(data.Y, data.O, data.X, params["B"], params["C"], params["M"], params["S"])


def pca_model(rank: int, block_rows: int | None = None, newton: bool = False) -> Model:
    """The PLN-PCA :class:`Model` of rank ``rank`` (q), one object per (rank, block_rows, newton) (the
    fits' caches key on it). ``block_rows``: the rows in blocks of that many inside every step
    (:func:`pca_value_and_grad`; memory O(b p) instead of O(n p), docs/concepts/memory.md); None
    (the default): every row at once. ``newton``: the model optimizer="newton" fits, whose
    ``value_and_grad`` gives one round of block Newton updates (:func:`pca_newton_step`) in place
    of the gradient; every row at once (no ``block_rows``)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank={rank!r}: allowed values are integers >= 1 (at most the data's p)")
    block_rows = check_block_rows(block_rows)
    if newton and block_rows is not None:
        raise ValueError(
            f"block_rows={block_rows!r} with optimizer=newton: its step takes every row at once; "
            "allowed values are None, or use optimizer=rprop or adam"
        )
    return _pca_model(rank, block_rows, bool(newton))


def check_block_rows(block_rows, key: str = "block_rows", none: str = "None") -> int | None:
    """``block_rows``: None or an integer >= 1; a one-line ValueError naming ``key`` otherwise
    (``none``: how the message spells None, ``null`` for a config)."""
    if block_rows is not None and (isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1):
        raise ValueError(
            f"{key}={block_rows!r}: allowed values are integers >= 1 (rows per block) or {none} (no blocks)"
        )
    return block_rows


def _pca_free(s: PLNState) -> Params:
    return {"B": s.B, "C": s.Sigma, "M": s.M, "S": s.S, "R": s.Omega}


def _pca_free_newton(s: PLNState) -> Params:
    return {"B": s.B, "C": s.Sigma, "M": s.M, "S": s.S}


@cache
def _pca_model(rank: int, block_rows: int | None, newton: bool = False) -> Model:
    return Model(
        name=PCA_NAME,
        # Newton's rounds never turn the latent axes (R stays 0): no R among its parameters, so that
        # neither its step nor its ELBO computes the rotation (fewer kernels to compile)
        free=_pca_free_newton if newton else _pca_free,
        elbo=partial(pca_elbo, block_rows=block_rows),
        value_and_grad=pca_newton_step if newton else partial(pca_value_and_grad, block_rows=block_rows),
        complete=_pca_complete,
        centred_m=lambda s, data: s.M,
        params=_pca_params,
        host_elbo=_pca_host_elbo,
        work=PCA_WORK,
        rank=rank,
        block_rows=block_rows,
        newton=newton,
    )


EIGH_MAX_P = 1000  # the data init's singular vectors: an eigh of the p x p R'R up to this p, subspace iteration beyond
SUBSPACE_ITERATIONS = 12  # beyond EIGH_MAX_P: power steps, each gaining a factor (lambda_(q+l+1)/lambda_q)^2
SUBSPACE_EXTRA = 10  # beyond EIGH_MAX_P: l, the block's columns beyond q


def _top_right_singular(R: jax.Array, rows: Rows | None, q: int) -> tuple[jax.Array, jax.Array]:
    """(V (p, q), lambda (q,)): the top-q eigenvectors and eigenvalues of R'R (a sum over rows).

    Up to p = :data:`EIGH_MAX_P`, an eigendecomposition of the p x p R'R (n p^2 + p^3 operations);
    beyond, where that is minutes (p = 14,000: ~4e12 + 3e12), subspace iteration with Rayleigh-Ritz
    (Halko, Martinsson and Tropp 2011, algorithms 4.4 and 5.3): a block of q + l columns from a
    fixed seed (the init stays deterministic), :data:`SUBSPACE_ITERATIONS` steps V <- orth(R'(RV)),
    then the eigendecomposition of the small (q + l) x (q + l) V'R'RV; 2 n p (q + l) operations a
    step and no p x p array."""
    p = R.shape[1]
    if p <= EIGH_MAX_P:
        eigenvalues, vectors = jnp.linalg.eigh(_total(rows, R.T @ R))
        return vectors[:, ::-1][:, :q], eigenvalues[::-1][:q]
    k = min(p, q + SUBSPACE_EXTRA)
    V = jax.random.normal(jax.random.PRNGKey(0), (p, k), R.dtype)
    for _ in range(SUBSPACE_ITERATIONS):
        V, _r = jnp.linalg.qr(_total(rows, R.T @ (R @ V)))
    RV = R @ V
    eigenvalues, U = jnp.linalg.eigh(_total(rows, RV.T @ RV))
    return (V @ U)[:, ::-1][:, :q], eigenvalues[::-1][:q]


def _pca_init(data: Arrays, rank: int, init: str, noise: jax.Array | None) -> PLNState:
    """The PLN-PCA initial state (see :func:`init_state`)."""
    n, p = data.Y.shape
    d = data.X.shape[1]
    dtype = data.Y.dtype
    if init == "seed":
        B = jnp.zeros((d, p), dtype)
        C = PCA_INIT_C * jnp.eye(p, rank, dtype=dtype)
        M = jnp.zeros((n, rank), dtype)
    else:
        Z = jnp.log1p(data.Y) - data.O
        B = closed_form_b(data.X, Z, data.rows)
        R = _data_rows(data.rows, Z - data.X @ B)
        # the top-q right singular vectors V and values of R; M C' = R V V' with M'M / n = I (M_i's
        # prior is N(0, I))
        V, lam = _top_right_singular(R, data.rows, rank)
        scale = jnp.sqrt(jnp.maximum(lam, jnp.finfo(dtype).tiny) / _n(data.rows, R))
        C = V * scale
        M = (R @ V) / scale
        if noise is not None:
            M = M + noise
    S = jnp.full((n, rank), 1.0 if init == "seed" else 0.5, dtype)
    if init != "seed":
        B = _poisson_b(data, data.O + M @ C.T + 0.5 * (S * S) @ (C * C).T)
    R = jnp.zeros((rank, rank), dtype)  # the latent axes as the init found them
    return _pca_complete({"B": B, "C": C, "M": M, "S": S, "R": R}, data)


def _pca_data_init_blocks(data: Arrays, rank: int, noise: jax.Array | None, b: int) -> PLNState:
    """:func:`_pca_init`'s ``data`` (and ``random``) start with the rows in blocks of ``b``
    (:func:`_row_blocks`: every sum over rows taken block by block, each block of Y read as
    :func:`dense_rows` reads it), so that it holds a few b x p arrays, never n x p: what a blocked
    fit of sparse counts (:class:`plnexp.core.arrays.SparseCounts`) starts from. The same start as
    :func:`_pca_init`'s, the same steps (the eigendecomposition of R'R up to :data:`EIGH_MAX_P`,
    subspace iteration beyond, one pass over the rows a step), its sums over rows taken in another
    order."""
    rows = data.rows
    n, p = data.Y.shape
    dtype = data.Y.dtype
    d = data.X.shape[1]

    def row_sum(f, zeros, *latent):  # sum over blocks of f(take, count, *latent rows): each block's share
        def body(start, take, count, keep, total):
            parts = f(take, count, keep, *(take(a) for a in latent))
            return jax.tree_util.tree_map(jnp.add, total, parts)

        return _total(rows, _row_blocks(data, b, body, _own_sums(rows, zeros)))

    def z(take):  # log(1 + Y) - O of a block
        return jnp.log1p(take(data.Y)) - take(data.O)

    B0 = cho_solve(
        (jnp.linalg.cholesky(_total(rows, data.X.T @ data.X)), True),
        row_sum(lambda take, w, keep: _weighted(w, take(data.X)).T @ z(take), jnp.zeros((d, p), dtype)),
    )

    def residual(take, keep):  # R = log(1 + Y) - O - X B0 of a block, 0 on padding rows
        return _weighted(keep, z(take) - take(data.X) @ B0)

    def gram(V):  # R'R (V None), else (RV)'(RV): sums over rows
        def f(take, w, keep):
            R = residual(take, keep) if V is None else residual(take, keep) @ V
            return R.T @ _weighted(w, R)

        k = p if V is None else V.shape[1]
        return row_sum(f, jnp.zeros((k, k), dtype))

    if p <= EIGH_MAX_P:  # as _top_right_singular: the eigendecomposition of the p x p R'R
        eigenvalues, vectors = jnp.linalg.eigh(gram(None))
        V, lam = vectors[:, ::-1][:, :rank], eigenvalues[::-1][:rank]
    else:  # its subspace iteration from the same block, one pass over the rows a step
        k = min(p, rank + SUBSPACE_EXTRA)
        V = jax.random.normal(jax.random.PRNGKey(0), (p, k), dtype)
        for _ in range(SUBSPACE_ITERATIONS):
            step = lambda take, w, keep, V=V: residual(take, keep).T @ _weighted(w, residual(take, keep) @ V)
            V, _r = jnp.linalg.qr(row_sum(step, jnp.zeros((p, k), dtype)))
        eigenvalues, U = jnp.linalg.eigh(gram(V))
        V, lam = (V @ U)[:, ::-1][:, :rank], eigenvalues[::-1][:rank]
    scale = jnp.sqrt(jnp.maximum(lam, jnp.finfo(dtype).tiny) / _n(rows, data.O))
    C = V * scale

    def rows_of_m(k_, carry):  # M = R V / scale, block by block (a clamped block writes its rows again, the same)
        start = jnp.minimum(k_ * b, n - b)
        take = lambda a: dense_rows(a, start, b)
        keep = None if rows is None else take(rows.weight)
        return jax.lax.dynamic_update_slice_in_dim(carry, (residual(take, keep) @ V) / scale, start, axis=0)

    M = jax.lax.fori_loop(0, -(-n // b), rows_of_m, _own_sums(rows, jnp.zeros((n, rank), dtype)))  # a device's rows
    if noise is not None:
        M = M + noise
    S = jnp.full((n, rank), 0.5, dtype)
    CC = jnp.concatenate([C, C * C], axis=1)

    def exp_shift(take, M_b, S_b):  # exp(O + MC' + S^2 (C o C)'/2) of a block: the A before XB
        return jnp.exp(take(data.O) + jnp.concatenate([M_b, 0.5 * (S_b * S_b)], axis=1) @ CC.T)

    col = lambda x: jnp.sum(x, axis=0)
    y_sum, e_sum = row_sum(
        lambda take, w, keep, M_b, S_b: (col(_weighted(w, take(data.Y))), col(_weighted(w, exp_shift(take, M_b, S_b)))),
        (jnp.zeros((p,), dtype), jnp.zeros((p,), dtype)),
        M,
        S,
    )
    B = jnp.zeros((d, p), dtype).at[0].set(jnp.log((y_sum + 0.5) / e_sum))
    for _ in range(POISSON_B_STEPS if d > 1 else 0):  # _poisson_b's Newton steps, their sums by blocks

        def newton_sums(take, w, keep, M_b, S_b, B=B):
            X_b = take(data.X)
            A = exp_shift(take, M_b, S_b) * jnp.exp(X_b @ B)
            Xw = _weighted(w, X_b)
            return Xw.T @ (take(data.Y) - A), jnp.einsum("nd,np,ne->pde", Xw, A, X_b)

        gradient, hessian = row_sum(newton_sums, (jnp.zeros((d, p), dtype), jnp.zeros((p, d, d), dtype)), M, S)
        B = B + jnp.linalg.solve(hessian, gradient.T[..., None])[..., 0].T
    return _pca_complete({"B": B, "C": C, "M": M, "S": S, "R": jnp.zeros((rank, rank), dtype)}, data)


POISSON_B_STEPS = 6  # Newton steps of the data init's Poisson regression for B (from its intercept-only solution)


def _poisson_b(data: Arrays, shift: jax.Array) -> jax.Array:
    """B (d, p) of the Poisson regression Y_ij ~ Poisson(exp(shift_ij + (XB)_ij)), one column at a
    time: the data init's B given its latent part (``shift`` = O + MC' + S^2 (C o C)'/2, so that
    exp(shift + XB) is the ELBO's A). Least squares on log(1 + Y) - O puts B far above it where
    counts are mostly zero (log(1 + 0) = 0 against a log rate of -3 at 90% zeros: A then starts
    tens of times too large); on PLN-PCA counts with 90% zeros this B takes the fit to pyPLNmodels'
    final ELBO in fewer iterations (docs/results.md, "PLN-PCA against pyPLNmodels' PlnPCA").
    From the intercept-only solution log((sum_i Y_ij + 1/2) / sum_i exp(shift_ij)) (X's first column
    is the intercept; the 1/2 keeps an all-zero column finite), :data:`POISSON_B_STEPS` Newton steps
    (p systems of d x d) take in the other covariates; with d = 1 they change nothing."""
    rows, X, Y = data.rows, data.X, data.Y
    E = _data_rows(rows, jnp.exp(shift))
    intercept = jnp.log((_total(rows, jnp.sum(Y, axis=0)) + 0.5) / _total(rows, jnp.sum(E, axis=0)))
    B = jnp.zeros((X.shape[1], Y.shape[1]), Y.dtype).at[0].set(intercept)
    if X.shape[1] == 1:
        return B
    for _ in range(POISSON_B_STEPS):
        A = E * jnp.exp(X @ B)
        gradient = _total(rows, X.T @ (Y - A))  # (d, p)
        hessian = _total(rows, jnp.einsum("nd,np,ne->pde", X, A, X))  # (p, d, d): minus the Hessian
        B = B + jnp.linalg.solve(hessian, gradient.T[..., None])[..., 0].T
    return B


INIT_NOISE = 0.5  # init="random": the standard deviation of the noise added to the data init's M


def init_state(model: Model, data: Arrays, init: str, seed: int = 0) -> PLNState:
    """Initial state. ``seed``: M = 0, S = 1, B = 0 (the tutorial's; Sigma = I follows).
    ``data``: M from log(Y + 1) - O (least-squares B for the full model), S = 0.5.
    PLN-PCA (rank q): M = 0 with C = 0 is a saddle (every gradient of M and C vanishes), so
    ``seed`` is B = 0, M = 0, S = 1 and C = :data:`PCA_INIT_C` times the first q columns of the
    identity (dM = (Y - A) C is then not 0); ``data`` is C and M from the top-q singular vectors of
    the residual R of log(Y + 1) - O on X (M C' = R's rank-q truncation, M'M / n = I), S = 0.5, and
    B the Poisson regression of Y on X given them (:func:`_poisson_b`); ``random`` adds the noise
    to that M (n x q).
    ``random``: the ``data`` init with N(0, INIT_NOISE^2) noise added to M, drawn on the host by
    ``numpy.random.default_rng(seed)`` row after row (so that a fit's data rows get the same noise
    whatever padding follows them; padding rows get none). ``seed`` is used by ``random`` only.

    One compiled program (:func:`_init`), not op by op: eagerly, each of its ~30 operations was a
    compile of its own, a large share of a one-off oaks fit (docs/results.md, "A one-off fit against
    pyPLNmodels").
    """
    return _init(model, init, data, init_noise(model, data, init, seed))


def init_state_given(model: Model, data: Arrays, init: str, noise: jax.Array | None) -> PLNState:
    """:func:`init_state` with its noise given (:func:`init_noise`, drawn for every row): what a
    row-sharded fit of sparse counts runs under ``shard_map`` on each device's rows."""
    return _init(model, init, data, noise)


def init_noise(model: Model, data: Arrays, init: str, seed: int = 0) -> jax.Array | None:
    """What :func:`init_state` adds to the data init's M: for ``init="random"`` the (n, width) noise
    (zero on padding rows; across processes, each process's rows of it where its rows of X are),
    else None. One-line ValueError for an unknown ``init``."""
    if init not in ("seed", "data", "random"):
        raise ValueError(f"init={init!r}: allowed values are 'seed', 'data', 'random'")
    if init != "random":
        return None
    width = model.rank or data.Y.shape[1]  # M's columns: q for pca
    noise = INIT_NOISE * np.random.default_rng(seed).standard_normal((data.Y.shape[0], width))
    if data.rows is not None:
        weight = data.rows.weight
        if isinstance(weight, jax.Array) and not weight.is_fully_addressable:  # a fit across processes
            from jax.experimental import multihost_utils

            weight = multihost_utils.process_allgather(weight, tiled=True)
        noise = noise * np.asarray(weight)
    if isinstance(data.X, jax.Array) and not data.X.is_fully_addressable:
        # every process drew the same noise: each puts its rows of it where its rows of X (and Y) are
        return jax.device_put(np.asarray(noise, data.Y.dtype), data.X.sharding)
    return jnp.asarray(noise, data.Y.dtype)


@partial(jax.jit, static_argnums=(0, 1))
def _init(model: Model, init: str, data: Arrays, noise: jax.Array | None) -> PLNState:
    if model.rank:
        b = _blocks_of(model.block_rows, data.Y.shape[0])
        if init != "seed" and isinstance(data.Y, SparseCounts):  # one block where b >= n (a device's rows)
            return _pca_data_init_blocks(data, model.rank, noise, b or data.Y.shape[0])
        return _pca_init(data, model.rank, init, noise)
    n, p = data.Y.shape
    d = data.X.shape[1]
    dtype = data.Y.dtype
    if init == "seed":
        B = jnp.zeros((d, p), dtype)
        M = jnp.zeros((n, p), dtype)
    else:
        Z = jnp.log1p(data.Y) - data.O
        B = closed_form_b(data.X, Z, data.rows)
        M = Z - data.X @ B if model is FULL else Z
        if noise is not None:
            M = M + noise
    S = jnp.full((n, p), 1.0 if init == "seed" else 0.5, dtype)
    # no Sigma, Omega yet: free() reads B, M, S only, complete() computes them
    return model.complete(model.free(PLNState(B, M, S, None, None)), data)  # type: ignore[arg-type]  # Sigma, Omega: None until complete()
