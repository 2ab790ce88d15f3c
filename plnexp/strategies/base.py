"""What a JIT strategy is: something that turns a :class:`~plnexp.problem.Problem` into a Program.

A Program offers two ways to run the same fit:

- ``call(state, data)``: the plain path a user would write (jit on first call, or no jit at all);
- ``compile(state, data)``: ahead-of-time compilation, returning a :class:`Compiled` whose ``run``
  executes without any further tracing or compiling, with the compile time measured apart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol
from collections.abc import Callable, Sequence

import jax

from ..model import Arrays, init_state
from ..problem import FitState, Output, Problem


@dataclass(frozen=True)
class Compiled:
    run: Callable[[FitState, Arrays], Output]
    compile_s: float
    # XLA's estimates, per compiled function name; for scans they count the loop body once
    cost_analysis: dict[str, Any] = field(default_factory=dict)
    memory_analysis: dict[str, Any] = field(default_factory=dict)
    # what profiling and fingerprinting read, per compiled function name: jax.stages.Lowered and
    # jax.stages.Compiled (optimized HLO: ``executables[name].as_text()``); empty for eager and torch
    lowered: dict[str, Any] = field(default_factory=dict)
    executables: dict[str, Any] = field(default_factory=dict)


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


@dataclass(frozen=True)
class AotResult:
    lowered: jax.stages.Lowered
    compiled: jax.stages.Compiled
    seconds: float
    cost: dict
    memory: dict


def aot_compile(jitted, *args) -> AotResult:
    """``jitted.lower(*args).compile()``, timed (tracing + lowering + XLA compilation); the lowered
    and compiled stages are kept (profiling reads them without compiling again)."""
    t0 = time.perf_counter()
    lowered = jitted.lower(*args)
    compiled = lowered.compile()
    return AotResult(lowered, compiled, time.perf_counter() - t0, _cost(compiled), _memory(compiled))


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
        aot = aot_compile(self._jitted, state, data)
        cost = aot.cost
        if cost:  # XLA costs a while/scan body once, whatever the trip count
            cost["counted"] = "per iteration: the loop body once (+ one final ELBO)"
        return Compiled(
            aot.compiled,
            aot.seconds,
            {self.label: cost},
            {self.label: aot.memory},
            {self.label: aot.lowered},
            {self.label: aot.compiled},
        )
