"""A sweep's worker whose driver is gone (killed: no handler ran) ends itself and its runs
(:func:`watch_driver`, issue #48)."""

from __future__ import annotations

import os
import platform
import time

from .. import store
from .sweep_record import SweepRecord


# ---------------------------------------------------------------- a worker whose driver is gone
WATCH_THREAD = "plnexp-driver-watch"  # its thread's name: a process runs one (a fork starts with none)


def watch_driver(record: SweepRecord, poll_s: float = 0.5, grace_s: float = 3.0) -> None:
    """In a sweep's worker process (joblib's loky workers: the record's driver is another process of
    this host), start once a daemon thread that ends this process when the driver is gone: a SIGKILL
    of the driver runs no handler and loky cannot shut its pool down, so the workers would run on
    (issue #48). Gone: the driver's PID exists no more, or belongs to a process started since (its
    start time, read when the watch starts), or this process's parent changed (reparented). Then it
    ends this process's RUNNING runs FAILED ``orphaned`` (what the next command's sweep-up would
    say), waiting at most ``grace_s`` for the store, and exits (``os._exit(1)``). Never in the driver,
    nor in a SLURM job (the cluster's own machinery ends those); a compiled fit releases the GIL, so
    the thread runs during a fit."""
    import threading

    from ..system import slurm

    if record.pid == os.getpid() or record.host != platform.node() or slurm.in_job():
        return
    if any(t.name == WATCH_THREAD for t in threading.enumerate()):  # this process watches already
        return
    driver, parent = store.LocalProcess.of(record.pid), os.getppid()

    def gone() -> bool:
        return driver.alive() is False or os.getppid() != parent

    def watch() -> None:
        while not gone():
            time.sleep(poll_s)
        reason = f"orphaned: the sweep's driver ({driver}) ended without closing this run"
        ender = threading.Thread(
            target=store.end_process_runs, args=(record.uri, "FAILED", reason, "orphaned"), daemon=True
        )
        ender.start()
        ender.join(grace_s)
        os._exit(1)

    threading.Thread(target=watch, name=WATCH_THREAD, daemon=True).start()
