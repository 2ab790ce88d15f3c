"""What a JIT strategy is: something that turns a :class:`~plnexp.core.problem.Problem` into a Program.

A Program offers two ways to run the same fit:

- ``call(state, data)``: the plain path a user would write (jit on first call, or no jit at all);
- ``compile(state, data)``: ahead-of-time compilation, returning a :class:`Compiled` whose ``run``
  executes without any further tracing or compiling, with the compile time measured apart: in
  three parts, tracing (``jitted.trace``), lowering (``traced.lower()``) and XLA's compilation
  (``lowered.compile()``), and what XLA made of the program (:func:`xla_metrics`, read from the
  optimized HLO by :mod:`plnexp.measure.xla_stats`).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.extend import core as jax_core

from ..system.commandline import first_line
from ..measure import xla_stats
from ..measure.timing import ProgramStats
from ..core.arrays import Arrays
from ..core.initial_state import init_state
from ..core.problem import FitState, Output, Problem

NAN = float("nan")
# what a compiled program logs besides its compile times (see xla_metrics)
XLA_METRICS = ("xla_instructions", "xla_fusions", "xla_flops_per_iter", "xla_bytes_per_iter", "peak_bytes")
# what a program's cost_analysis counts (its "per_iteration" says how one iteration's is counted)
WHOLE_PROGRAM = "the whole program: the loop body once whatever its trip count, and the code around it"


@dataclass(frozen=True)
class Compiled:
    run: Callable[[FitState, Arrays], Output]
    compile_s: float
    # XLA's estimates, per compiled function name: for the whole program (a loop's body counted
    # once, the code around it too); "per_iteration" holds one iteration's (see xla_stats)
    cost_analysis: dict[str, Any] = field(default_factory=dict)
    memory_analysis: dict[str, Any] = field(default_factory=dict)
    # what profiling and fingerprinting read, per compiled function name: jax.stages.Lowered and
    # jax.stages.Compiled (optimized HLO: ``executables[name].as_text()``); empty for eager and torch
    lowered: dict[str, Any] = field(default_factory=dict)
    executables: dict[str, Any] = field(default_factory=dict)
    # compile_s in parts (summed over functions) and xla_metrics, worked out on first use
    program: ProgramStats = field(default_factory=ProgramStats)


class Program(Protocol):
    """What a strategy builds. ``place`` puts the data where the program runs (one data set per fit
    of the program's batch: one device, rows split across devices, or stacked replicates);
    ``initial`` makes the initial state there (``seeds``: one per fit, for ``init="random"``);
    ``call``/``compile`` run the fit(s); ``split`` and ``unbatch`` give back one state / one Output
    per fit, as an unbatched, unpadded fit of that data set would have them."""

    def place(self, data: Sequence, dtype, device) -> Arrays: ...

    def initial(self, problem: Problem, data: Arrays, init: str, seeds: Sequence[int]) -> FitState: ...

    def call(self, state: FitState, data: Arrays) -> Output: ...

    def compile(self, state: FitState, data: Arrays) -> Compiled: ...

    def split(self, state: FitState, data: Arrays) -> list[FitState]: ...

    def unbatch(self, out: Output, data: Arrays) -> list[Output]: ...


class OneDevice:
    """Placement, initial state and outputs of a program that runs one fit on one device."""

    def place(self, data: Sequence, dtype, device) -> Arrays:
        """The data set's arrays in ``dtype`` on ``device``, with the log-factorial constant."""
        (one,) = data
        arrays = one.to_device(dtype, device)
        return arrays._replace(log_factorial=jax.device_put(dtype(one.log_factorial), device))

    def initial(self, problem: Problem, data: Arrays, init: str, seeds: Sequence[int]) -> FitState:
        (seed,) = seeds
        return problem.init(init_state(problem.model, data, init, seed))

    def split(self, state: FitState, data: Arrays) -> list[FitState]:
        return [state]

    def unbatch(self, out: Output, data: Arrays) -> list[Output]:
        return [out]


def _cost(compiled: jax.stages.Compiled) -> dict:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - not every backend provides it, each fails its own way
        return {}
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    keep = ("flops", "transcendentals", "bytes accessed", "optimal_seconds")
    return {k: float(v) for k, v in (cost or {}).items() if k in keep}


def _memory(compiled: jax.stages.Compiled) -> dict:
    try:
        mem = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - as _cost: optional, backend-specific
        return {}
    if mem is None:
        return {}
    names = (
        "argument_size_in_bytes",
        "output_size_in_bytes",
        "temp_size_in_bytes",
        "alias_size_in_bytes",
        "generated_code_size_in_bytes",
    )
    return {k: int(getattr(mem, k)) for k in names if hasattr(mem, k)}


class Steps(NamedTuple):
    """The fit's loop as traced: its length (None for a ``while_loop``, which stops on a condition)
    and its unroll factor (the steps one trip of the compiled loop runs)."""

    length: int | None
    unroll: int


def loop_steps(jaxpr) -> Steps | None:
    """The outermost loop of a traced program (``jax.stages.Traced.jaxpr``): the longest ``scan``
    (``fori_loop`` with static bounds is one), else a ``while``; None where the program has no loop
    (a function that ``jit_per_function`` calls once per iteration). Nested calls (``pjit``,
    ``shard_map``, ``custom_jvp``...) are looked into, loop bodies are not."""
    found: list[Steps] = []
    stack = [getattr(jaxpr, "jaxpr", jaxpr)]
    while stack:
        for eqn in stack.pop().eqns:
            name = eqn.primitive.name
            if name == "scan":
                length = int(eqn.params["length"])
                unroll = eqn.params.get("unroll", 1)
                unroll = length if unroll is True else max(int(unroll), 1)
                found.append(Steps(length, min(unroll, max(length, 1))))
            elif name == "while":
                found.append(Steps(None, 1))
            else:
                stack.extend(jax_core.jaxprs_in_params(eqn.params))
    scans = [s for s in found if s.length is not None]
    if scans:
        return max(scans, key=lambda s: s.length or 0)
    return found[0] if found else None


def per_iteration(hlo: str, steps: Steps | None, whole: dict) -> dict:
    """XLA's "flops" and "bytes accessed" of one iteration of a program (see :mod:`plnexp.measure.xla_stats`),
    with ``counted``, how: one call of a function without a loop; one trip of the loop's body and
    condition over the steps it runs; without a loop left in the HLO, the whole program over its
    steps. ``whole``: the program's own cost analysis (:func:`_cost`)."""
    keys = ("flops", "bytes accessed")
    if not whole:
        return {}
    if steps is None:
        return {**{k: whole[k] for k in keys if k in whole}, "counted": "one call (one per iteration)"}
    found = xla_stats.loop_modules(hlo)
    if found is not None and found[0].trip_count is not None and steps.length is not None:
        if found[0].trip_count != steps.length // steps.unroll:  # another loop: the fit's was unrolled away
            found = None
    if found is not None:
        loop, modules = found
        try:
            parts = [xla_stats.module_cost(m) for m in modules]
        except Exception as e:  # noqa: BLE001 - jaxlib's private API moved, or a module it will not parse
            why = first_line(e)
            return {
                **{k: whole[k] / steps.unroll for k in keys if k in whole},
                "counted": f"the whole program / {steps.unroll} (the loop alone could not be costed: {why})",
            }
        out: dict[str, Any] = {k: sum(p.get(k, 0.0) for p in parts) / steps.unroll for k in keys}
        out["counted"] = f"one trip of loop {loop.name} (body + condition) / {steps.unroll} step(s) per trip"
        return out
    n = max(steps.length or 1, 1)
    return {**{k: whole[k] / n for k in keys if k in whole}, "counted": f"no loop left: the whole program / {n}"}


@dataclass(frozen=True)
class AotResult:
    lowered: jax.stages.Lowered
    compiled: jax.stages.Compiled
    seconds: float  # trace_s + lower_s + xla_compile_s
    cost: dict  # the whole program's, with "per_iteration" (per_iteration) where XLA gives one
    memory: dict
    trace_s: float = NAN
    lower_s: float = NAN
    xla_compile_s: float = NAN
    hlo: str = field(default="", repr=False)  # compiled.as_text()
    steps: Steps | None = None  # the fit's loop as traced (loop_steps)

    def per_iteration(self) -> dict:
        """One iteration's cost (:func:`per_iteration`), worked out on first call and kept in
        ``cost["per_iteration"]`` (so the run's analysis.json has it); {} without a cost analysis."""
        if self.cost and self.hlo and "per_iteration" not in self.cost:
            self.cost["per_iteration"] = per_iteration(self.hlo, self.steps, self.cost)
        return self.cost.get("per_iteration", {})


def aot_compile(jitted, *args, counted: str = "") -> AotResult:
    """``jitted.trace(*args)``, ``.lower()``, ``.compile()``, each timed (their sum is the compile
    time); the lowered and compiled stages are kept (profiling reads them without compiling again),
    with XLA's cost analysis (the whole program's and one iteration's; ``counted``: what it counts,
    kept in it where XLA gives one) and memory analysis."""
    t0 = time.perf_counter()
    traced = jitted.trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    hlo = compiled.as_text() or ""
    steps = loop_steps(traced.jaxpr)
    cost = _cost(compiled)
    if cost and counted:
        cost["counted"] = counted
    return AotResult(lowered, compiled, t3 - t0, cost, _memory(compiled), t1 - t0, t2 - t1, t3 - t2, hlo, steps)


def peak_bytes(memory: dict) -> float:
    """argument + output + temp - alias bytes of XLA's memory analysis (NaN without one)."""
    names = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
    if not all(k in memory for k in names):
        return NAN
    return float(sum(memory[k] for k in names) - memory.get("alias_size_in_bytes", 0))


def xla_metrics(aot: dict[str, AotResult]) -> dict[str, float]:
    """What XLA made of a program of one or more compiled functions (one call of each per iteration):
    ``xla_instructions`` and ``xla_fusions`` (:func:`plnexp.measure.xla_stats.stats`), summed over the
    functions; ``xla_flops_per_iter`` and ``xla_bytes_per_iter`` (:func:`per_iteration`), summed;
    ``peak_bytes`` (:func:`peak_bytes`), the largest. A figure XLA did not give is left out."""
    out: dict[str, float] = {}
    texts = [a.hlo for a in aot.values() if a.hlo]
    if texts:
        counted = [xla_stats.stats(t) for t in texts]
        out["xla_instructions"] = float(sum(s.instructions for s in counted))
        out["xla_fusions"] = float(sum(s.fusions for s in counted))
    per_iter = [a.per_iteration() for a in aot.values()]
    for key, metric in (("flops", "xla_flops_per_iter"), ("bytes accessed", "xla_bytes_per_iter")):
        if per_iter and all(key in p for p in per_iter):
            out[metric] = float(sum(p[key] for p in per_iter))
    peaks = [peak_bytes(a.memory) for a in aot.values()]
    if peaks and all(math.isfinite(p) for p in peaks):
        out["peak_bytes"] = max(peaks)
    return out


def compile_one(jitted, label: str, counted: str, *args) -> Compiled:
    """The :class:`Compiled` of a program that is the one function ``jitted`` (``label``: its name),
    compiled for ``args`` (:func:`aot_compile`; ``counted``: what its cost analysis counts)."""
    aot = aot_compile(jitted, *args, counted=counted)
    return compiled_program(aot.compiled, {label: aot})


def compiled_program(run: Callable[[FitState, Arrays], Output], aot: dict[str, AotResult]) -> Compiled:
    """The :class:`Compiled` of a program made of the functions ``aot`` (by name; one call of each per
    iteration where there are several): compile times summed, XLA's analyses by function."""
    return Compiled(
        run,
        sum(a.seconds for a in aot.values()),
        {name: a.cost for name, a in aot.items()},
        {name: a.memory for name, a in aot.items()},
        {name: a.lowered for name, a in aot.items()},
        {name: a.compiled for name, a in aot.items()},
        program=ProgramStats(
            trace_s=sum(a.trace_s for a in aot.values()),
            lower_s=sum(a.lower_s for a in aot.values()),
            xla_compile_s=sum(a.xla_compile_s for a in aot.values()),
            analyse=functools.cache(lambda: xla_metrics(aot)),
            hlo=xla_stats.join_functions({name: a.hlo for name, a in aot.items() if a.hlo}),
        ),
    )


@dataclass(frozen=True)
class SingleProgram(OneDevice):
    """A strategy whose whole fit is one compiled function ``fit(state, data) -> Output``."""

    fit: Callable[[FitState, Arrays], Output]
    label: str = "fit"
    _jitted: jax.stages.Wrapped = field(init=False, repr=False, compare=False)  # jax.jit(fit)

    def __post_init__(self):
        object.__setattr__(self, "_jitted", jax.jit(self.fit))

    def call(self, state, data):
        return self._jitted(state, data)

    def compile(self, state, data) -> Compiled:
        return compile_one(self._jitted, self.label, WHOLE_PROGRAM + " (+ one final ELBO)", state, data)


def scanned(problem: Problem, n_iter: int, step, carry, data: Arrays, unroll: int = 1, final=lambda c: c) -> Output:
    """The fit of the ``scan`` strategies: ``n_iter`` steps ``step(carry, data) -> (carry, elbo)`` in one
    ``lax.scan`` from ``carry``; the Output of the state ``final(carry)`` makes of the last carry, the
    curve of the steps' ELBOs and the ELBO at that state."""

    def body(c, _):
        return step(c, data)

    carry, curve = jax.lax.scan(body, carry, None, length=n_iter, unroll=unroll)
    state = final(carry)
    return Output(state, curve, jnp.asarray(n_iter, jnp.int32), problem.elbo(state, data))
