"""Single-cell counts of an AnnData (a ``.h5ad`` file or an ``anndata.AnnData``: the ``single-cell``
extra) as a :class:`~plnexp.core.data.Data` (:func:`load_anndata`): the counts of X or a layer, dense
(float32 from :data:`~plnexp.core.data.COMPACT_ENTRIES` counts on, when exact) or kept sparse,
covariates and offsets from ``obs``, whole or only some cells (backed mode)."""

from __future__ import annotations

from pathlib import Path
from collections.abc import Sequence

import numpy as np

from .data import COMPACT_ENTRIES, FLOAT32_EXACT, Data, DataError, RowPart, _aligned_empty, row_offsets, sparse_counts
from .data_checks import COUNTS_ALLOWED, COUNTS_MAX, COVARIATES_ALLOWED, _check_finite, _floats, check_counts
from .data_checks import check_full_rank, design_matrix, warn_empty_columns
from .reference import row_blocks

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
    if matrix is None:
        raise DataError(f"{counts}: no count matrix (X is empty); allowed are AnnData with counts in X or a layer")
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
    kept = slice(None) if rows is None else slice(*rows)
    part = None if rows is None else RowPart(rows[0], rows[1], adata.n_obs)
    return Data(Y, O, X[kept], name or default_name, names, columns=columns, part=part, row_names=cells[kept])
