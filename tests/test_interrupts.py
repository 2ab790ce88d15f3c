"""plnexp.system.interrupts in-process: signals become Interrupted, deferred sections, the helper thread
that stops a process whose main thread is stuck in compiled code."""

from __future__ import annotations

import signal
import time

import pytest

from plnexp.system import interrupts


@pytest.fixture(autouse=True)
def terminal_signals():
    """These tests raise SIGINT and SIGTERM in this process and rely on what a terminal's foreground
    job has: SIGINT raising KeyboardInterrupt, SIGTERM its default action (a background job of a shell
    starts with SIGINT ignored: conftest.pytest_configure sets them for the session). Each test starts
    from them whatever ran before it, and what it found is put back after it."""
    wanted = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    found = {s: signal.signal(s, h) for s, h in wanted.items()}
    yield
    for s, h in found.items():
        signal.signal(s, signal.SIG_DFL if h is None else h)  # None: a handler not set from Python


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signals_raise_interrupted_and_handlers_are_restored(signum, code):
    before = signal.getsignal(signum)
    with pytest.raises(interrupts.Interrupted) as stop:
        with interrupts.handled():
            signal.raise_signal(signum)
    assert stop.value.signum == signum and stop.value.exit_code == code
    assert isinstance(stop.value, KeyboardInterrupt)
    assert signal.getsignal(signum) is before


def test_deferred_holds_the_signal_until_the_end():
    done = []
    with pytest.raises(interrupts.Interrupted, match="SIGTERM"):
        with interrupts.handled():
            with interrupts.deferred():
                signal.raise_signal(signal.SIGTERM)
                done.append("the critical section ran to its end")
            done.append("not reached")
    assert done == ["the critical section ran to its end"]


def test_later_signals_are_ignored_while_stopping():
    with interrupts.handled() as guard:
        guard.stopping()
        signal.raise_signal(signal.SIGINT)  # no exception: the clean-up goes on


def test_an_interrupt_swallowed_in_a_callback_is_delivered_again():
    """A signal handled inside a __del__ or a gc callback (JAX has one) raises where Python ignores
    exceptions: it must not be lost."""

    class Finalised:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # the handler runs inside __del__
            sum(range(10))

    with pytest.raises(interrupts.Interrupted):
        with interrupts.handled():
            x = Finalised()
            del x
            time.sleep(30)  # the interrupt arrives again while the main thread waits here


def test_an_ignored_signal_stays_ignored(monkeypatch):
    """A shell runs background jobs with SIGINT ignored: plnexp keeps it so."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts.handled():
            signal.raise_signal(signal.SIGINT)  # ignored: nothing raised
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        with pytest.raises(interrupts.Interrupted, match="SIGTERM"):
            with interrupts.handled():
                signal.raise_signal(signal.SIGTERM)  # still handled
    finally:
        signal.signal(signal.SIGINT, previous)


def test_pending_tells_code_that_caught_another_error_about_the_interrupt():
    assert interrupts.pending() is None
    with interrupts.handled():
        assert interrupts.pending() is None
        try:
            try:
                signal.raise_signal(signal.SIGTERM)
            except interrupts.Interrupted as e:
                raise RuntimeError("a library turned it into this") from e
        except RuntimeError:
            assert interrupts.pending().exit_code == 143
    assert interrupts.pending() is None


def test_plain_keyboard_interrupt_is_a_sigint():
    assert interrupts.as_interrupted(KeyboardInterrupt()).exit_code == 130


def test_second_signal_while_the_main_thread_is_stuck_forces_the_stop(monkeypatch, capsys):
    """The helper thread's side, driven directly: two signals arrive and the main thread's handler
    never runs (as inside a compiled call that does not check for signals)."""
    forced, exits = [], []
    monkeypatch.setattr(interrupts, "GRACE_S", 0.01)
    monkeypatch.setattr(interrupts.os, "_exit", exits.append)
    guard = interrupts._Guard(forced.append)
    guard.thread.start()
    guard.write.send(bytes([signal.SIGINT, signal.SIGINT]))
    guard.write.close()
    guard.thread.join(timeout=10)
    guard.read.close()
    assert forced == [signal.SIGINT] and exits == [130]
    err = capsys.readouterr().err
    assert "stops when it returns" in err and "SIGINT again: stopping now" in err


def test_no_forced_stop_when_the_main_thread_reacted(monkeypatch):
    forced, exits = [], []
    monkeypatch.setattr(interrupts, "GRACE_S", 0.01)
    monkeypatch.setattr(interrupts.os, "_exit", exits.append)
    guard = interrupts._Guard(forced.append)
    guard.reacted.set()  # the main thread is already cleaning up
    guard.thread.start()
    guard.write.send(bytes([signal.SIGINT, signal.SIGINT, signal.SIGTERM]))
    guard.write.close()
    guard.thread.join(timeout=10)
    guard.read.close()
    assert forced == [] and exits == []
