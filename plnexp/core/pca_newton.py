"""PLN-PCA by block Newton rounds (``optimizer="newton"``, the default for ``model="pca"``):
:func:`pca_newton_step`, what the Newton model's ``value_and_grad`` gives
(:func:`plnexp.core.model.pca_model` with ``newton=True``). Pure functions: no jit, no I/O, no global
state.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from .arrays import Arrays
from .pca_elbo import _pca_exponent, _pca_rows, _rotated
from .pln_elbo import Params, PLNState
from .row_sums import _data_rows, _total


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
