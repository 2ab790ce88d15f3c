"""What :func:`plnexp.fit` accepts as its data, turned into a :class:`~plnexp.core.data.Data`:
counts in memory (:func:`as_data`: a NumPy array or a pandas DataFrame, offsets and covariates
beside them) or an AnnData (:func:`~plnexp.core.anndata_counts.load_anndata`: its counts in X or a
layer, obs columns as covariates, offsets the library size or an obs column)."""

from __future__ import annotations

import numpy as np

from . import row_names
from .anndata_counts import load_anndata
from .data import Data, DataError, row_offsets
from .data_checks import COUNTS_ALLOWED, COVARIATES_ALLOWED, _check_finite, _floats, check_counts, check_full_rank
from .data_checks import check_offsets, design_matrix, warn_empty_columns

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


FIT_ACCEPTS = (
    "a NumPy array (n samples x p variables), a pandas DataFrame, an anndata.AnnData (plnexp.load_anndata reads it) "
    "or a plnexp.Data (plnexp.load_csv, plnexp.load_oaks, plnexp.as_data, plnexp.simulate)"
)


def is_anndata(value) -> bool:
    """Whether ``value`` is an ``anndata.AnnData`` (found by its type, anndata never imported here)."""
    return any(t.__name__ == "AnnData" and t.__module__.startswith("anndata") for t in type(value).__mro__)


def to_data(data, offsets=None, covariates=None, *, layer: str | None = None, sparse: bool = False) -> Data:
    """``data`` as a :class:`Data`. An AnnData: ``layer`` (None: X), ``covariates`` obs column names,
    ``offsets`` ``"library_size"`` (the default), ``"none"`` or an obs column of totals, as
    :func:`load_anndata` reads them; ``sparse``: its counts kept sparse (for a fit that reads them
    so: PLN-PCA with ``block_rows``). Anything else: :func:`as_data` (``layer`` refused in one line)."""
    if is_anndata(data):
        if covariates is not None and isinstance(covariates, str):
            covariates = (covariates,)
        return load_anndata(
            data,
            layer,
            tuple(covariates or ()),
            "library_size" if offsets is None else offsets,
            name="anndata",
            sparse=sparse,
        )
    if layer is not None:
        raise TypeError(f"layer={layer!r}: allowed only with data given as an AnnData (got a {type(data).__name__})")
    if not isinstance(data, (Data, np.ndarray)) and not hasattr(data, "to_numpy"):
        raise TypeError(
            f"counts: got a {type(data).__name__}; allowed are {FIT_ACCEPTS} (np.asarray(...) converts other arrays)"
        )
    return as_data(data, offsets, covariates)
