"""PLN-PCA's partial ELBO and its gradient in closed form, pure functions (no jit, no I/O, no global
state); the model itself is :func:`plnexp.core.model.pca_model`, its block Newton rounds
:mod:`plnexp.core.pca_newton`, its initial state :mod:`plnexp.core.initial_state`.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, cast

import jax
import jax.numpy as jnp
import numpy as np

from .arrays import Arrays, dense_rows
from .pln_elbo import Params, PLNState
from .row_sums import _blocks_of, _own_sums, _row_blocks, _total, _weighted

if TYPE_CHECKING:
    from .data import Data


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
