"""Who owns a RUNNING run: the tags written on a run when it starts, read back as an :class:`Owner`
that says whether it is still alive.

A run left RUNNING is ended by someone else than its owner only when its owner says ``alive()``
is False (see :mod:`plnexp.store.running`); an owner that cannot be checked from here (a process
of another host, a SLURM job whose scheduler cannot be asked) answers None and its runs are left
alone.

A run is owned by a :class:`LocalProcess` (host, boot id, PID and the process's start time: a PID
alone is reused by the kernel, and host and PID would name a later stranger), or, inside a SLURM job, by a
:class:`SlurmJob` (which writes the host and PID tags too, so that older code still reads them):
alive or not as the scheduler says (:func:`slurm_state`: ``squeue``, then ``sacct`` for a job the
controller has forgotten, else ``ENDED``); where the scheduler cannot be asked (no ``squeue`` here,
the controller does not answer, another cluster's job) its :meth:`~SlurmJob.alive` is None.

Another kind of owner plugs in by implementing the protocol with tags of its own, being listed in
:data:`KINDS` (before ``LocalProcess``, whose tags it may also write) and being what :func:`current`
returns in the processes its launcher starts. An owner known to be gone says why
(:meth:`Owner.end_reason`): the tags its runs are ended with (``orphaned``; ``slurm job 12_3
CANCELLED``).
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Protocol, runtime_checkable

from ..system import slurm

HOST_TAG, PID_TAG = "plnexp.host", "plnexp.pid"
# With host and PID, what tells a process from a later one that got its PID again: the boot it ran
# in and its start time in that boot (runs of older versions lack them: host and PID only, as then)
BOOT_TAG, START_TAG = "plnexp.boot_id", "plnexp.pid_start"


@runtime_checkable
class Owner(Protocol):
    """What owns a RUNNING run. Owners are values: two owners are equal when they name the same
    owner (so ``owner == current()`` tells this process's runs); ``str(owner)`` names it in messages."""

    def tags(self) -> dict[str, str]:
        """The tags written on a run when it starts (read back by :meth:`from_tags`)."""
        ...

    def alive(self) -> bool | None:
        """True while the owner may still end the run itself, False once it never will, None when
        that cannot be told from here (the run must then be left alone)."""
        ...

    def cancel(self) -> None:
        """Stop the owner, where that makes sense (nothing for a local process)."""
        ...

    def end_reason(self) -> tuple[str, str]:
        """Once ``alive()`` is False: (the ``reason`` tag, the ``status_reason`` text) of the runs it
        left RUNNING."""
        ...

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> Owner | None:
        """The owner these run tags name, or None if they name no owner of this kind."""
        ...


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` from field 3 (state) on, after the command name (which may
    hold spaces and parentheses); [] where it cannot be read (no such process, no ``/proc``)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (a zombie does not count)."""
    if pid <= 0:
        return True  # unknown: leave it alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _stat(pid)[:1] != ["Z"]


@lru_cache(maxsize=1)
def boot_id() -> str:
    """This host's boot (Linux: ``/proc/sys/kernel/random/boot_id``, new at every boot); "" where
    there is none to read."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def start_time(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot (field 22 of ``/proc/<pid>/stat``),
    as text; "" where it cannot be read (no such process, no ``/proc``)."""
    fields = _stat(pid)
    return fields[22 - 3] if len(fields) > 22 - 3 else ""


def _agree(a: str, b: str) -> bool:
    """Two values of an identity field agree unless both are known and differ."""
    return not a or not b or a == b


@dataclass(frozen=True, eq=False)
class LocalProcess:
    """A process of a host (tags ``plnexp.host``, ``plnexp.pid``, and ``plnexp.boot_id`` and
    ``plnexp.pid_start`` where known): alive or not as seen from that host only; from any other host
    :meth:`alive` is None.

    Two owners are equal when host and PID are, and so are boot id and start time wherever both
    know them: an older run (host and PID only) is compared as it was then."""

    host: str
    pid: int
    boot: str = ""  # boot_id() of the host when the process ran; "": unknown (an older run)
    start: str = ""  # start_time(pid) then; "": unknown

    @classmethod
    def of(cls, pid: int) -> LocalProcess:
        """Process ``pid`` of this host, as it is now (its boot and start time read from ``/proc``)."""
        return cls(platform.node(), pid, boot_id(), start_time(pid))

    @classmethod
    def here(cls) -> LocalProcess:
        """This process (computed at each call: a forked worker is another process)."""
        return cls.of(os.getpid())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LocalProcess):
            return NotImplemented
        return (
            (self.host, self.pid) == (other.host, other.pid)
            and _agree(self.boot, other.boot)
            and _agree(self.start, other.start)
        )

    def __hash__(self) -> int:  # equal owners share host and PID
        return hash((self.host, self.pid))

    def tags(self) -> dict[str, str]:
        tags = {HOST_TAG: self.host, PID_TAG: str(self.pid)}
        if self.boot:
            tags[BOOT_TAG] = self.boot
        if self.start:
            tags[START_TAG] = self.start
        return tags

    def alive(self) -> bool | None:
        if self.host != platform.node() or self.pid <= 0:
            return None  # another host's process (or no PID): cannot tell from here
        here = boot_id()
        if self.boot and here and self.boot != here:
            return False  # it ran before this host's last boot: it ended with it
        if not _alive(self.pid):
            return False
        now = start_time(self.pid)
        if self.start and now and now != self.start:
            return False  # its PID belongs to a process started since: the owner is gone
        return True

    def cancel(self) -> None:
        """Nothing: plnexp does not signal processes it is not (a local job is stopped by its own
        Ctrl-C or SIGTERM)."""

    def end_reason(self) -> tuple[str, str]:
        return "orphaned", f"orphaned: {self} ended without closing this run"

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> LocalProcess | None:
        host, pid = tags.get(HOST_TAG), tags.get(PID_TAG)
        if not host or not pid:
            return None
        try:
            return cls(host, int(pid), tags.get(BOOT_TAG, ""), tags.get(START_TAG, ""))
        except ValueError:
            return None

    def __str__(self) -> str:
        return f"process {self.pid} on {self.host}"


SLURM_JOB_TAG, SLURM_CLUSTER_TAG = "plnexp.slurm_job", "plnexp.slurm_cluster"


def slurm_state(job: str) -> str | None:
    """A SLURM job's state as its scheduler says (:func:`plnexp.system.slurm.state`): the queue's
    (``squeue``), else, once the controller has forgotten the job, its final state (``sacct``; ``ENDED``
    where there is no accounting); None when the scheduler cannot be asked from here."""
    return slurm.state(job)


def this_cluster() -> str:
    """The SLURM cluster this machine belongs to: ``$SLURM_CLUSTER_NAME`` inside a job, else the
    controller's ``ClusterName`` (``scontrol show config``, asked once per process); "" if unknown."""
    return slurm.cluster_name() or _configured_cluster(os.environ.get("PATH", ""), os.environ.get("SLURM_CONF", ""))


@lru_cache(maxsize=8)
def _configured_cluster(path: str, conf: str) -> str:
    """``ClusterName`` of ``scontrol show config`` (cached per PATH and SLURM_CONF); "" if it fails."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=slurm.QUERY_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip()
    return ""


@dataclass(frozen=True)
class SlurmJob:
    """A SLURM job (tags ``plnexp.slurm_job``: ``<array job>_<task>`` or the job id, and
    ``plnexp.slurm_cluster``), alive or not as its scheduler says (:func:`slurm_state`): from a machine
    that cannot ask that cluster's scheduler, :meth:`alive` is None. The state last asked is kept (not
    compared: two owners are equal by job, cluster, host and PID) for :meth:`end_reason`."""

    job: str
    cluster: str = ""
    host: str = ""
    pid: int = 0
    state: str | None = field(default=None, compare=False, repr=False)  # the scheduler's last answer

    @classmethod
    def here(cls, environ=os.environ) -> SlurmJob | None:
        """This process's job, or None outside SLURM."""
        job = slurm.job_id(environ)
        if job is None:
            return None
        return cls(job, slurm.cluster_name(environ), platform.node(), os.getpid())

    def tags(self) -> dict[str, str]:
        return {SLURM_JOB_TAG: self.job, SLURM_CLUSTER_TAG: self.cluster, HOST_TAG: self.host, PID_TAG: str(self.pid)}

    def alive(self) -> bool | None:
        if self.cluster and this_cluster() != self.cluster:
            return None  # another cluster's job (or ours is unknown): its scheduler is not ours to ask
        state = slurm_state(self.job)
        object.__setattr__(self, "state", state)
        return None if state is None else not slurm.ended(state)

    def cancel(self) -> None:
        slurm.cancel([self.job])

    def end_reason(self) -> tuple[str, str]:
        state = self.state or "ENDED"
        return (
            f"slurm job {self.job} {state}",
            f"slurm job {self.job} ended {state} without closing this run (scancel, time limit, preemption, "
            "node failure or a crash)",
        )

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> SlurmJob | None:
        job = tags.get(SLURM_JOB_TAG)
        if not job:
            return None
        try:
            pid = int(tags.get(PID_TAG, 0) or 0)
        except ValueError:
            pid = 0
        return cls(job, tags.get(SLURM_CLUSTER_TAG, ""), tags.get(HOST_TAG, ""), pid)

    def __str__(self) -> str:
        return f"slurm job {self.job}"


# tried in order by owner_of: the most specific first
KINDS: tuple[type[SlurmJob | LocalProcess], ...] = (SlurmJob, LocalProcess)


def owner_of(tags: dict[str, str]) -> Owner | None:
    """The owner a run's tags name (the first kind of :data:`KINDS` that reads them), or None."""
    for kind in KINDS:
        owner = kind.from_tags(tags)
        if owner is not None:
            return owner
    return None


def current() -> Owner:
    """The owner of the runs this process creates: its SLURM job inside one, else this process."""
    return SlurmJob.here() or LocalProcess.here()
