"""Ctrl-C (SIGINT) and SIGTERM as one exception, :class:`Interrupted`, and critical sections.

``with handled(on_force):`` (the command line, around a run or a sweep) makes both signals raise
:class:`Interrupted` in the main thread, so that the job that was running can be recorded KILLED
and the sweep closed before the process exits with 128 + the signal number. Once that clean-up has
begun (``guard.stopping()``) later signals are ignored; an Interrupted that Python swallowed (raised
inside a garbage-collector callback, e.g. JAX's) is delivered again.

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
from collections.abc import Callable, Iterator

from .commandline import first_line

SIGNALS = (signal.SIGINT, signal.SIGTERM)
REDELIVER_S = 0.01
GRACE_S = 2.0  # after this long without the main thread reacting, say that the fit holds it
# the force path's clean-up (on_force: runs ended KILLED, the sweep closed) is given this long, then
# the process ends anyway (a store that hangs: those runs are left to sync and the sweep-up of orphans)
FORCE_S = 5.0


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


def _caught(signals=SIGNALS) -> list[int]:
    """The signals to handle: those not ignored (a background job of a shell script ignores
    SIGINT, ``nohup`` SIGHUP: that choice is kept)."""
    return [s for s in signals if signal.getsignal(s) is not signal.SIG_IGN]


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM back inside the block; the first one that came is raised at its end."""
    if not _main_thread():
        yield
        return
    pending: list[int] = []
    guard = _guard_in_place()

    def hold(signum, frame):
        pending.append(signum)
        if guard is not None:
            guard.held = True

    old = {s: signal.signal(s, hold) for s in _caught(guard.signals if guard is not None else SIGNALS)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if pending:
            signal.raise_signal(pending[0])  # through the handler now in place


def pending() -> Interrupted | None:
    """The interrupt the handler in place has seen, if any: for code that caught an error which may
    be that interrupt turned into something else by a library. Found through the installed handler
    itself (no module state); None outside :func:`handled` and inside :func:`deferred`."""
    guard = _guard_in_place()
    return Interrupted(guard.signum) if guard is not None and guard.signum is not None else None


def in_place() -> bool:
    """Whether a :func:`handled` block is in force (its handlers installed)."""
    return _guard_in_place() is not None


def _guard_in_place() -> _Guard | None:
    for s in SIGNALS:
        guard = getattr(signal.getsignal(s), "__self__", None)
        if isinstance(guard, _Guard):
            return guard
    return None


class _Guard:
    """The handlers and the helper thread of one :func:`handled` block."""

    def __init__(self, on_force: Callable[[int], object] | None, signals: tuple = SIGNALS):
        self.on_force = on_force
        self.signals = tuple(signals)
        self.reacted = threading.Event()  # the main thread's handler ran
        self.stopped = False
        self.held = False  # a signal came during a deferred() section
        self.signum: int | None = None  # the signal the main thread's handler saw
        self.previous_hook = sys.unraisablehook
        self.read, self.write = socket.socketpair()
        self.write.setblocking(False)
        self.thread = threading.Thread(target=self._watch, name="plnexp-interrupts", daemon=True)

    def handler(self, signum, frame):
        self.signum = signum
        self.reacted.set()
        if self.stopped:
            return  # the clean-up in progress runs to its end
        raise Interrupted(signum)

    def stopping(self) -> None:
        """Say that the process is stopping (its clean-up has begun): later signals are ignored."""
        self.stopped = True
        self.reacted.set()

    def unraisable(self, info) -> None:
        """``sys.unraisablehook``: an Interrupted raised where Python swallows exceptions (a garbage
        collector callback, a ``__del__``) is delivered again, to land in ordinary code."""
        if isinstance(info.exc_value, Interrupted) and not self.stopped:
            # sent from another thread a moment later: the handler then runs once this hook returned
            threading.Timer(
                REDELIVER_S, signal.pthread_kill, (threading.main_thread().ident, info.exc_value.signum)
            ).start()
            return
        self.previous_hook(info)

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
                if signum not in self.signals:
                    continue
                seen += 1
                if seen == 1:
                    if not self.reacted.wait(GRACE_S):
                        what = (
                            "plnexp stops once the step in progress (writing results, checking) is done"
                            if self.held
                            else "the fit running in compiled code stops when it returns"
                        )
                        print(
                            f"\nplnexp: {signal.Signals(signum).name} received; {what} (send it again to stop now)",
                            file=sys.stderr,
                            flush=True,
                        )
                elif not self.reacted.is_set():
                    self._force(signum)
                elif self.stopped:  # a second signal during the clean-up (a store that hangs): stop now
                    self._force(signum, clean_up=False)

    def _force(self, signum: int, clean_up: bool = True) -> None:
        """End the process now: ``on_force`` (what it can record) is given :data:`FORCE_S` seconds in a
        thread of its own, then ``os._exit`` whatever it is doing. ``clean_up=False``: the main
        thread's clean-up was under way already, and is cut short."""
        name = signal.Signals(signum).name
        print(f"\nplnexp: {name} again: stopping now", file=sys.stderr, flush=True)
        try:
            cut = "" if clean_up else "the clean-up was cut short"
            if clean_up and self.on_force is not None:
                worker = threading.Thread(target=self._clean_up, args=(signum,), name="plnexp-force", daemon=True)
                worker.start()
                worker.join(FORCE_S)
                cut = f"the store did not answer within {FORCE_S:g} s" if worker.is_alive() else ""
            if cut:
                print(
                    f"plnexp: {cut}: the runs not ended stay RUNNING until python -m plnexp sync (or the next "
                    "plnexp command on this store)",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + signum)

    def _clean_up(self, signum: int) -> None:
        assert self.on_force is not None
        try:
            self.on_force(signum)
        except Exception as e:  # noqa: BLE001 - the store failed too: one line, the process ends anyway
            print(f"plnexp: store error: the runs could not be ended ({first_line(e)})", file=sys.stderr)


class _NoGuard:
    signum = None

    def stopping(self) -> None:
        pass


@contextmanager
def handled(on_force: Callable[[int], object] | None = None, signals: tuple = SIGNALS):
    """SIGINT and SIGTERM (or ``signals``, which must include them: a SLURM job adds SIGUSR2) raise
    :class:`Interrupted` in the main thread inside the block."""
    if not _main_thread():
        yield _NoGuard()
        return
    guard = _Guard(on_force, signals)
    old = {s: signal.signal(s, guard.handler) for s in _caught(signals)}
    old_fd = signal.set_wakeup_fd(guard.write.fileno(), warn_on_full_buffer=False)
    sys.unraisablehook = guard.unraisable
    guard.thread.start()
    try:
        yield guard
    finally:
        sys.unraisablehook = guard.previous_hook
        signal.set_wakeup_fd(old_fd)
        for s, h in old.items():
            signal.signal(s, h)
        guard.write.close()  # the helper thread reads EOF and ends
        guard.thread.join(timeout=1.0)
        guard.read.close()


def stopped_by(e: BaseException, guard) -> Interrupted | None:
    """The interrupt behind ``e``: a KeyboardInterrupt, or any error raised while one was being
    handled (a signal that landed inside Hydra's or a library's code can come out as another error)."""
    if isinstance(e, KeyboardInterrupt):
        return as_interrupted(e)
    return Interrupted(guard.signum) if guard.signum is not None else None
