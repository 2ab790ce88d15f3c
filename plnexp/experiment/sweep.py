"""A sweep's life in MLflow, owned here, whatever executor runs its jobs.

::

    python -m plnexp sweep [overrides]              (plnexp.__main__, one process: the driver)
      -> plan.plan, check_data, store.check_store  every job composed once and validated once into
                                                      a JobSpec, each data set loaded once, the store
                                                      reached: still no run
      -> open_sweep(sweep_dir, ...)                   the experiment and the parent run, created once,
                                                      and the record <sweep_dir>/plnexp-sweep.json
      -> run_jobs(task, record, sweep_dir, specs, executor)   (plnexp.experiment.sweep_dispatch)
           the plan's jobs (the grid, then its control job and peers: plnexp.experiment.sweep_extras.extras),
           less those a resumed sweep reuses (sweep_dispatch.to_run), handed to the executor
           (plnexp.experiment.executors: in this process, joblib's workers, a SLURM job array),
           which runs each spec as one Task call (plnexp.experiment.job_task.Task), given the
           record: the job runs as a child of the parent, its run written live, its folder
           <sweep_dir>/<job number>
      -> close_sweep(record, status)                  after the last job, or on an interrupt
                                                      (KILLED) or a crash (FAILED): children still
                                                      RUNNING are ended (unless their owner is alive
                                                      elsewhere), the summary is read back from
                                                      MLflow, the parent closed.

A job in another process gets the record with its spec (pickled), never through this process's
memory; a worker tells itself from the driver by the record (its driver's host and process:
:func:`plnexp.experiment.job_task.in_driver`). A job of
``processes`` > 1 (one fit across N JAX processes) runs through its N workers, which
:func:`plnexp.experiment.job_task.run_job` starts from the process running the job (the basic
launcher's driver) and waits for (:mod:`plnexp.experiment.processes`: process 0 logs the child run
and hands the outcome back); under SLURM it is one SLURM job of N tasks, each joining the others
(:func:`~plnexp.experiment.sweep_dispatch.across_in_worker`).

The sweep's **control job** and its **peers**, after the grid where the driver runs it all: planned
with it (:func:`plnexp.experiment.sweep_extras.extras`). The record: :mod:`plnexp.experiment.sweep_record`;
the summary: :mod:`plnexp.experiment.sweep_summary`.
"""

from __future__ import annotations

import os
import platform
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..system import interrupts
from ..jobs import provenance
from . import resume
from . import runner
from .. import store
from ..jobs import config as C
from ..system.commandline import first_line
from ..system.redact import redact_text
from .sweep_record import RECORD_NAME, SweepRecord, write_record
from .sweep_summary import Summary


def open_sweep(
    sweep_dir: Path,
    name: str,
    experiment: str,
    uri: str,
    total: int,
    tags: dict,
    reused: tuple = (),
) -> SweepRecord:
    """Create the experiment (once, before any job) and the parent run, and write the record
    (``reused``: the jobs a resumed sweep does not run again, see :mod:`plnexp.experiment.resume`)."""
    sweep_dir = Path(sweep_dir)
    taken = C.ConfigError(
        f"hydra.sweep.dir={sweep_dir}: already holds a sweep ({RECORD_NAME}); allowed values are new or empty folders"
    )
    if (sweep_dir / RECORD_NAME).exists():
        raise taken
    sweep_dir.mkdir(parents=True, exist_ok=True)
    tags = {"jobs": total, "git_commit": provenance.git_commit(), "sweep": name, "sweep_dir": str(sweep_dir), **tags}
    parent = store.open_parent(uri, experiment, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}", tags)
    record = SweepRecord(
        uri,
        parent.experiment_id,
        parent.run_id,
        name,
        total,
        platform.node(),
        os.getpid(),
        time.time(),
        time.monotonic(),
        tuple(reused),
    )
    try:
        write_record(sweep_dir, record)
    except FileExistsError:
        store.close_parent(parent, "FAILED", {"status_reason": "sweep folder taken by another sweep"})
        raise taken from None
    return record


def close_sweep(record: SweepRecord, status: str = "FINISHED", reason: str = "", seen: dict | None = None) -> Summary:
    """End the sweep: children still RUNNING are ended (KILLED on an interrupt, FAILED otherwise) when
    their owner is this process or is gone (a dead local process); a child whose owner is alive
    elsewhere, or cannot be checked from here, is left RUNNING and counted so. The summary table is
    read back from MLflow (the store down: ``seen``, the rows this process's jobs saw,
    :attr:`plnexp.experiment.job_task.Task.seen`) and logged, and the parent closed with ``status`` (FAILED instead of
    FINISHED when jobs are missing). Safe to call again: it re-reads the store. First, unless
    interrupted, the results kept locally while the store failed (:mod:`plnexp.store.pending`)
    are sent if it is back (else they stay kept, their runs ended FAILED here until sent)."""
    if status != "KILLED":
        try:
            for line in store.pending.send_all(record.uri):
                print(line, file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - the store still fails: the results stay kept (the job's line said so)
            pass
    end_status = "KILLED" if status == "KILLED" else "FAILED"
    why = reason or "the sweep ended while this job was running"
    store_error = ""
    try:
        found = store.end_children(record.parent, end_status, why, "interrupted" if status == "KILLED" else "lost")
        found = sorted(
            found + resume.rows(record.uri, record.reused), key=lambda r: (r["job"], r.get("replicate", 0))
        )  # the grid
        rows = [runner.Row(r["name"], r["status"], r["metrics"], r["metrics"].get("wall_s", 0.0)) for r in found]
        jobs = tuple(r["job"] for r in found)
    except Exception as e:  # noqa: BLE001 - the store failed: the summary is what this process saw
        store_error = _store_error_line(record, e)
        saw = sorted((seen or {}).items())  # what this process's jobs saw (job_task.Task.seen)
        found, rows, jobs = [], [row for _, row in saw], tuple(job for (job, _), _ in saw)
    if status == "FINISHED" and len({j for j in jobs if j < record.total}) < record.total:  # (the control: not counted)
        status = "FAILED"
    here = record.host == platform.node() and record.clock
    wall = time.monotonic() - record.clock if here else time.time() - record.started
    summary = Summary(
        status,
        rows,
        record.total,
        wall,
        record.parent_id,
        tuple(r["name"] for r in found if r.get("reason") == "reused"),
        jobs,
        store_error,
    )
    if store_error:  # the store is down: the parent is not closed (sync or the next command ends it)
        return summary
    tags = {
        "n_done": summary.n_jobs,
        "n_failed": summary.n_failed,
        "wall_s": f"{summary.wall_s:.1f}",
        "fit_s": f"{summary.fit_s:.1f}",
    }
    if summary.n_running:
        tags["n_running"] = summary.n_running
    if reason:
        tags["status_reason"] = reason
    tags["mlflow.note.content"] = (
        f"**Sweep `{record.name}`** ({status}): {summary.n_jobs} of {record.total} jobs ran{summary.runs_note()}, "
        f"{summary.n_failed} failed; each job is a child run (expand this run's + to see them). `python -m plnexp report --run "
        f"{record.parent_id}` writes its table and plots and attaches them here (a sweep does it at its end)."
    )
    if status == "KILLED":
        tags["reason"] = "interrupted"
    try:
        store.close_parent(record.parent, status, tags, summary.table() + "\n" if rows else None)
    except Exception as e:  # noqa: BLE001 - the store failed at the last step: one line, the summary still shown
        summary.store_error = _store_error_line(record, e)
    return summary


def _store_error_line(record: SweepRecord, e: BaseException) -> str:
    """The one line a store that failed at the sweep's close gives (no traceback)."""
    return (
        f"plnexp: store error: {redact_text(record.uri)}: the sweep's close failed ({first_line(e)}); "
        f"the parent run {record.parent_id} stays RUNNING until python -m plnexp sync (or the next plnexp "
        "command on this store) ends it, the results kept in pending/ are sent then"
    )


def force_stop(record: SweepRecord | None, uri: str, signame: str, seen: dict | None = None) -> None:
    """From the interrupt helper thread, when the main thread is stuck in a compiled fit: end this
    process's RUNNING runs KILLED and close the sweep (the process exits right after)."""
    reason = f"interrupted by {signame} (twice: stopped inside a compiled fit)"
    store.end_process_runs(uri, "KILLED", reason, "interrupted")
    if record is not None:
        close_sweep(record, "KILLED", reason, seen).show(signame)
    else:
        print(f"plnexp: interrupted by {signame}: {killed_line(uri)}", file=sys.stderr, flush=True)


def killed_line(uri: str) -> str:
    """What an interrupted single ``run`` says: its run id (the runs this process created)."""
    ids = ", ".join(r.info.run_id for r in store.process_runs(uri))
    return f"the run {ids} was recorded KILLED" if ids else "no run had been created"


@dataclass
class Ended:
    """How a sweep session ended: its record and summary, and the interrupt or error that ended it."""

    record: SweepRecord
    summary: Summary
    stop: interrupts.Interrupted | None = None
    error: BaseException | None = None


def session(
    sweep_dir: Path,
    name: str,
    experiment: str,
    uri: str,
    total: int,
    tags: dict,
    jobs,
    *,
    header,
    reused: tuple = (),
    seen: dict | None = None,
) -> Ended:
    """A sweep's whole life, the one path of ``sweep``, ``sweep ... resume=true`` and ``rerun`` of a
    sweep: open the parent (:func:`open_sweep`; a :class:`~plnexp.jobs.config.ConfigError` before anything
    exists), print ``header(record)``, run ``jobs(record)`` (:func:`run_jobs` through an executor),
    then close it whatever happened (FINISHED; KILLED on Ctrl-C or SIGTERM; FAILED on an error of the
    machinery) and show the summary (``seen``: the rows the driver's jobs saw, for a store that fails at
    the close). A second signal while a fit is stuck in compiled code ends the
    process's runs and the sweep from the interrupt helper thread (:func:`force_stop`)."""
    held: dict = {}
    force = lambda signum: force_stop(held.get("record"), uri, signal.Signals(signum).name, seen)
    with interrupts.handled(force) as guard:
        record = held["record"] = open_sweep(sweep_dir, name, experiment, uri, total, tags, reused=reused)
        print(header(record), flush=True)
        status, reason, stop, error = "FAILED", "the sweep stopped on an error", None, None
        try:
            jobs(record)
            status, reason = "FINISHED", ""
        except BaseException as e:  # noqa: BLE001 - an interrupt, or an error of the machinery
            stop = interrupts.stopped_by(e, guard)
            if stop is None:
                error = e
                reason = f"the sweep stopped on an error: {type(e).__name__}"
            else:
                status, reason = "KILLED", f"interrupted by {stop.name}"
        guard.stopping()
        with interrupts.deferred():  # the parent never stays RUNNING
            summary = close_sweep(record, status, reason, seen)
        summary.show(stop.name if stop is not None else None)
    return Ended(record, summary, stop, error)
