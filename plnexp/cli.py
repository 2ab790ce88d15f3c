"""From command-line overrides to validated jobs, before any work: the sweep grid is expanded the
way Hydra's basic sweeper does it, and every job's config is composed (Hydra compose API) and
loaded into a frozen :class:`~plnexp.config.Config`. Any problem is one :class:`ConfigError` line.
"""

from __future__ import annotations

from dataclasses import dataclass

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf

from . import config as C
from .config import ConfigError


@dataclass(frozen=True)
class Job:
    overrides: tuple[str, ...]
    config: C.Config

    @property
    def name(self) -> str:
        return job_name(self.config, self.overrides)


_NAMED = {"strategy", "dataset", "dataset.replication", "dataset.n", "dataset.p", "dataset.d", "precision",
          "device", "sweep", "n_iter_cap", "experiment", "tracking_uri", "repeats", "warmup", "first_call",
          "compile_cache"}


def job_name(config: C.Config, overrides) -> str:
    """``scan-oaks_x100-f32-cpu``, plus the values of other swept or overridden keys."""
    extra = []
    for o in overrides:
        key, _, value = o.lstrip("+~").partition("=")
        if key in _NAMED or key.startswith(("hydra.", "dataset.")):
            continue
        extra.append(value if key in C.GROUPS else f"{key.rsplit('.', 1)[-1]}{value}")
    return "-".join([config.run_name, *extra])


def _parse(overrides: list[str]):
    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as e:
        raise ConfigError(f"bad override: {str(e).splitlines()[0]}") from None


def _check_groups(parsed) -> None:
    for o in parsed:
        group = o.key_or_group
        if group in C.GROUPS and not o.is_delete():
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
            options = C.group_options(group)
            for v in values:
                if v not in options and not (group == "sweep" and v == "null"):
                    raise ConfigError(f"{group}={v}: allowed values are {', '.join(options)}")


def _compose(overrides: list[str], hydra: bool = False):
    try:
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)
    except (HydraException, ValueError, KeyError) as e:
        text = str(e).splitlines()
        msg = text[0] if text else type(e).__name__
        if msg.startswith("Could not override"):
            key = msg.split("'")[1]
            raise ConfigError(f"{key}: unknown key (use +{key}=... only for keys the config has)") from None
        cause = e.__cause__
        detail = f" ({str(cause).splitlines()[0]})" if cause else ""
        raise ConfigError(f"{msg}{detail}") from None


def _check_keys(parsed, overrides: list[str], cache: dict) -> None:
    """Every plain ``key=value`` must name a key that exists (given this job's dataset choice: the
    only group whose options differ in their keys)."""
    groups = tuple(o for o, p in zip(overrides, parsed) if p.key_or_group == "dataset")
    if groups not in cache:
        cache[groups] = _compose(list(groups))
    base = cache[groups]
    for p in parsed:
        key = p.key_or_group
        if key in C.GROUPS or key.startswith("hydra.") or p.is_add() or p.is_delete() or p.is_force_add():
            continue
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(base, parent, throw_on_missing=False) if parent else base
        if not (OmegaConf.is_dict(node) and leaf in node.keys()):
            allowed = ", ".join(node.keys()) if OmegaConf.is_dict(node) else "none"
            where = f" under {parent}" if parent else ""
            raise ConfigError(f"{key}: unknown key; allowed keys{where} are {allowed}")


def plan(overrides: list[str], multirun: bool, *, check_device: bool = True) -> list[Job]:
    """Validate the command line; returns the jobs (one for a run, the grid for a multirun)."""
    overrides = list(overrides)
    parsed = _parse(overrides)
    _check_groups(parsed)
    sweeps = [o for o in parsed if o.is_sweep_override()]
    if sweeps and not multirun:
        o = sweeps[0]
        raise ConfigError(f"{o.input_line}: a list of values needs `python -m plnexp sweep` or --multirun")
    cache: dict = {}
    with initialize_config_dir(config_dir=str(C.CONF_DIR), version_base="1.3", job_name="plnexp"):
        if multirun:
            fixed = [o for o, p in zip(overrides, parsed) if not p.is_sweep_override()]
            master = _compose(fixed, hydra=True)
            params = master.hydra.sweeper.params
            params = OmegaConf.to_container(params, resolve=False) if params else {}
            grid_args = [f"{k}={v}" for k, v in params.items()] + overrides
            grid = BasicSweeper.split_arguments(_parse(grid_args), None)[0]
            for job in grid:
                _check_groups(_parse(job))
        else:
            grid = [overrides]
        jobs = []
        for job in grid:
            _check_keys(_parse(job), job, cache)
            jobs.append(Job(tuple(job), C.load(_compose(job), check_device=check_device)))
    return jobs
