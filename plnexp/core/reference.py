"""Float64 host (numpy) evaluation of the ELBO: the exact number every jitted result is checked against.

Independent of XLA, so it cannot share a compiler bug with the jitted code path. Counts are a dense
``(n, p)`` array or a scipy sparse CSR matrix (:func:`is_sparse`); the PLN-PCA ELBO then takes its
Y-terms (sum Y Z, sum log Y!) over the non-zeros alone, and its A-term a block of rows at a time.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.special import gammaln


BLOCK_ENTRIES = 1 << 22  # the host checks read their arrays in blocks of about this many entries
ROWS = 8192  # and of at most this many rows


def block_rows(p: int, rows: int | None = None) -> int:
    """Rows per block for arrays of ``p`` columns: ``rows`` if given, else ``BLOCK_ENTRIES // p``
    capped at :data:`ROWS` (so ``ROWS`` for p <= 512): each float64 block array is at most 32 MiB."""
    return rows if rows is not None else min(ROWS, max(1, BLOCK_ENTRIES // max(int(p), 1)))


def row_blocks(n: int, p: int, step: int | None = None) -> list[slice]:
    """Consecutive slices of ``step`` rows (None: ``max(1, BLOCK_ENTRIES // p)``) covering ``n`` rows:
    the blocks in which plnexp reads an ``(n, p)`` host array without an ``n x p`` transient."""
    step = step or max(1, BLOCK_ENTRIES // max(int(p), 1))
    return [slice(a, min(a + step, n)) for a in range(0, n, step)]


def is_sparse(Y) -> bool:
    """Whether the counts are a scipy sparse matrix (CSR: :func:`plnexp.core.data.sparse_counts`)."""
    return sparse.issparse(Y)


def dense_rows(Y, rows: slice, dtype=None) -> np.ndarray:
    """Rows ``rows`` of the counts as a dense array (in ``dtype``; None: the counts' own), whether
    they are a dense array or a CSR matrix: how a host check reads any counts a block at a time."""
    block = Y[rows].toarray() if is_sparse(Y) else Y[rows]
    return np.asarray(block, dtype=dtype)


def log_factorial_sum(Y) -> float:
    """sum_ij log(Y_ij!) with the exact log-gamma, in float64 on the host, a block of rows at a time
    (:func:`row_blocks`: one block, the whole sum at once, up to ``BLOCK_ENTRIES`` entries); for CSR
    counts, over the stored values (log 0! = 0)."""
    if is_sparse(Y):  # BLOCK_ENTRIES values at a time
        parts = (Y.data[k : k + BLOCK_ENTRIES] for k in range(0, Y.nnz, BLOCK_ENTRIES))
        return sum(float(np.sum(gammaln(np.asarray(v, dtype=np.float64) + 1.0))) for v in parts)
    Y = np.asarray(Y)
    if Y.ndim != 2:
        return float(np.sum(gammaln(np.asarray(Y, dtype=np.float64) + 1.0)))
    return sum(float(np.sum(gammaln(np.asarray(Y[r], dtype=np.float64) + 1.0))) for r in row_blocks(*Y.shape))


def elbo(Y, O, X, B, M, S, Sigma, *, log_factorial: bool = True, rows: int | None = None) -> float:
    """ELBO at (B, centred M, S, Sigma) in float64; with the exact log(y!) unless told otherwise.

    Inputs may be any dtype (float32 device arrays included): they are converted to float64
    ``rows`` rows at a time (default :func:`block_rows`), so the host memory stays O(rows x p)
    however large n is.
    """
    return elbo_and_terms(Y, O, X, B, M, S, Sigma, log_factorial=log_factorial, rows=rows)[0]


def elbo_and_terms(Y, O, X, B, M, S, Sigma, *, log_factorial: bool = True, rows: int | None = None):
    """(:func:`elbo`, the sum of the magnitudes of the terms it adds up): what a compiled ELBO's
    rounding scales with (``Precision.check_tolerance``), far above |ELBO| where the terms cancel (a
    count of 1e12: Y Z and log Y! near 3e13 each, the ELBO a few hundred)."""
    sums = elbo_sums(Y, O, X, B, M, S, log_factorial=log_factorial, rows=rows)
    return elbo_of_sums(*sums, Sigma, np.shape(M)[0])


def elbo_sums(
    Y, O, X, B, M, S, *, log_factorial: bool = True, rows: int | None = None
) -> tuple[float, np.ndarray, float, float]:
    """What :func:`elbo` sums over the rows: (the Poisson and entropy terms, the p x p second moment
    M'M + diag(sum S^2), sum log y!, the sum of those row terms' magnitudes), so that rows held apart
    (one process's each) give the whole ELBO once summed: :func:`elbo_of_sums`."""
    B = np.asarray(B, dtype=np.float64)
    Y, O, X, M, S = (np.asarray(a) for a in (Y, O, X, M, S))  # host views, dtype kept
    n, p = M.shape
    poisson, second_moment, log_fact, terms = 0.0, np.zeros((p, p)), 0.0, 0.0
    for block in row_blocks(n, p, block_rows(p, rows)):
        y, o, x, m, s = (np.asarray(a[block], dtype=np.float64) for a in (Y, O, X, M, S))
        z = o + x @ B + m
        s2 = s * s
        yz, a, log_s2 = y * z, np.exp(z + s2 / 2), np.log(s2)
        poisson += np.sum(yz - a) + 0.5 * np.sum(log_s2)
        terms += np.sum(np.abs(yz)) + np.sum(a) + 0.5 * np.sum(np.abs(log_s2))
        second_moment += m.T @ m + np.diag(s2.sum(axis=0))
        if log_factorial:
            log_fact += float(np.sum(gammaln(y + 1.0)))
    return poisson, second_moment, log_fact, terms


def elbo_of_sums(poisson, second_moment, log_fact, terms, Sigma, n: int) -> tuple[float, float]:
    """(:func:`elbo`, the magnitude of its terms) of the sums :func:`elbo_sums` gives over all ``n`` rows."""
    Sigma = np.asarray(Sigma, dtype=np.float64)
    p = Sigma.shape[0]
    L = np.linalg.cholesky(Sigma)
    logdet_sigma = 2.0 * np.sum(np.log(np.diag(L)))
    # tr(Sigma^-1 C) through two triangular solves of the Cholesky factor
    trace = np.trace(np.linalg.solve(L.T, np.linalg.solve(L, second_moment)))
    value = poisson - 0.5 * n * logdet_sigma - 0.5 * trace + 0.5 * n * p - log_fact
    return float(value), float(terms + 0.5 * n * abs(logdet_sigma) + 0.5 * abs(trace) + 0.5 * n * p + log_fact)


def block_gradients(y, o, x, m, s, B, Omega) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ELBO's gradient in (B, centred M, S) of these rows, Sigma held at its closed form: the rows'
    share of dB, and their dM and dS (see :func:`elbo_gradient_max`), in float64."""
    y, o, x, m, s = (np.asarray(a, dtype=np.float64) for a in (y, o, x, m, s))
    a = np.exp(o + x @ B + m + s * s / 2)
    return x.T @ (y - a), y - a - m @ Omega, 1.0 / s - s * a - s * np.diag(Omega)


def elbo_gradient_max(Y, O, X, B, M, S, Sigma, *, rows: int | None = None) -> float:
    """The largest entry of the ELBO's gradient in (B, centred M, S), Sigma held at the closed form
    (M'M + diag(sum S^2)) / n, in float64 on the host, ``rows`` rows at a time: 0 at a stationary
    point. With Z = O + XB + M, A = exp(Z + S^2/2) and Omega = Sigma^-1:
    dB = X'(Y - A), dM = Y - A - M Omega, dS = 1/S - S A - S diag(Omega) (Sigma's own derivative
    vanishes at its closed form). Written out here, independent of the compiled gradients."""
    B = np.asarray(B, dtype=np.float64)
    Omega = np.linalg.inv(np.asarray(Sigma, dtype=np.float64))
    n = np.shape(M)[0]
    worst, gB = 0.0, np.zeros_like(B)
    for block in row_blocks(n, np.shape(Y)[1], block_rows(np.shape(Y)[1], rows)):
        part, gM, gS = block_gradients(Y[block], O[block], X[block], M[block], S[block], B, Omega)
        gB += part
        worst = max(worst, float(np.abs(gM).max()), float(np.abs(gS).max()))
    return max(worst, float(np.abs(gB).max()))


def pca_elbo(Y, O, X, B, C, M, S, *, log_factorial: bool = True, rows: int | None = None) -> float:
    """ELBO of PLN-PCA at (B (d, p), C (p, q), M (n, q), S (n, q)) in float64; with the exact log(y!)
    unless told otherwise:

        sum_ij [Y Z - exp(Z + S^2 (C o C)'/2) - log Y!] - 1/2 sum_ik (M^2 + S^2 - log S^2 - 1),

    Z = O + XB + MC'. Converted to float64 ``rows`` rows at a time, as :func:`elbo`.
    """
    return pca_elbo_and_terms(Y, O, X, B, C, M, S, log_factorial=log_factorial, rows=rows)[0]


def pca_elbo_and_terms(Y, O, X, B, C, M, S, *, log_factorial: bool = True, rows: int | None = None):
    """(:func:`pca_elbo`, the sum of the magnitudes of the terms it adds up), as :func:`elbo_and_terms`."""
    B, C = np.asarray(B, dtype=np.float64), np.asarray(C, dtype=np.float64)
    sparse_counts = is_sparse(Y)
    Y = sparse.csr_array(Y) if sparse_counts else np.asarray(Y)
    O, X, M, S = (np.asarray(a) for a in (O, X, M, S))
    C2 = C * C
    total, terms = 0.0, 0.0
    for block in row_blocks(M.shape[0], C.shape[0], block_rows(C.shape[0], rows)):
        o, x, m, s = (np.asarray(a[block], dtype=np.float64) for a in (O, X, M, S))
        z = o + x @ B + m @ C.T
        s2 = s * s
        a = np.exp(z + 0.5 * s2 @ C2.T)
        prior = 0.5 * np.sum(m * m + s2 - np.log(s2) - 1.0)
        terms += np.sum(a) + 0.5 * np.sum(m * m + s2 + np.abs(np.log(s2)) + 1.0)
        if sparse_counts:  # the Y-terms over the block's stored entries alone
            lo, hi = int(Y.indptr[block.start]), int(Y.indptr[block.stop])
            y = np.asarray(Y.data[lo:hi], dtype=np.float64)
            i = np.repeat(np.arange(block.stop - block.start), np.diff(Y.indptr[block.start : block.stop + 1]))
            yz = y * z[i, Y.indices[lo:hi]]
            total += np.sum(yz) - np.sum(a) - prior
        else:
            y = np.asarray(Y[block], dtype=np.float64)
            yz = y * z
            total += np.sum(yz - a) - prior
        terms += np.sum(np.abs(yz))
        if log_factorial:
            log_y = float(np.sum(gammaln(y + 1.0)))
            total -= log_y
            terms += log_y
    return float(total), float(terms)
