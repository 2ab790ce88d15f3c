"""Who owns a RUNNING run: the tags written on a run when it starts, read back as an :class:`Owner`
that says whether it is still alive.

A run left RUNNING is ended by someone else than its owner only when its owner says ``alive()``
is False (see :mod:`plnexp.tracking.running`); an owner that cannot be checked from here (a process
of another host) answers None and its runs are left alone.

Today every run is owned by a :class:`LocalProcess` (host and PID). Another kind of owner plugs in
by implementing the protocol with tags of its own, being listed in :data:`KINDS` (before
``LocalProcess``, whose tags it may also write) and being what :func:`current` returns in the
processes its launcher starts. E.g. a future ``SlurmJob(job_id, cluster)``: tags
``plnexp.slurm_job``/``plnexp.slurm_cluster``, ``alive()`` from ``squeue -j`` (None when the
cluster cannot be queried from here), ``cancel()`` by ``scancel``, and ``current()`` returning it
when the SLURM launcher set ``$SLURM_JOB_ID`` for the job. (Not implemented.)
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

HOST_TAG, PID_TAG = "plnexp.host", "plnexp.pid"


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

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> Owner | None:
        """The owner these run tags name, or None if they name no owner of this kind."""
        ...


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
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@dataclass(frozen=True)
class LocalProcess:
    """A process of a host (tags ``plnexp.host`` and ``plnexp.pid``): alive or not as seen from that
    host only; from any other host :meth:`alive` is None."""

    host: str
    pid: int

    @classmethod
    def here(cls) -> LocalProcess:
        """This process (computed at each call: a forked worker is another process)."""
        return cls(platform.node(), os.getpid())

    def tags(self) -> dict[str, str]:
        return {HOST_TAG: self.host, PID_TAG: str(self.pid)}

    def alive(self) -> bool | None:
        if self.host != platform.node() or self.pid <= 0:
            return None  # another host's process (or no PID): cannot tell from here
        return _alive(self.pid)

    def cancel(self) -> None:
        """Nothing: plnexp does not signal processes it is not (a local job is stopped by its own
        Ctrl-C or SIGTERM)."""

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> LocalProcess | None:
        host, pid = tags.get(HOST_TAG), tags.get(PID_TAG)
        if not host or not pid:
            return None
        try:
            return cls(host, int(pid))
        except ValueError:
            return None

    def __str__(self) -> str:
        return f"process {self.pid} on {self.host}"


KINDS: tuple[type, ...] = (LocalProcess,)  # tried in order by owner_of: the most specific first


def owner_of(tags: dict[str, str]) -> Owner | None:
    """The owner a run's tags name (the first kind of :data:`KINDS` that reads them), or None."""
    for kind in KINDS:
        owner = kind.from_tags(tags)
        if owner is not None:
            return owner
    return None


def current() -> Owner:
    """The owner of the runs this process creates: this local process (a launcher that runs jobs
    elsewhere would make it return its own kind, see the module's docstring)."""
    return LocalProcess.here()
