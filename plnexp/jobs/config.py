"""The typed experiment config: ``load(DictConfig) -> Config``, frozen, validated once.

This is the only place that turns omegaconf nodes into Python objects; everything below the
runner receives a :class:`Config`, and a fit its :meth:`Config.fit_spec` (no name is parsed again).
Every bad value raises :class:`ConfigError` with one line naming the key and the allowed values: a
field with a simple rule declares it beside its type and default (:mod:`plnexp.jobs.schema`, checked
whenever the dataclass is built, in code too); the rules that span fields are checked in :func:`load`.
Names are resolved into the registries' records: :class:`~plnexp.core.optim.OptimizerSpec`,
:class:`~plnexp.strategies.StrategySpec` (a strategy and its own options),
:class:`~plnexp.core.precision.Precision`, :class:`~plnexp.core.model.Model`. It imports leaf modules only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from ..core.data import Data
from ..core.oaks import OAKS_COVARIATES
from ..core.model import PCA_NAME, check_block_rows
from ..core.optim import OptimizerSpec
from ..system.credentials import refusal, secret_value
from ..system.paths import CONF_DIR, install_command, outputs_dir
from ..core.precision import PRECISIONS, Precision, precision as precision_named
from ..core.problem import GRADIENTS
from ..core.device import DEVICES, resolve_device
from ..fitting.spec import (
    INITS,
    MODEL_NAMES,
    FitSpec,
    TimingSpec,
    cache_choice,
    check_compile_cache,
    default_optimizer,
    model_named,
)
from ..strategies import STRATEGIES, StrategySpec
from .schema import ConfigError, Flag, Integer, Number, OneOf, Text, check_fields, checked, read, setting

GROUPS = ("dataset", "optimizer", "strategy", "device", "precision", "model", "sweep")


OmegaConf.register_new_resolver("plnexp_outputs", lambda: str(outputs_dir()), replace=True)


def group_options(group: str, user_dirs: Sequence[Path] = ()) -> list[str]:
    """The options of a config group: the yaml files in ``conf/<group>/``, and in the same group
    of the user's config folders ``user_dirs`` (``--config-dir``, ``hydra.searchpath``)."""
    return sorted({p.stem for folder in (CONF_DIR, *user_dirs) for p in (folder / group).glob("*.yaml")})


def allowed_options(group: str, user_dirs: Sequence[Path] = ()) -> str:
    """The options of a config group for an error message; where there are none (a broken install
    without its configs), that fact and the folder looked in, never an empty list."""
    return (
        ", ".join(group_options(group, user_dirs))
        or f"none found: no .yaml files in {CONF_DIR / group} (reinstall plnexp: {install_command()})"
    )


def check_configs() -> None:
    """The configs are where plnexp reads them (``plnexp.system.paths.CONF_DIR``): one line if not."""
    if not (CONF_DIR / "config.yaml").is_file():
        raise ConfigError(
            f"configs not found: {CONF_DIR / 'config.yaml'} does not exist (an install without plnexp's conf/); "
            f"reinstall plnexp ({install_command()})"
        )


# the members come from the registries at import time (one list of names each), which mypy cannot enumerate
Device = Enum("Device", {k: k for k in DEVICES}, type=str)  # type: ignore[misc]  # members built from DEVICES
ModelName = Enum("ModelName", {k: k for k in MODEL_NAMES}, type=str)  # type: ignore[misc]  # members built from MODEL_NAMES
Init = Enum("Init", {k: k for k in INITS}, type=str)  # type: ignore[misc]  # members built from INITS
Gradient = Enum("Gradient", {k: k for k in GRADIENTS}, type=str)  # type: ignore[misc]  # members built from GRADIENTS

_E = TypeVar("_E", bound=Enum)


def _choice(key: str, value: Any, enum: type[_E]) -> _E:
    return cast(_E, OneOf(enum)(key, value))


def _model(value: Any) -> tuple[ModelName, int | None, int | None]:
    """``model``: a name (full, profiled) or ``{name: pca, rank: q, block_rows: b or null}`` -> (its
    name, pca's rank or None, pca's rows per block or None)."""
    if not isinstance(value, dict):
        if value == PCA_NAME:
            raise ConfigError(f"model.rank: required for model={PCA_NAME}; allowed values are integers >= 1")
        return _choice("model", value, ModelName), None, None
    _keys("model", value, ("name", "rank", "block_rows"))
    name = _choice("model.name", value.get("name"), ModelName)
    if name.value != PCA_NAME:
        raise ConfigError(f"model.rank: only model={PCA_NAME} has one; allowed keys for model={name.value} are none")
    rank = value.get("rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ConfigError(f"model.rank={rank!r}: allowed values are integers >= 1 (at most the data set's p)")
    try:
        block_rows = check_block_rows(value.get("block_rows"), "model.block_rows", "null")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return name, rank, block_rows


def _precision(value: Any) -> Precision:
    try:
        return precision_named(value)
    except ValueError as e:
        raise ConfigError(str(e)) from None


SECONDS = Number(0, None, "numbers >= 0 (seconds)")
STORE_TIMEOUT_S = 30.0  # store_timeout_s's default (conf/config.yaml)
STORE_TIMEOUT_RANGE = (1, 3600)
# store_timeout_s: how long one call to the store may take, its retries included (seconds)
STORE_TIMEOUT = Number(
    *STORE_TIMEOUT_RANGE, f"numbers from {STORE_TIMEOUT_RANGE[0]} to {STORE_TIMEOUT_RANGE[1]} (seconds)"
)


def min_speedup(value: Any, key: str = "report.min_speedup") -> float:
    """A minimum effect (a factor >= 1: 1.10 names a winner only 10% ahead of the next); one-line
    :class:`ConfigError` naming ``key`` otherwise (the config key, or the report's ``--min-speedup``)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (1 <= value < float("inf")):
        raise ConfigError(
            f"{key}={value!r}: allowed values are numbers >= 1 (a factor: 1.10 names a strategy fastest only "
            "when it is at least 1.10 times as fast as the next)"
        )
    return float(value)


def _keys(key: str, node: dict, allowed) -> None:
    unknown = sorted(set(node) - set(allowed))
    if unknown:
        where = f"{key}." if key else ""
        raise ConfigError(
            f"{where}{unknown[0]}: unknown key; allowed keys{' under ' + key if key else ''} are {', '.join(allowed)}"
        )


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
        """After the replication (oaks: its covariates)."""
        return ""

    @property
    def label(self) -> str:
        """``oaks``, ``oaks_x100+tree``, ``synthetic_n2000_p50_d2_s0_x10``, ``csv_counts_x4``..."""
        times = f"_x{self.replication}" if self.replication > 1 else ""
        return f"{self.base_label}{times}{self.label_tail}"

    def _load(self) -> Data:
        raise NotImplementedError

    def load(self) -> Data:
        from ..core.data_rows import replicate

        return replicate(self._load(), self.replication)

    def _rows(self) -> int:
        """The rows of the data before replication (read without the data where the source allows)."""
        return self._load().n

    def _load_rows(self, start: int, stop: int) -> Data:
        """Rows ``start:stop`` of the data before replication; this default reads them whole first."""
        from ..core.data_rows import take_rows

        return take_rows(self._load(), start, stop)

    def rows(self) -> int:
        """The number of rows of :meth:`load`'s data."""
        return self._rows() * self.replication

    def load_rows(self, start: int, stop: int) -> Data:
        """Rows ``start:stop`` of :meth:`load`'s data (:attr:`~plnexp.core.data.Data.part` set), the same
        numbers, read alone where the source allows (CSV and ``.h5ad`` rows, :func:`~plnexp.core.simulation.simulate_pca`'s
        blocks); replicated data: the base data read once, then only these rows made. What one process
        of a fit across processes reads (:mod:`plnexp.experiment.processes`)."""
        from ..core.data_rows import replicate_rows

        if self.replication == 1:
            return self._load_rows(start, stop)
        return replicate_rows(self._load(), self.replication, start, stop)


@dataclass(frozen=True)
class OaksData(DatasetSpec):
    covariates: tuple[str, ...] = ()
    name: ClassVar[str] = "oaks"

    def __post_init__(self):
        super().__post_init__()
        for c in self.covariates:
            if c not in OAKS_COVARIATES:
                raise ConfigError(f"dataset.covariates={c!r}: allowed values are {', '.join(OAKS_COVARIATES)}")

    base_label: ClassVar[str] = "oaks"

    @property
    def label_tail(self) -> str:  # oaks_x100+tree: the covariates after the replication, as ever
        return "+" + "+".join(self.covariates) if self.covariates else ""

    def _load(self) -> Data:
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

    def _load(self) -> Data:
        from ..core.simulation import simulate

        return simulate(self.n, self.p, self.d, self.seed)

    def _rows(self) -> int:
        return self.n


@dataclass(frozen=True)
class CsvData(DatasetSpec):
    counts: str
    offsets: str | None = None
    covariates: str | None = None
    log_offsets: bool = setting(Flag(), False)
    name: ClassVar[str] = "csv"

    def __post_init__(self):
        super().__post_init__()
        for key in ("counts", "offsets", "covariates"):
            value = getattr(self, key)
            if value is None and key != "counts":
                continue
            if not isinstance(value, str) or not Path(value).is_file():
                raise ConfigError(f"dataset.{key}={value!r}: allowed values are paths of existing CSV files")
            object.__setattr__(self, key, str(Path(value).resolve()))

    @property
    def base_label(self) -> str:
        return f"csv_{Path(self.counts).stem}"

    def _load(self) -> Data:
        """Raises :class:`~plnexp.core.data.DataError` (one line naming the file) for a bad file."""
        from ..core.csv_files import load_csv

        return load_csv(self.counts, self.offsets, self.covariates, log_offsets=self.log_offsets)

    def _rows(self) -> int:
        from ..core.csv_files import csv_rows

        return csv_rows(self.counts)

    def _load_rows(self, start: int, stop: int) -> Data:
        from ..core.csv_files import load_csv

        return load_csv(self.counts, self.offsets, self.covariates, log_offsets=self.log_offsets, rows=(start, stop))


@dataclass(frozen=True)
class AnndataData(DatasetSpec):
    """Single-cell counts of an ``.h5ad`` file (:func:`plnexp.core.anndata_counts.load_anndata`; the ``single-cell``
    extra). The file, anndata and the keys' types are checked here; the layer and obs columns when
    the file is read (before any run: a :class:`~plnexp.core.data.DataError` line naming the ones there are)."""

    path: str
    layer: str | None = None
    covariates: tuple[str, ...] = ()
    offsets: str = "library_size"
    sparse: bool = setting(Flag(), False)  # counts kept sparse (CSR), for model=pca with block_rows
    name: ClassVar[str] = "anndata"

    def __post_init__(self):
        super().__post_init__()
        import importlib.util

        path = self.path
        if not isinstance(path, str) or Path(path).suffix != ".h5ad" or not Path(path).is_file():
            raise ConfigError(f"dataset.path={path!r}: allowed values are paths of existing .h5ad files")
        object.__setattr__(self, "path", str(Path(path).resolve()))
        if importlib.util.find_spec("anndata") is None:
            raise ConfigError(
                "dataset=anndata: needs the anndata package, which is not installed; install plnexp's "
                f"single-cell extra ({install_command('single-cell')})"
            )
        if self.layer is not None and (not isinstance(self.layer, str) or not self.layer):
            raise ConfigError(f"dataset.layer={self.layer!r}: allowed values are null (X) or the name of a layer")
        covariates = self.covariates if isinstance(self.covariates, (list, tuple)) else [self.covariates]
        covariates = () if self.covariates is None else covariates
        for c in covariates:
            if not isinstance(c, str) or not c:
                raise ConfigError(f"dataset.covariates={c!r}: allowed values are names of obs columns")
        object.__setattr__(self, "covariates", tuple(covariates))
        if not isinstance(self.offsets, str) or not self.offsets:
            raise ConfigError(
                f"dataset.offsets={self.offsets!r}: allowed values are library_size, none or the name of an "
                "obs column of positive totals"
            )

    @property
    def base_label(self) -> str:
        layer = f"_{self.layer}" if self.layer else ""
        return f"anndata_{Path(self.path).stem}{layer}" + ("_sparse" if self.sparse else "")

    @property
    def label_tail(self) -> str:  # anndata_pbmc_x4+batch: the covariates after the replication, as oaks
        return "+" + "+".join(self.covariates) if self.covariates else ""

    def _load(self) -> Data:
        """Raises :class:`~plnexp.core.data.DataError` (one line naming the file) for a bad file."""
        from ..core.anndata_counts import load_anndata

        return load_anndata(self.path, self.layer, self.covariates, self.offsets, sparse=self.sparse)

    def _rows(self) -> int:
        import anndata

        return int(anndata.read_h5ad(self.path, backed="r").n_obs)

    def _load_rows(self, start: int, stop: int) -> Data:
        from ..core.anndata_counts import load_anndata

        return load_anndata(
            self.path, self.layer, self.covariates, self.offsets, sparse=self.sparse, rows=(start, stop)
        )


@dataclass(frozen=True)
class SyntheticPcaData(DatasetSpec):
    """Counts drawn from the low-rank PLN-PCA model (:func:`plnexp.core.simulation.simulate_pca`)."""

    n: int = setting(Integer(2), 2000)
    p: int = setting(Integer(1), 200)
    q: int = setting(Integer(1), 5)
    d: int = setting(Integer(1), 1)
    zero_fraction: float | None = None
    seed: int = setting(Integer(0), 0)
    sparse: bool = setting(Flag(), False)  # counts kept sparse (CSR), for model=pca with block_rows
    name: ClassVar[str] = "synthetic_pca"
    drawn: ClassVar[bool] = True

    def __post_init__(self):
        super().__post_init__()
        if self.q > self.p:
            raise ConfigError(f"dataset.q={self.q!r}: allowed values are integers from 1 to dataset.p={self.p}")
        zf = self.zero_fraction
        if zf is not None and (isinstance(zf, bool) or not isinstance(zf, (int, float)) or not 0 < zf < 1):
            raise ConfigError(
                f"dataset.zero_fraction={zf!r}: allowed values are null (as drawn) or numbers in (0, 1) "
                "(the fraction of zero counts: 0.8 to 0.95 in single-cell data)"
            )
        if zf is not None:
            object.__setattr__(self, "zero_fraction", float(zf))

    @property
    def base_label(self) -> str:
        from ..core.simulation import pca_name

        tail = "_sparse" if self.sparse else ""
        return pca_name(self.n, self.p, self.q, self.d, self.zero_fraction, self.seed) + tail

    def _load(self) -> Data:
        from ..core.simulation import simulate_pca

        return simulate_pca(self.n, self.p, self.q, self.zero_fraction, self.d, self.seed, sparse=self.sparse)

    def _rows(self) -> int:
        return self.n

    def _load_rows(self, start: int, stop: int) -> Data:
        from ..core.simulation import simulate_pca

        return simulate_pca(
            self.n, self.p, self.q, self.zero_fraction, self.d, self.seed, sparse=self.sparse, rows=(start, stop)
        )


DATASETS = {cls.name: cls for cls in (OaksData, SyntheticData, CsvData, AnndataData, SyntheticPcaData)}
Dataset = OaksData | SyntheticData | CsvData | AnndataData | SyntheticPcaData


# ---------------------------------------------------------------- the report's settings
@dataclass(frozen=True)
class ReportSpec:
    """How the sweep's report ranks (:mod:`plnexp.jobs.ranking`): not part of a fit, so left out of
    :meth:`Config.as_dict` (the params, the config hash that ``resume=true`` matches on) and logged as
    the run's tags instead (:func:`plnexp.experiment.runner.run_job`)."""

    min_speedup: float = 1.10  # a winner leads the next by at least this factor (asv's default factor)
    # the sweep's reference job run again at its end, an A/A pair (plnexp.experiment.sweep)
    control: bool = setting(Flag(), True)
    peers: tuple[str, ...] = ()  # other packages' fits run beside the grid, for the report (plnexp.jobs.peers)
    # interleaved rounds of a group at most (plnexp.experiment.groups); 0: none, the jobs' own timings
    rounds: int = setting(Integer(0), 30)
    # a group's rounds stop after about this long, decided or not (seconds)
    rounds_budget_s: float = setting(Number(0, 3600, "numbers of seconds in (0, 3600]", low_open=True), 30.0)

    def __post_init__(self):
        object.__setattr__(self, "min_speedup", min_speedup(self.min_speedup))
        check_fields(self, "report.")
        peers = () if self.peers is None else self.peers
        if isinstance(peers, str) or not isinstance(peers, (list, tuple)):
            peers = (peers,)
        if peers:
            from .peers import PEERS

            for name in peers:
                if name not in PEERS:
                    raise ConfigError(f"report.peers={name!r}: allowed values are {', '.join(PEERS)}")
        object.__setattr__(self, "peers", tuple(peers))


REPORT_KEYS = tuple(f.name for f in fields(ReportSpec))


# ---------------------------------------------------------------- the config
# keys whose value the run name shows already (run_name) or never (where results go, how they are timed)
_NAMED = {
    "strategy",
    "dataset",
    "dataset.replication",
    "dataset.n",
    "dataset.p",
    "dataset.d",
    "precision",
    "device",
    "sweep",
    "n_iter_cap",
    "experiment",
    "tracking_uri",
    "store_timeout_s",
    "repeats",
    "warmup",
    "time_budget_s",
    "first_call",
    "compile_cache",
    "plnexp_job",
}


def _strategy_options(per) -> dict[str, dict]:
    """``strategy_options``: strategy name -> its options, applied when that strategy is the job's
    (what a sweep's grid over ``strategy`` cannot say: ``strategy.tol=0`` would be refused for scan).
    Each entry is checked against the registry, whichever strategy the job runs."""
    per = per or {}
    if not isinstance(per, dict) or not all(isinstance(v, dict) for v in per.values()):
        raise ConfigError(
            f"strategy_options={per!r}: allowed values are maps strategy -> map of its options "
            "(e.g. strategy_options.while_loop.tol=0)"
        )
    for name, opts in per.items():
        if name not in STRATEGIES:
            raise ConfigError(f"strategy_options.{name}: unknown strategy; allowed keys are {', '.join(STRATEGIES)}")
        try:
            StrategySpec.of(name, **opts)
        except ValueError as e:
            raise ConfigError(f"strategy_options.{name}: {e}") from None
    return per


def hidden_in_name(key: str) -> bool:
    """Whether :meth:`Config.job_name` leaves an override of ``key`` out of a run's name (its value
    shows already, or is where results go or how they are timed: :data:`_NAMED`; Hydra's own keys)."""
    return key in _NAMED or key.startswith(
        ("hydra.", "hydra/", "dataset.", "n_iter_cap.", "strategy.", "strategy_options.", "report.")
    )


@dataclass(frozen=True)
class Config:
    dataset: Dataset
    optimizer: OptimizerSpec
    strategy: StrategySpec
    model: ModelName = ModelName("full")
    rank: int | None = None  # model.rank: pca's q (None for the other models); see as_dict
    block_rows: int | None = None  # model.block_rows: pca's rows per block in a step (None: no blocks)
    device: Device = setting(OneOf(Device), Device("cpu"))
    precision: Precision = PRECISIONS["float32"]
    n_iter: int = setting(Integer(1), 1000)  # after the cap
    n_iter_requested: int = setting(Integer(1), 1000)  # (the config's n_iter)
    repeats: int = setting(Integer(1), 1)
    warmup: int = setting(Integer(0), 0)
    time_budget_s: float = setting(SECONDS, 0.0)
    first_call: bool = setting(Flag(), False)
    compile_cache: bool | None = None  # None: auto (on for a run, off in a sweep or a rerun: see as_study)
    init: Init = setting(OneOf(Init), Init("seed"))
    gradient: Gradient = setting(OneOf(Gradient), Gradient("analytic"))
    seed: int = setting(Integer(0), 0)
    replicates: int = setting(Integer(1), 1)
    # JAX processes the fit spans (plnexp.experiment.processes): 1, this process; N > 1: N processes,
    # started on this machine or by srun, their rows split between them (hashed only when > 1)
    processes: int = setting(Integer(1), 1)
    experiment: str = setting(Text("non-empty strings"), "run")
    tracking_uri: str | None = setting(Text("null or an MLflow tracking URI string", nullable=True, empty=True), None)
    # how long a store call may take: not the fit's (left out of as_dict)
    store_timeout_s: float = setting(STORE_TIMEOUT, STORE_TIMEOUT_S)
    n_iter_cap: dict = field(default_factory=dict)
    report: ReportSpec = ReportSpec()  # the report's settings: not the fit's (left out of as_dict)

    def __post_init__(self):
        check_fields(self)  # the fields' declared allowed values (plnexp.jobs.schema)

    @property
    def run_name(self) -> str:
        """``scan-oaks_x100-f32-cpu``: the strategy, data, precision and device (see :meth:`job_name`)."""
        return f"{self.strategy.name}-{self.dataset.label}-{self.precision.label}-{self.device.value}"

    def job_name(self, overrides=(), shown=()) -> str:
        """The name of a run of this config (the one naming rule: ``run``, ``sweep`` and ``rerun``):
        :attr:`run_name`, then the strategy's options set away from their defaults as the entry names
        them (``unroll4``, ``max-autotune``), then the values of the other keys ``overrides`` set or
        swept; ``n_iter`` as it runs (after a cap), not as it was asked. ``shown``: keys named
        although the name hides them (:func:`hidden_in_name`), those that alone tell jobs of a
        sweep apart (``repeats1``, ``repeats3``: :func:`plnexp.experiment.plan.plan`)."""
        extra = self.strategy.name_parts()
        for o in {o.lstrip("+~").partition("=")[0]: o for o in overrides}.values():  # a key given twice: the last
            key, _, value = o.lstrip("+~").partition("=")
            if hidden_in_name(key) and key not in shown:
                continue
            if key == "n_iter":
                value = str(self.n_iter)
            extra.append(value if key in GROUPS else f"{key.rsplit('.', 1)[-1]}{value}")
        return "-".join([self.run_name, *extra])

    def fit_spec(self) -> FitSpec:
        """The typed fit this job runs (device resolved where it runs). ``compile_cache``: see
        :func:`plnexp.fitting.spec.cache_choice` (None, auto: the cache in ``<outputs>/jax_cache``, one compile)."""
        cache, warm = cache_choice(self.compile_cache, self.strategy, outputs_dir() / "jax_cache")
        return FitSpec(
            model_named(self.model.value, self.rank, self.block_rows),
            self.optimizer,
            self.strategy,
            self.precision,
            self.device.value,
            self.n_iter,
            self.init.value,
            self.gradient.value,
            TimingSpec(self.repeats, self.warmup, self.first_call, cache, self.time_budget_s, warm),
            self.seed,
            self.replicates,
        )

    def as_study(self) -> Config:
        """This config as a timing study runs it (a sweep's jobs, a rerun): ``compile_cache`` auto
        (None) is off there, so that every compile is cold; a value the user set is kept."""
        if self.compile_cache is not None:
            return self
        from dataclasses import replace

        return replace(self, compile_cache=False)

    def replicate_datasets(self) -> list[Dataset]:
        """The data set of each replicate: K synthetic data sets from seeds ``dataset.seed + k``; one
        data set shared by every replicate otherwise (they differ by their initial seed)."""
        if self.replicates > 1 and isinstance(self.dataset, (SyntheticData, SyntheticPcaData)):
            from dataclasses import replace

            return [replace(self.dataset, seed=self.dataset.seed + k) for k in range(self.replicates)]
        return [self.dataset]

    def as_dict(self) -> dict:
        """Plain nested dict of the resolved values (for YAML and flat MLflow params)."""
        ds = {"name": self.dataset.name, **{f.name: getattr(self.dataset, f.name) for f in fields(self.dataset)}}
        if "covariates" in ds and isinstance(ds["covariates"], tuple):
            ds["covariates"] = list(ds["covariates"])
        out: dict[str, Any] = {
            "dataset": ds,
            "optimizer": {"name": self.optimizer.name, "lr": self.optimizer.lr},
            "strategy": self.strategy.as_dict(),
        }
        # model: its name (full, profiled: as before pca existed, so their hashes and params stay),
        # or {name: pca, rank: q} (with block_rows: b where set, so that a fit without keeps its hash)
        blocks = {} if self.block_rows is None else {"block_rows": self.block_rows}
        out["model"] = {"name": PCA_NAME, "rank": self.rank, **blocks} if self.rank is not None else self.model.value
        for f in fields(self):
            # report: not the fit's; rank, block_rows: in model
            if f.name not in out and f.name not in ("report", "rank", "block_rows", "store_timeout_s"):
                v = getattr(self, f.name)
                out[f.name] = v.value if isinstance(v, Enum) else v.name if isinstance(v, Precision) else v
        return out


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


REQUIRED = {
    "dataset.counts": "paths of existing CSV files (dataset=csv needs one)",
    "dataset.path": "paths of existing .h5ad files (dataset=anndata needs one)",
}
TOP_KEYS = (
    "dataset",
    "optimizer",
    "strategy",
    "model",
    "device",
    "precision",
    "n_iter",
    "n_iter_cap",
    "strategy_options",
    "repeats",
    "warmup",
    "time_budget_s",
    "first_call",
    "compile_cache",
    "init",
    "gradient",
    "seed",
    "replicates",
    "processes",
    "experiment",
    "tracking_uri",
    "store_timeout_s",
    "report",
)


def loadable(config: Config) -> dict:
    """The node that :func:`load` turns back into ``config`` (its ``as_dict``, with ``n_iter`` as it
    was asked: the caps apply again)."""
    node = config.as_dict()
    node["n_iter"] = node.pop("n_iter_requested")
    return node


def load(cfg: DictConfig | dict, *, check_device: bool = True) -> Config:
    """Validate and resolve a composed config into a frozen :class:`Config` (one-line errors)."""
    node: dict[str, Any]
    if isinstance(cfg, DictConfig):
        try:
            # a DictConfig converts to a dict (to_container's return type covers lists and values too)
            node = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))
        except Exception as e:  # noqa: BLE001 - a ??? left unset, a broken interpolation: one line
            key = getattr(e, "full_key", "") or "config"
            if isinstance(e, MissingMandatoryValue):
                allowed = REQUIRED.get(key, "a value")
                raise ConfigError(
                    f"{key}: required, no value given (set {key}=...); allowed values are {allowed}"
                ) from None
            raise ConfigError(f"{key}: {str(e).splitlines()[0]}") from None
    else:
        node = dict(cfg)
    node.pop("hydra", None)
    node.pop("sweep", None)
    secret = secret_value(node)
    if secret is not None:  # a config file's (an override's is refused before Hydra: plnexp.__main__)
        raise ConfigError(refusal(secret))
    _keys("", node, TOP_KEYS)
    for key in ("dataset", "optimizer", "strategy"):
        if not isinstance(node.get(key), dict):
            raise ConfigError(f"{key}={node.get(key)!r}: allowed values are {allowed_options(key)}")

    ds = dict(node["dataset"])
    kind = ds.pop("name", None)
    if kind not in DATASETS:
        raise ConfigError(f"dataset.name={kind!r}: allowed values are {', '.join(DATASETS)}")
    cls = DATASETS[kind]
    _keys("dataset", ds, ["name"] + [f.name for f in fields(cls)])
    if "covariates" in ds and kind == "oaks":
        ds["covariates"] = tuple(ds["covariates"] or ())
    try:
        dataset = cls(**ds)
    except TypeError as e:
        raise ConfigError(f"dataset: {e}") from None

    opt = dict(node["optimizer"])
    _keys("optimizer", opt, ("name", "lr"))
    strat = dict(node["strategy"])
    strat.update(_strategy_options(node.get("strategy_options")).get(str(strat.get("name")), {}))
    device = read(Config, node, "device")
    try:
        compile_cache = check_compile_cache(node.get("compile_cache"))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    replicates = read(Config, node, "replicates")
    processes = read(Config, node, "processes")  # a config logged before it: 1
    model, rank, block_rows = _model(node.get("model"))
    p = getattr(dataset, "p", None)  # known without loading for the simulated data sets
    if rank is not None and isinstance(p, int) and rank > p:
        raise ConfigError(f"model.rank={rank}: allowed values are integers from 1 to dataset.p={p}")
    try:
        # the name as given (None where missing): OptimizerSpec checks it against its registry
        optimizer = OptimizerSpec(cast(str, opt.get("name")), opt.get("lr"))
        if optimizer.name == "newton" and block_rows is not None:
            # PLN-PCA's Newton round (its default, conf/model/pca.yaml) takes every row at once: in
            # blocks of rows the fit takes the model's default, as plnexp.fit does (one rule)
            optimizer = OptimizerSpec(default_optimizer(model_named(model.value, rank, block_rows)), None)
        strategy = StrategySpec.of(strat.pop("name", None), **strat)
        devices = getattr(strategy.options, "devices", 0)
        if processes > 1 and devices != 0:  # before the devices are counted: it is the rule, not their number
            raise ValueError(
                f"strategy.devices={devices}: with processes={processes} the rows are split across every "
                "device of every process; allowed value is 0"
            )
        strategy.check(
            compile_cache,
            resolve_device(device.value).platform if check_device else None,
            replicates,
            optimizer.name,
            str(node.get("gradient")),
            model.value,
            processes,
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None
    n_iter = read(Config, node, "n_iter")
    caps = node.get("n_iter_cap") or {}
    if not isinstance(caps, dict):
        raise ConfigError(f"n_iter_cap={caps!r}: allowed values are maps strategy -> integer >= 1")
    for name, cap in caps.items():
        if name not in STRATEGIES:
            raise ConfigError(f"n_iter_cap.{name}: unknown strategy; allowed keys are {', '.join(STRATEGIES)}")
        Integer(1)(f"n_iter_cap.{name}", cap)
    rep = node.get("report") or {}  # a logged config (rerun) has none: the defaults
    if not isinstance(rep, dict):
        raise ConfigError(f"report={rep!r}: allowed values are maps with the keys {', '.join(REPORT_KEYS)}")
    _keys("report", rep, REPORT_KEYS)
    report = ReportSpec(**rep)
    if report.peers:  # each peer follows the job's model: one it does not fit is refused before any run
        from .peers import PEERS, model_error

        for name in report.peers:
            why = model_error(PEERS[name], model.value)
            if why is not None:
                raise ConfigError(why)
    return Config(
        dataset=dataset,
        optimizer=optimizer,
        strategy=strategy,
        model=model,
        rank=rank,
        block_rows=block_rows,
        device=device,
        precision=_precision(node.get("precision")),
        n_iter=min(n_iter, caps.get(strategy.name, n_iter)),
        n_iter_requested=n_iter,
        compile_cache=compile_cache,
        replicates=replicates,
        processes=processes,
        n_iter_cap=dict(caps),
        report=report,
        # the rest as given (their defaults where a logged config lacks them), checked by Config
        **{key: node[key] for key in AS_GIVEN if key in node},
    )


# the top-level keys Config checks itself (plnexp.jobs.schema): load passes them on as given
AS_GIVEN = (
    "repeats",
    "warmup",
    "time_budget_s",
    "first_call",
    "init",
    "gradient",
    "seed",
    "experiment",
    "tracking_uri",
    "store_timeout_s",
)
