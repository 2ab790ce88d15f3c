"""From command-line overrides to validated jobs, before any work: the sweep grid is expanded the
way Hydra's basic sweeper does it, and every job's config is composed (Hydra compose API) and
loaded into a frozen :class:`~plnexp.jobs.config.Config`, and the fit it runs built (:func:`check_fit`).
Any problem is one :class:`ConfigError` line. Then :func:`check_data` loads each distinct data set of
the grid once (a :class:`DataError` line) and checks each job's PLN-PCA rank against its data's p,
and :func:`check_outputs` makes sure the outputs folder can be written.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, cast

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf, open_dict

from ..jobs import config as C
from ..jobs import config_load
from ..jobs.config import ConfigError
from ..system.paths import install_command, probe_writes
from ..fitting.spec import check_rank
from ..jobs.spec import JobSpec
from . import executors, hydra_compat


@dataclass(frozen=True)
class Job:
    overrides: tuple[str, ...]
    config: C.Config
    shown: tuple[str, ...] = ()  # keys named although the name hides them: they alone tell jobs of the grid apart

    @property
    def name(self) -> str:
        return self.config.job_name(self.overrides, self.shown)


LOCAL_LAUNCHERS = executors.LOCAL  # launchers whose jobs run on this machine


def jobs_run_here(overrides) -> bool:
    """Whether the jobs run on this machine (Hydra's basic launcher, joblib), so that their device can
    be checked before any work; a cluster launcher's jobs check it where they run (a CPU login node
    has no GPU)."""
    launcher = next((v for k, v in map(_key_value, reversed(overrides)) if k == "hydra/launcher"), "basic")
    return launcher in LOCAL_LAUNCHERS  # (the last launcher given)


def pop_switch(args: list[str], key: str, default: bool) -> tuple[list[str], bool]:
    """Take a command switch ``key=true|false`` (not a config key: ``resume``, ``report``) out of the
    command line; returns the rest and its value (the last one given, else ``default``)."""
    values = [a.split("=", 1)[1] for a in args if a.split("=", 1)[0] == key]
    rest = [a for a in args if a.split("=", 1)[0] != key]
    if not values:
        return rest, default
    value = values[-1].strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"{key}={values[-1]}: allowed values are true, false")
    return rest, value == "true"


FORMS = "key=value, group=option, key=a,b (a sweep), +key=value, ~key"


def parse(overrides: list[str]):
    """``overrides`` parsed by Hydra's override grammar (its ``Override`` objects, in order); a bad one
    is a :class:`ConfigError` naming it, in one line, with the allowed forms."""
    try:
        return hydra_compat.parse_overrides(overrides)
    except HydraException as e:
        bad = overrides[0] if len(overrides) == 1 else " ".join(overrides)
        for o in overrides:
            try:
                hydra_compat.parse_overrides([o])
            except HydraException:
                bad = o
                break
        raise ConfigError(f"bad override {bad!r}: {str(e).splitlines()[0]}; allowed forms are {FORMS}") from None


# Hydra's submitit launchers: hydra-submitit-launcher's module, which plnexp's cluster extra installs
SUBMITIT_LAUNCHERS = ("slurm", "submitit_slurm", "submitit_local")
SUBMITIT = "hydra_plugins.hydra_submitit_launcher"


def _check_launcher(parsed) -> None:
    """A launcher of an optional extra that is not installed: one line saying what to install,
    before Hydra answers with its list of the launchers it found."""
    import importlib.util

    for o in parsed:
        if o.key_or_group == "hydra/launcher" and not o.is_sweep_override():
            name = o.get_value_element_as_str()
            if name in SUBMITIT_LAUNCHERS:
                if (
                    importlib.util.find_spec(SUBMITIT.split(".")[0]) is None
                    or importlib.util.find_spec(SUBMITIT) is None
                ):
                    raise ConfigError(
                        f"hydra/launcher={name}: needs hydra-submitit-launcher, which is not installed; "
                        f"install plnexp's cluster extra ({install_command('cluster')}); allowed values "
                        f"here are {', '.join(LOCAL_LAUNCHERS)}"
                    )
                if name in executors.SLURM and shutil.which("sbatch") is None:
                    raise ConfigError(
                        f"hydra/launcher={name}: sbatch not found on PATH (no SLURM client here): run "
                        "the sweep on a machine that submits to the cluster (a login node); allowed "
                        f"values here are {', '.join(LOCAL_LAUNCHERS)}"
                    )


SEARCHPATH = "hydra.searchpath"
SEARCHPATH_FORMS = "a list of existing folders, e.g. [file:///home/me/conf] (pkg://MODULE for a package's)"


def user_config_dirs(parsed) -> list[Path]:
    """The user's own config folders, where Hydra looks after plnexp's conf/ (``hydra.searchpath``,
    which ``--config-dir DIR`` sets): each must exist; ``pkg://`` entries are Hydra's to read."""
    dirs: list[Path] = []
    for o in parsed:
        if o.key_or_group != SEARCHPATH or o.is_delete():
            continue
        value = o.value()
        entries = value if isinstance(value, list) else [value]
        for entry in entries:
            text = str(entry)
            if text.startswith("pkg://"):
                continue
            folder = Path(text.removeprefix("file://"))
            if not folder.is_dir():
                raise ConfigError(f"{SEARCHPATH}: {text} is not a folder; allowed values are {SEARCHPATH_FORMS}")
            dirs.append(folder)
    return dirs


def check_groups(parsed) -> None:
    """Each ``group=option`` of ``parsed`` (from :func:`parse`) names an option that the group has, in
    ``conf/`` or a user's config directory; else a :class:`ConfigError` in one line."""
    user_dirs = user_config_dirs(parsed)
    for o in parsed:
        group = o.key_or_group
        if group in C.GROUPS and not o.is_delete():
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
            options = C.group_options(group, user_dirs)
            for v in values:
                if v not in options and not (group == "sweep" and v == "null"):
                    raise ConfigError(f"{group}={v}: allowed values are {C.allowed_options(group, user_dirs)}")


def _compose(overrides: list[str], hydra: bool = False):
    hydra_compat.cache_config_sources()  # Hydra's compose all the same, without re-parsing unchanged files
    try:
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)
    except (HydraException, ValueError, KeyError) as e:
        text = str(e).splitlines()
        msg = text[0] if text else type(e).__name__
        if "Could not find" in msg and "Available options in" in "\n".join(text):
            options = [
                t.strip()
                for t in text[text.index(next(t for t in text if t.startswith("Available"))) + 1 :]
                if t.startswith("\t") and "=" not in t
            ]
            group, _, option = msg.split("'")[-2].rpartition("/")
            raise ConfigError(f"{group}={option}: allowed values are {', '.join(options)}") from None
        if msg.startswith("Could not override"):
            key = msg.split("'")[1]
            raise ConfigError(f"{key}: unknown key (use +{key}=... only for keys the config has)") from None
        cause = e.__cause__
        detail = f" ({str(cause).splitlines()[0]})" if cause else ""
        raise ConfigError(f"{msg}{detail}") from None


def check_keys(parsed, base) -> None:
    """Every plain ``key=value`` must name a key that exists in ``base``, the job's config (or its
    dataset, strategy and model choices alone: the groups whose options differ in their keys)."""
    for p in parsed:
        key = p.key_or_group
        if key in C.GROUPS or key.startswith(("hydra.", "hydra/")) or p.is_add() or p.is_delete() or p.is_force_add():
            continue
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(base, parent, throw_on_missing=False) if parent else base
        if not (OmegaConf.is_dict(node) and leaf in node.keys()):
            allowed = ", ".join(node.keys()) if OmegaConf.is_dict(node) else "none"
            where = f" under {parent}" if parent else ""
            raise ConfigError(f"{key}: unknown key; allowed keys{where} are {allowed}")


def expand(parsed) -> list[list[str]]:
    """The jobs of a grid, in the order Hydra's basic sweeper runs them: the cartesian product of
    every key's values, a key's last override winning (at the place of its first)."""
    values: dict[str, list[str]] = {}
    for o in parsed:
        key = o.get_key_element()
        if o.is_sweep_override():
            if not o.is_discrete_sweep():
                raise ConfigError(f"{o.input_line}: a range or interval sweep; allowed sweeps are lists (key=a,b,c)")
            values[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            values[key] = [f"{key}={o.get_value_element_as_str()}"]
    return [list(job) for job in itertools.product(*values.values())]


# Keys a sweep has one value of: they are its parent run's (where it is, what it is named after), and
# every job goes to that parent: a job with another value would land in the parent's experiment and
# store all the same, under its own value's name (and resume=true would look for it elsewhere).
ONE_PER_SWEEP = {
    "experiment": "a sweep writes into one experiment (its parent run's)",
    "tracking_uri": "a sweep writes into one store (its parent run's)",
    "store_timeout_s": "a sweep waits on one store as long for each call",
    "sweep": "a sweep runs one sweep file (its parent run is named after it)",
    "report.min_speedup": "a sweep's report ranks with one minimum effect (python -m plnexp report --min-speedup X ranks it again with another)",
    "report.control": "a sweep has one control job or none",
    "report.rounds": "a sweep times its groups in one series of rounds",
    "report.rounds_budget_s": "a sweep times its groups in one series of rounds",
}


def _key_value(override: str) -> tuple[str, str]:
    key, _, value = override.lstrip("+").partition("=")
    return key, value


def _one_per_sweep(key: str, values: list[str], overrides: list[str], source: str = "") -> NoReturn:
    """One line refusing a sweep over ``key`` (several ``values``), with the command that runs
    the sweep of its first value (the others likewise)."""
    values = [re.sub(r"\\(.)", r"\1", v) for v in values]  # as typed: without the escapes of Hydra's grid (sqlite\:///)
    rest = [o for o in overrides if _key_value(o)[0] != key]
    if key != "sweep" and not any(_key_value(o)[0] == "sweep" for o in rest):
        rest.insert(0, "sweep=null")  # a plain multirun: no sweep file (``sweep`` alone would take sweep=default)
    then = ", ".join(f"{key}={v}" for v in values[1:])
    raise ConfigError(
        f"{key}={','.join(values)}{source}: {ONE_PER_SWEEP[key]}, so allowed is one value per sweep; "
        f"run one sweep per value: python -m plnexp sweep {' '.join([*rest, f'{key}={values[0]}'])} (then {then})"
    )


def _check_one_per_sweep(grid: list[list[str]], overrides: list[str], swept_by: str) -> None:
    """A grid whose jobs differ in a key of :data:`ONE_PER_SWEEP` is refused, before any run."""
    for key in ONE_PER_SWEEP:
        values = list(dict.fromkeys(v for job in grid for k, v in map(_key_value, job) if k == key))
        if len(values) > 1:
            given = any(_key_value(o)[0] == key for o in overrides)
            _one_per_sweep(key, values, overrides, "" if given else f" (swept by {swept_by})")


def _distinct_names(jobs: list[Job]) -> list[Job]:
    """The jobs of a grid, named apart: where two would get one name (a key the name hides, like
    ``repeats``, is all that tells them apart), every job's name also shows the keys whose values
    differ between such jobs. Jobs that differ in nothing named keep one name (the same fit twice)."""
    by_name: dict[str, list[Job]] = {}
    for job in jobs:
        by_name.setdefault(job.name, []).append(job)
    shown: dict[str, None] = {}
    for same in by_name.values():
        values: dict[str, set[str]] = {}
        for job in same:
            for key, value in map(_key_value, job.overrides):
                values.setdefault(key, set()).add(value)
        for key, seen in values.items():
            # Hydra's own keys never reach a job's overrides (hydra.overrides.task): not nameable
            if len(seen) > 1 and not key.startswith(("hydra.", "hydra/", "~")):
                shown[key] = None
    if not shown:
        return jobs
    return [Job(j.overrides, j.config, tuple(shown)) for j in jobs]


@dataclass(frozen=True)
class Plan:
    """What a command will run, before any of it runs: its jobs (the grid's, in Hydra's order), each
    composed once and validated once, and where they run (the ``hydra/launcher`` choice and its
    ``hydra.launcher`` node, from the command's own composition with Hydra's config). Iterates over
    its jobs."""

    jobs: tuple[Job, ...]
    launcher: str = "basic"
    hydra: Any = None  # the command's composition with Hydra's config (a DictConfig): the launcher's node
    multirun: bool = False  # a sweep (its control job and peers follow the grid), not a single run

    def __iter__(self):
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    def __getitem__(self, i):
        return self.jobs[i]

    def specs(self) -> list[JobSpec]:
        """Every job the command runs, as specs: the grid's, numbered in order (job ``i`` is its run's
        ``job`` tag; a job of ``replicates=K`` is one spec, its K fits one program; a job of
        ``processes=N`` one spec, its N processes one fit), then, for a sweep whose grid runs in
        the driver (the basic launcher), its control job and its peers
        (:func:`plnexp.experiment.sweep_extras.extras`)."""
        grid = [JobSpec(j.config, j.name, num=i, overrides=j.overrides) for i, j in enumerate(self.jobs)]
        if not (self.multirun and self.launcher == "basic"):
            return grid
        from .sweep_extras import extras

        return grid + extras(grid)

    def executor(self, sweep_dir: Path | None = None) -> executors.Executor:
        """The executor of the command's launcher, its settings resolved with ``hydra.sweep.dir`` at
        ``sweep_dir`` (where the submitit launcher's folder lies)."""
        node = None
        if self.hydra is not None and self.launcher != "basic":
            cfg = self.hydra.copy()
            if sweep_dir is not None:
                OmegaConf.update(cfg, "hydra.sweep.dir", str(sweep_dir))
            try:
                node = cast(dict[str, Any], OmegaConf.to_container(cfg.hydra.launcher, resolve=True))
            except Exception as e:  # noqa: BLE001 - a launcher setting that does not resolve: one line
                raise ConfigError(f"hydra.launcher: {str(e).splitlines()[0]}") from None
        return executors.from_launcher(self.launcher, node)

    def run_dir(self) -> Path:
        """A single run's folder (``hydra.run.dir``: under ``<outputs>/runs`` unless the command sets it)."""
        if self.hydra is not None:
            try:
                return Path(str(OmegaConf.select(self.hydra, "hydra.run.dir", throw_on_resolution_failure=True)))
            except Exception as e:  # noqa: BLE001 - a folder setting that does not resolve: one line
                raise ConfigError(f"hydra.run.dir: {str(e).splitlines()[0]}") from None
        return C.outputs_dir() / "runs" / time.strftime("%Y-%m-%d_%H-%M-%S")


def plan(overrides: list[str], multirun: bool, *, check_device: bool = True) -> Plan:
    """Validate the command line; returns its plan: the jobs (one for a run, the grid for a
    multirun), each composed by Hydra once, and the command's launcher. A run's one job is composed
    with Hydra's config (its run folder); a multirun composes once more, the command without its
    swept keys, for its grid (the sweep file's ``hydra.sweeper.params``) and its launcher."""
    overrides = list(overrides)
    parsed = parse(overrides)
    check_groups(parsed)
    _check_launcher(parsed)
    sweeps = [o for o in parsed if o.is_sweep_override()]
    if sweeps and not multirun:
        o = sweeps[0]
        raise ConfigError(f"{o.input_line}: a list of values needs `python -m plnexp sweep` or --multirun")
    cache: dict = {}
    master = None
    with initialize_config_dir(config_dir=str(C.CONF_DIR), version_base="1.3", job_name="plnexp"):
        if multirun:
            fixed = [o for o, p in zip(overrides, parsed) if not p.is_sweep_override()]
            master = _compose(fixed, hydra=True)
            params = master.hydra.sweeper.params
            # a DictConfig of the swept keys' values (to_container's return type covers lists and values too)
            params = cast(dict[str, Any], OmegaConf.to_container(params, resolve=False)) if params else {}
            grid_args = [f"{k}={v}" for k, v in params.items()] + overrides
            grid = expand(parse(grid_args))
            for job in grid:
                check_groups(parse(job))
            sweep_file = next((v for k, v in map(_key_value, fixed) if k == "sweep"), "null")
            swept_by = "hydra.sweeper.params" if sweep_file == "null" else f"sweep={sweep_file}"
            _check_one_per_sweep(grid, overrides, swept_by)
        else:
            grid = [overrides]
        jobs = []
        for job in grid:
            parsed = parse(job)
            try:
                composed = _compose(job, hydra=not multirun)
            except ConfigError:
                # which key is unknown, and the keys allowed there, from the job's group choices alone
                # (composed once per choice): a clearer line than Hydra's, where that is the cause
                groups = tuple(o for o, p in zip(job, parsed) if p.key_or_group in ("dataset", "strategy", "model"))
                if groups not in cache:
                    cache[groups] = _compose(list(groups))
                check_keys(parsed, cache[groups])
                raise
            if not multirun:  # the run's own composition, Hydra's config included: the job's config is the rest
                master = composed
                composed = composed.copy()
                with open_dict(composed):
                    del composed["hydra"]
            check_keys(parsed, composed)  # keys that Hydra's compose let through (a node not in struct mode)
            config = config_load.load(composed, check_device=check_device)
            check_fit(config)
            jobs.append(Job(tuple(job), config))
    if multirun:
        for key in ("experiment", "tracking_uri"):  # a value set some other way than by its key (a group's file)
            values = list(dict.fromkeys("null" if (v := getattr(j.config, key)) is None else str(v) for j in jobs))
            if len(values) > 1:
                _one_per_sweep(key, values, overrides, " (set by the jobs' configs)")
        jobs = _distinct_names(jobs)
    launcher = str(master.hydra.runtime.choices.get("hydra/launcher", "basic")) if master is not None else "basic"
    if multirun and launcher not in executors.LAUNCHERS:
        raise ConfigError(f"hydra/launcher={launcher}: allowed values are {', '.join(executors.LAUNCHERS)}")
    if multirun:
        nodes = OmegaConf.select(master, "hydra.launcher.nodes", default=None) if master is not None else None
        _check_processes(jobs, launcher, int(nodes or 1))
    return Plan(tuple(jobs), launcher, master, multirun)


def _check_processes(jobs: list[Job], launcher: str, nodes: int = 1) -> None:
    """A sweep's jobs of ``processes`` > 1, on CPUs. Under the basic launcher their workers start from
    the sweep's driver, one job after the other (:func:`plnexp.experiment.job_task.run_job`); under
    SLURM each is a job of N tasks (:meth:`plnexp.experiment.executors.Slurm.submit`), its tasks spread
    evenly over the launcher's ``nodes``; a joblib worker does not start processes of its own. Else
    one :class:`ConfigError` line."""
    across = next((j.config for j in jobs if j.config.processes > 1), None)
    if across is None:
        return
    n = across.processes
    if across.device.value != "cpu":
        raise ConfigError(
            f"processes={n} with device={across.device.value}: a sweep's {n} processes would share the "
            "accelerators of their machine; allowed value with processes > 1 in a sweep is device=cpu"
        )
    if launcher in executors.SLURM:
        for tasks in {j.config.processes for j in jobs if j.config.processes > 1}:
            executors.tasks_per_node(tasks, nodes)
    elif launcher != "basic":
        raise ConfigError(
            f"hydra/launcher={launcher}: a sweep's jobs of processes={n} start their processes from the sweep's "
            f"driver or as one SLURM job of {n} tasks; allowed values with processes > 1 are basic, "
            + ", ".join(executors.SLURM)
        )


def group_value(group: str, option: str):
    """What ``group=option`` gives the key named after the group (a node or a value), composed by
    Hydra from ``conf/``."""
    with initialize_config_dir(config_dir=str(C.CONF_DIR), version_base="1.3", job_name="plnexp"):
        return _compose([f"{group}={option}"])[group]


def check_fit(config: C.Config) -> None:
    """The fit a job runs, as :func:`plnexp.fitting.engine.run` will get it (:meth:`~plnexp.jobs.config.Config.fit_spec`,
    whose checks go beyond the config's: ``n_iter`` within the loops' int32 counter): one
    :class:`ConfigError` line before any run, not a FAILED run."""
    try:
        config.fit_spec()
    except ValueError as e:
        raise ConfigError(str(e).splitlines()[0]) from None


def check_data(jobs: Plan | list[Job]) -> None:
    """Check each job's values that size memory against the machine (:func:`plnexp.jobs.limits.check`),
    then load and check each distinct data set of the jobs once (kept for the jobs of this process; of a
    fit across processes, ``processes`` > 1, only its first row: its processes read their own rows);
    a bad file raises :class:`~plnexp.core.data.DataError` naming the file and what is allowed. Then each
    job against its data: a PLN-PCA ``model.rank`` above the data's p, sparse counts with a model or
    strategy that does not read them (:func:`plnexp.fitting.engine.check_sparse`): one :class:`ConfigError` line."""
    from ..fitting.engine import check_sparse
    from ..jobs import limits
    from .srun import srun_tasks
    from .runner import load_data

    # every value that sizes memory against the machine, before the data is loaded (plnexp.jobs.limits)
    local = getattr(jobs, "launcher", "basic") in LOCAL_LAUNCHERS and (srun_tasks() or 1) == 1
    limits.check_all([j.config for j in jobs], local=local)
    # a fit across processes reads its rows in each process: here only the first row (p, the file's format)
    across = {j.config.dataset for j in jobs if j.config.processes > 1}
    for dataset in dict.fromkeys(j.config.dataset for j in jobs):
        data = dataset.load_rows(0, 1) if dataset in across else load_data(dataset)
        for config in (j.config for j in jobs if j.config.dataset == dataset):
            try:
                if config.rank is not None:
                    check_rank(config.rank, data.p, "model.rank")
                check_sparse(config.fit_spec(), data)  # sparse counts the fit refuses: here, before a run
            except ValueError as e:
                raise ConfigError(str(e)) from None


def check_outputs() -> Path:
    """The outputs folder (``$PLNEXP_OUTPUTS`` or ``./outputs``) exists or can be made, and can
    be written; else one :class:`ConfigError` line."""
    out = C.outputs_dir()
    env = os.environ.get("PLNEXP_OUTPUTS")
    where = f"PLNEXP_OUTPUTS={env}" if env else f"outputs folder {out}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe_writes(out)  # a byte written through: a full disk fails here, named
    except OSError as e:
        raise ConfigError(
            f"{where}: cannot write there ({e.strerror or e}); allowed values are writable folders"
        ) from None
    return out
