"""Ctrl-C (SIGINT) and SIGTERM as one exception, :class:`Interrupted`, and critical sections.

``with handled(on_force):`` (the command line, around a run or a sweep) makes both signals raise
:class:`Interrupted` in the main thread, so that the job that was running can be recorded KILLED
and the sweep closed before the process exits with 128 + the signal number. Signals that follow the
first are ignored while that clean-up runs.

Python runs a signal handler only between bytecodes of the main thread: while a compiled fit runs
inside XLA (one long C++ call) the exception waits until the call returns. A helper thread, woken
through :func:`signal.set_wakeup_fd` even then, says so once, and on a *second* signal while the
main thread has still not reacted it calls ``on_force(signum)`` (record what it can) and ends the
process with ``os._exit``.

``with deferred():`` holds the signals back for a few lines that must not be cut in half (writing a
run's results, closing a sweep) and raises them at the end.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from contextlib import contextmanager
from typing import Callable

SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_S = 2.0  # after this long without the main thread reacting, say that the fit holds it


class Interrupted(KeyboardInterrupt):
    """A SIGINT or SIGTERM arrived (a KeyboardInterrupt, so libraries treat it as one)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def as_interrupted(exc: BaseException) -> Interrupted:
    """A plain KeyboardInterrupt (Python's default SIGINT handler, e.g. in a worker) is a SIGINT."""
    return exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def deferred():
    """Hold SIGINT/SIGTERM back inside the block; the first one that came is raised at its end."""
    if not _main_thread():
        yield
        return
    pending: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if pending:
            signal.raise_signal(pending[0])  # through the handler now in place


class _Guard:
    """The handlers and the helper thread of one :func:`handled` block."""

    def __init__(self, on_force: Callable[[int], None] | None):
        self.on_force = on_force
        self.reacted = threading.Event()  # the main thread's handler ran
        self.read, self.write = socket.socketpair()
        self.write.setblocking(False)
        self.thread = threading.Thread(target=self._watch, name="plnexp-interrupts", daemon=True)

    def handler(self, signum, frame):
        if self.reacted.is_set():
            return  # already stopping: the clean-up in progress runs to its end
        self.reacted.set()
        raise Interrupted(signum)

    def stopping(self) -> None:
        """Say that the process is stopping (e.g. on a KeyboardInterrupt from elsewhere): later
        signals are ignored while the clean-up runs."""
        self.reacted.set()

    def _watch(self) -> None:
        seen = 0
        while True:
            try:
                data = self.read.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum not in SIGNALS:
                    continue
                seen += 1
                if seen == 1:
                    if not self.reacted.wait(GRACE_S):
                        print(f"\nplnexp: {signal.Signals(signum).name} received; the fit running in compiled code "
                              "stops when it returns (send it again to stop now)", file=sys.stderr, flush=True)
                elif not self.reacted.is_set():
                    self._force(signum)

    def _force(self, signum: int) -> None:
        print(f"\nplnexp: {signal.Signals(signum).name} again: stopping now", file=sys.stderr, flush=True)
        try:
            if self.on_force is not None:
                self.on_force(signum)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + signum)


class _NoGuard:
    def stopping(self) -> None:
        pass


@contextmanager
def handled(on_force: Callable[[int], None] | None = None):
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread inside the block."""
    if not _main_thread():
        yield _NoGuard()
        return
    guard = _Guard(on_force)
    old = {s: signal.signal(s, guard.handler) for s in SIGNALS}
    old_fd = signal.set_wakeup_fd(guard.write.fileno(), warn_on_full_buffer=False)
    guard.thread.start()
    try:
        yield guard
    finally:
        signal.set_wakeup_fd(old_fd)
        for s, h in old.items():
            signal.signal(s, h)
        guard.write.close()  # the helper thread reads EOF and ends
        guard.thread.join(timeout=1.0)
        guard.read.close()
