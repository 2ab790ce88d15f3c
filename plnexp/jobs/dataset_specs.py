"""The data sets a config may name (``dataset=``): each a frozen spec of where its counts come from
(:class:`OaksData`, :class:`SyntheticData`, :class:`CsvData`, :class:`AnndataData`,
:class:`SyntheticPcaData`), its fields checked when it is built (one line naming the key and its
allowed values), and how it loads (:meth:`DatasetSpec.load`, its rows: :meth:`DatasetSpec.load_rows`).
The config's union of them and the registry by name: :mod:`plnexp.jobs.config`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar


from ..core.data import Data
from ..core.oaks import OAKS_COVARIATES
from ..system.paths import install_command
from .schema import ConfigError, File, Flag, Integer, Names, Number, Text, check_fields, checked, setting

CSV_FILES = "paths of existing CSV files"


# ---------------------------------------------------------------- data sets
@dataclass(frozen=True)
class DatasetSpec:
    """What every data set has: ``replication``, the number of times its rows are stacked (the
    seed's way of making a data set bigger), an axis of its own for oaks, synthetic and CSV data
    alike. Subclasses declare their own fields and ``_load`` (the data before replication)."""

    # (field, not setting: mypy reads kw_only from dataclasses.field alone)
    replication: int = field(default=1, kw_only=True, metadata=checked(Integer(1)))
    # the best known ELBO of the data as fitted (exact log y!; plnexp.fitting.optimum): None = shipped, cached
    # or computed once; false = none (no convergence metrics). Scores runs, changes no fit (not hashed)
    optimum: float | bool | None = field(default=None, kw_only=True)
    name: ClassVar[str]
    # drawn from its settings by plnexp's code (synthetic data): its config and plnexp's commit say
    # what its arrays are, so ``resume`` need not draw it again to compare digests
    drawn: ClassVar[bool] = False

    def __post_init__(self):
        check_fields(self, "dataset.")  # every subclass's declared fields too
        opt = self.optimum
        if opt is True or not (
            opt is None or opt is False or (isinstance(opt, (int, float)) and math.isfinite(opt) and opt != 0)
        ):
            raise ConfigError(
                f"dataset.optimum={opt!r}: allowed values are null (the best known ELBO: shipped, cached or "
                "computed once), false (none) or the ELBO (a finite non-zero number)"
            )
        if opt is not None and opt is not False:
            object.__setattr__(self, "optimum", float(opt))

    @property
    def base_label(self) -> str:
        raise NotImplementedError

    @property
    def label_tail(self) -> str:
        """After the replication: the covariates' names, where a data set names them (oaks, anndata:
        ``oaks_x100+tree``, ``anndata_pbmc_x4+batch``)."""
        names = getattr(self, "covariates", ())
        return "+" + "+".join(names) if isinstance(names, tuple) and names else ""

    @property
    def label(self) -> str:
        """``oaks``, ``oaks_x100+tree``, ``synthetic_n2000_p50_d2_s0_x10``, ``csv_counts_x4``..."""
        times = f"_x{self.replication}" if self.replication > 1 else ""
        return f"{self.base_label}{times}{self.label_tail}"

    # whether _load reads rows alone (CSV and .h5ad rows, simulate_pca's blocks); else it reads them whole
    reads_rows: ClassVar[bool] = False

    def _load(self, rows: tuple[int, int] | None = None) -> Data:
        """The data before replication; rows ``start:stop`` of it alone where ``rows`` and :attr:`reads_rows`."""
        raise NotImplementedError

    def load(self) -> Data:
        from ..core.data_rows import replicate

        return replicate(self._load(), self.replication)

    def _rows(self) -> int:
        """The rows of the data before replication (read without the data where the source allows)."""
        return self._load().n

    def rows(self) -> int:
        """The number of rows of :meth:`load`'s data."""
        return self._rows() * self.replication

    def load_rows(self, start: int, stop: int) -> Data:
        """Rows ``start:stop`` of :meth:`load`'s data (:attr:`~plnexp.core.data.Data.part` set), the same
        numbers, read alone where the source allows (CSV and ``.h5ad`` rows, :func:`~plnexp.core.simulation.simulate_pca`'s
        blocks); replicated data: the base data read once, then only these rows made. What one process
        of a fit across processes reads (:mod:`plnexp.experiment.processes`)."""
        from ..core.data_rows import replicate_rows, take_rows

        if self.replication > 1:
            return replicate_rows(self._load(), self.replication, start, stop)
        return self._load((start, stop)) if self.reads_rows else take_rows(self._load(), start, stop)


@dataclass(frozen=True)
class OaksData(DatasetSpec):
    covariates: tuple[str, ...] = setting(Names(OAKS_COVARIATES), ())  # each a column of the oaks data
    name: ClassVar[str] = "oaks"

    base_label: ClassVar[str] = "oaks"

    def _load(self, rows: tuple[int, int] | None = None) -> Data:
        from ..core.oaks import load_oaks

        return load_oaks(1, self.covariates)


@dataclass(frozen=True)
class SyntheticData(DatasetSpec):
    n: int = setting(Integer(2), 2000)
    p: int = setting(Integer(1), 50)
    d: int = setting(Integer(1), 2)
    seed: int = setting(Integer(0), 0)
    name: ClassVar[str] = "synthetic"
    drawn: ClassVar[bool] = True

    @property
    def base_label(self) -> str:
        return f"synthetic_n{self.n}_p{self.p}_d{self.d}_s{self.seed}"

    def _load(self, rows: tuple[int, int] | None = None) -> Data:
        from ..core.simulation import simulate

        return simulate(self.n, self.p, self.d, self.seed)

    def _rows(self) -> int:
        return self.n


@dataclass(frozen=True)
class CsvData(DatasetSpec):
    counts: str = setting(File(CSV_FILES))
    offsets: str | None = setting(File(CSV_FILES, nullable=True), None)
    covariates: str | None = setting(File(CSV_FILES, nullable=True), None)
    log_offsets: bool = setting(Flag(), False)
    name: ClassVar[str] = "csv"
    reads_rows: ClassVar[bool] = True

    @property
    def base_label(self) -> str:
        return f"csv_{Path(self.counts).stem}"

    def _load(self, rows: tuple[int, int] | None = None) -> Data:
        """Raises :class:`~plnexp.core.data.DataError` (one line naming the file) for a bad file."""
        from ..core.csv_files import load_csv

        return load_csv(self.counts, self.offsets, self.covariates, log_offsets=self.log_offsets, rows=rows)

    def _rows(self) -> int:
        from ..core.csv_files import csv_rows

        return csv_rows(self.counts)


@dataclass(frozen=True)
class AnndataData(DatasetSpec):
    """Single-cell counts of an ``.h5ad`` file (:func:`plnexp.core.anndata_counts.load_anndata`; the ``single-cell``
    extra). The file, anndata and the keys' types are checked here; the layer and obs columns when
    the file is read (before any run: a :class:`~plnexp.core.data.DataError` line naming the ones there are)."""

    path: str = setting(File("paths of existing .h5ad files", ".h5ad"))
    layer: str | None = setting(Text("null (X) or the name of a layer", nullable=True), None)
    covariates: tuple[str, ...] = setting(Text("names of obs columns", many=True), ())
    offsets: str = setting(Text("library_size, none or the name of an obs column of positive totals"), "library_size")
    sparse: bool = setting(Flag(), False)  # counts kept sparse (CSR), for model=pca with block_rows
    name: ClassVar[str] = "anndata"
    reads_rows: ClassVar[bool] = True

    def __post_init__(self):
        super().__post_init__()
        import importlib.util

        if importlib.util.find_spec("anndata") is None:
            raise ConfigError(
                "dataset=anndata: needs the anndata package, which is not installed; install plnexp's "
                f"single-cell extra ({install_command('single-cell')})"
            )

    @property
    def base_label(self) -> str:
        layer = f"_{self.layer}" if self.layer else ""
        return f"anndata_{Path(self.path).stem}{layer}" + ("_sparse" if self.sparse else "")

    def _load(self, rows: tuple[int, int] | None = None) -> Data:
        """Raises :class:`~plnexp.core.data.DataError` (one line naming the file) for a bad file."""
        from ..core.anndata_counts import load_anndata

        return load_anndata(self.path, self.layer, self.covariates, self.offsets, sparse=self.sparse, rows=rows)

    def _rows(self) -> int:
        import anndata

        return int(anndata.read_h5ad(self.path, backed="r").n_obs)


@dataclass(frozen=True)
class SyntheticPcaData(DatasetSpec):
    """Counts drawn from the low-rank PLN-PCA model (:func:`plnexp.core.simulation.simulate_pca`)."""

    n: int = setting(Integer(2), 2000)
    p: int = setting(Integer(1), 200)
    q: int = setting(Integer(1), 5)
    d: int = setting(Integer(1), 1)
    zero_fraction: float | None = setting(
        Number(
            0,
            1,
            "null (as drawn) or numbers in (0, 1) (the fraction of zero counts: 0.8 to 0.95 in single-cell data)",
            low_open=True,
            high_open=True,
            nullable=True,
        ),
        None,
    )
    seed: int = setting(Integer(0), 0)
    sparse: bool = setting(Flag(), False)  # counts kept sparse (CSR), for model=pca with block_rows
    name: ClassVar[str] = "synthetic_pca"
    reads_rows: ClassVar[bool] = True
    drawn: ClassVar[bool] = True

    def __post_init__(self):
        super().__post_init__()
        if self.q > self.p:
            raise ConfigError(f"dataset.q={self.q!r}: allowed values are integers from 1 to dataset.p={self.p}")

    @property
    def base_label(self) -> str:
        from ..core.simulation import pca_name

        tail = "_sparse" if self.sparse else ""
        return pca_name(self.n, self.p, self.q, self.d, self.zero_fraction, self.seed) + tail

    def _load(self, rows: tuple[int, int] | None = None) -> Data:
        from ..core.simulation import simulate_pca

        return simulate_pca(
            self.n, self.p, self.q, self.zero_fraction, self.d, self.seed, sparse=self.sparse, rows=rows
        )

    def _rows(self) -> int:
        return self.n
