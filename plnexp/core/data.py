"""A data set ready to fit (:class:`Data`: host numpy arrays, float64) and how it holds its arrays:
:meth:`Data.to_device` casts and places them for a fit. Offsets are always stored on the log scale.
Large data sets stay lean on the host (see docs/concepts/memory.md): offsets that are one per row are
an ``(n, p)`` read-only view of their ``(n, 1)`` column (:func:`row_offsets`), and a fit's device gets
that column alone (:func:`device_offsets`); :func:`~plnexp.core.simulation.simulate_pca` and
:func:`~plnexp.core.anndata_counts.load_anndata` (sparse counts) keep :data:`COMPACT_ENTRIES` or more
counts in float32 when exact (below 2**24); plnexp reads them a block of rows at a time, in float64,
so the numbers are those of float64 arrays. Counts may also be kept sparse (``simulate_pca(...,
sparse=True)``, ``load_anndata(..., sparse=True)``: a CSR matrix, :func:`sparse_counts`), for a
PLN-PCA fit that reads them a block of rows at a time.

The ways in, each in its module: counts in memory (:func:`plnexp.core.inputs.as_data`), CSV files
(:mod:`plnexp.core.csv_files`), the shipped oaks data (:mod:`plnexp.core.oaks`), AnnData files
(:mod:`plnexp.core.anndata_counts`) and simulation (:mod:`plnexp.core.simulation`). Every one checks
the values with the same functions (:mod:`plnexp.core.data_checks`): a problem is one
:class:`DataError` line naming the argument or file, the row and column, and what is allowed. A data
set's rows (one process's, replicated, hashed by rows): :mod:`plnexp.core.data_rows`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .reference import dense_rows, is_sparse, row_blocks

COMPACT_ENTRIES = (
    1 << 26
)  # from this many counts on, simulate_pca and sparse load_anndata keep them in float32 (if exact)


FLOAT32_EXACT = 1 << 24  # every integer below this is exact in float32


def row_offsets(column, p: int) -> np.ndarray:
    """Offsets that are one per row, ``(n,)`` or ``(n, 1)``, as the ``(n, p)`` float64 array they
    stand for, without its memory: a read-only view whose columns all share the one column's values
    (stride 0). Every reader of ``Data.O`` sees an ``(n, p)`` array of those values."""
    column = np.asarray(column, dtype=np.float64).reshape(-1, 1)
    return np.broadcast_to(column, (column.shape[0], int(p)))


def _row_column(a: np.ndarray) -> np.ndarray | None:
    """The ``(n, 1)`` column of an ``(n, p)`` view made by :func:`row_offsets` (its columns share
    their memory), else None."""
    if a.ndim == 2 and a.shape[1] > 1 and a.strides[1] == 0:
        return a[:, :1]
    return None


def device_offsets(O: np.ndarray) -> np.ndarray:
    """The offsets as a fit's device holds them: the ``(n, 1)`` column of offsets that are one per
    row (a :func:`row_offsets` view), which every JAX computation broadcasts against the ``(n, p)``
    arrays, else ``O`` itself ``(n, p)``. At single-cell scale that is one n x p array fewer on the
    device, and fewer bytes each iteration reads (the values, and the sums over them, are the same)."""
    O = np.asarray(O)
    column = _row_column(O)
    return O if column is None else column


def _aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised array whose data start on a 64-byte boundary: JAX's CPU client then takes it
    without a copy (``jax.device_put`` aliases it), where numpy's own 16-byte alignment costs a copy."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(size + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + size].view(dtype).reshape(shape)


def _as_host(a: np.ndarray, dtype) -> np.ndarray:
    """``a`` in ``dtype``: itself when it has it, else a 64-byte aligned copy converted a block of rows
    at a time (no transient beyond the copy)."""
    if a.dtype == dtype:
        return a
    out = _aligned_empty(a.shape, dtype)
    for r in row_blocks(*a.shape) if a.ndim == 2 else [slice(None)]:
        out[r] = a[r]
    return out


class DataError(ValueError):
    """A data file or array that cannot be fitted; the message names the file and the problem."""

    kind = "data error"  # its one line: plnexp: data error: ... (plnexp.system.commandline.fail)


class DataWarning(UserWarning):
    """Data that can be fitted but not meaningfully in part (one line naming the columns)."""


@dataclass(frozen=True)
class RowPart:
    """Which rows of a data set a :class:`Data` holds: ``start:stop`` of its ``n`` (one JAX process's
    rows of a fit across processes, :func:`plnexp.core.data_rows.row_range`)."""

    start: int
    stop: int
    n: int


@dataclass(frozen=True, eq=False, repr=False)  # __repr__: one line, below
class Data:
    """A data set ready to fit: n samples, p count variables, d covariates (intercept included).

    Build one with :func:`as_data` (counts in memory), :func:`load_csv`, :func:`load_oaks` or
    :func:`simulate`, which check the values; :func:`plnexp.fit` also accepts the counts directly and
    calls :func:`as_data` itself. Constructing ``Data`` by hand skips those checks.

    Attributes:
        Y: counts, ``(n, p)`` float64 holding non-negative integers (float32 for a data set of
            :data:`COMPACT_ENTRIES` counts or more from :func:`simulate_pca` or a sparse AnnData,
            all below 2**24, so exact: read it as float64 a block of rows at a time, as plnexp does);
            or sparse: a scipy CSR matrix of them (:func:`sparse_counts`, ``simulate_pca(...,
            sparse=True)``), which a PLN-PCA fit with ``block_rows`` reads a block of rows at a
            time, densified on the device only while it is used (:attr:`sparse`).
        O: offsets on the log scale, ``(n, p)`` float64 (zeros: no offsets); one offset per row
            is a read-only view of its column (:func:`row_offsets`): ``(n, p)`` all the same (a
            fit's device gets the ``(n, 1)`` column: :meth:`to_device`).
        X: covariates, the design matrix ``(n, d)`` float64, intercept first.
        name: the data set's name (run names and reports).
        covariate_names: the names of ``X``'s columns (``"intercept"`` first; a categorical
            column's levels as ``"column=level"``).
        truth: the true ``B`` and ``Sigma`` of simulated data (:func:`simulate`), else None.
        columns: the names of the ``p`` count variables (a DataFrame's columns, a CSV header), or
            None when they have none (a NumPy array).
    """

    Y: np.ndarray
    O: np.ndarray
    X: np.ndarray
    name: str = "data"
    covariate_names: tuple[str, ...] = ("intercept",)
    truth: dict | None = field(default=None, repr=False)  # simulate(): the true B and Sigma
    columns: tuple[str, ...] | None = None
    # rows start:stop of a data set of part.n rows (one process's rows of a fit across processes), else None
    part: RowPart | None = field(default=None, repr=False)
    # the rows' names (a DataFrame's index, obs_names, a CSV's index column: plnexp.core.row_names), else None
    row_names: tuple[str, ...] | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        """One line (the arrays' values are never printed: at single-cell scale they are gigabytes):
        the name, the shape, the covariates, the counts' dtype, and whether a simulation's truth is
        kept: ``Data('oaks', n=116 x p=114, d=1 covariate, float64)``."""
        extras = ", simulated (truth kept)" if self.truth is not None else ""
        layout = f", sparse ({getattr(self.Y, 'nnz', 0)} non-zeros)" if self.sparse else ""
        return (
            f"{type(self).__name__}({self.name!r}, n={self.n} x p={self.p}, d={self.d} covariate"
            f"{'s' if self.d != 1 else ''}, {self.Y.dtype}{layout}{extras})"
        )

    @property
    def sparse(self) -> bool:
        """Whether the counts are kept sparse (a scipy CSR matrix: :func:`sparse_counts`)."""
        return is_sparse(self.Y)

    @property
    def n(self) -> int:
        return self.Y.shape[0]

    @property
    def p(self) -> int:
        return self.Y.shape[1]

    @property
    def d(self) -> int:
        return self.X.shape[1]

    @cached_property
    def log_factorial(self) -> float:
        """sum_ij log(Y_ij!) in float64, computed once per data set (the fit's constant), a block of
        rows at a time."""
        from .reference import log_factorial_sum

        return log_factorial_sum(self.Y)

    def digest(self) -> str:
        """sha256 of Y, O and X (float64 bytes, row-major, each after its shape): identifies the data a
        run was fitted on. Hashed a block of rows at a time: the same bytes in the same order as the
        whole arrays' (so the digest does not depend on how the arrays are stored), no n x p copy."""
        return digest_by_rows(lambda a, b: Data(self.Y[a:b], self.O[a:b], self.X[a:b]), self.n, self.p)

    def to_device(self, dtype, device):
        """The arrays as :class:`plnexp.core.arrays.Arrays` of ``dtype``, committed to ``device``, without a
        second n x p copy on the host: an array of another dtype is converted a block of rows at a
        time into one buffer that JAX's CPU client takes as it is (64-byte aligned); offsets that are
        one per row go as their ``(n, 1)`` column (:func:`device_offsets`), which the fit's
        computations broadcast. The values are those of ``jax.device_put(np.asarray(a, dtype),
        device)`` (O's: its first column, for offsets one per row). Sparse counts go as
        :class:`plnexp.core.arrays.SparseCounts`: their non-zeros, never densified here."""
        import jax

        from .arrays import Arrays

        dtype = np.dtype(dtype)
        put = lambda a: jax.device_put(_as_host(a, dtype), device)
        Y = _device_sparse(self.Y, dtype, device) if self.sparse else put(np.asarray(self.Y))
        return Arrays(Y, put(device_offsets(self.O)), put(np.asarray(self.X)))


def sparse_counts(indptr, indices, values, shape: tuple[int, int]):
    """Counts kept sparse: the scipy CSR matrix of ``values`` (float32 or float64 holding the counts),
    their columns ``indices`` and row starts ``indptr`` (n + 1), as :class:`Data` holds them
    (int32 indices while the non-zeros number below 2**31). Explicit zeros may be stored."""
    from scipy import sparse

    index = np.int32 if len(values) < 2**31 else np.int64
    csr = sparse.csr_array(
        (values, np.asarray(indices, dtype=index), np.asarray(indptr, dtype=index)), shape=shape, copy=False
    )
    csr.has_canonical_format = True  # made row after row, columns increasing: no sort, no copy
    return csr


def _device_sparse(Y, dtype, device):
    """CSR counts on ``device`` as :class:`plnexp.core.arrays.SparseCounts` in ``dtype``: the values
    (one entry of value 0 after them), their columns, the row starts; int32 (a one-line DataError
    from 2**31 non-zeros on, which this layout does not hold)."""
    import jax

    from .arrays import SparseCounts

    if Y.nnz >= 2**31 - 1:
        raise DataError(f"sparse counts: {Y.nnz} non-zeros; allowed are fewer than 2**31 - 1 (int32 offsets)")
    values = _aligned_empty((Y.nnz + 1,), dtype)  # 64-byte aligned: JAX's CPU client takes them as they are
    values[:-1], values[-1] = Y.data, 0
    indices = _aligned_empty((Y.nnz + 1,), np.int32)  # (not aligned, it copied them once more)
    indices[:-1], indices[-1] = Y.indices, 0
    row_nnz = np.diff(Y.indptr)
    return SparseCounts(
        jax.device_put(np.asarray(Y.indptr, dtype=np.int32), device),
        jax.device_put(indices, device),
        jax.device_put(values, device),
        (int(Y.shape[0]), int(Y.shape[1])),
        int(row_nnz.max()) if row_nnz.size else 0,
    )


def digest_by_rows(read: Callable[[int, int], Data], n: int, p: int) -> str:
    """:meth:`Data.digest` of a data set of ``n`` rows read ``read(start, stop)`` a block of rows at a
    time, never whole: the same bytes in the same order (Y's rows, then O's, then X's), so the same
    digest as the data read whole, in the memory of one block (three passes over the rows)."""
    h = hashlib.sha256()
    for k in range(3):  # Y, O, X: each after its shape
        for rows in row_blocks(n, p):
            part = read(rows.start, rows.stop)
            a = (part.Y, part.O, part.X)[k]
            if rows.start == 0:
                h.update(str((n, *a.shape[1:])).encode())
            for r in row_blocks(*a.shape):
                h.update(np.ascontiguousarray(dense_rows(a, r), dtype=np.float64).reshape(-1).data)
    return h.hexdigest()
