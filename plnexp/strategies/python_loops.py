"""Strategies with a Python ``for`` loop: ``eager`` (no jit, level 0) and ``jit_per_function`` (level 1).

``jit_per_function`` jits the three pieces of a step separately (loss-and-gradient, optimizer
update, closed forms) and dispatches them from Python. The update donates its optimizer
state and parameter buffers (the loop never reads them again), after one defensive copy of the
caller's initial state so that the caller's arrays stay valid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp

from ..core.problem import FitState, Output, Problem
from .base import Compiled, OneDevice, aot_compile, compiled_program


@dataclass(frozen=True)
class PythonLoop(OneDevice):
    """``eager`` (``jit=False``: op-by-op dispatch, nothing compiled as a whole, compile_s = 0) or
    ``jit_per_function`` (``jit=True``: the step's three functions jitted, the update donating)."""

    problem: Problem
    n_iter: int
    jit: bool = False
    _fns: dict[str, Callable] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        p = self.problem
        fns = {"loss_and_grad": p.loss_and_grad, "update": p.update, "complete": p.complete}
        if self.jit:
            fns = {name: jax.jit(f, donate_argnums=(1, 2) if name == "update" else ()) for name, f in fns.items()}
        object.__setattr__(self, "_fns", fns)

    def _run(self, fns, state: FitState, data) -> Output:
        if self.jit:
            state = jax.tree_util.tree_map(jnp.copy, state)  # donation must not consume the caller's arrays
        pln, opt_state = state
        free = self.problem.model.free
        curve = []
        for _ in range(self.n_iter):
            params = free(pln)
            loss, grads = fns["loss_and_grad"](params, pln, data)
            params, opt_state = fns["update"](grads, opt_state, params)
            pln = fns["complete"](params, data)
            curve.append(loss)
        final_loss, _ = fns["loss_and_grad"](free(pln), pln, data)
        return Output(FitState(pln, opt_state), -jnp.stack(curve), jnp.asarray(self.n_iter, jnp.int32), -final_loss)

    def call(self, state, data):
        return self._run(self._fns, state, data)

    def compile(self, state, data) -> Compiled:
        if not self.jit:
            return Compiled(self.call, 0.0)
        model = self.problem.model
        params = model.free(state.pln)
        loss_and_grad = self._fns["loss_and_grad"]
        grads = jax.eval_shape(loss_and_grad, params, state.pln, data)[1]
        example = {
            "loss_and_grad": (params, state.pln, data),
            "update": (grads, state.opt_state, params),
            "complete": (params, data),
        }
        counted = "per call: one call per iteration"
        aot = {name: aot_compile(self._fns[name], *args, counted=counted) for name, args in example.items()}
        compiled = {name: a.compiled for name, a in aot.items()}
        # compile times and XLA's counts summed over the 3 functions, peak_bytes the largest
        return compiled_program(lambda s, d: self._run(compiled, s, d), aot)
