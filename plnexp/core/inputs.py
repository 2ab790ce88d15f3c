"""What :func:`plnexp.fit` accepts as its data, turned into a :class:`~plnexp.core.data.Data`:
counts in memory (:func:`~plnexp.core.data.as_data`) or an AnnData (:func:`~plnexp.core.data.load_anndata`:
its counts in X or a layer, obs columns as covariates, offsets the library size or an obs column)."""

from __future__ import annotations

import numpy as np

from .data import Data, as_data, load_anndata

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
