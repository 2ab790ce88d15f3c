"""CSV files: counts (a header row, then integer rows), offsets and covariates read as a
:class:`~plnexp.core.data.Data` (:func:`load_csv`), whole or only some rows, line by line; the rows'
names from an index column (:mod:`plnexp.core.row_names`)."""

from __future__ import annotations

from pathlib import Path
from collections.abc import Sequence

import numpy as np

from . import row_names
from .data import Data, DataError, RowPart
from .data_checks import COVARIATES_ALLOWED, _check_finite, _label, check_counts, check_full_rank, check_offsets
from .data_checks import design_matrix, warn_empty_columns

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


def _read_text_table(path) -> dict[str, np.ndarray]:
    lines = [ln.split(",") for ln in Path(path).read_text().splitlines() if ln.strip()]
    header = [h.strip().strip('"') for h in lines[0]]
    cols = list(zip(*lines[1:]))
    return {h: np.asarray([c.strip().strip('"') for c in col]) for h, col in zip(header, cols)}


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
