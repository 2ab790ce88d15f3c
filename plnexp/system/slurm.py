"""SLURM, as plnexp's jobs meet it: the scheduler's job states, and the driver's wait for a sweep's
jobs (``hydra/launcher=slurm``: :class:`plnexp.experiment.executors.Slurm`).

The driver submits the sweep's jobs as one job array (through submitit's ``AutoExecutor``) and then waits here: a job is done when its result file appears, or when the
scheduler says it ended without one (cancelled, out of time, preempted, its node failed). One line
per job as it ends, like a local sweep's. The scheduler is asked with ``squeue`` (one call for all
jobs), never with ``sacct``, which needs accounting that many clusters lack: submitit's own watcher
calls ``sacct`` and, without accounting, warns at every poll and never learns that a cancelled
job ended. Ctrl-C in the driver cancels the jobs still queued or running (``scancel``).

Inside a job (``$SLURM_JOB_ID`` set), :data:`JOB_SIGNALS` are those that end it: SIGTERM (``scancel``,
the time limit, preemption; SIGKILL follows after the cluster's ``KillWait``) and SIGUSR2, which
submitit asks SLURM to send ``signal_delay_s`` before the time limit.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from collections.abc import Callable, Iterable, Sequence

from .executor_compat import result_file

# States of a job that has not ended (squeue's long names)
ACTIVE = frozenset(
    {
        "PENDING",
        "RUNNING",
        "CONFIGURING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
    }
)
QUERY_TIMEOUT_S = 10.0
JOB_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)
log = logging.getLogger(__name__)


def in_job(environ=os.environ) -> bool:
    """Whether this process runs inside a SLURM job."""
    return bool(environ.get("SLURM_JOB_ID"))


def job_id(environ=os.environ) -> str | None:
    """This job's id as ``squeue -j`` and ``scancel`` take it: ``<array job>_<task>`` for a task of a
    job array, else ``$SLURM_JOB_ID``; None outside SLURM."""
    if not in_job(environ):
        return None
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else environ["SLURM_JOB_ID"]


def _base(job: str) -> str:
    return job.split("_", 1)[0]


def states(jobs: Iterable[str], run=subprocess.run) -> dict[str, str] | None:
    """The scheduler's state of each job still known to it (``squeue --states=all``, array tasks one
    per line); a job missing from the answer has ended and been forgotten. None when the scheduler
    cannot be asked (no ``squeue`` here, the controller does not answer)."""
    jobs = list(jobs)
    if not jobs:
        return {}
    cmd = ["squeue", "-h", "-r", "--states=all", "-o", "%i|%T", "-j", ",".join(sorted({_base(j) for j in jobs}))]
    out = _ask(cmd, run)
    if out is None:
        return None
    if out.returncode != 0:
        if "invalid job id" in (out.stderr or "").lower():
            return {}  # all of them ended long enough ago to be forgotten
        return None
    found = {}
    for line in out.stdout.splitlines():
        jid, _, state = line.strip().partition("|")
        if jid:
            found[jid] = state.split()[0] if state else "UNKNOWN"
    return found


def state(job: str, run=subprocess.run) -> str | None:
    """One job's state: the queue's (:func:`states`), else, for a job the controller has forgotten, its
    final state: ``sacct``'s where accounting exists (``CANCELLED by 0`` -> CANCELLED), else ``ENDED``
    (gone from the queue, final state unknown); None when the scheduler cannot be asked from here."""
    found = states([job], run=run)
    if found is None:
        return None
    if job in found:
        return found[job]
    out = _ask(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"], run)
    words = out.stdout.split() if out is not None and out.returncode == 0 else []
    return words[0] if words else "ENDED"


def _ask(cmd: list[str], run=None) -> subprocess.CompletedProcess | None:
    """The scheduler's answer to ``cmd`` (its output as text; ``run``: ``subprocess.run``, looked up at
    the call), given up after :data:`QUERY_TIMEOUT_S`; None where it cannot be asked (no such command
    here, no answer in time)."""
    try:
        return (run or subprocess.run)(cmd, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None


def cluster_name(environ=os.environ) -> str:
    """This job's cluster (``$SLURM_CLUSTER_NAME``), "" outside a job."""
    return environ.get("SLURM_CLUSTER_NAME", "")


def ended(state: str | None) -> bool:
    """Whether a job in ``state`` (None: forgotten by the scheduler) has ended."""
    return state is None or state.split()[0] not in ACTIVE


@dataclass
class JobEnd:
    """How one job of the array ended: its place, its result (a Hydra ``JobReturn``) or None, and
    the scheduler's last word on it."""

    index: int
    job: str
    result: object | None
    state: str  # "COMPLETED", "CANCELLED", ... or "ENDED" (forgotten: final state unknown)
    error: str = ""  # the job raised (submitit recorded the error) or left no result


def wait(
    jobs: Sequence,
    on_end: Callable[[JobEnd], None],
    *,
    poll_s: float = 1.0,
    grace_s: float = 20.0,
    query=states,
    clock=time.monotonic,
    sleep=time.sleep,
) -> list[JobEnd]:
    """Wait for every submitit job of ``jobs``; call ``on_end`` as each ends; returns them in order.

    A job has ended when its result file exists, or when the scheduler says that it ended without
    one: after 5 s for a job cancelled, failed, out of time..., after ``grace_s`` for a job COMPLETED or
    forgotten (its result file may show up late on a network filesystem).
    On any exception (Ctrl-C) the jobs not yet ended are cancelled before it propagates."""
    pending = dict(enumerate(jobs))
    out: dict[int, JobEnd] = {}
    gone_since: dict[int, float] = {}
    last_state: dict[int, str] = {}

    def finish(i: int, e: JobEnd) -> None:
        out[i] = e
        del pending[i]
        on_end(e)

    try:
        while pending:
            for i, job in list(pending.items()):
                if result_file(job).exists():
                    finish(i, _read(i, job, last_state.get(i, "COMPLETED")))
            if not pending:
                break
            known = query([j.job_id for j in pending.values()])
            now = clock()
            for i, job in list(pending.items()):
                if known is None:
                    continue  # cannot ask now: keep waiting
                state = known.get(job.job_id)
                last_state[i] = state or "ENDED"
                if not ended(state):
                    gone_since.pop(i, None)
                    continue
                limit = grace_s if last_state[i] in ("COMPLETED", "ENDED") else min(grace_s, 5.0)
                if now - gone_since.setdefault(i, now) >= limit and not result_file(job).exists():
                    finish(i, JobEnd(i, job.job_id, None, last_state[i], "no result"))
            if pending:
                sleep(poll_s)
    except BaseException:
        cancel([j.job_id for j in pending.values()])
        raise
    return [out[i] for i in range(len(jobs))]


def _read(i: int, job, state: str) -> JobEnd:
    try:
        return JobEnd(i, job.job_id, job.result(), state)
    except Exception as e:  # noqa: BLE001 - the job's own error, recorded by submitit
        text = [t for t in str(e).strip().splitlines() if t.strip()]
        return JobEnd(i, job.job_id, None, state, text[-1].strip() if text else type(e).__name__)


TASK_ENDED = re.compile(r"^srun: error: (\S+): (tasks?) ([\d,-]+): (.+)$")


def first_task_failure(log: str | os.PathLike, tasks: int) -> str:
    """How the first task of a job of ``tasks`` tasks that srun saw end abnormally ended, from the
    job's log (the batch script's output, where srun writes ``srun: error: NODE: task K: WHY``):
    ``task K of N on NODE: WHY``; "" where the log is unreadable or says nothing of the kind."""
    try:
        with open(log, errors="replace") as f:
            for line in f:
                m = TASK_ENDED.match(line.rstrip("\n"))
                if m:
                    node, word, which, what = m.groups()
                    return f"{word} {which} of {tasks} on {node}: {what}"
    except OSError:
        pass
    return ""


def cancel(ids: Sequence[str]) -> None:
    """``scancel`` the jobs (best effort: a job that ended meanwhile is no error)."""
    ids = list(ids)
    if ids and _ask(["scancel", *ids]) is None:
        log.warning("could not cancel slurm job(s) %s", ", ".join(ids))


def why(signum: int, environ=os.environ) -> str:
    """What a signal means inside a SLURM job, to follow "interrupted by SIGTERM" in a run's reason;
    "" outside SLURM."""
    job = job_id(environ)
    if job is None:
        return ""
    if signum == signal.SIGUSR2:
        return f" in slurm job {job} (its time limit is near)"
    if signum == signal.SIGTERM:
        return f" in slurm job {job} (scancel, time limit or preemption)"
    return f" in slurm job {job}"


class QuietSacct:
    """A filter for submitit's logger: its watcher calls ``sacct`` at every poll and, on a cluster
    without accounting, warns each time ("Bypassing sacct error ..."). Said once, in one line (on
    plnexp's logger), with what to do; submitit's other messages (real errors) pass."""

    def __init__(self):
        self.said = False

    def filter(self, record) -> bool:
        if "Bypassing sacct error" not in record.getMessage():
            return True
        if not self.said:
            self.said = True
            log.warning(
                "sacct is not usable on this cluster (no SLURM accounting?): submitit cannot tell when a job "
                "ended without a result; hydra/launcher=slurm asks squeue instead"
            )
        return False


def quiet_sacct() -> None:
    """Install :class:`QuietSacct` on submitit's logger (once)."""
    logger = logging.getLogger("submitit")
    if not any(isinstance(f, QuietSacct) for f in logger.filters):
        logger.addFilter(QuietSacct())
