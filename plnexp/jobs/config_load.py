"""A composed config (Hydra's, a logged run's node) into a frozen :class:`~plnexp.jobs.config.Config`:
``load(DictConfig) -> Config``, validated once (:func:`load`), and back (:func:`loadable`).

Every bad value raises :class:`~plnexp.jobs.schema.ConfigError` with one line naming the key and the
allowed values: the keys known (:data:`TOP_KEYS`), a value left unset (:data:`REQUIRED`), the rules
that span fields (a model's rank against the data, a strategy against the device, the replicates and
the processes, the report's peers against the model); a field with a simple rule is checked by the
dataclass itself (:mod:`plnexp.jobs.schema`).
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from ..core.model import PCA_NAME, check_block_rows
from ..core.optim import OptimizerSpec
from ..system.credentials import refusal, secret_value
from ..core.precision import precision as precision_named
from ..core.device import resolve_device
from ..fitting.spec import check_compile_cache, default_optimizer, model_named
from ..strategies import STRATEGIES, StrategySpec
from .peers import PEERS, model_error
from .config import DATASETS, REPORT_KEYS, Config, ModelName, ReportSpec, allowed_options
from .schema import RULE, ConfigError, Integer, OneOf, allowed_values, read


def _model(value: Any) -> tuple[ModelName, int | None, int | None]:
    """``model``: a name (full, profiled) or ``{name: pca, rank: q, block_rows: b or null}`` -> (its
    name, pca's rank or None, pca's rows per block or None)."""
    if not isinstance(value, dict):
        if value == PCA_NAME:
            raise ConfigError(f"model.rank: required for model={PCA_NAME}; allowed values are integers >= 1")
        return OneOf(ModelName)("model", value), None, None
    _keys("model", value, ("name", "rank", "block_rows"))
    name = OneOf(ModelName)("model.name", value.get("name"))
    if name.value != PCA_NAME:
        raise ConfigError(f"model.rank: only model={PCA_NAME} has one; allowed keys for model={name.value} are none")
    rank = Integer(1, "integers >= 1 (at most the data set's p)")("model.rank", value.get("rank"))
    return name, rank, check_block_rows(value.get("block_rows"), "model.block_rows", "null")


def _keys(key: str, node: dict, allowed) -> None:
    unknown = sorted(set(node) - set(allowed))
    if unknown:
        where = f"{key}." if key else ""
        raise ConfigError(
            f"{where}{unknown[0]}: unknown key; allowed keys{' under ' + key if key else ''} are {', '.join(allowed)}"
        )


def _per_strategy(key: str, per: Any, each: type, allowed: str) -> dict:
    """A map strategy name -> a value of type ``each`` (``n_iter_cap``, ``strategy_options``; unset:
    empty); one line naming ``key`` for another shape or a name that is not a strategy's."""
    per = per or {}
    if not isinstance(per, dict) or not all(isinstance(v, each) for v in per.values()):
        raise ConfigError(f"{key}={per!r}: allowed values are maps strategy -> {allowed}")
    for name in per:
        if name not in STRATEGIES:
            raise ConfigError(f"{key}.{name}: unknown strategy; allowed keys are {', '.join(STRATEGIES)}")
    return per


def _strategy_options(per) -> dict[str, dict]:
    """``strategy_options``: strategy name -> its options, applied when that strategy is the job's
    (what a sweep's grid over ``strategy`` cannot say: ``strategy.tol=0`` would be refused for scan).
    Each entry is checked against the registry, whichever strategy the job runs."""
    per = _per_strategy("strategy_options", per, dict, "map of its options (e.g. strategy_options.while_loop.tol=0)")
    for name, opts in per.items():
        try:
            StrategySpec.of(name, **opts)
        except ValueError as e:
            raise ConfigError(f"strategy_options.{name}: {e}") from None
    return per


# the data sets' fields without a default (csv's counts, anndata's path) -> what they allow, left unset
REQUIRED = {
    f"dataset.{f.name}": f"{f.metadata[RULE].allowed} (dataset={cls.name} needs one)"
    for cls in DATASETS.values()
    for f in fields(cls)
    if f.default is MISSING and RULE in f.metadata
}
# the keys of a node: Config's fields as the node names them (the model's rank and block_rows under
# model, n_iter as asked), and the strategies' options
TOP_KEYS = (
    *(f.name for f in fields(Config) if f.name not in ("rank", "block_rows", "n_iter_requested")),
    "strategy_options",
)


def loadable(config: Config) -> dict:
    """The node that :func:`load` turns back into ``config`` (its ``as_dict``, with ``n_iter`` as it
    was asked: the caps apply again)."""
    node = config.as_dict()
    node["n_iter"] = node.pop("n_iter_requested")
    return node


def load(cfg: DictConfig | dict, *, check_device: bool = True) -> Config:
    """Validate and resolve a composed config into a frozen :class:`Config` (one-line errors)."""
    try:
        return _load(cfg, check_device)
    except ValueError as e:  # the registries' own one-line checks (precision, optimizer, strategy, block rows...)
        raise ConfigError(str(e)) from None


def _load(cfg: DictConfig | dict, check_device: bool) -> Config:
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
    try:
        dataset = cls(**ds)
    except TypeError as e:
        raise ConfigError(f"dataset: {e}") from None

    opt = dict(node["optimizer"])
    _keys("optimizer", opt, ("name", "lr"))
    strat = dict(node["strategy"])
    strat.update(_strategy_options(node.get("strategy_options")).get(str(strat.get("name")), {}))
    device = read(Config, node, "device")
    compile_cache = check_compile_cache(node.get("compile_cache"))
    replicates = read(Config, node, "replicates")
    processes = read(Config, node, "processes")  # a config logged before it: 1
    model, rank, block_rows = _model(node.get("model"))
    p = getattr(dataset, "p", None)  # known without loading for the simulated data sets
    if rank is not None and isinstance(p, int) and rank > p:
        raise ConfigError(f"model.rank={rank}: allowed values are integers from 1 to dataset.p={p}")
    # the name as given (None where missing): OptimizerSpec checks it against its registry
    optimizer = OptimizerSpec(cast(str, opt.get("name")), opt.get("lr"))
    if optimizer.name == "newton" and block_rows is not None:
        # PLN-PCA's Newton round (its default, conf/model/pca.yaml) takes every row at once: in
        # blocks of rows the fit takes the model's default, as plnexp.fit does (one rule)
        optimizer = OptimizerSpec(default_optimizer(model_named(model.value, rank, block_rows)), None)
    strategy = StrategySpec.of(strat.pop("name", None), **strat)
    devices = getattr(strategy.options, "devices", 0)
    if processes > 1 and devices != 0:  # before the devices are counted: it is the rule, not their number
        raise ConfigError(
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
    n_iter = read(Config, node, "n_iter")
    caps = _per_strategy("n_iter_cap", node.get("n_iter_cap"), object, "integer >= 1")
    for name, cap in caps.items():
        Integer(1)(f"n_iter_cap.{name}", cap)
    rep = node.get("report") or {}  # a logged config (rerun) has none: the defaults
    if not isinstance(rep, dict):
        raise ConfigError(f"report={rep!r}: allowed values are maps with the keys {', '.join(REPORT_KEYS)}")
    _keys("report", rep, REPORT_KEYS)
    report = ReportSpec(**rep)
    if report.peers:  # each peer follows the job's model: one it does not fit is refused before any run
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
        precision=precision_named(cast(str, node.get("precision"))),  # checked by its registry
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
AS_GIVEN = tuple(
    k for k in allowed_values(Config) if k not in ("device", "n_iter", "n_iter_requested", "replicates", "processes")
)
