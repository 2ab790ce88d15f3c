"""The progress bar of an untimed fit (:mod:`plnexp.fitting.progress`): seen in a terminal (a pty),
absent from a log, and never part of a timed program: the chunks make the same fit, and a timed fit's
compiled program (its ``hlo_fingerprint``) is the same with progress on and off."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

import numpy as np
import pytest

import plnexp
from plnexp.fitting import progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_in_a_terminal_off_in_a_log_unless_asked():
    assert progress.wanted(None, _Terminal()) and not progress.wanted(None, io.StringIO())
    assert progress.wanted(True, io.StringIO()) and not progress.wanted(False, _Terminal())
    closed = io.StringIO()
    closed.close()
    assert not progress.wanted(None, closed)


def test_chunks_a_power_of_two_near_the_update_interval():
    assert progress.chunk_length(1e-3, 10_000) == 512  # 0.5 s at 1 ms an iteration (2**9 <= 1000)
    assert progress.chunk_length(10.0, 10_000) == progress.MIN_CHUNK  # never shorter
    assert progress.chunk_length(1e-3, 100) == 100  # never past the end
    assert progress.chunk_length(float("nan"), 5) == 5


@pytest.mark.slow  # ~2 s: two fits, three programs compiled
@pytest.mark.parametrize("strategy", ["scan", "fori_loop"])
def test_a_fit_in_chunks_is_the_same_fit(strategy):
    """The chunks (8, then the rest: two programs) make the same iterations as one program: the same
    curve, final state and ELBO, to the last bit (float64, CPU)."""
    data = plnexp.simulate(n=40, p=6, d=2, seed=3)
    kw = dict(n_iter=30, precision="float64", strategy=strategy, init="seed", timed=False)
    whole = plnexp.fit(data, progress=False, **kw)
    chunked = plnexp.fit(data, progress=True, **kw)
    assert np.array_equal(whole.elbo, chunked.elbo) and whole.n_iter == chunked.n_iter == 30
    for key in whole.params:
        assert np.array_equal(whole.params[key], chunked.params[key]), key
    assert whole.loglik == chunked.loglik and whole.extra["final_elbo_jit"] == chunked.extra["final_elbo_jit"]


@pytest.mark.slow  # ~3 s: two timed fits (cold compiles)
def test_a_timed_fit_is_the_same_program_with_progress_on_and_off(capsys):
    data = plnexp.simulate(n=40, p=6, d=2, seed=3)
    kw = dict(n_iter=20, strategy="scan", init="seed", compile_cache=False)
    on = plnexp.fit(data, progress=True, **kw)
    off = plnexp.fit(data, progress=False, **kw)
    assert on.timing.fingerprint and on.timing.fingerprint == off.timing.fingerprint
    assert np.isfinite(on.timing.ms_per_iter)  # timed as before, one program
    assert "it/s" not in capsys.readouterr().err  # no bar drawn around a timed program


CHILD = """
import plnexp
from plnexp.fitting import progress
progress.SHOW_AFTER_S = 0.0  # this test's fit is short: the bar at once
res = plnexp.fit(plnexp.load_oaks(), n_iter=400, init="seed", timed=False)  # progress=None: the default
print("DONE", res.n_iter, flush=True)
"""


def _read_all(fd: int, proc: subprocess.Popen, timeout: float) -> bytes:
    out = b""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    return out


@pytest.mark.slow  # a child process paying every import (~10 s)
def test_the_bar_is_seen_in_a_terminal_and_not_in_a_log(tmp_path):
    env = {**os.environ, "PLNEXP_OUTPUTS": str(tmp_path)}
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal's size: 120 columns
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=child, stdout=child, stderr=child, env=env)
    os.close(child)
    try:
        seen = _read_all(main, proc, 240).decode(errors="replace")
    finally:
        os.close(main)
        proc.wait(timeout=60)
    assert proc.returncode == 0, seen
    assert "DONE 400" in seen
    assert "400/400" in seen and "it/s" in seen and "ELBO -3" in seen, seen  # oaks' ELBO: -32,0xx
    logged = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=240)
    assert logged.returncode == 0, logged.stderr
    assert "DONE 400" in logged.stdout and "it/s" not in logged.stderr  # stderr a pipe: no bar
