"""Runs left RUNNING, and who may end them: only their :class:`~plnexp.tracking.owners.Owner`, or
anyone once that owner is known to be gone (``alive()`` is False). A run whose owner is alive, or
cannot be checked from here (``alive()`` None: another host's process), is never touched."""

from __future__ import annotations

from . import owners
from .owners import Owner
from .queries import _search_experiments, children
from .store import client
from .writes import JOB_TAG, Parent


def _runs_of(cl, owner: Owner | None = None, status: str | None = "RUNNING") -> list:
    """The runs with ``status`` (None: any status) in every experiment; with ``owner``, only the
    runs written with its tags."""
    where = [f"attributes.status = '{status}'"] if status else []
    where += [f"tags.`{k}` = '{v}'" for k, v in (owner.tags() if owner is not None else {}).items()]
    return _search_experiments(cl, " and ".join(where))


def may_end(run, me: Owner | None = None) -> bool:
    """Whether this process may end ``run`` (RUNNING): its owner is this process (``me``, by default
    :func:`~plnexp.tracking.owners.current`), or it is known to be gone (``alive()`` is False)."""
    owner = owners.owner_of(run.data.tags)
    if owner is None:
        return False  # nobody named: cannot tell
    return owner == (me if me is not None else owners.current()) or owner.alive() is False


def end_running(cl, runs, status: str, reason: str, code: str) -> list:
    """End every run of ``runs`` still RUNNING with ``status``, tags ``reason=code`` and
    ``status_reason=reason``; returns those runs. (It does not ask their owners: see :func:`may_end`.)"""
    from mlflow.entities import RunTag

    ended = []
    for r in runs:
        if r.info.status != "RUNNING":
            continue
        cl.log_batch(r.info.run_id, tags=[RunTag("reason", code), RunTag("status_reason", reason)])
        cl.set_terminated(r.info.run_id, status)
        ended.append(r)
    return ended


def end_children(parent: Parent, status: str, reason: str, code: str) -> list[dict]:
    """End the parent's children still RUNNING that this process may end (:func:`may_end`: its own,
    and those of owners known to be gone; see :func:`end_running`); a child whose owner is alive
    elsewhere, or cannot be checked from here, stays RUNNING. Returns every child as a plain row:
    name, status, reason, metrics, job number."""
    cl = client(parent.uri)
    runs = children(cl, parent)
    me = owners.current()
    if end_running(cl, [r for r in runs if r.info.status == "RUNNING" and may_end(r, me)], status, reason, code):
        runs = children(cl, parent)
    return [{"name": r.info.run_name, "status": r.info.status, "reason": r.data.tags.get("status_reason", ""),
             "metrics": dict(r.data.metrics), "job": int(r.data.tags.get(JOB_TAG, 0) or 0)} for r in runs]


def process_runs(uri: str) -> list:
    """The runs this process created (any status), in this store."""
    return _runs_of(client(uri), owners.current(), status=None)


def end_process_runs(uri: str, status: str, reason: str, code: str) -> list:
    """End the runs this process left RUNNING (e.g. when it must exit without unwinding)."""
    cl = client(uri)
    return end_running(cl, _runs_of(cl, owners.current()), status, reason, code)


def sweep_up_orphans(uri: str) -> list:
    """Mark FAILED (tag ``reason=orphaned``) the runs left RUNNING by owners that are gone (for a
    local process: a process of this host that no longer exists, after a SIGKILL or a crash);
    returns them. Runs whose owner cannot be checked from here (another host's processes) are left
    alone. ``sweep`` and ``run`` call it first (and so can ``report``)."""
    cl = client(uri)
    dead = []
    for r in _runs_of(cl):
        owner = owners.owner_of(r.data.tags)
        if owner is not None and owner.alive() is False:
            end_running(cl, [r], "FAILED", f"orphaned: {owner} ended without closing this run", "orphaned")
            dead.append(r)
    return dead
