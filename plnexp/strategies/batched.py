"""``replicates=K``: K independent fits in one compiled program, ``jax.vmap`` of a strategy's fit.

The fit is written for one data set and one initial state (any strategy whose whole fit is one
function: :class:`~plnexp.strategies.base.SingleProgram`); ``vmap`` turns it into a program over a
leading axis of K. The K fits share the data (K random initialisations: ``init="random"`` with
seeds ``seed, seed+1, ...``) or each has its own (K data sets of the same shape, stacked). Nothing
mixes replicates, so each one's curve is that of the single fit with its seed and data; a replicate
that diverges does not change the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..core.data import device_offsets
from ..core.arrays import Arrays
from ..core.initial_state import init_state
from ..core.problem import FitState, Output, Problem
from .base import WHOLE_PROGRAM, Compiled, SingleProgram, compile_one


def _take(tree, k: int):
    return jax.tree.map(lambda a: a[k], tree)


def shares_data(data: Arrays) -> bool:
    """Whether the replicates share one data set (Y is (n, p)) or each has its own (Y is (K, n, p))."""
    return data.Y.ndim == 2


@dataclass(frozen=True, eq=False)
class Batched:
    """The Program of ``replicates`` fits of ``inner`` (see the module's doc)."""

    inner: SingleProgram
    replicates: int
    _jitted: dict[bool, jax.stages.Wrapped] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_jitted", {})  # per "shares the data"

    def place(self, data: Sequence, dtype, device) -> Arrays:
        """One data set for every replicate (placed once), or one per replicate stacked on axis 0.
        Offsets one per row in every data set stack as their (n, 1) columns
        (:func:`~plnexp.core.data.device_offsets`); otherwise each data set's as (n, p)."""
        data = list(data)
        if len(data) == 1:
            return self.inner.place(data, dtype, device)
        if len(data) != self.replicates:
            raise ValueError(f"replicates={self.replicates}: got {len(data)} data sets")
        stack = lambda arrays: jax.device_put(np.stack([np.asarray(a, dtype) for a in arrays]), device)
        offsets = [device_offsets(d.O) for d in data]
        if len({o.shape for o in offsets}) > 1:  # some (n, 1), some (n, p): np.stack needs one shape
            offsets = [np.broadcast_to(o, d.Y.shape) for o, d in zip(offsets, data)]
        return Arrays(
            stack([d.Y for d in data]),
            stack(offsets),
            stack([d.X for d in data]),
            jax.device_put(np.array([d.log_factorial for d in data], dtype), device),
        )

    def _one(self, data: Arrays, k: int) -> Arrays:
        return data if shares_data(data) else _take(data, k)

    def initial(self, problem: Problem, data: Arrays, init: str, seeds: Sequence[int]) -> FitState:
        """Each replicate's initial state as its single fit makes it, stacked."""
        if len(seeds) != self.replicates:
            raise ValueError(f"replicates={self.replicates}: got {len(seeds)} seeds")
        states = [
            problem.init(init_state(problem.model, self._one(data, k), init, seed)) for k, seed in enumerate(seeds)
        ]
        return jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)

    def split(self, state: FitState, data: Arrays) -> list[FitState]:
        return [_take(state, k) for k in range(self.replicates)]

    def unbatch(self, out: Output, data: Arrays) -> list[Output]:
        return [_take(out, k) for k in range(self.replicates)]

    def _program(self, data: Arrays):
        shared = shares_data(data)
        if shared not in self._jitted:
            axes = jax.tree.map(lambda _: None if shared else 0, data)
            self._jitted[shared] = jax.jit(jax.vmap(self.inner.fit, in_axes=(0, axes)))
        return self._jitted[shared]

    def call(self, state, data):
        return self._program(data)(state, data)

    def compile(self, state, data) -> Compiled:
        label, counted = f"{self.inner.label}_x{self.replicates}", f"{WHOLE_PROGRAM}, all {self.replicates} replicates"
        return compile_one(self._program(data), label, counted, state, data)
