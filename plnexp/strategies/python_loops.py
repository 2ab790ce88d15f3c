"""Strategies with a Python ``for`` loop: ``eager`` (no jit, level 0) and ``jit_per_function`` (level 1).

``jit_per_function`` jits the three pieces of a step separately (loss-and-gradient, optimizer
update, closed forms) and dispatches them from Python. The update donates its optimizer
state and parameter buffers (the loop never reads them again), after one defensive copy of the
caller's initial state so that the caller's arrays stay valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp

from ..core.problem import FitState, Output, Problem
from .base import Compiled, OneDevice, aot_compile, compiled_program


def _python_loop(loss_and_grad, update, complete, model, state: FitState, data, n_iter: int) -> Output:
    pln, opt_state = state
    curve = []
    for _ in range(n_iter):
        params = model.free(pln)
        loss, grads = loss_and_grad(params, pln, data)
        params, opt_state = update(grads, opt_state, params)
        pln = complete(params, data)
        curve.append(loss)
    final_loss, _ = loss_and_grad(model.free(pln), pln, data)
    return Output(FitState(pln, opt_state), -jnp.stack(curve), jnp.asarray(n_iter, jnp.int32), -final_loss)


@dataclass(frozen=True)
class EagerProgram(OneDevice):
    """Op-by-op dispatch: nothing is compiled as a whole (compile_s = 0)."""

    problem: Problem
    n_iter: int

    def call(self, state, data):
        p = self.problem
        return _python_loop(p.loss_and_grad, p.update, p.complete, p.model, state, data, self.n_iter)

    def compile(self, state, data) -> Compiled:
        return Compiled(self.call, 0.0)


@dataclass(frozen=True)
class JitPerFunctionProgram(OneDevice):
    problem: Problem
    n_iter: int
    _fns: dict[str, jax.stages.Wrapped] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        p = self.problem
        object.__setattr__(
            self,
            "_fns",
            {
                "loss_and_grad": jax.jit(p.loss_and_grad),
                "update": jax.jit(p.update, donate_argnums=(1, 2)),
                "complete": jax.jit(p.complete),
            },
        )

    def _run(self, fns, state, data):
        state = jax.tree_util.tree_map(jnp.copy, state)  # donation must not consume the caller's arrays
        return _python_loop(
            fns["loss_and_grad"], fns["update"], fns["complete"], self.problem.model, state, data, self.n_iter
        )

    def call(self, state, data):
        return self._run(self._fns, state, data)

    def compile(self, state, data) -> Compiled:
        model = self.problem.model
        params = model.free(state.pln)
        loss_and_grad = self._fns["loss_and_grad"]
        grads = jax.eval_shape(loss_and_grad, params, state.pln, data)[1]
        example = {
            "loss_and_grad": (params, state.pln, data),
            "update": (grads, state.opt_state, params),
            "complete": (params, data),
        }
        aot = {name: aot_compile(self._fns[name], *args) for name, args in example.items()}
        for a in aot.values():
            if a.cost:
                a.cost["counted"] = "per call: one call per iteration"
        compiled = {name: a.compiled for name, a in aot.items()}
        # compile times and XLA's counts summed over the 3 functions, peak_bytes the largest
        return compiled_program(lambda s, d: self._run(compiled, s, d), aot)
