"""plnexp.interrupts in-process: signals become Interrupted, deferred sections, the helper thread
that stops a process whose main thread is stuck in compiled code."""

from __future__ import annotations

import signal

import pytest

from plnexp import interrupts


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
