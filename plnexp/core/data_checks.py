"""The checks every way in (:func:`plnexp.core.inputs.as_data`, :func:`plnexp.core.csv_files.load_csv`,
:func:`plnexp.core.oaks.load_oaks`, :func:`plnexp.core.anndata_counts.load_anndata`,
:func:`plnexp.core.simulation.simulate`) makes of the values: counts (:func:`check_counts`), offsets
(:func:`check_offsets`), covariates (:func:`design_matrix`, :func:`check_full_rank`), columns without
counts (:func:`warn_empty_columns`). A problem is one :class:`~plnexp.core.data.DataError` line naming
the argument or file, the row and column, and what is allowed."""

from __future__ import annotations

import warnings
from pathlib import Path
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from .data import DataError, DataWarning
from .reference import BLOCK_ENTRIES, is_sparse, row_blocks  # the one block size of the host's n x p reads


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


def _label(what: str, source) -> str:
    """How a message names the values: ``counts file PATH`` for a file, ``counts`` for an argument."""
    return what if source is None else f"{what} file {source}"


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
