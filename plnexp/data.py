"""Data sets: counts in memory (:func:`as_data`), the shipped oaks data, CSV files, and simulation
from the PLN generative model.

A :class:`Data` holds host (numpy, float64) arrays; :meth:`Data.to_device` casts and places them
for a fit. Offsets are always stored on the log scale. Every way in (:func:`as_data`,
:func:`load_csv`, :func:`load_oaks`, :func:`simulate`) checks the values with the same functions
(:func:`check_counts`, :func:`check_offsets`, :func:`check_full_rank`): a problem is one
:class:`DataError` line naming the argument or file, the row and column, and what is allowed.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from collections.abc import Mapping, Sequence

import numpy as np

OAKS_COVARIATES = ("tree", "orientation", "distTOground")


class DataError(ValueError):
    """A data file or array that cannot be fitted; the message names the file and the problem."""


class DataWarning(UserWarning):
    """Data that can be fitted but not meaningfully in part (one line naming the columns)."""


def warn_empty_columns(Y: np.ndarray, source: str, columns: Sequence[str] | None = None) -> list[int]:
    """Warn, in one line naming them, about count columns that are zero in every row (common in
    microbiome tables): the fit drives their mean to -inf (B, M grow without bound) so their
    estimates mean nothing. Returns their 0-based indices."""
    empty = [int(j) for j in np.flatnonzero(~(np.asarray(Y) != 0).any(axis=0))]
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


@dataclass(frozen=True, eq=False)
class Data:
    """A data set ready to fit: n samples, p count variables, d covariates (intercept included).

    Build one with :func:`as_data` (counts in memory), :func:`load_csv`, :func:`load_oaks` or
    :func:`simulate`, which check the values; :func:`plnexp.fit` also accepts the counts directly and
    calls :func:`as_data` itself. Constructing ``Data`` by hand skips those checks.

    Attributes:
        Y: counts, ``(n, p)`` float64 holding non-negative integers.
        O: offsets on the log scale, ``(n, p)`` float64 (zeros: no offsets).
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
        """sum_ij log(Y_ij!) in float64, computed once per data set (the fit's constant)."""
        from .reference import log_factorial_sum

        return log_factorial_sum(self.Y)

    def digest(self) -> str:
        """sha256 of Y, O and X (float64 bytes): identifies the data a run was fitted on."""
        h = hashlib.sha256()
        for a in (self.Y, self.O, self.X):
            h.update(str(a.shape).encode())
            h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
        return h.hexdigest()

    def to_device(self, dtype, device):
        """The arrays as :class:`plnexp.model.Arrays` of ``dtype``, committed to ``device``."""
        import jax

        from .model import Arrays

        return Arrays(*(jax.device_put(np.asarray(a, dtype=dtype), device) for a in (self.Y, self.O, self.X)))


def replicate(data: Data, times: int) -> Data:
    """Stack the rows ``times`` times (the seed's way of making oaks bigger)."""
    if int(times) != times or times < 1:
        raise DataError(f"replication={times!r}: must be an integer >= 1")
    if times == 1:
        return data
    rep = lambda a: np.tile(a, (int(times), 1))
    return Data(
        rep(data.Y),
        rep(data.O),
        rep(data.X),
        f"{data.name}_x{times}",
        data.covariate_names,
        data.truth,
        data.columns,
    )


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


def _read_csv(path: Path, what: str) -> tuple[list[str], np.ndarray]:
    """Read a numeric CSV with a header row; one clear DataError for any problem."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} file {path}: not found")
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    if len(lines) < 2:
        raise DataError(f"{what} file {path}: empty (need a header row and at least one data row)")
    header = [h.strip().strip('"') for h in lines[0].split(",")]
    rows = []
    for i, ln in enumerate(lines[1:], start=2):
        cells = ln.split(",")
        if len(cells) != len(header):
            raise DataError(f"{what} file {path}: line {i} has {len(cells)} fields, header has {len(header)}")
        try:
            rows.append([_number(c) for c in cells])
        except ValueError:  # which cell, counted as the value checks count (row 1: the first data row)
            j = next(j for j, c in enumerate(cells) if not _is_number(c))
            raise DataError(
                f"{what} file {path}: non-numeric value {cells[j].strip()!r} at row {i - 1}, column {j + 1}; "
                f"allowed values are {NUMBERS_ALLOWED}"
            ) from None
    return header, np.asarray(rows, dtype=np.float64)


def _check_finite(a: np.ndarray, label: str, allowed: str) -> None:
    bad = ~np.isfinite(a)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        kind = "missing (NaN)" if np.isnan(a[r, c]) else "infinite"
        raise DataError(f"{label}: {kind} value at row {r + 1}, column {c + 1}; allowed values are {allowed}")


COUNTS_ALLOWED = "non-negative integers"
COVARIATES_ALLOWED = "finite numbers or text categories"


def check_counts(Y: np.ndarray, source: str | Path | None = None) -> np.ndarray:
    """Counts must be a non-empty 2-d table of finite non-negative integers; returns them as
    float64. ``source``: the file they were read from (None: the ``counts`` argument)."""
    label = _label("counts", source)
    Y = np.asarray(Y, dtype=np.float64)
    if Y.ndim != 2 or Y.size == 0:
        raise DataError(f"{label}: must be a non-empty 2-d table (n samples x p variables), got shape {Y.shape}")
    _check_finite(Y, label, COUNTS_ALLOWED)
    if (Y < 0).any():
        r, c = np.argwhere(Y < 0)[0]
        raise DataError(
            f"{label}: negative count {Y[r, c]:g} at row {r + 1}, column {c + 1}; allowed values are {COUNTS_ALLOWED}"
        )
    if (Y != np.round(Y)).any():
        r, c = np.argwhere(Y != np.round(Y))[0]
        raise DataError(
            f"{label}: non-integer count {Y[r, c]:g} at row {r + 1}, column {c + 1}; allowed values are {COUNTS_ALLOWED}"
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
    table: Mapping[str, np.ndarray | Sequence[str]], columns: Sequence[str], n: int
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Intercept + the named columns; text columns become one-hot with the first level dropped."""
    blocks, names = [np.ones((n, 1))], ["intercept"]
    for col in columns:
        if col not in table:
            raise DataError(f"covariate {col!r}: not in the covariates table; allowed: {sorted(table)}")
        values = np.asarray(table[col])
        try:
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
    header, Y = _read_csv(folder / "counts.csv", "counts")
    _, totals = _read_csv(folder / "offsets.csv", "offsets")
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
) -> Data:
    """Load counts (header + integer rows), optional offsets and covariates from CSV files.

    ``offsets`` are raw positive totals (logged here) unless ``log_offsets=True``. Covariates:
    all columns of the file (text columns one-hot encoded) unless ``covariate_columns`` names
    some; an intercept is always added. Any problem raises :class:`DataError` naming the file.
    """
    header, Y = _read_csv(counts, "counts")
    Y = check_counts(Y, str(counts))
    warn_empty_columns(Y, f"file {counts}", header)
    n, p = Y.shape
    if offsets is None:
        O = np.zeros_like(Y)
    else:
        _, O = _read_csv(offsets, "offsets")
        if O.shape != Y.shape:
            raise DataError(f"offsets file {offsets}: shape {O.shape} does not match counts {Y.shape}")
        O = check_offsets(O, offsets, log_offsets)
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
        rows = len(next(iter(table.values())))
        if rows != n:
            raise DataError(f"covariates file {path}: {rows} rows, counts have {n}")
        X, names = design_matrix(table, covariate_columns if covariate_columns is not None else list(table), n)
        _check_finite(X, _label("covariates", path), COVARIATES_ALLOWED)
    check_full_rank(X, names, covariates)
    return Data(Y, O, X, name or Path(counts).stem, names, columns=tuple(header))


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
        O = np.repeat(O.reshape(n, 1), p, axis=1)
    elif O.shape != (n, p):
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
        DataError: a value that cannot be fitted: a negative, non-integer, missing (NaN) or
            infinite count, a non-positive offset, a shape that does not match the counts'
            (``n x p``), linearly dependent covariates: one line naming the argument and, for a
            value, its row and column.
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
    O = np.zeros_like(Y) if offsets is None else _offsets_argument(offsets, Y.shape, log_offsets)
    X, names = (
        (np.ones((Y.shape[0], 1)), ("intercept",))
        if covariates is None
        else _covariates_argument(covariates, Y.shape[0])
    )
    check_full_rank(X, names, None)
    return Data(Y, O, X, name or "data", names, columns=columns)


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
