"""The one place where fits are timed: compile apart from run, always ``block_until_ready``.

For a Program (see :mod:`plnexp.strategies.base`), :func:`measure` by default pays for exactly
one ahead-of-time compile and one run of the compiled program:

- ``compile_s``: a cold ahead-of-time compile (summed over the functions of ``jit_per_function``;
  0 for ``eager``), in three parts that sum to it: ``trace_s`` (``jitted.trace(*args)``), ``lower_s``
  (``traced.lower()``, to StableHLO) and ``xla_compile_s`` (``lowered.compile()``: XLA's passes and
  code generation). The PyTorch strategies have ``compile_s`` only.
- What XLA made of the compiled program (:func:`plnexp.strategies.base.xla_metrics`; none for
  ``eager`` and the PyTorch strategies): ``xla_instructions`` and ``xla_fusions`` in its optimized
  HLO, ``xla_flops_per_iter`` and ``xla_bytes_per_iter`` of one iteration by XLA's cost analysis
  (how each is counted: :mod:`plnexp.measure.xla_stats`), ``peak_bytes`` (argument + output + temporary -
  aliased bytes of XLA's memory analysis; the largest function's for ``jit_per_function``); the HLO
  itself is ``hlo`` (logged as the run's ``program.hlo.txt``).
- ``run_cpu_s``: the median process CPU time (every thread's) of the timed runs, beside their wall
  time: how much of the machine a run kept busy (XLA's threads included), where ``run_s`` is what a
  user waits.
- ``run_s``: the median of the timed runs of the compiled program (each ended by
  ``block_until_ready``; the last one's output is the fit's result), after ``warmup`` untimed runs:
  at least ``repeats`` runs, then more while the timed runs so far took less than ``budget_s``
  seconds (at most :data:`MAX_RUNS`); ``ms_per_iter`` = run_s / iterations run. Their spread,
  ``run_s_iqr``, is the interquartile range from 5 runs on, the range (max - min) below;
  ``n_runs`` counts them (see :class:`Spread`).
- ``calib_before_s`` / ``calib_after_s``: a fixed host workload (:func:`calibrate`) timed just
  before and just after the timed runs, in the same process. A machine busy with something else
  (another job, another user) slows it: :data:`CALIBRATION_TOLERANCE` says how much it moves on an
  idle machine. ``timed_start`` / ``timed_end`` (epoch seconds) bound the timed runs, so that the
  report can see jobs whose timed runs overlapped on one host.
- ``fingerprint``: of the compiled program's optimized HLO (:mod:`plnexp.measure.fingerprint`; "" for
  eager and the PyTorch strategies).

**Cold, without clearing the caller's caches.** A compile is cold when nothing in JAX's in-memory
caches (tracing, lowering, compiled executables) can serve it. :func:`measure` gets that by
compiling a program built for the occasion (``fresh()``: new Python functions, so new jit wrappers
that JAX has never traced), never by ``jax.clear_caches()``, which would also throw away every
compiled function of the caller's. Each cold step (the first call, the compile, the warm compile)
gets a program of its own, so none of them warms another. What a fresh program may still find
warm are JAX's own library functions that the fit calls inside (jitted helpers of ``jax.numpy``,
and the primitives ``eager`` dispatches one by one): a few percent of a compile, and exactly what a
user's second fit in a process finds warm too. Only where plnexp owns the process (a job of its
command line, ``owns_process=True``) are JAX's caches also cleared before each cold step, so that
every job of a sweep is measured from the same empty caches, whichever jobs ran before it in that
process.

Opt-in extras, each an added cost:

- ``first_call=True``: ``first_call_s``, one plain call of a fresh program, blocked: what a naive
  user times (tracing + compiling + running). NaN (and not a metric) when off. It runs with the
  persistent cache off, so it stays cold and cannot warm the compile below.
- ``compile_cache_dir=PATH``: JAX's persistent compilation cache in PATH for the compiles
  (every entry written: no minimum compile time or size). ``compile_s`` is then the first compile
  (a miss on a fresh cache; ``compile_cache_hits`` counts the XLA compilations it got from the
  cache, 0 when truly cold) and, with ``warm_compile`` (the default), ``compile_warm_s`` the
  compile of another fresh program, served by the persistent cache (``compile_warm_cache_hits``),
  which is what a new process pays. With ``None`` the persistent cache is off for the whole
  measurement; either way JAX's previous cache settings, and the cache object JAX builds from them,
  are restored afterwards (:func:`persistent_cache`): a compile of the caller's after the fit goes
  where the caller's own settings send it, never into plnexp's folder.
  :func:`usable_cache_dir` checks a folder first (a warning and no cache where it cannot be written).

Note that ``eager`` (and, for its few glue operations, ``jit_per_function``) compiles each
primitive on first use: in a fresh process (or after the cache clearing of ``owns_process``) its
first run pays those compiles. Ask for ``warmup >= 1`` when comparing their per-iteration cost with
the compiled loops.
"""

from __future__ import annotations

import functools
import math
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import jax
import numpy as np

from . import fingerprint
from ..core.problem import Output
from ..system import jax_compat
from ..system.runtime import caller_stacklevel

NAN = float("nan")
MAX_RUNS = 30  # timed runs of one job at most, whatever the budget: enough for a steady IQR
# The calibration workload (see calibrate): on an idle machine its before/after ratio stays within
# CALIBRATION_TOLERANCE (benchmarks/calibration.py measures it; docs/results.md, "Calibration and
# contention").
CALIBRATION_SIZE, CALIBRATION_PASSES, CALIBRATION_REPEATS = 1 << 16, 96, 3
CALIBRATION_TOLERANCE = 0.25
# How much slower than the host's fastest calibration of the sweep a job's may be: looser, since it
# compares calibrations minutes apart, which spread more even in an idle default sweep (docs/results.md,
# "Calibration and contention").
CALIBRATION_LEVEL_TOLERANCE = 0.5
_CACHE_OPTIONS = (
    "jax_compilation_cache_dir",
    "jax_enable_compilation_cache",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


@dataclass(frozen=True)
class Spread:
    """The timed runs of one job: their median, and an interval that holds their middle: the
    interquartile range (inclusive quartiles) from 5 runs on, the whole range below 5 runs."""

    runs: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.runs)

    @property
    def median(self) -> float:
        return statistics.median(self.runs) if self.runs else NAN

    @property
    def interval(self) -> tuple[float, float]:
        if not self.runs:
            return NAN, NAN
        if self.n < 5:
            return min(self.runs), max(self.runs)
        q1, _, q3 = statistics.quantiles(self.runs, n=4, method="inclusive")
        return q1, q3

    @property
    def width(self) -> float:
        lo, hi = self.interval
        return hi - lo


def check_counts(spec, **lowest: int) -> None:
    """Each field named in ``lowest`` of ``spec``: an integer at least its lowest value; a one-line
    ValueError naming the field otherwise."""
    for key, low in lowest.items():
        value = getattr(spec, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{key}={value!r}: allowed values are integers >= {low}")


@dataclass(frozen=True)
class TimingSpec:
    """How a fit is timed (:func:`measure`): after ``warmup`` untimed runs, at least ``repeats``
    timed runs (median and spread), more while they took less than ``time_budget_s`` seconds in all;
    a cold plain call when ``first_call``; JAX's persistent compilation cache in
    ``compile_cache_dir`` (None: off), and with it, when ``warm_compile``, a second compile timed
    (``compile_warm_s``: the timing study's ``compile_cache=true``; see
    :func:`plnexp.fitting.spec.cache_choice`)."""

    repeats: int = 1
    warmup: int = 0
    first_call: bool = False
    compile_cache_dir: Path | None = None
    time_budget_s: float = 0.0
    warm_compile: bool = True

    def __post_init__(self):
        check_counts(self, repeats=1, warmup=0)
        b = self.time_budget_s
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not (0 <= b < float("inf")):
            raise ValueError(f"time_budget_s={b!r}: allowed values are numbers >= 0 (seconds)")
        for key in ("first_call", "warm_compile"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key}={getattr(self, key)!r}: allowed values are True, False")


def calibrate(clock=time.perf_counter) -> float:
    """Seconds of a fixed host workload, the best of :data:`CALIBRATION_REPEATS` timings (a few
    milliseconds each: docs/results.md, "Calibration and contention"): :data:`CALIBRATION_PASSES`
    passes of NumPy element-wise arithmetic over :data:`CALIBRATION_SIZE` float64 values.
    Single-threaded on purpose: a multi-threaded workload (BLAS) also measures how soon XLA's own
    worker threads, still spinning after the fit, let go of the cores, which moved it far beyond the
    tolerance on an idle machine (same section)."""
    x0 = np.linspace(0.0, 1.0, CALIBRATION_SIZE)
    best = math.inf
    for _ in range(CALIBRATION_REPEATS):
        t0 = clock()
        x = x0
        for _ in range(CALIBRATION_PASSES):
            x = np.sqrt(x * x + 1.0) - 0.5
        best = min(best, clock() - t0)
    return best


@dataclass(frozen=True)
class ProgramStats:
    """What one cold compile says of its program: ``compile_s`` in three parts (NaN where they do
    not apply: eager, torch) and what XLA made of it (``xla``: xla_instructions, xla_fusions,
    xla_flops_per_iter, xla_bytes_per_iter, peak_bytes; worked out on first use by ``analyse``,
    since parsing the HLO and costing the loop take time that only a logged run needs: docs/results.md,
    "Where the time goes, and other figures"),
    and the optimized HLO as logged (``hlo``: one function's text, or each after a header line)."""

    trace_s: float = NAN
    lower_s: float = NAN
    xla_compile_s: float = NAN
    analyse: Callable[[], dict[str, float]] = field(default=dict, repr=False, compare=False)
    hlo: str = field(default="", repr=False)

    @property
    def xla(self) -> dict[str, float]:
        return self.analyse()

    def as_metrics(self) -> dict[str, float]:
        return {"trace_s": self.trace_s, "lower_s": self.lower_s, "xla_compile_s": self.xla_compile_s, **self.xla}

    def __reduce__(self):
        """Pickled with ``analyse``'s figures, worked out now (after any timed run: the timing is the
        one measured), not the function, which holds the compiled program (no pickle has it)."""
        known = functools.partial(dict, self.xla)  # a copy of the figures as worked out, at each call
        return (ProgramStats, (self.trace_s, self.lower_s, self.xla_compile_s, known, self.hlo))


@dataclass(frozen=True, kw_only=True)
class Timing:
    """A fit's figures (NaN: not measured; see the module docstring); :meth:`of_runs` from timed runs."""

    compile_s: float = NAN
    first_call_s: float = NAN
    run_s: float = NAN
    ms_per_iter: float = NAN
    runs_s: tuple[float, ...] = ()
    # the process's CPU time (every thread's, time.process_time) over a timed run, median: how much of
    # the machine the run kept busy; run_s is the wall time a user waits (docs/concepts/study.md)
    run_cpu_s: float = NAN
    fingerprint: str = ""  # of the compiled program (plnexp.measure.fingerprint); "" for eager and torch
    calib_before_s: float = NAN
    calib_after_s: float = NAN
    timed_start: float = NAN  # epoch seconds: when the timed runs began and ended
    timed_end: float = NAN
    # XLA's estimates per compiled function. A scan's cost counts its body once: it is per iteration.
    cost_analysis: dict = field(default_factory=dict)
    memory_analysis: dict = field(default_factory=dict)
    # only with the persistent compilation cache on (NaN otherwise)
    compile_warm_s: float = NAN
    compile_cache_hits: float = NAN
    compile_warm_cache_hits: float = NAN
    # compile_s in parts and what XLA made of the program (nothing for eager and torch)
    program: ProgramStats = field(default_factory=ProgramStats)

    @classmethod
    def of_runs(cls, runs_s, n_iter: int, **figures) -> Timing:
        """The timing of the timed runs ``runs_s`` (seconds) of ``n_iter`` iterations: their median
        ``run_s`` and its ``ms_per_iter``; ``figures``: the other fields."""
        run_s = statistics.median(runs_s)
        return cls(run_s=run_s, ms_per_iter=1e3 * run_s / max(n_iter, 1), runs_s=tuple(runs_s), **figures)

    @property
    def spread(self) -> Spread:
        return Spread(self.runs_s)

    def as_metrics(self) -> dict[str, float]:
        """The measured numbers (every number of the timing and of its program), without those not
        measured (NaN)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values = {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        values.update(self.program.as_metrics())
        if not math.isnan(self.run_s):  # timed runs (an untimed call has no spread)
            spread = self.spread
            lo, hi = spread.interval
            values.update(run_s_iqr=spread.width, run_s_lo=lo, run_s_hi=hi, n_runs=float(spread.n))
        return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)}


def _timed(fn, state, data, clock=time.perf_counter) -> tuple[Output, float]:
    t0 = clock()
    out = jax.block_until_ready(fn(state, data))
    return out, clock() - t0


def _apply_cache_options(values: dict) -> None:
    for name, value in values.items():
        if name in jax.config.values:  # min_entry_size_bytes may be missing from another jax
            jax.config.update(name, value)
    # JAX builds its cache object once, from the directory set at its first use: start over.
    jax_compat.reset_compilation_cache()


class CacheWarning(UserWarning):
    """The persistent compilation cache could not be used; the fit ran without it."""


def usable_cache_dir(directory: str | Path | None) -> Path | None:
    """``directory`` (created if missing) when a cache entry can be written there; else ``None``
    and a one-line :class:`CacheWarning`: a cache that cannot be written never stops a fit."""
    if directory is None:
        return None
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        warnings.warn(
            f"compile_cache: cannot write the compilation cache {path} ({e.strerror or e}); "
            "this fit compiles without it",
            CacheWarning,
            stacklevel=caller_stacklevel(),
        )
        return None
    return path


@contextmanager
def persistent_cache(directory: str | Path | None):
    """JAX's persistent compilation cache in ``directory`` (created; every compiled program is
    written, whatever its compile time or size: JAX's thresholds, 1 s of compile time by default,
    would skip a small fit's program), or off when ``None``; JAX's previous cache settings are
    restored on exit."""
    saved = {name: jax.config.values[name] for name in _CACHE_OPTIONS if name in jax.config.values}
    wanted: dict[str, Any]
    if directory is None:
        wanted = {"jax_compilation_cache_dir": None}
    else:
        Path(directory).mkdir(parents=True, exist_ok=True)
        # min entry size -1: no minimum, and JAX may not raise it (0 lets it pick one at first use)
        wanted = {
            "jax_compilation_cache_dir": str(directory),
            "jax_enable_compilation_cache": True,
            "jax_persistent_cache_min_compile_time_secs": 0.0,
            "jax_persistent_cache_min_entry_size_bytes": -1,
        }
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


def _cold(program, fresh: Callable[[], Any] | None, owns_process: bool):
    """The program for one cold step: ``fresh()`` (functions JAX has never traced), or ``program``
    itself when the caller has no other; JAX's caches are cleared first only in a process plnexp owns
    (see the module's doc)."""
    if owns_process:
        jax.clear_caches()
    return fresh() if fresh is not None else program


def _cold_compile(program, state, data):
    """``program.compile``; returns (Compiled, persistent-cache hits)."""
    with _count_events(jax_compat.cache_hit_event()) as hits:
        compiled = program.compile(state, data)
    return compiled, hits[0]


def measure(
    program,
    state,
    data,
    spec: TimingSpec | None = None,
    *,
    fresh: Callable[[], Any] | None = None,
    owns_process: bool = False,
    clock=time.perf_counter,
    keep: list | None = None,
) -> tuple[Output, Timing]:
    """One cold AOT compile, then ``warmup`` untimed runs and the timed runs: at least ``repeats``,
    more while they took less than ``time_budget_s`` in all, as ``spec`` says (:class:`TimingSpec`;
    None: one timed run; see the module docstring for the rest); returns the output of the last
    timed run and its :class:`Timing`.

    ``fresh``: makes a new Program equivalent to ``program`` whose functions JAX has never traced,
    one per cold step (the first call, the compile, the warm compile); without it those steps use
    ``program`` itself, cold only if nothing compiled it before. ``owns_process``: also clear JAX's
    in-memory caches before each cold step: for a process plnexp owns, never a library call.
    ``clock``: for tests. ``keep``: a list the compiled program is appended to (to run it again)."""
    spec = spec or TimingSpec()
    first_call_s, compile_warm_s, hits, warm_hits = NAN, NAN, NAN, NAN
    with persistent_cache(None):
        if spec.first_call:
            _, first_call_s = _timed(_cold(program, fresh, owns_process).call, state, data, clock)
        with persistent_cache(spec.compile_cache_dir):
            compiled, cold_hits = _cold_compile(_cold(program, fresh, owns_process), state, data)
            if spec.compile_cache_dir is not None:
                hits = float(cold_hits)
                if spec.warm_compile:
                    warm, warm_count = _cold_compile(_cold(program, fresh, owns_process), state, data)
                    compile_warm_s, warm_hits = warm.compile_s, float(warm_count)
        for _ in range(spec.warmup):
            _timed(compiled.run, state, data, clock)
        calib_before = calibrate(clock)
        start = time.time()
        runs: list[float] = []
        cpu: list[float] = []  # the process's CPU time of each timed run, all threads
        out: Output | None = None
        while len(runs) < spec.repeats or (sum(runs) < spec.time_budget_s and len(runs) < MAX_RUNS):
            cpu0 = time.process_time()
            out, seconds = _timed(compiled.run, state, data, clock)
            cpu.append(time.process_time() - cpu0)
            runs.append(seconds)
        end = time.time()
        calib_after = calibrate(clock)
    assert out is not None  # repeats >= 1: the loop ran
    if keep is not None:
        keep.append(compiled)
    return out, Timing.of_runs(
        runs,
        int(np.max(np.asarray(out.n_run))),  # a batch of fits: the longest sets the time
        compile_s=compiled.compile_s,
        first_call_s=first_call_s,
        run_cpu_s=statistics.median(cpu),
        fingerprint=fingerprint.of_executables(compiled.executables),
        calib_before_s=calib_before,
        calib_after_s=calib_after,
        timed_start=start,
        timed_end=end,
        cost_analysis=compiled.cost_analysis,
        memory_analysis=compiled.memory_analysis,
        compile_warm_s=compile_warm_s,
        compile_cache_hits=hits,
        compile_warm_cache_hits=warm_hits,
        program=compiled.program,
    )


def untimed(program, state, data, *, compile_cache_dir: str | Path | None = None) -> tuple[Output, Timing]:
    """One plain call of ``program`` (its jit cache, if it has compiled before: nothing is made cold):
    for tests and quick fits. The persistent
    compilation cache is used if ``compile_cache_dir`` is given (``compile_cache_hits``), off
    otherwise."""
    with persistent_cache(compile_cache_dir), _count_events(jax_compat.cache_hit_event()) as hits:
        out, seconds = _timed(program.call, state, data)
    return out, Timing(
        first_call_s=seconds, runs_s=(seconds,), compile_cache_hits=NAN if compile_cache_dir is None else float(hits[0])
    )
