"""The one place where fits are timed: compile apart from run, always ``block_until_ready``.

For a Program (see :mod:`plnexp.strategies.base`), :func:`measure` by default pays for exactly
one ahead-of-time compile and one run of the compiled program:

- ``compile_s``: after ``jax.clear_caches()``, ahead-of-time ``lower().compile()`` (tracing +
  lowering + XLA compilation, summed over the functions of ``jit_per_function``; 0 for ``eager``);
- ``run_s``: one run of the compiled program, ended by ``block_until_ready`` (its output is the
  fit's result); with ``repeats > 1`` the median of that many runs, after ``warmup`` untimed runs;
  ``ms_per_iter`` = run_s / iterations run.

Opt-in extras, each an added cost:

- ``first_call=True``: ``first_call_s``, after ``jax.clear_caches()`` one plain call, blocked: what
  a naive user times (tracing + compiling + running). NaN (and not a metric) when off. It runs
  with the persistent cache off, so it stays cold and cannot warm the compile below.
- ``compile_cache_dir=PATH``: JAX's persistent compilation cache in PATH for the compiles
  (every entry written: no minimum compile time or size). ``compile_s`` is then the first compile
  (a miss on a fresh cache; ``compile_cache_hits`` counts the XLA compilations it got from the
  cache, 0 when truly cold) and ``compile_warm_s`` a second ``jax.clear_caches()`` + compile,
  served by the cache (``compile_warm_cache_hits``), which is what a new process pays. With
  ``None`` the persistent cache is off for the whole measurement; either way JAX's previous cache
  settings are restored afterwards.

Note that ``eager`` (and, for its few glue operations, ``jit_per_function``) compiles each
primitive on first use: after the cache clearing, its first run pays those compiles. Ask for
``warmup >= 1`` when comparing their per-iteration cost with the compiled loops.
"""

from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
from jax.experimental.compilation_cache import compilation_cache as _jax_cache

from .problem import Output

NAN = float("nan")
# jax 0.10.2 records this event (jax/_src/compiler.py) once per XLA compilation served by the cache
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_CACHE_OPTIONS = ("jax_compilation_cache_dir", "jax_enable_compilation_cache",
                  "jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes")


@dataclass(frozen=True, kw_only=True)
class Timing:
    compile_s: float
    first_call_s: float
    run_s: float
    ms_per_iter: float
    runs_s: tuple[float, ...] = ()
    # XLA's estimates per compiled function. A scan's cost counts its body once: it is per iteration.
    cost_analysis: dict = field(default_factory=dict)
    memory_analysis: dict = field(default_factory=dict)
    # only with the persistent compilation cache on (NaN otherwise)
    compile_warm_s: float = NAN
    compile_cache_hits: float = NAN
    compile_warm_cache_hits: float = NAN

    def as_metrics(self) -> dict[str, float]:
        """The measured numbers, without those not measured (NaN)."""
        values = {"compile_s": self.compile_s, "compile_warm_s": self.compile_warm_s,
                  "first_call_s": self.first_call_s, "run_s": self.run_s, "ms_per_iter": self.ms_per_iter,
                  "compile_cache_hits": self.compile_cache_hits,
                  "compile_warm_cache_hits": self.compile_warm_cache_hits}
        return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)}


def _timed(fn, *args) -> tuple[Output, float]:
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - t0


def _apply_cache_options(values: dict) -> None:
    for name, value in values.items():
        if name in jax.config.values:  # min_entry_size_bytes may be missing from another jax
            jax.config.update(name, value)
    # JAX builds its cache object once, from the directory set at its first use: start over.
    _jax_cache.reset_cache()


@contextmanager
def persistent_cache(directory: str | Path | None):
    """JAX's persistent compilation cache in ``directory`` (created; every compiled program is
    written, whatever its compile time or size), or off when ``None``; JAX's previous cache
    settings are restored on exit."""
    saved = {name: jax.config.values[name] for name in _CACHE_OPTIONS if name in jax.config.values}
    if directory is None:
        wanted = {"jax_compilation_cache_dir": None}
    else:
        Path(directory).mkdir(parents=True, exist_ok=True)
        wanted = {"jax_compilation_cache_dir": str(directory), "jax_enable_compilation_cache": True,
                  "jax_persistent_cache_min_compile_time_secs": 0.0,
                  "jax_persistent_cache_min_entry_size_bytes": 0}
    _apply_cache_options(wanted)
    try:
        yield
    finally:
        _apply_cache_options(saved)


@contextmanager
def _count_events(name: str):
    """Count the ``jax.monitoring`` events called ``name`` recorded inside the block."""
    count = [0]

    def listener(event: str, **kwargs) -> None:
        if event == name:
            count[0] += 1

    jax.monitoring.register_event_listener(listener)
    try:
        yield count
    finally:
        jax.monitoring.unregister_event_listener(listener)


def _cold_compile(program, state, data):
    """``jax.clear_caches()`` then ``program.compile``; returns (Compiled, persistent-cache hits)."""
    jax.clear_caches()
    with _count_events(CACHE_HIT_EVENT) as hits:
        compiled = program.compile(state, data)
    return compiled, hits[0]


def measure(program, state, data, *, repeats: int = 1, warmup: int = 0, first_call: bool = False,
            compile_cache_dir: str | Path | None = None) -> tuple[Output, Timing]:
    """One cold AOT compile and one run by default (see the module docstring for the options);
    returns the output of the last timed run and its :class:`Timing`."""
    if not (isinstance(repeats, int) and repeats >= 1 and isinstance(warmup, int) and warmup >= 0):
        raise ValueError(f"repeats={repeats!r}, warmup={warmup!r}: need integers repeats >= 1 and warmup >= 0")
    first_call_s, compile_warm_s, hits, warm_hits = NAN, NAN, NAN, NAN
    with persistent_cache(None):
        if first_call:
            jax.clear_caches()
            _, first_call_s = _timed(program.call, state, data)
        with persistent_cache(compile_cache_dir):
            compiled, cold_hits = _cold_compile(program, state, data)
            if compile_cache_dir is not None:
                hits = float(cold_hits)
                warm, warm_count = _cold_compile(program, state, data)
                compile_warm_s, warm_hits = warm.compile_s, float(warm_count)
        for _ in range(warmup):
            _timed(compiled.run, state, data)
        runs, out = [], None
        for _ in range(repeats):
            out, seconds = _timed(compiled.run, state, data)
            runs.append(seconds)
    run_s = statistics.median(runs)
    n_run = max(int(np.max(np.asarray(out.n_run))), 1)  # a batch of fits: the longest sets the time
    return out, Timing(compile_s=compiled.compile_s, first_call_s=first_call_s, run_s=run_s,
                       ms_per_iter=1e3 * run_s / n_run, runs_s=tuple(runs), cost_analysis=compiled.cost_analysis,
                       memory_analysis=compiled.memory_analysis, compile_warm_s=compile_warm_s,
                       compile_cache_hits=hits, compile_warm_cache_hits=warm_hits)


def untimed(program, state, data, *, compile_cache_dir: str | Path | None = None) -> tuple[Output, Timing]:
    """One plain call (cached jit, no cache clearing): for tests and quick fits. The persistent
    compilation cache is used if ``compile_cache_dir`` is given, off otherwise."""
    with persistent_cache(compile_cache_dir):
        out, seconds = _timed(program.call, state, data)
    return out, Timing(compile_s=NAN, first_call_s=seconds, run_s=NAN, ms_per_iter=NAN, runs_s=(seconds,))
