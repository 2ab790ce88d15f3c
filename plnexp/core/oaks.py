"""The oaks powdery-mildew data shipped with plnexp (plnexp/datasets/oaks, CSV files): :func:`load_oaks`."""

from __future__ import annotations

from importlib import resources
from collections.abc import Sequence

import numpy as np

from .csv_files import _read_csv, _read_text_table
from .data import Data
from .data_checks import check_counts, design_matrix, warn_empty_columns
from .data_rows import replicate

OAKS_COVARIATES = ("tree", "orientation", "distTOground")


def _oaks_dir():
    return resources.files("plnexp.datasets") / "oaks"


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
