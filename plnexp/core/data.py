"""Data sets: counts in memory (:func:`as_data`), the shipped oaks data, CSV files, AnnData files
(single-cell counts), and simulation from the PLN generative model (full or low-rank).

A :class:`Data` holds host (numpy, float64) arrays; :meth:`Data.to_device` casts and places them
for a fit. Offsets are always stored on the log scale. Large data sets stay lean on the host (see
docs/concepts/memory.md): offsets that are one per row are an ``(n, p)`` read-only view of their
``(n, 1)`` column (:func:`row_offsets`), and a fit's device gets that column alone
(:func:`device_offsets`); :func:`simulate_pca` and :func:`load_anndata` (sparse
counts) keep :data:`COMPACT_ENTRIES` or more counts in float32 when exact (below 2**24); plnexp
reads them a block of rows at a time, in float64, so the numbers are those of float64 arrays.
Counts may also be kept sparse (``simulate_pca(..., sparse=True)``, ``load_anndata(..., sparse=True)``:
a CSR matrix, :func:`sparse_counts`), for a PLN-PCA fit that reads them a block of rows at a time.
Every way in (:func:`as_data`, :func:`load_csv`, :func:`load_oaks`, :func:`load_anndata`,
:func:`simulate`) checks the values with the same functions (:func:`check_counts`,
:func:`check_offsets`, :func:`check_full_rank`): a problem is one :class:`DataError` line naming the
argument or file, the row and column, and what is allowed.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

import numpy as np

from . import row_names
from .reference import BLOCK_ENTRIES, dense_rows, is_sparse, row_blocks  # the one block size of the host's n x p reads

OAKS_COVARIATES = ("tree", "orientation", "distTOground")
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


def row_range(n: int, devices: int, first: int, count: int) -> tuple[int, int, int]:
    """The rows of a data set of ``n`` rows that devices ``first`` to ``first + count - 1`` of a
    1-D mesh of ``devices`` hold when its rows are split evenly across them, padded to a multiple of
    ``devices`` (each device ``ceil(n / devices)`` rows; the padding rows, past the data's, are
    the last devices'): ``(start, stop, pad)``, the data rows ``start:stop`` followed by ``pad``
    padding rows. What one JAX process of a fit across processes reads (its devices' rows)."""
    for key, value, low in (("n", n, 1), ("devices", devices, 1), ("first", first, 0), ("count", count, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{key}={value!r}: allowed values are integers >= {low}")
    if first + count > devices:
        raise ValueError(f"first={first}, count={count}: allowed are devices within the mesh's {devices}")
    per = -(-n // devices)
    lo, hi = first * per, (first + count) * per
    start, stop = min(lo, n), min(hi, n)
    return start, stop, (hi - lo) - (stop - start)


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


def warn_empty_columns(Y, source: str, columns: Sequence[str] | None = None) -> list[int]:
    """Warn, in one line naming them, about count columns that are zero in every row (common in
    microbiome tables): the fit drives their mean to -inf (B, M grow without bound) so their
    estimates mean nothing. Returns their 0-based indices."""
    seen = np.zeros(Y.shape[1], dtype=bool)
    if is_sparse(Y):
        for k in range(0, Y.nnz, BLOCK_ENTRIES):  # no nnz-long transient
            part = slice(k, k + BLOCK_ENTRIES)
            seen[Y.indices[part][Y.data[part] != 0]] = True
    else:
        Y = np.asarray(Y)
        for r in row_blocks(*Y.shape):  # no n x p boolean transient
            seen |= (Y[r] != 0).any(axis=0)
    empty = [int(j) for j in np.flatnonzero(~seen)]
    if empty:
        names = [f"{columns[j]!r}" if columns is not None else f"{j + 1}" for j in empty]
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        warnings.warn(
            DataWarning(
                f"counts of {source}: {len(empty)} of {Y.shape[1]} column(s) have no counts at all (column"
                f"{'s' if len(empty) > 1 else ''} {shown}): their means diverge to -inf during the fit and their "
                f"estimates mean nothing; drop them for a meaningful fit"
            ),
            stacklevel=3,
        )
    return empty


@dataclass(frozen=True)
class RowPart:
    """Which rows of a data set a :class:`Data` holds: ``start:stop`` of its ``n`` (one JAX process's
    rows of a fit across processes, :func:`plnexp.core.data.row_range`)."""

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
        h = hashlib.sha256()
        for a in (self.Y, self.O, self.X):
            h.update(str(a.shape).encode())
            for r in row_blocks(*a.shape):  # CSR counts: the same bytes as the dense counts'
                h.update(np.ascontiguousarray(dense_rows(a, r), dtype=np.float64).reshape(-1).data)
        return h.hexdigest()

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


def replicate(data: Data, times: int) -> Data:
    """Stack the rows ``times`` times (the seed's way of making oaks bigger)."""
    if int(times) != times or times < 1:
        raise DataError(f"replication={times!r}: must be an integer >= 1")
    if times == 1:
        return data
    rep = lambda a: np.tile(a, (int(times), 1))
    if data.sparse:
        from scipy import sparse

        Y = sparse.csr_array(sparse.vstack([data.Y] * int(times), format="csr"))
    else:
        Y = rep(data.Y)
    column = _row_column(np.asarray(data.O))  # offsets one per row stay a view of their column
    return Data(
        Y,
        rep(data.O) if column is None else row_offsets(rep(column), data.p),
        rep(data.X),
        f"{data.name}_x{times}",
        data.covariate_names,
        data.truth,
        data.columns,
    )


def take_rows(data: Data, start: int, stop: int) -> Data:
    """Rows ``start:stop`` of the whole ``data`` (:attr:`Data.part` set): for a source that cannot be
    read by rows (the draw of :func:`simulate`), the data read whole, then only these rows kept."""
    column = _row_column(np.asarray(data.O))
    O = np.asarray(data.O)[start:stop] if column is None else row_offsets(column[start:stop], data.p)
    Y = data.Y[start:stop]
    return Data(
        Y if is_sparse(Y) else np.ascontiguousarray(Y),
        O,
        np.asarray(data.X)[start:stop],
        data.name,
        data.covariate_names,
        data.truth,
        data.columns,
        RowPart(start, stop, data.n),
    )


def replicate_rows(data: Data, times: int, start: int, stop: int) -> Data:
    """Rows ``start:stop`` of :func:`replicate` ``(data, times)`` without its other rows: row ``i`` is
    the base data's row ``i % n`` (oaks x 1,724 is 116 rows read once, then only one process's rows)."""
    n = data.n
    if not (0 <= start <= stop <= n * times):
        raise DataError(f"rows {start}:{stop}: allowed are rows within the {n * times} of replication={times}")
    index = np.arange(start, stop) % n
    column = _row_column(np.asarray(data.O))
    Y = data.Y[index] if not is_sparse(data.Y) else data.Y[index]
    return Data(
        Y,
        np.asarray(data.O)[index] if column is None else row_offsets(column[index], data.p),
        np.asarray(data.X)[index],
        f"{data.name}_x{times}" if times > 1 else data.name,
        data.covariate_names,
        data.truth,
        data.columns,
        RowPart(start, stop, n * times),
    )


def digest_by_rows(read: Callable[[int, int], Data], n: int, p: int) -> str:
    """:meth:`Data.digest` of a data set of ``n`` rows read ``read(start, stop)`` a block of rows at a
    time, never whole: the same bytes in the same order (Y's rows, then O's, then X's), so the same
    digest as the data read whole, in the memory of one block (three passes over the rows)."""
    step = max(1, BLOCK_ENTRIES // max(p, 1))
    h = hashlib.sha256()
    for k in range(3):  # Y, O, X: each after its shape
        for start in range(0, n, step):
            part = read(start, min(start + step, n))
            a = (part.Y, part.O, part.X)[k]
            if start == 0:
                h.update(str((n, *a.shape[1:])).encode())
            for r in row_blocks(*a.shape):
                h.update(np.ascontiguousarray(dense_rows(a, r), dtype=np.float64).reshape(-1).data)
    return h.hexdigest()


# ---------------------------------------------------------------- validation helpers
def _label(what: str, source) -> str:
    """How a message names the values: ``counts file PATH`` for a file, ``counts`` for an argument."""
    return what if source is None else f"{what} file {source}"


NUMBERS_ALLOWED = "numbers (empty, NA or NaN for a missing value)"
MISSING = ("", "NA", "nan", "NaN")


def _number(cell: str) -> float:
    return float(cell) if cell.strip() not in MISSING else np.nan


def _is_number(cell: str) -> bool:
    try:
        _number(cell)
    except ValueError:
        return False
    return True


def csv_rows(path) -> int:
    """The data rows of a CSV file with a header row (its non-empty lines less one), read line by line."""
    with open(path) as f:
        return max(sum(1 for ln in f if ln.strip()) - 1, 0)


def _read_csv(
    path: Path, what: str, rows: tuple[int, int] | None = None, index_col: int | None = None
) -> tuple[list[str], np.ndarray, tuple[str, ...] | None]:
    """Read a numeric CSV with a header row; one clear DataError for any problem. ``rows``: only the
    data rows ``start:stop`` (0-based, empty lines not counted) are parsed and kept, the others
    skipped as the file is read line by line. ``index_col``: that column holds the rows' names
    (returned third; None without it)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} file {path}: not found")
    with open(path) as f:
        numbered = ((i, ln) for i, ln in enumerate(ln for ln in f if ln.strip()))
        lines = [ln for i, ln in numbered if i == 0 or rows is None or rows[0] < i <= rows[1]]
    lines = [ln.rstrip("\r\n") for ln in lines]
    first_line = 2 if rows is None else rows[0] + 2  # the file's line of lines[1] (empty lines not counted)
    if len(lines) < 2:
        if rows is not None and lines:
            raise DataError(f"{what} file {path}: no data rows {rows[0] + 1} to {rows[1]}")
        raise DataError(f"{what} file {path}: empty (need a header row and at least one data row)")
    header = [h.strip().strip('"') for h in lines[0].split(",")]
    body, names = lines[1:], None
    if index_col is not None:
        header, body, names = row_names.split_index(header, body, index_col, path, what, DataError)
    rows_read = []
    for i, ln in enumerate(body, start=first_line):
        cells = ln.split(",")
        if len(cells) != len(header):
            raise DataError(f"{what} file {path}: line {i} has {len(cells)} fields, header has {len(header)}")
        try:
            rows_read.append([_number(c) for c in cells])
        except ValueError:  # which cell, counted as the value checks count (row 1: the first data row)
            j = next(j for j, c in enumerate(cells) if not _is_number(c))
            raise DataError(
                f"{what} file {path}: non-numeric value {cells[j].strip()!r} at row {i - 1}, column {j + 1}; "
                f"allowed values are {NUMBERS_ALLOWED}{row_names.hint(header, j)}"
            ) from None
    return header, np.asarray(rows_read, dtype=np.float64), names


def _first_bad(a: np.ndarray, bad) -> tuple[int, int] | None:
    """(row, column) of the first entry of the 2-d ``a``, in row-major order, where ``bad(block)``
    is True; None if none. A block of rows at a time: no n x p transient."""
    for rows in row_blocks(*a.shape):
        found = np.argwhere(bad(a[rows]))
        if found.size:
            r, c = found[0]
            return int(r) + rows.start, int(c)
    return None


def _check_finite(a: np.ndarray, label: str, allowed: str) -> None:
    where = _first_bad(a, lambda block: ~np.isfinite(block))
    if where is not None:
        r, c = where
        kind = "missing (NaN)" if np.isnan(a[r, c]) else "infinite"
        raise DataError(f"{label}: {kind} value at row {r + 1}, column {c + 1}; allowed values are {allowed}")


COUNTS_ALLOWED = "non-negative integers"
# The largest count a fit accepts, ~1.8e19 (log 44): products of two count-sized numbers (a squared
# gradient (y - exp(m))^2 in adam's second moment, y * m summed over the n x p entries) must stay finite
# in float32, the default precision, whose largest number is ~3.4e38 (a count of 1e40 is already inf
# there). Real counts (reads, cells, individuals) are many orders of magnitude below it.
COUNTS_MAX = float(np.finfo(np.float32).max) ** 0.5
COVARIATES_ALLOWED = "finite numbers or text categories"


def check_counts(Y: np.ndarray, source: str | Path | None = None, *, keep_float32: bool = False) -> np.ndarray:
    """Counts must be a non-empty 2-d table of finite non-negative integers up to :data:`COUNTS_MAX`
    (~1.8e19); returns them as float64 (float32 counts as they are with ``keep_float32``). ``source``:
    the file they were read from (None: the ``counts`` argument). Checked a block of rows at a time
    (no n x p transient)."""
    label = _label("counts", source)
    Y = np.asarray(Y)
    if not (keep_float32 and Y.dtype == np.float32):
        Y = np.asarray(Y, dtype=np.float64)
    if Y.ndim != 2 or Y.size == 0:
        raise DataError(f"{label}: must be a non-empty 2-d table (n samples x p variables), got shape {Y.shape}")
    _check_finite(Y, label, COUNTS_ALLOWED)
    for what, bad in (("negative", lambda y: y < 0), ("non-integer", lambda y: y != np.round(y))):
        where = _first_bad(Y, bad)
        if where is not None:
            r, c = where
            raise DataError(
                f"{label}: {what} count {Y[r, c]:g} at row {r + 1}, column {c + 1}; allowed values are {COUNTS_ALLOWED}"
            )
    largest = max(float(Y[rows].max()) for rows in row_blocks(*Y.shape))
    if largest > COUNTS_MAX:
        where = _first_bad(Y, lambda y: y == largest)
        assert where is not None  # the largest count is somewhere
        r, c = where
        raise DataError(
            f"{label}: too large count {largest!r} at row {r + 1}, column {c + 1} (the largest); allowed values "
            f"are {COUNTS_ALLOWED} up to {COUNTS_MAX!r} (larger ones overflow float32 arithmetic)"
        )
    return Y


def check_offsets(O: np.ndarray, source: str | Path | None, log_scale: bool) -> np.ndarray:
    """Raw offsets (totals) must be finite and > 0, log-scale ones finite; returns them on the log
    scale. ``source``: the file they were read from (None: the ``offsets`` argument)."""
    label = _label("offsets", source)
    if log_scale:
        _check_finite(O, label, "finite numbers (log scale, log_offsets=true)")
        return O
    allowed = "finite numbers > 0 (raw totals; log_offsets=true for offsets already on the log scale)"
    _check_finite(O, label, allowed)
    if (O <= 0).any():
        r, c = np.argwhere(O <= 0)[0]
        raise DataError(f"{label}: offset {O[r, c]:g} at row {r + 1}, column {c + 1}; allowed values are {allowed}")
    return np.log(O)


def check_full_rank(X: np.ndarray, names: Sequence[str], source: str | Path | None) -> None:
    """The design matrix (intercept first) must have linearly independent columns. ``source``: the
    covariates file (None: the ``covariates`` argument)."""
    if np.linalg.matrix_rank(X) == X.shape[1]:
        return
    for j in range(1, X.shape[1] + 1):
        if np.linalg.matrix_rank(X[:, :j]) < j:
            break
    what = "the intercept" if j == 2 else "the intercept and the columns before it"
    raise DataError(
        f"{_label('covariates', source)}: column {names[j - 1]!r} is a linear combination of {what} "
        f"(e.g. constant, or a copy), so the design matrix {tuple(names)} is rank-deficient; "
        f"allowed values are linearly independent columns"
    )


def design_matrix(
    table: Mapping[str, np.ndarray | Sequence[str]],
    columns: Sequence[str],
    n: int,
    categorical: Collection[str] = (),
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Intercept + the named columns; text columns, and those named in ``categorical`` (whatever
    their values look like: an AnnData category ``"1", "2"``), become one-hot with the first level
    (sorted as text) dropped."""
    blocks, names = [np.ones((n, 1))], ["intercept"]
    for col in columns:
        if col not in table:
            raise DataError(f"covariate {col!r}: not in the covariates table; allowed: {sorted(table)}")
        values = np.asarray(table[col])
        try:
            if col in categorical:
                raise TypeError(col)
            blocks.append(values.astype(np.float64).reshape(n, 1))
            names.append(col)
        except (TypeError, ValueError):  # categorical (TypeError: an object column that float() refuses)
            levels = sorted(set(values.tolist()), key=str)
            for level in levels[1:]:
                blocks.append((values == level).astype(np.float64).reshape(n, 1))
                names.append(f"{col}={level}")
    return np.hstack(blocks), tuple(names)


# ---------------------------------------------------------------- loaders
def _oaks_dir():
    return resources.files("plnexp.datasets") / "oaks"


def _read_text_table(path) -> dict[str, np.ndarray]:
    lines = [ln.split(",") for ln in Path(path).read_text().splitlines() if ln.strip()]
    header = [h.strip().strip('"') for h in lines[0]]
    cols = list(zip(*lines[1:]))
    return {h: np.asarray([c.strip().strip('"') for c in col]) for h, col in zip(header, cols)}


def load_oaks(replication: int = 1, covariates: Sequence[str] = ()) -> Data:
    """The oaks powdery-mildew data (116 x 114), MIT licence: see plnexp/datasets/oaks/LICENSE.

    Offsets are the raw read totals shipped with the data, logged here once. ``covariates``:
    any of 'tree', 'orientation' (categorical, one-hot, first level dropped), 'distTOground'.
    """
    folder = _oaks_dir()
    header, Y, _ = _read_csv(folder / "counts.csv", "counts")
    _, totals, _ = _read_csv(folder / "offsets.csv", "offsets")
    X, names = design_matrix(_read_text_table(folder / "covariates.csv"), covariates, Y.shape[0])
    warn_empty_columns(Y, "oaks")
    data = Data(check_counts(Y, folder / "counts.csv"), np.log(totals), X, "oaks", names, columns=tuple(header))
    return replicate(data, replication)


def load_csv(
    counts,
    offsets=None,
    covariates=None,
    *,
    log_offsets: bool = False,
    covariate_columns: Sequence[str] | None = None,
    name: str | None = None,
    rows: tuple[int, int] | None = None,
    index_col: int | None = None,
) -> Data:
    """Load counts (header + integer rows), optional offsets and covariates from CSV files.

    ``index_col``: the column of the counts and offsets files holding the rows' names (pandas'
    default ``to_csv`` writes them first: ``index_col=0``), kept as :attr:`Data.row_names`.

    ``offsets`` are raw positive totals (logged here) unless ``log_offsets=True``. Covariates:
    all columns of the file (text columns one-hot encoded) unless ``covariate_columns`` names
    some; an intercept is always added. Any problem raises :class:`DataError` naming the file.
    ``rows``: ``(start, stop)``, only those data rows of the counts and offsets files are parsed and
    kept (:attr:`Data.part`; the files read line by line); the covariates are read whole (n x d: one
    design matrix, whose one-hot levels and rank are the whole file's), then those rows kept.
    """
    total = None if rows is None else csv_rows(counts)
    if rows is not None and not (0 <= rows[0] < rows[1] <= (total or 0)):
        raise DataError(
            f"counts file {counts}: rows={tuple(rows)!r}: allowed are (start, stop) within its {total} rows"
        )
    header, Y, index = _read_csv(counts, "counts", rows, index_col)
    Y = check_counts(Y, str(counts))
    if rows is None:  # a column without counts in some rows says nothing of the whole file's
        warn_empty_columns(Y, f"file {counts}", header)
    n, p = Y.shape
    if offsets is None:
        O = np.zeros_like(Y)
    else:
        _, O, _ = _read_csv(offsets, "offsets", rows, index_col)
        if O.shape != Y.shape or (rows is not None and csv_rows(offsets) != total):
            shape = O.shape if rows is None else (csv_rows(offsets), O.shape[1])
            raise DataError(
                f"offsets file {offsets}: shape {shape} does not match counts {Y.shape if rows is None else (total, p)}"
            )
        O = check_offsets(O, offsets, log_offsets)
    if rows is not None:
        n = int(total or 0)
    names: tuple[str, ...]
    if covariates is None:
        X, names = np.ones((n, 1)), ("intercept",)
    else:
        path = Path(covariates)
        if not path.is_file():
            raise DataError(f"covariates file {path}: not found")
        table = _read_text_table(path) if path.stat().st_size else {}
        if not table or len(next(iter(table.values()))) == 0:
            raise DataError(f"covariates file {path}: empty (need a header row and at least one data row)")
        found = len(next(iter(table.values())))
        if found != n:
            raise DataError(f"covariates file {path}: {found} rows, counts have {n}")
        if index_col is not None and index_col < len(table):  # the rows' names: not a covariate
            del table[list(table)[index_col]]
        X, names = design_matrix(table, covariate_columns if covariate_columns is not None else list(table), n)
        _check_finite(X, _label("covariates", path), COVARIATES_ALLOWED)
    check_full_rank(X, names, covariates)
    if rows is not None:
        X = X[rows[0] : rows[1]]
    part = None if rows is None else RowPart(rows[0], rows[1], n)
    return Data(Y, O, X, name or Path(counts).stem, names, columns=tuple(header), part=part, row_names=index)


# ---------------------------------------------------------------- counts in memory
ACCEPTED = {
    "counts": "a NumPy array (n samples x p variables), a pandas DataFrame or a plnexp.Data",
    "offsets": "a NumPy array ((n, p), or (n,) for one offset per row) or a pandas DataFrame or Series",
    "covariates": "a NumPy array ((n, d), or (n,) for one covariate) or a pandas DataFrame or Series",
}


def _table(value, what: str) -> tuple[np.ndarray, tuple[str, ...] | None]:
    """(the values, their column names or None) of a NumPy array or a pandas object; else one
    TypeError line. pandas is found by what its objects have (``to_numpy``; ``columns`` for a
    DataFrame), never imported: plnexp does not depend on it."""
    if isinstance(value, np.ndarray):
        return value, None
    if hasattr(value, "to_numpy") and not isinstance(value, (str, bytes)):
        if hasattr(value, "columns"):  # a DataFrame
            return np.asarray(value.to_numpy()), tuple(str(c) for c in value.columns)
        name = getattr(value, "name", None)  # a Series: its name, if any, names its one column
        return np.asarray(value.to_numpy()), (str(name),) if name is not None else None
    raise TypeError(
        f"{what}: got a {type(value).__name__}; allowed are {ACCEPTED[what]} (np.asarray(...) converts other arrays)"
    )


def _floats(values: np.ndarray, label: str, allowed: str) -> np.ndarray:
    """``values`` as float64; a value that is not a number is one DataError line naming its place."""
    if values.dtype.kind == "c":
        raise DataError(f"{label}: complex values (dtype {values.dtype}); allowed values are {allowed}")
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):  # which value: only on this error path
        for index in np.ndindex(values.shape):
            try:
                float(values[index])
            except (TypeError, ValueError):
                place = f"row {index[0] + 1}" + (f", column {index[1] + 1}" if len(index) > 1 else "")
                raise DataError(
                    f"{label}: non-numeric value {values[index]!r} at {place}; allowed values are {allowed}"
                ) from None
        raise  # not reached: some value failed the conversion above


def _offsets_argument(offsets, shape: tuple[int, int], log_scale: bool) -> np.ndarray:
    n, p = shape
    values, _ = _table(offsets, "offsets")
    O = _floats(values, "offsets", "finite numbers")
    if O.shape in ((n,), (n, 1)):  # one offset per row (a sample's total): the same for its p counts
        return row_offsets(check_offsets(np.array(O.reshape(n, 1)), None, log_scale), p)
    if O.shape != (n, p):
        raise DataError(
            f"offsets: shape {O.shape} does not match counts {(n, p)}; allowed shapes are {(n, p)}, ({n},) or ({n}, 1)"
        )
    return check_offsets(np.array(O), None, log_scale)


def _covariates_argument(covariates, n: int) -> tuple[np.ndarray, tuple[str, ...]]:
    values, names = _table(covariates, "covariates")
    if values.ndim == 1:
        values = values.reshape(-1, 1)
    if values.ndim != 2:
        raise DataError(f"covariates: must be (n, d) or (n,), got shape {values.shape}")
    if values.shape[0] != n:
        raise DataError(f"covariates: {values.shape[0]} rows, counts have {n}")
    names = names or tuple(f"x{j + 1}" for j in range(values.shape[1]))
    X, design = design_matrix(dict(zip(names, values.T)), names, n)
    _check_finite(X, "covariates", COVARIATES_ALLOWED)
    return X, design


def as_data(counts, offsets=None, covariates=None, *, log_offsets: bool = False, name: str | None = None) -> Data:
    """A checked :class:`Data` from counts in memory (what :func:`plnexp.fit` calls on its data).

    Args:
        counts: an ``(n, p)`` NumPy array of non-negative integer counts (any numeric dtype: integers,
            or floats holding integers), or a pandas DataFrame of them, whose column names are kept
            (``Data.columns``), or a :class:`Data`, returned as it is.
        offsets: None (no offsets), or raw positive totals: an ``(n, p)`` array, or an ``(n,)``
            array or Series with one total per row (e.g. a sample's sequencing depth), the same for
            its p counts. Logged here, unless ``log_offsets=True`` (offsets already on the log
            scale), as :func:`load_csv` does.
        covariates: None (an intercept only), or an ``(n, d)`` array or DataFrame, or an ``(n,)``
            array or Series. An intercept column is always added first, as :func:`load_csv` does (so
            do not include one); text columns become one-hot columns, their first level dropped.
            Columns are named after the DataFrame's (``x1, x2, ...`` for an array).
        log_offsets: the offsets are already on the log scale.
        name: the data set's name (default ``"data"``).

    Returns:
        The :class:`Data`. Columns of counts that are all zero give one :class:`DataWarning` line.

    Raises:
        TypeError: ``counts``, ``offsets`` or ``covariates`` of another type (a list, a string, ...),
            or offsets or covariates given with a :class:`Data` (it carries its own): one line
            naming what is accepted.
        DataError: a value that cannot be fitted: a negative, non-integer, missing (NaN),
            infinite or too large (above :data:`COUNTS_MAX`, ~1.8e19) count, a non-positive offset,
            a shape that does not match the counts' (``n x p``), linearly dependent covariates: one
            line naming the argument and, for a value, its row and column.
    """
    if isinstance(counts, Data):
        if offsets is not None or covariates is not None:
            raise TypeError(
                "offsets, covariates: a plnexp.Data carries its own; allowed with counts given as a NumPy "
                "array or a pandas DataFrame"
            )
        return counts
    values, columns = _table(counts, "counts")
    Y = check_counts(_floats(values, "counts", COUNTS_ALLOWED))
    warn_empty_columns(Y, "the DataFrame" if columns is not None else "the array", columns)
    O = (
        row_offsets(np.zeros(Y.shape[0]), Y.shape[1])
        if offsets is None
        else _offsets_argument(offsets, Y.shape, log_offsets)
    )
    X, names = (
        (np.ones((Y.shape[0], 1)), ("intercept",))
        if covariates is None
        else _covariates_argument(covariates, Y.shape[0])
    )
    check_full_rank(X, names, None)
    return Data(Y, O, X, name or "data", names, columns=columns, row_names=row_names.of_index(counts))


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


# ---------------------------------------------------------------- single-cell counts (AnnData)
ANNDATA_OFFSETS = ("library_size", "none")  # else the name of an obs column of positive totals


def _anndata_module():
    """The ``anndata`` package (the ``single-cell`` extra); one :class:`DataError` line if absent."""
    try:
        import anndata
    except ImportError:
        from ..system.paths import install_command

        raise DataError(
            "AnnData counts need the anndata package, which is not installed; install plnexp's single-cell "
            f"extra ({install_command('single-cell')})"
        ) from None
    return anndata


def _read_h5ad(path: Path, anndata, backed: bool = False):
    """The AnnData of an ``.h5ad`` file, read whole (``backed``: X left in the file, read when sliced);
    a missing or unreadable file is one line."""
    if not path.is_file():
        raise DataError(f"AnnData file {path}: not found; allowed values are paths of existing .h5ad files")
    if path.suffix != ".h5ad":
        raise DataError(f"AnnData file {path}: not an .h5ad file (suffix {path.suffix!r}); allowed are .h5ad files")
    try:
        return anndata.read_h5ad(path, backed="r") if backed else anndata.read_h5ad(path)
    except Exception as e:  # noqa: BLE001 - h5py/anndata raise many kinds for a broken file: one line
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise DataError(f"AnnData file {path}: not a readable .h5ad file ({first})") from None


def _exact_in_float32(values: np.ndarray) -> bool:
    """Whether ``values`` are all counts (finite non-negative integers) below 2**24, so that float32
    holds them exactly and :func:`check_counts` has nothing to say about them."""
    if values.size == 0:
        return True
    if values.dtype.kind == "f" and not (np.isfinite(values).all() and np.array_equal(values, np.round(values))):
        return False
    return bool(values.min() >= 0 and values.max() < FLOAT32_EXACT)


def _dense_counts(matrix, where: str) -> np.ndarray:
    """The count matrix (cells x genes) as one dense array: float64, or float32 (64-byte aligned) for
    a sparse matrix of :data:`COMPACT_ENTRIES` entries or more whose values are all counts below
    2**24 (exact in float32: the same numbers, half the memory). A scipy sparse matrix (CSR, or CSC
    converted to CSR once: a copy of its nnz) is densified block of rows by block of rows into that
    array, so the peak is the sparse matrix + n*p*8 (or 4) bytes + one block, never a second dense
    copy in the stored dtype."""
    from scipy import sparse

    if matrix is None:
        raise DataError(f"{where}: no count matrix (X is empty); allowed are AnnData with counts in X or a layer")
    if sparse.issparse(matrix):
        csr = sparse.csr_matrix(matrix)
        if csr.dtype.kind not in "biuf":
            raise DataError(f"{where}: counts of dtype {csr.dtype}; allowed values are {COUNTS_ALLOWED}")
        n, p = csr.shape
        if n * p >= COMPACT_ENTRIES and _exact_in_float32(csr.data):
            Y = _aligned_empty((n, p), np.float32)
        else:
            Y = np.empty((n, p), dtype=np.float64)
        for r in row_blocks(n, p):
            Y[r] = csr[r].toarray()
        return Y
    return _floats(np.asarray(matrix), where, COUNTS_ALLOWED)


def _sparse_counts(matrix, where: str):
    """The counts of an AnnData as :class:`Data` holds sparse counts (:func:`sparse_counts`): a CSR
    matrix as it is stored (CSC or dense: converted once, duplicates summed), its values float32
    where there are :data:`COMPACT_ENTRIES` entries or more and all are counts below 2**24, else
    float64; each stored value checked as :func:`check_counts` checks a dense one (one line naming
    the row and column)."""
    from scipy import sparse

    if matrix is None:
        raise DataError(f"{where}: no count matrix (X is empty); allowed are AnnData with counts in X or a layer")
    csr = sparse.csr_array(matrix)
    if 0 in csr.shape:  # as check_counts says it of dense counts
        raise DataError(
            f"{where}: counts: must be a non-empty 2-d table (n samples x p variables), got shape {csr.shape}"
        )
    if csr.dtype.kind not in "biuf":
        raise DataError(f"{where}: counts of dtype {csr.dtype}; allowed values are {COUNTS_ALLOWED}")
    csr.sum_duplicates()  # canonical: sorted columns, no duplicates
    values = csr.data
    checks = (
        ("missing or infinite", lambda v: ~np.isfinite(v)),
        ("negative", lambda v: v < 0),
        ("non-integer", lambda v: v != np.round(v)),
        ("too large", lambda v: v > COUNTS_MAX),
    )
    for what, bad in checks if values.dtype.kind == "f" else checks[1:2]:
        found = np.flatnonzero(bad(values))
        if found.size:
            k = int(found[0])
            r, c = int(np.searchsorted(csr.indptr, k, side="right")) - 1, int(csr.indices[k])
            raise DataError(
                f"{where}: {what} count {float(values[k])!r} at row {r + 1}, column {c + 1}; allowed values are "
                f"{COUNTS_ALLOWED} up to {COUNTS_MAX!r}"
            )
    compact = csr.shape[0] * csr.shape[1] >= COMPACT_ENTRIES and _exact_in_float32(values)
    return sparse_counts(csr.indptr, csr.indices, values.astype(np.float32 if compact else np.float64), csr.shape)


def _obs_column(adata, column: str, where: str, what: str, also: str = ""):
    """The ``obs`` column ``column`` (a pandas Series), or one line naming the columns there are
    (after ``also``: the values allowed besides them)."""
    if column not in adata.obs.columns:
        allowed = ", ".join(map(str, adata.obs.columns)) or "none (obs has no columns)"
        raise DataError(f"{where}: {what} {column!r} is not an obs column; allowed values are {also}{allowed}")
    return adata.obs[column]


def _anndata_covariates(adata, covariates: Sequence[str], where: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """Intercept + the named obs columns: numeric (and boolean) ones as they are, categorical and
    text ones one-hot with the first level (sorted as text) dropped (:func:`design_matrix`)."""
    n = adata.n_obs
    table: dict[str, np.ndarray] = {}
    categorical = []
    for col in covariates:
        series = _obs_column(adata, col, where, "covariate")
        missing = np.flatnonzero(series.isna().to_numpy())
        if missing.size:
            raise DataError(
                f"{where}: covariate {col!r} is missing at row {missing[0] + 1} (cell {adata.obs_names[missing[0]]!r}); "
                f"allowed values are {COVARIATES_ALLOWED}"
            )
        if series.dtype.kind in "biuf":
            table[col] = series.to_numpy(dtype=np.float64)
        else:  # categorical, text: the levels as text
            table[col] = series.astype(str).to_numpy()
            categorical.append(col)
    X, names = design_matrix(table, list(covariates), n, categorical)
    _check_finite(X, f"{where}: covariates", COVARIATES_ALLOWED)
    return X, names


def _anndata_offsets(adata, Y: np.ndarray, offsets: str, where: str, rows: tuple[int, int] | None = None) -> np.ndarray:
    """Log offsets (n, p): the log library size (each cell's total count), none, or the log of the
    positive totals in an obs column, the same for each cell's p counts (:func:`row_offsets`: a view
    of the (n, 1) column)."""
    if offsets == "none":
        return row_offsets(np.zeros(Y.shape[0]), Y.shape[1])
    if offsets == "library_size":
        totals = Y.sum(axis=1, dtype=np.float64)  # integers: exact in any order, float32 counts too
        empty = np.flatnonzero(totals == 0)
        if empty.size:
            r = int(empty[0]) + (0 if rows is None else rows[0])
            raise DataError(
                f"{where}: cell {adata.obs_names[r]!r} (row {r + 1}) has no counts, so its library size is 0 and "
                f"its log offset -inf; allowed with offsets=library_size are cells with at least one count "
                f"(drop the {empty.size} empty cell(s), or offsets=none or an obs column of totals)"
            )
    else:
        series = _obs_column(adata, offsets, where, "offsets", f"{', '.join(ANNDATA_OFFSETS)} or the obs columns: ")
        allowed = f"finite numbers > 0 (each cell's total, logged here), or {', '.join(ANNDATA_OFFSETS)}"
        label = f"{where}: offsets column {offsets!r}"
        if series.dtype.kind not in "biuf":
            raise DataError(f"{label}: values of type {series.dtype}; allowed values are {allowed}")
        totals = series.to_numpy(dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(totals) | (totals <= 0))
        if bad.size:
            r = int(bad[0])
            raise DataError(f"{label}: value {totals[r]:g} at row {r + 1}; allowed values are {allowed}")
        if rows is not None:
            totals = totals[rows[0] : rows[1]]
    return row_offsets(np.log(totals), Y.shape[1])


def load_anndata(
    source,
    layer: str | None = None,
    covariates: Sequence[str] = (),
    offsets: str = "library_size",
    *,
    name: str | None = None,
    sparse: bool = False,
    rows: tuple[int, int] | None = None,
) -> Data:
    """Counts of an AnnData (single-cell data: rows are cells, columns genes), with covariates and
    offsets from its ``obs`` table. Needs the ``anndata`` package (the ``single-cell`` extra).

    Args:
        source: the path of an ``.h5ad`` file (read whole), or an ``anndata.AnnData``.
        layer: the layer holding the counts (``adata.layers[layer]``); None: ``adata.X``. Dense or
            scipy sparse (CSR, CSC): a sparse matrix is densified block of rows by block of rows into
            one float64 ``n x p`` array (peak: the sparse matrix + ``n*p*8`` bytes; the fit needs
            the dense counts, and the offsets are another ``n*p*8`` bytes).
        covariates: names of ``obs`` columns: numeric ones as they are, categorical and text ones
            one-hot with their first level (sorted as text) dropped; an intercept is always added.
        offsets: ``"library_size"``: the log of each cell's total count, the same for its p genes;
            ``"none"``; else the name of an ``obs`` column holding each cell's positive total (logged
            here). The two words win over obs columns of the same name.
        name: the data set's name; default the file's stem (``"anndata"`` for an object).
        sparse: keep the counts sparse, as they are stored (CSR; a CSC or dense matrix converted
            once): :attr:`Data.sparse`, for a PLN-PCA fit with ``block_rows`` (memory: the
            non-zeros, never ``n x p``).
        rows: ``(start, stop)``: only those cells' counts (:attr:`Data.part`): a file is opened in
            backed mode (``anndata.read_h5ad(path, backed="r")``) and ``X[start:stop]`` alone read
            from it (a layer: anndata reads layers whole even then, so its rows are kept after);
            ``obs`` (the covariates, an obs column of totals) is read whole, its n rows small.

    Returns:
        The :class:`Data`, ``columns`` the genes (``var_names``).

    Raises:
        DataError: anndata not installed (the install command); a missing, non-``.h5ad`` or unreadable
            file; a layer or obs column that is not there (the ones that are); a count that is not a
            non-negative integer, a cell without counts under ``library_size``, a non-positive total,
            a missing covariate, linearly dependent covariates: one line naming the file, the layer
            or column and the row.
    """
    anndata = _anndata_module()
    if isinstance(source, anndata.AnnData):
        adata, where, default_name = source, "AnnData", "anndata"
    elif isinstance(source, (str, Path)):
        path = Path(source)
        adata = _read_h5ad(path, anndata, backed=rows is not None)
        where, default_name = f"AnnData file {path}", path.stem
    else:
        raise TypeError(f"source: got a {type(source).__name__}; allowed are a path of an .h5ad file or an AnnData")
    if rows is not None and not (0 <= rows[0] < rows[1] <= adata.n_obs):
        raise DataError(f"{where}: rows={tuple(rows)!r}: allowed are (start, stop) within its {adata.n_obs} cells")
    if layer is None:
        matrix, counts = adata.X, f"{where} (X)"
    elif layer not in adata.layers:
        allowed = ", ".join(map(str, adata.layers.keys())) or "none (the file has no layers; layer=null reads X)"
        raise DataError(f"{where}: no layer {layer!r}; allowed values are {allowed}")
    else:
        matrix, counts = adata.layers[layer], f"{where} (layer {layer!r})"
    if rows is not None:
        matrix = matrix[rows[0] : rows[1]]  # backed X: only these rows read from the file
    if sparse:
        Y = _sparse_counts(matrix, counts)
    else:
        Y = _dense_counts(matrix, counts)
        try:
            Y = check_counts(Y, keep_float32=True)
        except DataError as e:
            raise DataError(f"{counts}: {e}") from None
    columns = tuple(map(str, adata.var_names))
    if rows is None:  # a gene without counts in some cells says nothing of the whole file's
        warn_empty_columns(Y, counts, columns)
    O = _anndata_offsets(adata, Y, offsets, where if offsets not in ANNDATA_OFFSETS else counts, rows)
    covariates = (covariates,) if isinstance(covariates, str) else tuple(covariates)  # "batch": one column
    X, names = _anndata_covariates(adata, covariates, where)
    check_full_rank(X, names, where)
    cells = tuple(map(str, adata.obs_names))
    if rows is None:
        return Data(Y, O, X, name or default_name, names, columns=columns, row_names=cells)
    part = RowPart(rows[0], rows[1], adata.n_obs)
    return Data(
        Y,
        O,
        X[rows[0] : rows[1]],
        name or default_name,
        names,
        columns=columns,
        part=part,
        row_names=cells[rows[0] : rows[1]],
    )


# ---------------------------------------------------------------- low-rank synthetic counts (PLN-PCA)
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
