"""One job of ``run``, ``sweep`` or ``rerun`` as it runs where its executor put it (:class:`Task`: the
driver, a joblib worker, a SLURM task), given as its spec, whatever its kind: a job of the grid, the
control job, a peer's fit (:class:`~plnexp.jobs.spec.Kind`; the plan decided them all:
:func:`plnexp.experiment.sweep_extras.extras`). It runs, its run is logged live (created RUNNING, ended with
its status), and it says one line.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from ..system import credentials, interrupts
from ..jobs.spec import JobSpec, Kind
from ..jobs.provenance import RERUN_TAG
from ..jobs.tags import CONTROL_OF_TAG
from . import groups
from . import runner
from ..jobs import config as C
from ..jobs import config_load
from ..system.commandline import first_line
from ..system.redact import redact, redact_text
from .driver_watch import watch_driver
from .sweep_record import SweepRecord, store_of
from .sweep_summary import SKIPPED

if TYPE_CHECKING:
    from .peer_runs import PeerConfig
    from .processes import Ran


# ---------------------------------------------------------------- a job
def run_job(spec: JobSpec, output_dir: str = "", *, parent=None, hold: Callable | None = None) -> runner.Outcome | Ran:
    """Execute the job ``spec``, whatever its kind, with its MLflow run(s): the one way a job runs
    (:class:`Task`'s for ``run`` and a sweep's jobs, ``rerun``'s, process 0's of a fit across processes).

    A job of ``config.processes`` > 1 that this process has not joined (:func:`_joined`) runs
    through its N workers, started here and waited for (:func:`plnexp.experiment.processes.start`):
    process 0 runs it through this function and hands back its outcome
    (:class:`~plnexp.experiment.processes.Ran`), not its program (``hold`` is not kept). Any other
    job runs here: its runs created RUNNING now, ended with the job's status; one run per replicate
    (``config.replicates``, tagged ``replicate``), all fitted in one program
    (:func:`plnexp.experiment.runner.execute`), or a peer's fit (:attr:`~plnexp.jobs.spec.Kind.PEER`:
    :func:`plnexp.experiment.peer_runs.fit`; the convergence metrics against the data's best known
    ELBO apply), its run without plnexp's provenance tags (no ``config_hash``: never taken by resume
    for a job's run).

    ``parent`` (a :class:`plnexp.store.Parent`) makes the runs children of a sweep, in the sweep's
    store and experiment; otherwise they go to the config's store and experiment. On an interrupt the
    runs are ended KILLED and :class:`plnexp.system.interrupts.Interrupted` re-raised. The runs are
    created with the provenance tags (:func:`plnexp.jobs.provenance.run_tags`), ``spec.num`` as their
    job number, a sweep's job also with its ``report.min_speedup``
    (:data:`plnexp.jobs.ranking.MIN_SPEEDUP_TAG`), and the spec's tags. Returns the job's outcome
    (:func:`plnexp.experiment.runner.combined`), each replicate's in its ``batch``. ``hold``: given the
    job's compiled program (:class:`plnexp.fitting.prepared.Prepared`) to run it again.
    """
    from ..jobs import provenance
    from ..system import slurm
    from .. import store
    from ..jobs.ranking import MIN_SPEEDUP_TAG

    config = spec.config
    uri = parent.uri if parent else store.tracking_uri(config.tracking_uri)
    if config.processes > 1 and not _joined():
        from . import processes

        ran = processes.start(processes.Job(spec, run_job, parent), output_dir, uri)
        assert ran is not None  # every process here: process 0's outcome, or a FAILED one
        return ran
    peer = spec.kind is Kind.PEER
    if peer:
        from . import peer_runs
    store.set_timeout(config.store_timeout_s)  # a job in a process of its own (joblib, SLURM) too
    cl = store.client(uri)
    k = config.replicates
    outcomes = [
        runner.Outcome(
            runner.replicate_name(spec.name, i, k), spec.overrides, config, output_dir=output_dir, replicate=i
        )
        for i in range(k)
    ]
    outcomes[0].hold = hold
    tags = {
        **(peer_runs.tags(config) if peer else provenance.run_tags(config)),
        **({store.JOB_TAG: spec.num} if spec.num is not None else {}),
        # a sweep's job: the minimum effect its report ranks with (report.min_speedup, not a param:
        # not part of the fit, see plnexp.jobs.config.ReportSpec)
        **({MIN_SPEEDUP_TAG: f"{config.report.min_speedup:g}"} if parent is not None else {}),
        **spec.run_tags,
    }

    def finish(created: list[runner.Outcome]) -> None:  # each run ended with its outcome, or kept under pending/
        with interrupts.deferred():
            for out in created:
                out.kept = str(store.pending.finish(cl, uri, out.run_id, out) or "")

    try:
        with interrupts.deferred():
            exp_id = parent.experiment_id if parent else store.experiment_id(cl, config.experiment)
            for out in outcomes:
                out.run_id = store.start_job(
                    cl,
                    exp_id,
                    out,
                    parent.run_id if parent else None,
                    {**tags, provenance.REPLICATE_TAG: out.replicate},
                )
        if peer:
            peer_runs.fit(config, outcomes)
        else:
            runner.execute(config, outcomes)
    except KeyboardInterrupt as e:
        stop = interrupts.as_interrupted(e)
        for out in outcomes:
            out.status, out.reason = "KILLED", f"interrupted by {stop.name}{slurm.why(stop.signum)}"
            out.stop()
        finish([out for out in outcomes if out.run_id])
        raise stop from None
    finish(outcomes)
    job = runner.combined(outcomes)
    job.kept = next((o.kept for o in outcomes if o.kept), "")
    job.batch = outcomes
    return job


def _joined() -> bool:
    """Whether this process has joined a fit across processes already (a worker of
    :mod:`plnexp.experiment.processes`; a SLURM task of a job of N tasks,
    :func:`plnexp.experiment.sweep_dispatch.across_in_worker`): it runs its share itself, starting
    no workers."""
    import jax

    return jax.distributed.is_initialized()


def in_driver(record: SweepRecord | None) -> bool:
    """Whether this process is the sweep's driver (None: a single run, its own driver); else a
    worker (a joblib worker, a SLURM task), whose line goes back to the driver through its executor."""
    return record is None or (record.pid == os.getpid() and record.host == platform.node())


@dataclass
class Task:
    """The jobs of ``run``, ``sweep`` or ``rerun`` that this process executes, each given as its
    spec: run, log, one line (:meth:`__call__`, the one way a job runs).

    Picklable, so that launchers running jobs in other processes can ship it. ``failed`` counts the
    jobs of this process that did not finish (what ``run`` exits with; a peer's not counted); a
    sweep counts from MLflow.
    """

    failed: int = 0
    # why the store is down, once a job of this process saw it fail: the later jobs are skipped
    # (each would wait store_timeout_s on it again), said in one line each; "" while it answers
    store_down: str = ""
    # the programs of the jobs this process ran as a sweep's driver, kept for the rounds (groups.Held);
    # None: none kept (a single run, a rerun)
    held: groups.Held | None = None
    # how each job of the grid this process ran ended, by job number (what the control job needs)
    ended: dict[int, str] = field(default_factory=dict)
    absent: set[str] = field(default_factory=set)  # the peers said not installed (one line each)
    # what this process saw of the sweep's jobs, by (job number, replicate): the summary's rows when the
    # store cannot be read back at the sweep's close (plnexp.experiment.sweep.close_sweep)
    seen: dict[tuple[int, int], runner.Row] = field(default_factory=dict)

    def _saw(self, record: SweepRecord | None, num: int | None, rows) -> None:
        if record is not None and num is not None:
            self.seen.update({(num, k): row for k, row in enumerate(rows)})

    def __call__(self, spec: JobSpec, record: SweepRecord | None, output_dir: str) -> str | None:
        """Run the job ``spec`` (of the sweep ``record``; None: a single run) with its outputs in
        ``output_dir``; returns its progress line when it ran in another process than the driver
        (a joblib worker, a SLURM task, whose executor hands the line to the driver)."""
        from ..system import runtime
        from ..system import slurm

        # plnexp owns the process a job runs in (the driver, a joblib worker, a SLURM job): its
        # settings before the job starts JAX (idempotent where the command line applied them), and
        # its one masking boundary (the driver's command line installed it already)
        runtime.configure()
        if not credentials.installed():
            credentials.install()
        if slurm.in_job() and interrupts.pending() is None and not interrupts.in_place():
            with interrupts.handled(signals=slurm.JOB_SIGNALS):  # scancel, time limit, preemption
                return self._job(spec, record, output_dir)
        return self._job(spec, record, output_dir)

    def _label(self, spec: JobSpec, record: SweepRecord | None) -> str:
        """What the job's line starts with: its place in the sweep, or what a control job or a peer is."""
        tags = spec.run_tags
        if spec.kind is Kind.CONTROL:
            return f"[control] {spec.name} (job {int(tags[CONTROL_OF_TAG]) + 1} again: the report's A/A pair)"
        if spec.kind is Kind.PEER:
            from ..jobs.tags import PEER_OF_TAG

            label = cast("PeerConfig", spec.config).peer.label  # type: ignore[union-attr]
            if PEER_OF_TAG not in tags:  # a rerun's peer
                return f"[peer] {spec.name} (rerun of run {tags.get(RERUN_TAG)})"
            return f"[peer] {spec.name} (the default fit of {label} on job {int(tags[PEER_OF_TAG]) + 1}'s data)"
        if record is not None and spec.num is not None:
            return f"[{spec.num + 1}/{record.total}] {spec.name}"
        return spec.name

    def _skipped(self, spec: JobSpec) -> str | None:
        """Why a job beyond the grid does not run, in its line (None: it runs): a control job whose
        original did not finish here; a peer that is not installed."""
        if spec.kind is Kind.CONTROL:
            ref = int(spec.run_tags[CONTROL_OF_TAG])
            status = self.ended.get(ref, "FINISHED")  # not run here: reused (a resumed sweep) or given
            original = spec.name.removeprefix("control-")
            return (
                None
                if status == "FINISHED"
                else f"[control] {spec.name}: skipped (job {ref + 1}, {original}, did not finish)"
            )
        if spec.kind is Kind.PEER:
            why = cast("PeerConfig", spec.config).peer.available()  # type: ignore[union-attr]
            if why is None:
                return None
            if spec.peer in self.absent:  # said once per peer
                return ""
            self.absent.add(str(spec.peer))
            return f"[peer] {spec.peer}: {why}: its row is left out"
        return None

    def _job(self, spec: JobSpec, record: SweepRecord | None, output_dir: str) -> str | None:
        from ..system import slurm

        num = spec.num if record is not None else None
        config = spec.config
        peer = spec.kind is Kind.PEER
        here = in_driver(record)
        try:
            if record is not None:  # the record's URI is redacted: the store as this job reaches it
                record = replace(record, uri=store_of(record, config.tracking_uri))
        except C.ConfigError as e:
            line = f"plnexp: error: {redact_text(str(e))}"
            print(line, file=sys.stderr, flush=True)
            self.failed += 1
            return line
        skipped = self._skipped(spec)
        if skipped is not None:
            if skipped:
                print(skipped, flush=True)
            return None if here else skipped or None
        if record is not None and not peer:
            config = config.as_study()  # compile_cache auto: off, every job compiles cold
        if record is None or not peer:
            write_job_dir(output_dir, config, spec.overrides)
        if not here:  # a worker process: it ends when its driver is gone (watch_driver)
            assert record is not None
            watch_driver(record)
        label, name = self._label(spec, record), spec.name
        if self.store_down and record is not None:  # each job would wait store_timeout_s on it again
            grid = spec.kind is Kind.JOB  # a control job or a peer skipped: not one of the grid's jobs
            self.failed += grid
            self._saw(record, num, [runner.Row(name, SKIPPED, {}, 0.0)] if grid else [])
            line = f"{label} skipped: the store failed ({self.store_down}); resume=true runs it later"
            print(line, flush=True)
            return None if here else line
        if record is not None and here:
            print(f"{label} ...", end="", flush=True)
        try:
            outcome = run_job(  # a peer's: no job folder, no program kept
                replace(spec, config=config, num=num),
                "" if peer else output_dir,
                parent=record.parent if record else None,
                hold=self.held.keeper(num) if self.held is not None and num is not None and not peer else None,
            )
        except KeyboardInterrupt as e:
            self._saw(record, num, [runner.Row(name, "KILLED", {}, 0.0)])
            if record is not None:
                print(" KILLED" if here else f"{label} KILLED", flush=True)
            if not here and slurm.in_job():  # the run is recorded: the job ends normally, its line says why
                stop = interrupts.as_interrupted(e)
                return f"{label} KILLED (interrupted by {stop.name}{slurm.why(stop.signum)})"
            raise
        except Exception as e:  # the store failed under us: say so, go on
            pending = interrupts.pending()
            if pending is not None:  # a Ctrl-C that a library turned into another error
                raise pending from e
            self.failed += not peer
            self._saw(record, num, [runner.Row(name, "FAILED", {}, 0.0)])
            first = first_line(e)  # masked: a store's error may quote its URI
            self.store_down = f"job {name}: {type(e).__name__}"
            print(f"{' ' if record is not None and here else ''}FAILED", flush=True)
            what = "peer" if peer else "job"
            print(f"plnexp: error: {what} {name}: {first}", file=sys.stderr, flush=True)
            return None if here else f"{label} FAILED ({first})"
        self.failed += outcome.status != "FINISHED" and not peer
        if outcome.kept:  # the store failed after the fit: the next jobs are skipped
            self.store_down = f"job {name}'s result kept locally"
        self._saw(record, num, [o.row() for o in outcome.batch or [outcome]])  # (runner.Outcome, processes.Ran)
        if num is not None and spec.kind is Kind.JOB:
            self.ended[num] = outcome.status
        if record is None:
            print(f"{outcome.summary()}  (run {outcome.run_id}, experiment {config.experiment!r})", flush=True)
            return None
        word = "done" if outcome.status == "FINISHED" else outcome.status
        word += " (pending: kept locally)" if outcome.kept else ""  # not in the store yet
        if peer:
            r = outcome.result if isinstance(outcome, runner.Outcome) else None  # a peer's: in this process
            detail = f", {r.n_iter} iterations, run {r.timing.run_s:.3f} s, ELBO {r.loglik:.6g}" if r else ""
        else:
            detail = f" (+{time.monotonic() - outcome.clock - outcome.wall_s:.1f} s logging)"
        extra = f" ({redact_text(outcome.reason)})" if outcome.reason else ""
        text = f"{word} {outcome.wall_s:.1f} s{detail}{extra}"
        print(f" {text}" if here else f"{label} {text}", flush=True)
        return None if here else f"{label} {text}"


def write_job_dir(output_dir: str, config: C.Config, overrides=()) -> None:
    """The job's folder, with the config it runs (``config.yaml``, loadable: ``python -m plnexp run``
    of its values) and the overrides that named it (``overrides.yaml``), for people: nothing of
    plnexp reads them back (``rerun`` reads the run's logged config)."""
    if not output_dir:
        return
    import yaml

    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(redact(config_load.loadable(config)), sort_keys=False))
    (folder / "overrides.yaml").write_text(yaml.safe_dump([redact_text(o) for o in overrides]))
