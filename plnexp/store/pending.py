"""A fit's result that the store did not take: kept locally, sent later.

After a fit, :func:`finish` writes the job's run (:func:`~plnexp.store.writes.write_record`'s
writes, each call retried a few seconds: :func:`~plnexp.store.backend.after_fit`). If the store is
still failing, everything those writes hold (:func:`~plnexp.store.writes.job_record`: params,
metrics and curves, tags, text artifacts, status; credentials masked as in the store) is written
atomically to ``<outputs>/pending/<run_id>.json``, with the store's URI (masked) and the run's id.

:func:`send_all` sends the results kept for a store (the same writes, to the same run), removing
each file once sent: ``plnexp sync``, and every command that uses the store, before it sweeps up
orphans or reads a run, so a result kept locally is never marked FAILED nor fitted again.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..jobs.config import outputs_dir
from ..system.commandline import first_line
from ..system.paths import write_atomic
from ..system.redact import redact_text
from . import writes
from .backend import StoreError, _is_transient, after_fit, client
from .queries import MlflowStore


log = logging.getLogger(__name__)


def folder() -> Path:
    return outputs_dir() / "pending"


def keep(uri: str, run_id: str, record: dict) -> Path:
    """Write ``record`` for run ``run_id`` of store ``uri`` to ``<outputs>/pending/<run_id>.json``,
    whole or not at all (a temporary file, then renamed into place)."""
    target = folder() / f"{run_id}.json"
    write_atomic(target, json.dumps({"store": redact_text(uri), "run_id": run_id, **record}))
    return target


SHOWN_METRICS = ("final_elbo", "ms_per_iter", "n_iter_run")  # what a lost result's line names


def lost_line(run_id: str, record: dict, error: BaseException, unkept: BaseException) -> str:
    """The one line of a result that neither the store nor :func:`folder` took (a full disk holding
    both): what was lost, the run's status and headline metrics."""
    values = {k: v for k, v, step, _ in record.get("metrics", []) if step == 0 and k in SHOWN_METRICS}
    shown = ", ".join(f"{k}={values[k]:.6g}" for k in SHOWN_METRICS if k in values)
    return (
        f"the store failed after the fit of run {run_id} ({first_line(error)}) and its result could not be kept in "
        f"{folder()} either ({first_line(unkept)}): lost: the {record.get('status', '')} result of run {run_id}"
        f"{f' ({shown})' if shown else ''}; free space, then run the job again"
    )


class ResultLost(StoreError):
    """A fit's result that the store did not take and that could not be kept locally: one line
    (:func:`lost_line`) saying what was lost."""


def finish(cl, uri: str, run_id: str, job) -> Path | None:
    """Write the job's run (retried); if the store still fails, keep its result locally and say so
    in one warning line (plnexp's logger). Returns the file kept, or None when the store took everything.
    Where it cannot be kept either (the disk is full), raises :class:`ResultLost`, its line saying
    what was lost (no half-written file is left: :func:`keep`)."""
    record = writes.job_record(job)
    try:
        writes.write_record(after_fit(cl), run_id, record)
        return None
    except Exception as e:  # noqa: BLE001 - the store's failure, whatever it is: the result is kept
        try:
            path = keep(uri, run_id, record)
        except OSError as unkept:
            raise ResultLost(lost_line(run_id, record, e, unkept)) from None
        log.warning(
            f"the store failed after the fit of run {run_id} ({first_line(e)}): its result is kept in {path}, "
            "and sent by `python -m plnexp sync` or the next plnexp command on this store"
        )
        return path


def _kept() -> list[tuple[Path, dict | None, str]]:
    """Each file of the folder: its kept result, or None and why it cannot be read as one."""
    out: list[tuple[Path, dict | None, str]] = []
    for path in sorted(folder().glob("*.json")) if folder().is_dir() else []:
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or "store" not in data:
                raise ValueError("not a kept result: no store")
            out.append((path, data, ""))
        except (OSError, ValueError) as e:
            out.append((path, None, getattr(e, "strerror", None) or str(e).splitlines()[0] or type(e).__name__))
    return out


def waiting(uri: str) -> list[Path]:
    """The files of the results kept for the store ``uri``, oldest first."""
    found = [path for path, data, _ in _kept() if data is not None and data["store"] == redact_text(uri)]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def unreadable() -> list[tuple[Path, str]]:
    """The files in the folder that cannot be read as a kept result (unreadable, not JSON, no store),
    each with why: never sent, so ``sync`` names them rather than skip them unsaid."""
    return [(path, why) for path, data, why in _kept() if data is None]


def send(uri: str, path: Path) -> str:
    """Send one kept result to its run in ``uri`` (retried), then remove its file; returns the run id."""
    data = json.loads(path.read_text())
    cl = after_fit(client(uri))
    if "reason" not in data["tags"] and cl.get_run(data["run_id"]).data.tags.get("reason"):
        cl.delete_tag(data["run_id"], "reason")  # ended meanwhile (lost, orphaned): the result says how it ended
    writes.write_record(cl, data["run_id"], data)
    path.unlink()
    return data["run_id"]


def run_is_gone(uri: str, run_id: str) -> bool:
    """Whether the store answers that it has no run ``run_id`` (never created there, deleted, or a
    store emptied since): its kept result has nowhere to go. A store that fails otherwise: False."""
    try:
        run = MlflowStore(uri).run(run_id)
    except Exception:  # noqa: BLE001 - the store failing is not an answer about the run
        return False
    return run is None or run.deleted


def set_aside(run_id: str, path: Path) -> str:
    """Move the kept result ``path`` of run ``run_id`` to ``<outputs>/pending/orphaned`` (whole: one
    rename), out of the way of every later command, kept for a person to read; the line saying so."""
    target = folder() / "orphaned" / path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    path.replace(target)
    return (
        f"plnexp: the store no longer has run {run_id}, whose result was kept in {path}: moved to {target} "
        "(not sent; said once)"
    )


def send_all(uri: str) -> list[str]:
    """Send every result kept for ``uri``; returns one line per run sent (for
    the command to print), and one per result whose run the store no longer has, which is moved
    aside (:func:`set_aside`) instead of being tried by every later command. Then raises the
    store's first error, if any (those not sent stay kept)."""
    sent, errors = [], []
    for path in waiting(uri):
        try:
            data = json.loads(path.read_text())
            if run_is_gone(uri, data["run_id"]):
                sent.append(set_aside(data["run_id"], path))
                continue
            run_id = send(uri, path)
            sent.append(
                f"plnexp: sent the result of run {run_id} kept in {path} to the store ({data.get('status', '')})"
            )
        except Exception as e:  # noqa: BLE001 - this one stays kept; the others are still tried
            errors.append(e)
            from mlflow.exceptions import MlflowException

            if isinstance(e, MlflowException) and _is_transient(e):
                break  # the store is down: the others stay kept too, without waiting on it once each
    if errors:
        raise errors[0]
    return sent
