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
      -> the ELBO curves compared (see :class:`~plnexp.experiment.rerun_verdict.Verdict`) and the
         timings (new/original)

The store is ``tracking_uri=STORE`` on the command line, else ``$MLFLOW_TRACKING_URI``, else the local
one under the outputs folder; never the run's logged ``tracking_uri``, which holds ``***`` in place of a
password (:mod:`plnexp.system.redact`).

Exit status: 0 reproduced; 1 a result that disagrees (see
:meth:`~plnexp.experiment.rerun_verdict.Verdict.failed`), a rerun that did not finish, or an original
with no finished result to compare with (FAILED, KILLED): not reproduced; 2 bad input; 130/143
interrupted.

Where the rest is: what a rerun repeats, rebuilt and checked (:mod:`plnexp.experiment.rerun_sources`);
how it compares (:mod:`plnexp.experiment.rerun_verdict`); a sweep's rerun, run by run (:func:`pairs`).
"""

from __future__ import annotations

import signal
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from ..system import interrupts
from ..jobs import provenance
from .. import store
from ..jobs.config import ConfigError
from ..core.data import DataError
from ..jobs.spec import JobSpec
from .executors import InProcess
from .processes import Ran
from ..system.commandline import Parser, UsageError, fail
from .rerun_sources import Source, prepare, store_override
from .rerun_verdict import compare, report_environment

if TYPE_CHECKING:
    from ..store.records import RunRecord

USAGE = "usage: python -m plnexp rerun RUN_ID [--strict] [tracking_uri=STORE] [overrides ...]"


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


def _rerun_one(uri: str, src: Source, overrides: list[str]):
    """The rerun's outcome for the original's replicate (a job of ``replicates=K`` reruns all K, in
    one program as they ran; the original is compared with its own replicate)."""
    spec = src.spec(overrides, 0 if src.peer is not None else None)
    if src.peer is not None:
        return _rerun_peer(uri, spec, src.run.experiment_id)
    from . import job_task

    # compared with the original's timings: compile_cache auto is off, the compile cold (a sweep's rerun:
    # job_task.Task); a fit across processes through its workers, started here (job_task.run_job, the one switch)
    job = job_task.run_job(replace(spec, config=src.config.as_study()))
    k = src.run.replicate
    return job.batch[k] if k < len(job.batch) else job


def _rerun_peer(uri: str, spec: JobSpec, experiment_id: str):
    """The rerun of a peer's run alone (``spec``: :meth:`Source.spec`): the peer's default fit on the
    data of the job it followed, a run of its own, through the path of a sweep's peers
    (:func:`plnexp.experiment.job_task.run_job`). A peer not installed here: one line."""
    from .peer_runs import PeerConfig
    from . import job_task

    assert isinstance(spec.config, PeerConfig) and spec.config.peer is not None
    why = spec.config.peer.available()
    if why is not None:
        raise ConfigError(f"run {spec.run_tags[provenance.RERUN_TAG]}: a run of the peer {spec.peer}, which is {why}")
    parent = store.Parent(uri, experiment_id, None)  # type: ignore[arg-type]  # None: no parent run
    return job_task.run_job(spec, parent=parent)


def _stopped(guard, e: KeyboardInterrupt, what: str) -> int:
    """An interrupt said in one line (``what`` it left); its exit code."""
    guard.stopping()
    stop = interrupts.as_interrupted(e)
    print(f"plnexp: interrupted by {stop.name}: {what}", file=sys.stderr, flush=True)
    return stop.exit_code


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
            given_store, overrides = store_override(overrides)
            with interrupts.deferred():
                uri, run, sources, digests = prepare(run_id, overrides, given_store)
        except (UsageError, ConfigError, DataError, store.StoreError) as e:
            return fail(e)
        except KeyboardInterrupt as e:
            return _stopped(guard, e, "before any run started")
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
    force = lambda signum: store.end_process_runs(
        uri,
        "KILLED",
        f"interrupted by {signal.Signals(signum).name} (twice: stopped inside a compiled fit)",
        "interrupted",
    )
    with interrupts.handled(force) as guard:
        try:
            outcome = _rerun_one(uri, src, overrides)
        except KeyboardInterrupt as e:
            return _stopped(guard, e, "the rerun was recorded KILLED")
    print(f"{outcome.summary()}  (run {outcome.run_id}, rerun_of {src.run_id})", flush=True)
    failed, lines = compare(uri, src, outcome, env_same, strict)  # (nothing to compare: not reproduced)
    for line in lines:
        print(line)
    print(f"rerun {'FAILED to reproduce' if failed else 'ok'}: run {outcome.run_id}", flush=True)
    return 1 if failed else 0


def _sweep(
    uri: str, parent_run: RunRecord, sources: list[Source], overrides: list[str], envs: dict, strict: bool
) -> int:
    """A new sweep of the sources' jobs, run in this process (the one sweep path,
    :func:`plnexp.experiment.sweep.session`), each job's spec made from its original's logged config; then
    every new run is compared with its original."""
    from . import job_task, sweep, sweep_dispatch, sweep_record

    name = parent_run.sweep if parent_run.sweep is not None else "sweep"
    sweep_dir = sweep_record.new_sweep_dir()
    # the given jobs (grid, control) in this process, then, as a sweep runs its peers, each peer's
    # run, numbered past the control job's (sources come in job order: peers last); a peer not
    # installed here is one line, compared below as "no rerun was recorded"
    jobs = [s for s in sources if s.peer is None]
    sources = jobs + [s for s in sources if s.peer is not None]
    specs = [s.spec(overrides, i if i < len(jobs) else i + 1) for i, s in enumerate(sources)]

    task = job_task.Task()

    def launch(record) -> None:
        sweep_dispatch.run_jobs(task, record, sweep_dir, specs, InProcess())

    end = sweep.session(
        sweep_dir,
        f"{name}-rerun",
        store.open(uri).experiment_name(parent_run.experiment_id),
        uri,
        len(jobs),
        {provenance.RERUN_TAG: parent_run.run_id, "command": provenance.command_line()},
        launch,
        seen=task.seen,
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
    for i, src, run in pairs(uri, parent_run, sources, specs, end.record.parent):
        if run is None:
            failed[i] = sources[i].name
            print(f"[{i + 1}/{len(sources)}] {src.name}: no rerun was recorded")
            continue
        outcome = Ran(run.name, run.status, run.status_reason, run.run_id)  # as recorded (perhaps by another process)
        bad, lines = compare(uri, src, outcome, envs[sources[i].run_id], strict)  # (nothing to compare: not reproduced)
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


def pairs(
    uri: str, parent_run: RunRecord, sources: list[Source], specs: list[JobSpec], new_parent
) -> list[tuple[int, Source, RunRecord | None]]:
    """``(i, source, rerun)`` for each run of each of ``sources`` (replicate 0 of a job, rerun as
    ``specs[i]``): the source itself, then one per other replicate of its job (the source with that
    replicate's original run), each with its rerun among ``new_parent``'s children, by the spec's
    job number and the replicate (None: none was recorded)."""
    db = store.open(uri)
    new: dict[tuple[int | None, int], RunRecord] = {
        (r.job, r.replicate): r for r in db.children(new_parent) if r.job is not None
    }
    earlier = db.sweep(parent_run)
    out: list[tuple[int, Source, RunRecord | None]] = []
    for i, (src, spec) in enumerate(zip(sources, specs)):
        out.append((i, src, new.get((spec.num, 0))))
        for k in range(1, src.original.replicates if src.peer is None else 1):
            twin = (r for r in earlier if (r.parent_id, r.job, r.replicate) == (src.run.parent_id, src.run.job, k))
            original = next(twin, None)
            if original is not None:
                out.append((i, replace(src, run=original), new.get((spec.num, k))))
    return out
