"""Simulated data sets, drawn from the PLN generative model with a documented seeded choice: full
(:func:`simulate`) or low-rank (PLN-PCA: :func:`simulate_pca`, a block of rows at a time on every core
this process may use, :func:`in_threads`, dense, float32 or sparse counts, or only some rows), the
truth kept (:class:`LowRankTruth`)."""

from __future__ import annotations

from functools import lru_cache
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from .data import COMPACT_ENTRIES, FLOAT32_EXACT, Data, DataError, RowPart, _aligned_empty, row_offsets, sparse_counts
from .data_checks import warn_empty_columns
from .reference import BLOCK_ENTRIES  # the one block size of the host's n x p reads


def simulate(n: int = 2000, p: int = 50, d: int = 2, seed: int = 0) -> Data:
    """Draw from the PLN model: Y ~ Poisson(exp(O + XB + W)), W ~ N(0, Sigma).

    The documented, seeded choice (numpy ``default_rng(seed)``):
    X = [1, N(0,1) columns] (n, d); B_kj ~ N(0, 0.5^2) with intercept row 1 + N(0, 0.5^2) so counts
    are O(e); Sigma = D^1/2 C D^1/2 with a banded correlation C_jk = 0.6^|j-k| and variances
    D_j ~ U(0.2, 0.6); offsets O = log(total) with total ~ U(50, 150)/100 per row (log-scale ~0).
    The truth is kept in ``data.truth`` ({'B': ..., 'Sigma': ...}).
    """
    for key, value, low in (("n", n, 2), ("p", p, 1), ("d", d, 1)):
        if int(value) != value or value < low:
            raise DataError(f"simulate: {key}={value!r} must be an integer >= {low}")
    rng = np.random.default_rng(seed)
    X = np.hstack([np.ones((n, 1)), rng.normal(size=(n, d - 1))])
    B = rng.normal(scale=0.5, size=(d, p))
    B[0] += 1.0
    idx = np.arange(p)
    corr = 0.6 ** np.abs(idx[:, None] - idx[None, :])
    sd = np.sqrt(rng.uniform(0.2, 0.6, size=p))
    Sigma = corr * sd[:, None] * sd[None, :]
    W = rng.multivariate_normal(np.zeros(p), Sigma, size=n, method="cholesky")
    O = np.log(rng.uniform(0.5, 1.5, size=(n, 1))) * np.ones((1, p))
    Y = rng.poisson(np.exp(O + X @ B + W)).astype(np.float64)
    warn_empty_columns(Y, f"simulate(n={n}, p={p}, d={d}, seed={seed})")
    names = ("intercept",) + tuple(f"x{k}" for k in range(1, d))
    return Data(Y, O, X, f"synthetic_n{n}_p{p}_d{d}_s{seed}", names, {"B": B, "Sigma": Sigma})


def in_threads(f: Callable, items: Sequence) -> Iterator:
    """``f(item)`` for each of ``items``, in order, computed by a thread per core this process may
    use (NumPy's draws and array operations release the GIL), at most two per thread at a time (the
    memory of a few blocks); in this thread alone on one core. The results are those of ``map``."""
    from ..system.machine import usable_cores

    workers = usable_cores()
    if workers < 2 or len(items) < 2:
        yield from map(f, items)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers, thread_name_prefix="plnexp-draw") as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(f, item))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _pca_latent_block(seed: np.random.SeedSequence, eta0: np.ndarray, C: np.ndarray):
    """One block of rows: its latent means ``eta0 + M C^T`` (M ~ N(0, I_q)) and the uniforms that
    decide its zeros, both drawn from the block's own seed (so that they can be drawn again)."""
    rng = np.random.default_rng(seed)
    M = rng.standard_normal((eta0.shape[0], C.shape[1]))
    W = np.empty(eta0.shape)
    rows = max(1, SINGLE_THREADED_GEMM // max(1, C.shape[0] * C.shape[1]))
    for a in range(0, M.shape[0], rows):  # a few rows a product: BLAS on this thread alone (in_threads)
        np.matmul(M[a : a + rows], C.T, out=W[a : a + rows])
    return rng, eta0 + W, rng.random(eta0.shape)


# m * n * k of the largest product that OpenBLAS computes on its calling thread (65536 times its
# GEMM_MULTITHREAD_THRESHOLD, 4): larger ones start its threads, which then spin beside the other
# blocks' draws (in_threads)
SINGLE_THREADED_GEMM = 65536 * 4


def _sortable(gaps: np.ndarray) -> np.ndarray:
    """float32 gaps as uint32 keys in the same order (the sign bit flipped for positives, every bit
    for negatives): the exact order of the numbers, bin by bin (:func:`_zero_threshold`)."""
    bits = gaps.view(np.uint32)
    return bits ^ np.where(bits >> 31, np.uint32(0xFFFFFFFF), np.uint32(0x80000000))


KEY_SHIFT = 16  # _zero_threshold's first pass counts the gaps in 2**16 bins of their top 16 bits


def _zero_threshold(map_gaps: Callable[[Callable], Iterator], N: int, zero_fraction: float) -> float:
    """The intercept shift ``delta`` that leaves ``round(zero_fraction * N)`` of the ``N`` gaps
    above it: a count is zero iff its gap ``log(-log U) - eta`` (float32) exceeds ``delta`` (see
    :func:`simulate_pca`): the midpoint of the k-th and (k+1)-th smallest gaps. Found exactly in two
    passes, ``map_gaps(f)`` giving ``f`` of each block's gaps (drawn again on each pass, a block of rows
    at a time): one counting the gaps by the top bits of their sortable keys (:func:`_sortable`), one
    keeping the gaps of the one or two bins that hold those two, never the ``N`` gaps at once."""
    k = min(max(int(round((1 - zero_fraction) * N)), 1), N - 1)  # gaps at or below delta
    bins_n = 1 << (32 - KEY_SHIFT)
    counts = np.zeros(bins_n, dtype=np.int64)
    for c in map_gaps(lambda gaps: np.bincount((_sortable(gaps) >> KEY_SHIFT).reshape(-1), minlength=bins_n)):
        counts += c
    below = np.cumsum(counts)
    bins = np.searchsorted(below, [k - 1, k], side="right")  # the bins of ranks k - 1 and k (0-based)
    ranked = np.concatenate(list(map_gaps(lambda g: g[np.isin(_sortable(g) >> KEY_SHIFT, bins)])))
    before = int(below[bins[0] - 1]) if bins[0] > 0 else 0  # gaps in the bins below
    at = (k - 1 - before, k - before)
    ranked.partition(at)
    return (float(ranked[at[0]]) + float(ranked[at[1]])) / 2


def simulate_pca(
    n: int = 2000,
    p: int = 200,
    q: int = 5,
    zero_fraction: float | None = None,
    d: int = 1,
    seed: int = 0,
    *,
    sparse: bool = False,
    rows: tuple[int, int] | None = None,
) -> Data:
    """Draw from the PLN-PCA model: Y ~ Poisson(exp(O + XB + W)), W = M C^T of rank q.

    The documented, seeded choice (numpy ``SeedSequence(seed)``: the parameters from its first
    child, each block of rows from one child of its own, so that memory stays at a few blocks of
    ``2**22`` entries beyond the returned arrays, for n*p up to ~1e8; the blocks drawn on every core
    this process may use, :func:`in_threads`, the same numbers as one after the other):
    X = [1, N(0,1) columns] (n, d); B_kj ~ N(0, 0.5^2) with intercept row 1 + N(0, 0.5^2);
    C_jk ~ N(0, 1/q) (p, q), so Sigma = C C^T has rank q and a diagonal near 1; M ~ N(0, I_q) (n, q);
    offsets O = log(total) with total ~ U(50, 150)/100 per row, as :func:`simulate`.

    A count is zero iff its uniform U < exp(-lambda) (probability exp(-lambda): the Poisson law), i.e.
    iff its gap log(-log U) - log(lambda) exceeds 0; a non-zero count is drawn from the zero-truncated
    Poisson law (1 + Poisson(lambda - t), t the first arrival of the process conditioned to come
    before 1). ``zero_fraction`` in (0, 1) (real single-cell counts: 80-95% zeros): the intercept row
    is shifted by the one delta (a quantile of the float32 gaps, found exactly in two more passes
    over the blocks' draws, :func:`_zero_threshold`: deterministic, no draw repeated) that leaves
    that fraction of the gaps above it, so the counts' zero fraction is the target to within 1/(n*p).
    The truth is kept in ``data.truth`` ({'B': ... (shifted), 'C': ...}; ``data.truth['Sigma']``
    gives C C^T, computed when read: :class:`LowRankTruth`). Offsets are a view of their column
    (:func:`row_offsets`); from :data:`COMPACT_ENTRIES` counts on, ``Y`` is float32 (exact below
    2**24, which every count of realistic parameters is; else float64), 64-byte aligned, so that a
    float32 fit on the CPU reads it in place: 4 bytes per count on the host in all.
    ``sparse``: keep the non-zeros alone, as a CSR matrix (:func:`sparse_counts`; values in the
    dtype the dense counts would have): the same counts as ``sparse=False`` draws, without their
    n x p array at any point (memory: the non-zeros and a few blocks).
    ``rows``: ``(start, stop)``, only those rows (:attr:`Data.part`), the same numbers as the whole
    draw's rows ``start:stop`` whatever the range (each block of rows has its own seed, so only the
    blocks that hold them are drawn; X and the offsets, n x d and n x 1, are drawn whole, and a
    ``zero_fraction``'s delta passes over every block's draws as ever: time, not memory).
    """
    for key, value, low in (("n", n, 2), ("p", p, 1), ("q", q, 1), ("d", d, 1)):
        if isinstance(value, bool) or int(value) != value or value < low:
            raise DataError(f"simulate_pca: {key}={value!r} must be an integer >= {low}")
    if q > p:
        raise DataError(f"simulate_pca: q={q!r} must be an integer <= p={p} (the rank of Sigma = C C^T, p x p)")
    if zero_fraction is not None and not (isinstance(zero_fraction, (int, float)) and 0 < zero_fraction < 1):
        raise DataError(f"simulate_pca: zero_fraction={zero_fraction!r} must be null or a number in (0, 1)")
    n, p, q, d = int(n), int(p), int(q), int(d)
    if rows is not None and not (0 <= rows[0] < rows[1] <= n):
        raise DataError(
            f"simulate_pca: rows={tuple(rows)!r}: allowed are (start, stop) with 0 <= start < stop <= n={n}"
        )
    zf = None if zero_fraction is None else float(zero_fraction)
    step, blocks, X, B, C, log_totals, delta = _pca_setup(n, p, q, zf, d, seed)
    B = B.copy()
    start, stop = (0, n) if rows is None else (int(rows[0]), int(rows[1]))
    # the blocks of rows that hold rows start:stop: each drawn from its own seed, as in the whole draw
    chosen = range(start // step, -(-stop // step))
    first, last = chosen[0] * step, min(chosen[-1] * step + step, n)
    eta0 = lambda r: log_totals[r] + X[r] @ B  # the latent mean before W (and before the shift delta)
    # float32 counts for a large data set (exact below 2**24; float64 again if a count is not)
    compact = n * p >= COMPACT_ENTRIES
    Y = None
    if not sparse:
        Y = _aligned_empty((last - first, p), np.float32) if compact else np.zeros((last - first, p), dtype=np.float64)
    pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # sparse: each block's row sizes, columns, counts

    def draw(k: int):  # block k's non-zeros (a mask; sparse: their row sizes, columns) and their counts
        rng, eta, U = _pca_latent_block(blocks[k], eta0(slice(k * step, min(k * step + step, n))), C)
        with np.errstate(divide="ignore"):
            gap = (np.log(-np.log(U)) - eta).astype(np.float32)  # as the threshold was found
        nonzero = gap <= np.float64(delta)
        lam = np.exp(eta[nonzero] + delta)
        t = -np.log1p(rng.random(lam.shape) * np.expm1(-lam))  # the first arrival, given one before 1
        counts = 1.0 + rng.poisson(np.maximum(lam - t, 0.0))
        if not sparse:
            return nonzero, counts
        # float32 where exact, as the dense counts (the blocks' concatenation: float64 if one is)
        kept = counts.astype(np.float32) if compact and counts.max(initial=0) < FLOAT32_EXACT else counts
        return nonzero.sum(axis=1), np.nonzero(nonzero)[1].astype(np.int32), kept

    for k, drawn in zip(chosen, in_threads(draw, chosen)):  # the blocks drawn on every core
        if Y is None:
            pieces.append(drawn)
            continue
        nonzero, counts = drawn
        here = slice(k * step - first, min(k * step + step, n) - first)
        if Y.dtype == np.float32 and counts.size and counts.max() >= FLOAT32_EXACT:
            Y = Y.astype(np.float64)  # the rows so far are exact: float64 from here on
        if compact:
            Y[here] = 0.0  # _aligned_empty: not zeroed
        Y[here][nonzero] = counts
    if Y is None:
        values = np.concatenate([c for _, _, c in pieces]) if pieces else np.zeros(0)
        indptr = np.concatenate([[0], np.cumsum(np.concatenate([k for k, _, _ in pieces]))])
        indices = np.concatenate([j for _, j, _ in pieces])
        del pieces
        Y = sparse_counts(indptr, indices, values, (last - first, p))
    if (first, last) != (start, stop):  # the rows asked for, of the blocks that hold them
        Y = Y[start - first : stop - first]
    B[0] += delta  # the truth: the intercept as drawn from
    label = f"simulate_pca(n={n}, p={p}, q={q}, zero_fraction={zero_fraction}, d={d}, seed={seed})"
    if rows is None:  # a column without counts in some rows of it says nothing of the data set's
        warn_empty_columns(Y, label)
    names = ("intercept",) + tuple(f"x{k}" for k in range(1, d))
    truth = LowRankTruth(B=B, C=C)
    name = pca_name(n, p, q, d, zero_fraction, seed) + ("_sparse" if sparse else "")
    part = None if rows is None else RowPart(start, stop, n)
    return Data(Y, row_offsets(log_totals[start:stop], p), np.array(X[start:stop]), name, names, truth, part=part)


@lru_cache(maxsize=2)
def _pca_setup(n: int, p: int, q: int, zero_fraction: float | None, d: int, seed: int):
    """What every block of :func:`simulate_pca`'s rows is drawn from: the rows per block, the blocks'
    seeds, X, B (before the shift delta), C, the log totals and delta (with ``zero_fraction``: two
    passes over every block's draws). Kept for the last two data sets, so that reading them a few
    rows at a time (:func:`digest_by_rows`) finds delta once. Read only: never change what it gives."""
    step = max(1, BLOCK_ENTRIES // p)
    params, *blocks = np.random.SeedSequence(seed).spawn(1 + -(-n // step))
    rng = np.random.default_rng(params)
    X = np.hstack([np.ones((n, 1)), rng.standard_normal((n, d - 1))])
    B = rng.normal(scale=0.5, size=(d, p))
    B[0] += 1.0
    C = rng.normal(scale=np.sqrt(1.0 / q), size=(p, q))
    log_totals = np.log(rng.uniform(0.5, 1.5, size=(n, 1)))
    rows = [slice(a, min(a + step, n)) for a in range(0, n, step)]
    eta0 = lambda r: log_totals[r] + X[r] @ B  # the latent mean before W (and before the shift delta)

    def gaps(i: int) -> np.ndarray:  # the float32 gaps of block i of rows, drawn again on each call
        _, eta, U = _pca_latent_block(blocks[i], eta0(rows[i]), C)
        with np.errstate(divide="ignore"):  # U = 0: an infinite gap, a zero
            return (np.log(-np.log(U)) - eta).astype(np.float32)

    def map_gaps(f):  # f of each block's gaps, in block order, the blocks drawn on every core
        return in_threads(lambda i: f(gaps(i)), range(len(rows)))

    delta = 0.0 if zero_fraction is None else _zero_threshold(map_gaps, n * p, zero_fraction)
    for a in (X, B, C, log_totals):
        a.flags.writeable = False
    return step, blocks, X, B, C, log_totals, delta


class LowRankTruth(dict):
    """:func:`simulate_pca`'s truth: ``B`` and ``C`` kept; ``Sigma`` = C C^T made each time it is
    read (``truth["Sigma"]``), never kept: p x p float64 is 3.2 GB at p = 20,000."""

    def __missing__(self, key):
        if key == "Sigma":
            C = self["C"]
            return C @ C.T
        raise KeyError(key)

    def __contains__(self, key) -> bool:
        return key == "Sigma" or super().__contains__(key)

    def get(self, key, default=None):
        return self[key] if key in self else default


def pca_name(n: int, p: int, q: int, d: int, zero_fraction: float | None, seed: int) -> str:
    """``synthetic_pca_n2000_p200_q5_s0`` (``_d2`` after q for d > 1, ``_zf0.9`` for a zero fraction):
    the name of :func:`simulate_pca`'s data and of ``dataset=synthetic_pca``'s label."""
    extra = (f"_d{d}" if d > 1 else "") + (f"_zf{zero_fraction:g}" if zero_fraction is not None else "")
    return f"synthetic_pca_n{n}_p{p}_q{q}{extra}_s{seed}"
