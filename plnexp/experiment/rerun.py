"""``python -m plnexp rerun RUN_ID [--strict] [overrides]``: run a logged run, or a whole sweep, again
and say whether it reproduces.

::

    rerun RUN_ID [--strict] [overrides]
      -> the run read back from the store: its resolved config artifact (config.yaml), never its
         name; for a sweep's parent run, every child (and the children of the sweeps it resumed)
      -> the overrides applied (group=option, key=value: device=gpu, precision=float64, n_iter=50)
      -> every job validated, its data loaded (synthetic data regenerated from its seed, CSV files
         hashed): any problem is one line, exit 2, nothing created
      -> the environment recorded on the original compared with this one: one line per difference
      -> a new run tagged rerun_of=RUN_ID in the original's experiment (a sweep: a new sweep whose
         parent is tagged rerun_of=PARENT_RUN_ID, each child tagged with the child it reruns)
      -> the ELBO curves compared (see :class:`Verdict`) and the timings (new/original)

The store is ``tracking_uri=STORE`` on the command line, else ``$MLFLOW_TRACKING_URI``, else the local
one under the outputs folder; never the run's logged ``tracking_uri``, which holds ``***`` in place of a
password (:mod:`plnexp.system.redact`).

Exit status: 0 reproduced; 1 a result that disagrees (see :meth:`Verdict.failed`), a rerun that
did not finish, or an original with no finished result to compare with (FAILED, KILLED): not
reproduced; 2 bad input; 130/143 interrupted.
"""

from __future__ import annotations

import re
import signal
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast
from collections.abc import Iterable

import numpy as np
import yaml

from ..jobs import config as C
from ..system import interrupts
from ..jobs import provenance
from . import rerun_pairs, runner
from .. import store as tracking
from ..jobs.config import Config, ConfigError
from ..core.data import DataError
from ..core.precision import PRECISIONS
from ..jobs.spec import JobSpec, Kind
from .executors import InProcess
from ..system.commandline import Parser, UsageError, fail

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..store.records import RunRecord

USAGE = "usage: python -m plnexp rerun RUN_ID [--strict] [tracking_uri=STORE] [overrides ...]"
RUN_ID = re.compile(r"^[0-9a-f]{32}$")
FORBIDDEN = ("experiment", "tracking_uri", "sweep")  # a rerun goes where its original is


@dataclass
class Source:
    """One run to rerun: the original (its record) and the config the rerun will use."""

    run: RunRecord
    original: Config
    config: Config
    peer: str | None = None  # a peer's run (tag plnexp.peer): the peer's name; its configs are the job's it followed

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def name(self) -> str:
        return self.run.name

    def logged(self, config: Config) -> Config:
        """What a run of ``config`` logs: the config, or for a peer's run what the peer runs beside
        the job (:func:`plnexp.experiment.peer_runs.peer_config`)."""
        if self.peer is None:
            return config
        from ..jobs.peers import PEERS
        from .peer_runs import peer_config

        return peer_config(PEERS[self.peer], config)

    @property
    def same_config(self) -> bool:
        recorded = self.run.config_hash or provenance.config_hash(self.logged(self.original))
        return recorded == provenance.config_hash(self.logged(self.config))


# ---------------------------------------------------------------- rebuilding a run's config
def apply_overrides(node: dict, overrides: list[str]) -> DictConfig:
    """``node`` (a logged config, loadable) with Hydra-style overrides applied: ``group=option``
    replaces the group's key with what Hydra composes for that option (every group of ``conf/`` sets
    the key named after it, whatever its package), ``key=value`` sets an existing key."""
    from omegaconf import OmegaConf

    from . import plan as cli

    parsed = cli.parse(overrides)
    cli.check_groups(parsed)
    cfg = OmegaConf.create(node)
    for text, p in zip(overrides, parsed):
        key = p.key_or_group
        if p.is_sweep_override():
            raise ConfigError(f"{text}: a rerun takes one value per key; allowed forms are key=value, group=option")
        if p.is_add() or p.is_delete() or p.is_force_add() or key.startswith(("hydra.", "hydra/")):
            raise ConfigError(f"{text}: not allowed in a rerun; allowed forms are key=value, group=option")
        if key.split(".")[0] in FORBIDDEN:
            raise ConfigError(
                f"{text}: a rerun goes to the original's experiment and store; allowed overrides are the other keys"
            )
        if key in C.GROUPS:  # the option's value of its key, as Hydra composes it, replaces the logged one
            cfg[key] = cli.group_value(key, p.get_value_element_as_str())
            continue
        parent, _, leaf = key.rpartition(".")
        where = OmegaConf.select(cfg, parent) if parent else cfg
        if not (OmegaConf.is_dict(where) and leaf in where):
            # a config's keys are strings (a DictConfig's keys() is typed for every key type omegaconf allows)
            allowed = ", ".join(cast(Iterable[str], where.keys())) if OmegaConf.is_dict(where) else "none"
            raise ConfigError(f"{key}: unknown key; allowed keys{' under ' + parent if parent else ''} are {allowed}")
        OmegaConf.update(cfg, key, p.value(), merge=False)
    return cfg


def logged_node(uri: str, run: RunRecord) -> dict:
    """The loadable config of a logged run, from its ``config.yaml`` artifact; one line if missing
    or made by an incompatible plnexp."""
    rid = run.run_id
    fmt = run.provenance
    if fmt is not None and fmt != provenance.PROVENANCE_VERSION:
        raise ConfigError(
            f"run {rid}: logged by plnexp {run.version or '?'} in "
            f"provenance format {fmt}; allowed values are runs of format "
            f"{provenance.PROVENANCE_VERSION} (plnexp {provenance.package_version()})"
        )
    text = tracking.read_artifact(uri, rid, "config.yaml")
    if text is None:
        raise ConfigError(
            f"run {rid} ({run.name}): its config artifact config.yaml is missing; allowed "
            f"values are runs logged by plnexp with their resolved config"
        )
    try:
        node = yaml.safe_load(text)
        if not isinstance(node, dict):
            raise ValueError("not a mapping")
        node = dict(node)
        if "n_iter_requested" in node:  # the resolved n_iter is re-derived from the request and the caps
            node["n_iter"] = node.pop("n_iter_requested")
        node = provenance.migrate_node(node)
        if peer_of(run) is not None:
            node = job_node_of_peer(node)
        C.load(node, check_device=False)
    except ConfigError as e:
        if "allowed values are paths of existing" in str(e):  # the config is fine, its data file is gone (CSV, .h5ad)
            raise ConfigError(f"run {rid}: {e}") from None
        raise ConfigError(
            f"run {rid}: made by an incompatible older plnexp (its config.yaml does not load: "
            f"{e}); allowed values are runs logged by plnexp {provenance.package_version()}"
        ) from None
    except (ValueError, TypeError, yaml.YAMLError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(
            f"run {rid}: made by an incompatible older plnexp (its config.yaml does not load: "
            f"{first}); allowed values are runs logged by plnexp "
            f"{provenance.package_version()}"
        ) from None
    return node


def peer_of(run: RunRecord) -> str | None:
    """The peer whose run ``run`` is (tag ``plnexp.peer``), else None. A peer the registry no longer
    has: one line."""
    from ..jobs.peers import PEERS

    name = run.peer
    if name is not None and name not in PEERS:
        raise ConfigError(
            f"run {run.run_id}: a run of the peer {name!r}, which this plnexp does not have; "
            f"allowed values are runs of plnexp's jobs and of the peers {', '.join(PEERS)}"
        )
    return name


def job_node_of_peer(node: dict) -> dict:
    """A peer run's logged config (:meth:`plnexp.experiment.peer_runs.PeerConfig.as_dict`) as the
    config of a job the peer follows: without ``peer``, with a strategy of plnexp's (the peer's
    config takes its model, optimizer, precision and iteration cap from the peer, never from the
    job: :func:`~plnexp.experiment.peer_runs.peer_config`), the keys a peer run leaves out at
    their defaults."""
    from dataclasses import MISSING, fields

    from .peer_runs import LEFT_OUT

    node = {k: v for k, v in node.items() if k != "peer"}
    node["strategy"] = {"name": "scan"}
    for f in fields(Config):  # the keys a peer's run does not log (settings of plnexp's fits alone)
        if f.name in LEFT_OUT and f.name not in node and f.name != "n_iter_requested":  # n_iter: the cap it ran
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            if default is not MISSING:
                node[f.name] = getattr(default, "value", default)
    return node


def source(uri: str, run: RunRecord, overrides: list[str], experiment: str) -> Source:
    node = logged_node(uri, run)
    original = C.load(node, check_device=False)
    node = {**node, "experiment": experiment, "tracking_uri": uri}
    return Source(run, original, C.load(apply_overrides(node, overrides)), peer_of(run))


def find(uri: str, run_id: str) -> RunRecord:
    if not RUN_ID.match(run_id):
        raise ConfigError(
            f"run id {run_id!r}: malformed; allowed values are MLflow run ids (32 hexadecimal characters)"
        )
    run = tracking.records.run(uri, run_id)
    if run is None or run.deleted:
        raise ConfigError(
            f"run {run_id}: not found in the store {uri}; allowed values are ids of runs in this "
            f"store (MLFLOW_TRACKING_URI or PLNEXP_OUTPUTS selects another)"
        )
    return run


def originals(uri: str, run: RunRecord) -> list[RunRecord]:
    """The runs a rerun of ``run`` repeats: ``[run]``, or for a sweep's parent the runs of the sweep
    (its children and the FINISHED children of the sweeps it resumed: :func:`tracking.records.sweep`)."""
    runs = tracking.records.sweep(uri, run)
    # a job of replicates=K is K runs of one program: it reruns as one job, each run compared (rerun_pairs)
    return [r for r in runs if r.replicate == 0] or [run]


def store_override(overrides: list[str]) -> tuple[str | None, list[str]]:
    """``tracking_uri=URI`` on a rerun's command line: the store the run is in (and the rerun goes
    to; the last one given wins), and the other overrides. Without it the store is
    ``$MLFLOW_TRACKING_URI`` or the local one under the outputs folder: never the run's logged
    ``tracking_uri``, which holds ``***`` in place of a password (:mod:`plnexp.system.redact`)."""
    given = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "tracking_uri"]
    return (given[-1] if given else None), [o for o in overrides if o.split("=", 1)[0] != "tracking_uri"]


def plan(
    run_id: str, overrides: list[str], store: str | None = None
) -> tuple[str, RunRecord, list[Source], dict[str, str]]:
    """Everything before the first run exists: (store URI, original run, sources, data digests by
    run id); ``store``: the ``tracking_uri=`` given (:func:`store_override`). Raises ConfigError,
    DataError or StoreError (one line each; a URI holding ``***`` is refused by the store's check)."""
    from . import plan as cli

    cli.check_outputs()
    uri = tracking.check_store(store)
    runner.load_data.cache_clear()  # a CSV file may have changed since this process read it
    find(uri, run_id)  # a malformed or unknown id fails before anything is written
    orphans = tracking.sweep_up_orphans(uri)  # as every command does: runs of dead processes are FAILED
    if orphans:
        print(
            f"plnexp: {len(orphans)} run(s) left RUNNING by processes of this host that no longer exist, "
            f"marked FAILED (reason=orphaned)",
            file=sys.stderr,
            flush=True,
        )
    run = find(uri, run_id)
    experiment = tracking.experiment_name(uri, run.experiment_id)
    for r in [run, *tracking.records.children(uri, run)]:
        if r.status == "RUNNING":
            of = "" if r is run else f" ({r.name}) of sweep {run_id}"
            raise ConfigError(
                f"run {r.run_id}{of}: still RUNNING; allowed values are ended runs (FINISHED, FAILED, KILLED)"
            )
    sources = [source(uri, r, overrides, experiment) for r in originals(uri, run)]
    cli.check_data([cli.Job((), s.config) for s in sources])  # as run and sweep: limits, rank, sparse counts
    digests = {s.run_id: runner.load_data(s.config.dataset).digest() for s in sources}
    return uri, run, sources, digests


# ---------------------------------------------------------------- comparing
@dataclass(frozen=True)
class Verdict:
    """How a rerun's ELBO curve compares with its original's.

    ``expect_identical`` (same config, same environment, CPU): the curves must be equal bit for bit.
    Otherwise they must agree within the precision's ``curve_rtol`` (:mod:`plnexp.core.precision`) (the
    looser of the two precisions) over the same number of iterations. A disagreement fails the
    rerun when the config is the same (only the environment moved) or when ``strict`` is asked
    for; a config changed by overrides is expected to give another curve.
    """

    identical: bool
    max_rel: float
    n_old: int
    n_new: int
    tol: float
    precision: str
    same_config: bool
    expect_identical: bool
    status_ok: bool = True  # the rerun FINISHED (or the original did not either)

    @property
    def within(self) -> bool:
        return self.n_old == self.n_new and self.max_rel <= self.tol

    @property
    def agree(self) -> bool:
        return self.status_ok and (self.identical if self.expect_identical else self.within)

    def failed(self, strict: bool = False) -> bool:
        return not self.agree and (self.same_config or strict or not self.status_ok)

    def line(self) -> str:
        if self.identical:
            return f"ELBO curves: identical, bit for bit ({self.n_new} iterations)"
        n = min(self.n_old, self.n_new)
        lengths = "" if self.n_old == self.n_new else f"; lengths differ: {self.n_old} -> {self.n_new} iterations"
        where = "within" if self.max_rel <= self.tol else "beyond"
        text = (
            f"ELBO curves: max relative difference {self.max_rel:.3g} over {n} iterations, {where} the "
            f"{self.precision} tolerance {self.tol:g}{lengths}"
        )
        if self.expect_identical:
            text += " (same config and environment on CPU: they must be identical)"
        return text


def verdict(src: Source, env_same: bool, old: np.ndarray, new: np.ndarray, status_ok: bool = True) -> Verdict:
    identical, rel = provenance.curve_difference(old, new)
    precisions = {src.original.precision.name, src.config.precision.name}
    tol = max(PRECISIONS[p].curve_rtol for p in precisions)
    precision = max(precisions, key=lambda p: PRECISIONS[p].curve_rtol)
    expect = src.same_config and env_same and src.run.platform == "cpu"
    return Verdict(identical, rel, len(old), len(new), tol, precision, src.same_config, expect, status_ok)


def timing_line(old: dict, new: dict) -> str:
    """The rerun's times over the original's. The machine floors are compared only when both runs
    counted the same bytes per iteration (``floor_bytes_per_iter``): runs logged before the floor knew
    the model counted another iteration."""

    def ratio(key, unit, fmt):
        a, b = old.get(key), new.get(key)
        if not a or b is None or not np.isfinite(a) or not np.isfinite(b):
            return "-"
        return f"{b / a:.2f}x ({fmt.format(b)} vs {fmt.format(a)} {unit})"

    floor = ratio("floor_ms_per_iter", "ms/iter", "{:.3f}")
    counted = old.get("floor_bytes_per_iter"), new.get("floor_bytes_per_iter")
    if floor != "-" and (counted[0] is None or counted[0] != counted[1]):
        floor = "- (counted differently)"
    return (
        f"timing new/original: compile {ratio('compile_s', 's', '{:.3f}')}, steady "
        f"{ratio('ms_per_iter', 'ms/iter', '{:.3f}')}, machine floor {floor}"
    )


def report_environment(src: Source, digest: str) -> list[str]:
    """The lines printed before running: environment differences and changed data files."""
    lines = provenance.changed_files(src.run.tags, src.config)
    lines += provenance.differences(src.run.tags, provenance.environment(src.config, digest))
    return lines


def compare(uri: str, src: Source, outcome, env_same: bool) -> tuple[Verdict | None, list[str]]:
    """After the rerun: the verdict (None when the original has no finished result: nothing to
    compare, not reproduced) and the lines."""
    new_run = tracking.records.run(uri, outcome.run_id)
    if src.run.status != "FINISHED":
        ended = "" if outcome.status == "FINISHED" else f"; the rerun ended {outcome.status}: {outcome.reason}"
        return None, [f"the original run was {src.run.status}: no finished result to compare with{ended}"]
    v = verdict(
        src,
        env_same,
        tracking.read_curve(uri, src.run_id),
        tracking.read_curve(uri, outcome.run_id),
        status_ok=outcome.status == "FINISHED",
    )
    tracking.set_tags(
        uri,
        outcome.run_id,
        {
            "rerun.identical": str(v.identical).lower(),
            "rerun.max_rel_diff": f"{v.max_rel:.3g}",
            "rerun.within_tolerance": str(v.within).lower(),
            "rerun.agrees": str(v.agree).lower(),
        },
    )
    lines = [] if v.status_ok else [f"the rerun ended {outcome.status}: {outcome.reason}"]
    lines.append(v.line())
    lines.append(timing_line(dict(src.run.metrics), dict(new_run.metrics) if new_run else {}))
    return v, lines


# ---------------------------------------------------------------- the command
def parser() -> Parser:
    """``rerun``'s arguments (:mod:`plnexp.cli.parser` names the command)."""
    p = Parser(USAGE.removeprefix("usage: "), HELP.split("\n\n", 1)[1])
    p.add_argument("run_id", nargs="?", metavar="RUN_ID", help="the run (or a sweep's parent run) to rerun")
    p.add_argument("--strict", action="store_true", help="fail also when overrides move the curve beyond tolerance")
    p.add_argument("overrides", nargs="*", help="tracking_uri=STORE, key=value, group=option")
    return p


def parse(args: list[str]) -> tuple[str, list[str], bool] | None:
    """(RUN_ID, the overrides, --strict); None once ``--help`` is printed; a UsageError (one line)
    for anything else."""
    p = parser()
    ns = p.parse(args)
    if ns is None:
        return None
    if ns.run_id is None:
        p.error("no run id")
    return ns.run_id, ns.overrides, ns.strict


def job_spec(src: Source, overrides: list[str], num: int | None = None) -> JobSpec:
    """The rerun of ``src`` as a job: its logged config (the overrides applied), named as a job of
    that config is (precision=float64 gives ...-f64-...) when overrides change it, else the
    original's name; tagged with the run it repeats; job number ``num`` of the rerun's sweep. A
    sweep's control job reruns as the control job (its tags kept: the rerun's A/A pair)."""
    logged = src.run.overrides + tuple(overrides)  # (job_name names a key given twice once, as it runs)
    base = src.name.removesuffix(f"-rep{src.run.replicate}") if src.original.replicates > 1 else src.name
    name = src.config.job_name(logged) if overrides else base  # a replicate's run reruns as its job: one suffix
    kind = Kind.CONTROL if src.run.control else Kind.JOB
    tags = {**src.run.control_tags, provenance.RERUN_TAG: src.run_id}
    return JobSpec(src.config, name, num, logged, kind, tags=tags)


def _rerun_one(uri: str, src: Source, overrides: list[str]):
    """The rerun's outcome for the original's replicate (a job of ``replicates=K`` reruns all K, in
    one program as they ran; the original is compared with its own replicate)."""
    if src.peer is not None:
        return _rerun_peer(uri, src, src.run.experiment_id, None, 0)
    spec = job_spec(src, overrides)
    from . import sweep

    # compared with the original's timings: compile_cache auto is off, the compile cold (a sweep's rerun:
    # sweep.Task); a fit across processes through its workers, started here (sweep.run_job, the one switch)
    job = sweep.run_job(src.config.as_study(), spec.overrides, spec.name, tags=spec.run_tags)
    k = src.run.replicate
    return job.batch[k] if k < len(job.batch) else job


def _rerun_peer(uri: str, src: Source, experiment_id: str, parent_id: str | None, num: int):
    """The rerun of a peer's run: the peer's default fit on the data of the job it followed, logged
    as job number ``num`` of ``parent_id`` (None: a run of its own), through the path of a sweep's
    peers (:func:`plnexp.experiment.peer_runs.run_peer`). A peer not installed here: one line."""
    from ..jobs.peers import PEERS
    from .peer_runs import run_peer

    assert src.peer is not None
    peer = PEERS[src.peer]
    why = peer.available()
    if why is not None:
        raise ConfigError(f"run {src.run_id}: a run of the peer {src.peer}, which is {why}")
    parent = tracking.Parent(uri, experiment_id, parent_id)  # type: ignore[arg-type]  # None: no parent run
    return run_peer(peer, src.config, parent, num, {provenance.RERUN_TAG: src.run_id})


def _stop_line(stop, what: str) -> None:
    print(f"plnexp: interrupted by {stop.name}: {what}", file=sys.stderr, flush=True)


HELP = f"""{USAGE}

Reruns the logged run RUN_ID (a sweep's parent: every child, as a new sweep) from its resolved config,
with the overrides applied (group=option, key=value), as a new run tagged rerun_of=RUN_ID in the same
experiment; prints every environment difference first, then compares the ELBO curves and timings.
The store: tracking_uri=STORE, else MLFLOW_TRACKING_URI, else the local one (never the run's logged
tracking_uri, which holds *** in place of a password).
Exit 0 reproduced; 1 not reproduced: a curve that disagrees, a rerun that did not finish, an original with
no finished result to compare with (--strict: also when overrides moved the curve beyond the
precision's tolerance); 2 bad input (nothing created)."""


def main(args: list[str]) -> int:
    with interrupts.handled() as guard:  # nothing created yet: an interrupt is one line
        try:
            parsed = parse(args)
            if parsed is None:  # --help: printed
                return 0
            run_id, overrides, strict = parsed
            store, overrides = store_override(overrides)
            with interrupts.deferred():
                uri, run, sources, digests = plan(run_id, overrides, store)
        except (UsageError, ConfigError, DataError, tracking.StoreError) as e:
            return fail(e)
        except KeyboardInterrupt as e:
            guard.stopping()
            stop = interrupts.as_interrupted(e)
            _stop_line(stop, "before any run started")
            return stop.exit_code
    is_sweep = len(sources) > 1 or sources[0].run is not run
    envs = {}
    for i, s in enumerate(sources):
        lines = report_environment(s, digests[s.run_id])
        envs[s.run_id] = not lines
        head = f"[{i + 1}/{len(sources)}] " if is_sweep else "rerun of "
        head += f"{s.name} (run {s.run_id})"
        print(f"{head}: {'same environment' if not lines else f'{len(lines)} difference(s) from the original'}")
        for line in lines:
            print(f"  {line}")
    sys.stdout.flush()
    return (
        _sweep(uri, run, sources, overrides, envs, strict)
        if is_sweep
        else _single(uri, sources[0], overrides, envs[sources[0].run_id], strict)
    )


def _single(uri: str, src: Source, overrides: list[str], env_same: bool, strict: bool) -> int:
    force = lambda signum: tracking.end_process_runs(
        uri,
        "KILLED",
        f"interrupted by {signal.Signals(signum).name} (twice: stopped inside a compiled fit)",
        "interrupted",
    )
    with interrupts.handled(force) as guard:
        try:
            outcome = _rerun_one(uri, src, overrides)
        except KeyboardInterrupt as e:
            guard.stopping()
            stop = interrupts.as_interrupted(e)
            _stop_line(stop, "the rerun was recorded KILLED")
            return stop.exit_code
    print(f"{outcome.summary()}  (run {outcome.run_id}, rerun_of {src.run_id})", flush=True)
    v, lines = compare(uri, src, outcome, env_same)
    for line in lines:
        print(line)
    failed = v is None or v.failed(strict)  # nothing to compare, or a rerun that did not finish: not reproduced
    print(f"rerun {'FAILED to reproduce' if failed else 'ok'}: run {outcome.run_id}", flush=True)
    return 1 if failed else 0


def _sweep(
    uri: str, parent_run: RunRecord, sources: list[Source], overrides: list[str], envs: dict, strict: bool
) -> int:
    """A new sweep of the sources' jobs, run in this process (the one sweep path,
    :func:`plnexp.experiment.sweep.session`), each job's spec made from its original's logged config; then
    every new run is compared with its original."""
    from . import sweep

    name = parent_run.sweep if parent_run.sweep is not None else "sweep"
    sweep_dir = sweep.new_sweep_dir()
    # the jobs (grid, control) in this process; then, as a sweep runs its peers, each peer's run,
    # numbered after the jobs (sources come in job order: peers last)
    jobs = [s for s in sources if s.peer is None]
    sources = jobs + [s for s in sources if s.peer is not None]
    specs = [job_spec(s, overrides, i) for i, s in enumerate(jobs)]

    def launch(record) -> None:
        if specs:  # the given jobs alone: no control job, no peers of the sweep's own (they are given too)
            sweep.run_jobs(sweep.Task(extras=False), record, sweep_dir, specs, InProcess())
        from ..jobs.peers import PEERS

        for num, s in enumerate(sources[len(jobs) :], start=len(jobs) + 1):  # past the control job's, as a sweep
            assert s.peer is not None
            why = PEERS[s.peer].available()
            if why is not None:  # compared below as "no rerun was recorded"
                print(f"[peer] {s.name}: {s.peer} is {why}: not rerun", flush=True)
                continue
            print(f"[peer] {s.name} (rerun of run {s.run_id}) ...", flush=True)
            _rerun_peer(uri, s, record.parent.experiment_id, record.parent.run_id, num)

    end = sweep.session(
        sweep_dir,
        f"{name}-rerun",
        tracking.experiment_name(uri, parent_run.experiment_id),
        uri,
        len(jobs),
        {provenance.RERUN_TAG: parent_run.run_id, "command": provenance.command_line()},
        launch,
        header=lambda record: (
            f"rerun of sweep {name} (run {parent_run.run_id}): {len(sources)} jobs, parent run {record.parent_id}"
        ),
    )
    if end.stop is not None:
        return end.stop.exit_code
    if end.error is not None:
        raise end.error
    if end.summary.store_error:  # said in one line; the comparison would read the store that failed
        return 1
    failed: dict[int, str] = {}  # a job not reproduced, by its place: any of its runs (every replicate's)
    for i, src, run in rerun_pairs.pairs(uri, parent_run, sources, end.record.parent, len(jobs)):
        if run is None:
            failed[i] = sources[i].name
            print(f"[{i + 1}/{len(sources)}] {src.name}: no rerun was recorded")
            continue
        outcome = Rerun.of(run)
        v, lines = compare(uri, src, outcome, envs[sources[i].run_id])
        bad = v is None or v.failed(strict)  # nothing to compare: not reproduced
        failed.update({i: sources[i].name} if bad else {})
        print(f"[{i + 1}/{len(sources)}] {src.name} (run {outcome.run_id}){' DISAGREES' if bad else ''}")
        for line in lines:
            print(f"  {line}")
    n, failures = len(sources), list(failed.values())
    print(
        f"rerun {'FAILED to reproduce' if failures else 'ok'}: {n - len(failures)} of {n} jobs reproduced"
        f"{': ' + ', '.join(failures) + ' did not' if failures else ''}; parent run {end.record.parent_id}",
        flush=True,
    )
    return 1 if failures else 0


@dataclass(frozen=True)
class Rerun:
    """A rerun as recorded in the store (a job run by the launcher, perhaps in another process)."""

    run_id: str
    status: str
    reason: str

    @classmethod
    def of(cls, run: RunRecord) -> Rerun:
        return cls(run.run_id, run.status, run.status_reason)
