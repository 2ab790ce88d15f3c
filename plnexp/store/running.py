"""Runs left RUNNING, and who may end them: only their :class:`~plnexp.store.owners.Owner`, or
anyone once that owner is known to be gone (``alive()`` is False), with the owner's reason
(:meth:`~plnexp.store.owners.Owner.end_reason`: ``orphaned`` for a dead local process, ``slurm job
12_3 CANCELLED`` for an ended SLURM job). A run whose owner is alive, or cannot be checked from here
(``alive()`` None: another host's process, a SLURM job whose scheduler cannot be asked), is never
touched. Each distinct owner is asked once per call (one ``squeue`` per SLURM job, not per run)."""

from __future__ import annotations

from . import owners
from .owners import Owner
from .queries import MlflowStore, search_experiments
from .backend import client
from .records import RunRecord, record
from .writes import Parent
from ..jobs.tags import REASON_TAG, STATUS_REASON_TAG


def _runs_of(cl, owner: Owner | None = None, status: str | None = "RUNNING") -> list[RunRecord]:
    """The runs with ``status`` (None: any status) in every experiment; with ``owner``, only the
    runs written with its tags."""
    where = [f"attributes.status = '{status}'"] if status else []
    where += [f"tags.`{k}` = '{v}'" for k, v in (owner.tags() if owner is not None else {}).items()]
    return [record(r) for r in search_experiments(cl, " and ".join(where))]


def _gone(owner: Owner, asked: dict) -> Owner | None:
    """The owner, asked whether it is alive (it then knows why it ended), if it is known to be gone;
    else None. Each distinct owner is asked once per ``asked`` (one ``squeue`` per SLURM job, not per run)."""
    # by its tags, not by equality: an older run's LocalProcess (host and PID only) equals every
    # later process that got its PID, which may be gone while that one is alive, or the reverse
    key = (type(owner).__name__, tuple(sorted(owner.tags().items())))
    if key not in asked:
        asked[key] = owner if owner.alive() is False else None
    return asked[key]


def end_running(cl, runs: list[RunRecord], status: str, reason: str, code: str) -> list[RunRecord]:
    """End every run of ``runs`` still RUNNING with ``status``, tags ``reason=code`` and
    ``status_reason=reason``; returns those runs. (It does not ask their owners.)"""
    from mlflow.entities import RunTag

    ended = []
    for r in runs:
        if r.status != "RUNNING":
            continue
        cl.log_batch(r.run_id, tags=[RunTag(REASON_TAG, code), RunTag(STATUS_REASON_TAG, reason)])
        cl.set_terminated(r.run_id, status)
        ended.append(r)
    return ended


def end_children(parent: Parent, status: str, reason: str, code: str) -> list[dict]:
    """End the parent's children still RUNNING that this process may end (its own,
    with ``status`` and ``reason``; those of owners known to be gone, FAILED with the owner's reason,
    except a local process's when ``status`` is KILLED: the interrupt that ends the sweep ended it, a
    joblib worker's Ctrl-C); a child whose owner is alive elsewhere, or cannot be checked from here,
    stays RUNNING. Returns every child as a plain row: name, status, reason, metrics, job number."""
    cl, db = client(parent.uri), MlflowStore(parent.uri)
    runs = db.children(parent)
    me, ended = owners.current(), []
    asked: dict = {}
    for r in runs:
        owner = r.owner
        if r.status != "RUNNING" or owner is None:
            continue
        gone = None if owner == me else _gone(owner, asked)
        if owner == me or (status == "KILLED" and isinstance(gone, owners.LocalProcess)):
            ended += end_running(cl, [r], status, reason, code)  # its own, or one the sweep's Ctrl-C ended too
        elif gone is not None:  # died on its own: FAILED, with its owner's reason (slurm job 12_3 CANCELLED)
            ended += end_running(cl, [r], "FAILED", *reversed(gone.end_reason()))
    if ended:
        runs = db.children(parent)
    return [
        {
            "name": r.name,
            "status": r.status,
            "reason": r.status_reason,
            "metrics": dict(r.metrics),
            "job": r.job or 0,
            "replicate": r.replicate,
        }
        for r in runs
    ]


def process_runs(uri: str) -> list[RunRecord]:
    """The runs this process created (any status), in this store."""
    return _runs_of(client(uri), owners.current(), status=None)


def end_process_runs(uri: str, status: str, reason: str, code: str) -> list[RunRecord]:
    """End the runs this process left RUNNING (e.g. when it must exit without unwinding)."""
    cl = client(uri)
    return end_running(cl, _runs_of(cl, owners.current()), status, reason, code)


def end_runs_of_processes(uri: str, pids, status: str, reason: str, code: str) -> list[RunRecord]:
    """End the runs left RUNNING by the processes ``pids`` of this host, which this process started
    and has seen end (the processes of one fit across processes, :mod:`plnexp.experiment.processes`):
    by their host and PID tags, which a SLURM task's runs carry too; a PID that is some live process
    again is left alone."""
    cl = client(uri)
    here, ours = owners.LocalProcess.here().host, {str(p) for p in pids}
    runs = [
        r
        for r in _runs_of(cl)
        if r.tags.get(owners.HOST_TAG) == here
        and r.tags.get(owners.PID_TAG) in ours
        and not owners.LocalProcess.of(int(r.tags[owners.PID_TAG])).alive()
    ]
    return end_running(cl, runs, status, reason, code)


def sweep_up_orphans(uri: str) -> list[RunRecord]:
    """Mark FAILED, with their owner's reason (tags ``reason``, ``status_reason``), the runs left
    RUNNING by owners that are gone (``reason=orphaned``: a process of this host that no longer
    exists, after a SIGKILL or a crash; ``reason=slurm job 12_3 CANCELLED``: a SLURM job that ended);
    returns them as they are now (ended, with those tags). Runs whose owner cannot be checked from
    here (another host's processes, a scheduler that does not answer) are left alone. Every command
    calls it first (run, sweep, rerun, report)."""
    cl = client(uri)
    dead: list[RunRecord] = []
    asked: dict = {}
    for r in _runs_of(cl):
        owner = r.owner
        gone = _gone(owner, asked) if owner is not None else None
        if gone is not None:
            code, why = gone.end_reason()
            end_running(cl, [r], "FAILED", why, code)
            dead.append(record(cl.get_run(r.run_id)))
    return dead
