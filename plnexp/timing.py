"""The one place where fits are timed: compile apart from run, always ``block_until_ready``.

For a Program (see :mod:`plnexp.strategies.base`):

- ``first_call_s``: after ``jax.clear_caches()``, one plain call, blocked: what a naive user times
  (tracing + compiling + running);
- ``compile_s``: after ``jax.clear_caches()``, ahead-of-time ``lower().compile()`` (summed over the
  functions of ``jit_per_function``; 0 for ``eager``);
- ``run_s``: steady state, the median of ``repeats`` runs of the compiled program after
  ``warmup`` runs, each ended by ``block_until_ready``; ``ms_per_iter`` = run_s / iterations run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import jax

from .problem import Output


@dataclass(frozen=True)
class Timing:
    compile_s: float
    first_call_s: float
    run_s: float
    ms_per_iter: float
    runs_s: tuple[float, ...] = ()
    # XLA's estimates per compiled function. A scan's cost counts its body once: it is per iteration.
    cost_analysis: dict = field(default_factory=dict)
    memory_analysis: dict = field(default_factory=dict)

    def as_metrics(self) -> dict[str, float]:
        return {"compile_s": self.compile_s, "first_call_s": self.first_call_s,
                "run_s": self.run_s, "ms_per_iter": self.ms_per_iter}


def _timed(fn, *args) -> tuple[Output, float]:
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - t0


def measure(program, state, data, *, repeats: int = 1, warmup: int = 1) -> tuple[Output, Timing]:
    """Cold first call, cold AOT compile, then ``repeats`` steady runs; returns the last output."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats={repeats}, warmup={warmup}: need repeats >= 1 and warmup >= 0")
    jax.clear_caches()
    _, first_call_s = _timed(program.call, state, data)
    jax.clear_caches()
    compiled = program.compile(state, data)
    for _ in range(warmup):
        _timed(compiled.run, state, data)
    runs, out = [], None
    for _ in range(repeats):
        out, seconds = _timed(compiled.run, state, data)
        runs.append(seconds)
    run_s = statistics.median(runs)
    n_run = max(int(out.n_run), 1)
    return out, Timing(compiled.compile_s, first_call_s, run_s, 1e3 * run_s / n_run, tuple(runs),
                       compiled.cost_analysis, compiled.memory_analysis)


def untimed(program, state, data) -> tuple[Output, Timing]:
    """One plain call (cached jit, no cache clearing): for tests and quick fits."""
    out, seconds = _timed(program.call, state, data)
    nan = float("nan")
    return out, Timing(nan, seconds, nan, nan, (seconds,))
