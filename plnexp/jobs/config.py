"""The typed experiment config: :class:`Config`, frozen, built once from a composed config by
:func:`plnexp.jobs.config_load.load` (``load(DictConfig) -> Config``, validated once).

That is the only place that turns omegaconf nodes into Python objects; everything below the
runner receives a :class:`Config`, and a fit its :meth:`Config.fit_spec` (no name is parsed again).
Every bad value raises :class:`ConfigError` with one line naming the key and the allowed values: a
field with a simple rule declares it beside its type and default (:mod:`plnexp.jobs.schema`, checked
whenever the dataclass is built, in code too); the rules that span fields are checked in
:func:`~plnexp.jobs.config_load.load`. The data sets' specs: :mod:`plnexp.jobs.dataset_specs`.
Names are resolved into the registries' records: :class:`~plnexp.core.optim.OptimizerSpec`,
:class:`~plnexp.strategies.StrategySpec` (a strategy and its own options),
:class:`~plnexp.core.precision.Precision`, :class:`~plnexp.core.model.Model`. It imports leaf modules only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from omegaconf import OmegaConf

from ..core.model import PCA_NAME
from ..core.optim import OptimizerSpec
from ..system.paths import CONF_DIR, install_command, outputs_dir
from ..core.precision import PRECISIONS, Precision
from ..core.problem import GRADIENTS
from ..core.device import DEVICES
from ..fitting.spec import (
    INITS,
    MODEL_NAMES,
    FitSpec,
    cache_choice,
    model_named,
)
from ..measure.timing import TimingSpec
from ..strategies import StrategySpec
from .peers import PEERS
from .schema import ConfigError, Flag, Integer, Names, Number, OneOf, Text, check_fields, setting
from .dataset_specs import AnndataData, CsvData, OaksData, SyntheticData, SyntheticPcaData

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


# the members come from the registries at import time (one list of names each), which mypy cannot enumerate
Device = Enum("Device", {k: k for k in DEVICES}, type=str)  # type: ignore[misc]  # members built from DEVICES
ModelName = Enum("ModelName", {k: k for k in MODEL_NAMES}, type=str)  # type: ignore[misc]  # members built from MODEL_NAMES
Init = Enum("Init", {k: k for k in INITS}, type=str)  # type: ignore[misc]  # members built from INITS
Gradient = Enum("Gradient", {k: k for k in GRADIENTS}, type=str)  # type: ignore[misc]  # members built from GRADIENTS

STORE_TIMEOUT_S = 30.0  # store_timeout_s's default (conf/config.yaml)


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


DATASETS = {cls.name: cls for cls in (OaksData, SyntheticData, CsvData, AnndataData, SyntheticPcaData)}
Dataset = OaksData | SyntheticData | CsvData | AnndataData | SyntheticPcaData


# ---------------------------------------------------------------- the report's settings
@dataclass(frozen=True)
class ReportSpec:
    """How the sweep's report ranks (:mod:`plnexp.jobs.ranking`): not part of a fit, so left out of
    :meth:`Config.as_dict` (the params, the config hash that ``resume=true`` matches on) and logged as
    the run's tags instead (:func:`plnexp.experiment.job_task.run_job`)."""

    min_speedup: float = 1.10  # a winner leads the next by at least this factor (asv's default factor)
    # the sweep's reference job run again at its end, an A/A pair (plnexp.experiment.sweep)
    control: bool = setting(Flag(), True)
    # other packages' fits run beside the grid, for the report (plnexp.jobs.peers)
    peers: tuple[str, ...] = setting(Names(tuple(PEERS)), ())
    # interleaved rounds of a group at most (plnexp.experiment.groups); 0: none, the jobs' own timings
    rounds: int = setting(Integer(0), 30)
    # a group's rounds stop after about this long, decided or not (seconds)
    rounds_budget_s: float = setting(Number(0, 3600, "numbers of seconds in (0, 3600]", low_open=True), 30.0)

    def __post_init__(self):
        object.__setattr__(self, "min_speedup", min_speedup(self.min_speedup))
        check_fields(self, "report.")


REPORT_KEYS = tuple(f.name for f in fields(ReportSpec))


# ---------------------------------------------------------------- the config
# Config fields that do not change a fit's result, left out of the config hash (plnexp.jobs.provenance):
# where it is logged (experiment, tracking_uri), how it is timed (repeats, warmup, time_budget_s, first_call,
# compile_cache: the result is always the output of one run of the compiled program), and the requested
# n_iter and its caps (the resolved n_iter, which is hashed, is what runs).
UNHASHED = (
    "experiment",
    "tracking_uri",
    "repeats",
    "warmup",
    "time_budget_s",
    "first_call",
    "compile_cache",
    "n_iter_requested",
    "n_iter_cap",
)
# keys whose value the run name shows already (run_name) or never (where results go, how they are timed;
# the data set's keys: hidden_in_name's prefixes)
_NAMED = {"strategy", "dataset", "precision", "device", "sweep", "store_timeout_s", "plnexp_job", *UNHASHED}


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
    time_budget_s: float = setting(Number(0, None, "numbers >= 0 (seconds)"), 0.0)
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
    # how long one call to the store may take, its retries included: not the fit's (left out of as_dict)
    store_timeout_s: float = setting(Number(1, 3600, "numbers from 1 to 3600 (seconds)"), STORE_TIMEOUT_S)
    n_iter_cap: dict = field(default_factory=dict)
    report: ReportSpec = field(default_factory=ReportSpec)  # the report's settings: not the fit's (left out of as_dict)

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
        return replace(self, compile_cache=False)

    def replicate_datasets(self) -> list[Dataset]:
        """The data set of each replicate: K synthetic data sets from seeds ``dataset.seed + k``; one
        data set shared by every replicate otherwise (they differ by their initial seed)."""
        if self.replicates > 1 and isinstance(self.dataset, (SyntheticData, SyntheticPcaData)):
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
