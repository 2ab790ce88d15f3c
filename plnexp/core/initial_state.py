"""Initial states of a fit (:func:`init_state`): ``seed``, ``data`` and ``random`` for the PLN models
(:data:`plnexp.core.model.FULL`, :data:`~plnexp.core.model.PROFILED`) and PLN-PCA
(:func:`plnexp.core.model.pca_model`), one compiled program each; the noise of ``random``
(:func:`init_noise`) drawn on the host.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve

from .arrays import Arrays, Rows, SparseCounts, dense_rows
from .model import FULL, Model
from .pca_elbo import _pca_complete
from .pln_elbo import PLNState, closed_form_b
from .row_sums import _blocks_of, _data_rows, _n, _own_sums, _row_blocks, _total, _weighted

PCA_INIT_C = 0.1  # init="seed": C = PCA_INIT_C times the first q columns of the p x p identity


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

    def gram(V):  # R'R (V None), else (RV)'(RV)
        RV = R if V is None else R @ V
        return _total(rows, RV.T @ RV)

    return _top_singular(gram, lambda V: _total(rows, R.T @ (R @ V)), R.shape[1], q, R.dtype)


def _top_singular(gram, times, p: int, q: int, dtype) -> tuple[jax.Array, jax.Array]:
    """:func:`_top_right_singular` of the R that ``gram(V)`` ((RV)'(RV), R'R for V None) and
    ``times(V)`` (R'(RV)) read, p its columns: however they take their sums over rows."""
    if p <= EIGH_MAX_P:
        eigenvalues, vectors = jnp.linalg.eigh(gram(None))
        return vectors[:, ::-1][:, :q], eigenvalues[::-1][:q]
    V = jax.random.normal(jax.random.PRNGKey(0), (p, min(p, q + SUBSPACE_EXTRA)), dtype)
    for _ in range(SUBSPACE_ITERATIONS):
        V, _r = jnp.linalg.qr(times(V))
    eigenvalues, U = jnp.linalg.eigh(gram(V))
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

    def times(V):  # R'(RV): the subspace iteration's step, one pass over the rows
        step = lambda take, w, keep: residual(take, keep).T @ _weighted(w, residual(take, keep) @ V)
        return row_sum(step, jnp.zeros((p, V.shape[1]), dtype))

    V, lam = _top_singular(gram, times, p, rank, dtype)  # as _top_right_singular's
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
