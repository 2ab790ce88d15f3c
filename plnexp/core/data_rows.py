"""A data set's rows: which rows a JAX process of a fit across processes holds (:func:`row_range`),
those rows taken (:func:`take_rows`), a data set stacked on itself (:func:`replicate`, and its rows
alone: :func:`replicate_rows`); its digest read a block of rows at a time
(:func:`~plnexp.core.data.digest_by_rows`) is the data's own."""

from __future__ import annotations

import numpy as np

from .data import Data, DataError, RowPart, _row_column, row_offsets
from .data import digest_by_rows as digest_by_rows  # a data set's digest read by rows: where Data.digest is
from .reference import is_sparse


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


def _rows(data: Data, index, name: str, part: RowPart | None = None) -> Data:
    """The rows ``index`` (a slice, or row numbers) of ``data``, named ``name``: offsets one per row
    stay a view of their column (:func:`~plnexp.core.data.row_offsets`), dense counts contiguous."""
    column = _row_column(np.asarray(data.O))
    O = np.asarray(data.O)[index] if column is None else row_offsets(column[index], data.p)
    Y = data.Y[index]
    Y = Y if is_sparse(Y) else np.ascontiguousarray(Y)
    X = np.asarray(data.X)[index]
    return Data(Y, O, X, name, data.covariate_names, data.truth, data.columns, part)


def replicate(data: Data, times: int) -> Data:
    """Stack the rows ``times`` times (the seed's way of making oaks bigger)."""
    if int(times) != times or times < 1:
        raise DataError(f"replication={times!r}: must be an integer >= 1")
    if times == 1:
        return data
    return _rows(data, np.arange(data.n * int(times)) % data.n, f"{data.name}_x{times}")


def take_rows(data: Data, start: int, stop: int) -> Data:
    """Rows ``start:stop`` of the whole ``data`` (:attr:`Data.part` set): for a source that cannot be
    read by rows (the draw of :func:`simulate`), the data read whole, then only these rows kept."""
    return _rows(data, slice(start, stop), data.name, RowPart(start, stop, data.n))


def replicate_rows(data: Data, times: int, start: int, stop: int) -> Data:
    """Rows ``start:stop`` of :func:`replicate` ``(data, times)`` without its other rows: row ``i`` is
    the base data's row ``i % n`` (oaks x 1,724 is 116 rows read once, then only one process's rows)."""
    n = data.n
    if not (0 <= start <= stop <= n * times):
        raise DataError(f"rows {start}:{stop}: allowed are rows within the {n * times} of replication={times}")
    name = f"{data.name}_x{times}" if times > 1 else data.name
    return _rows(data, np.arange(start, stop) % n, name, RowPart(start, stop, n * times))
