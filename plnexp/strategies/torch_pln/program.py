"""The PyTorch baselines as Programs (:mod:`plnexp.strategies.base`): ``torch_eager`` runs the step op
by op, ``torch_compile`` runs ``torch.compile`` of the whole step; both loop in Python.

A Program takes and returns what the JAX strategies do: the JAX :class:`~plnexp.core.problem.FitState`
made by ``Problem.init`` (parameters, closed forms and optax's optimizer state) and the data's
:class:`~plnexp.core.arrays.Arrays`, and returns an :class:`~plnexp.core.problem.Output` of JAX arrays. The
conversions are DLPack views (no copy; the step never writes into its inputs), made once at the
start of a run and once at its end, never inside the loop. Device and dtype are the arrays': a
JAX array on a GPU becomes a CUDA tensor.

Timing (the conventions of :mod:`plnexp.measure.timing`): ``torch_compile``'s ``compile`` resets
TorchDynamo's caches and compiles with Inductor's on-disk caches off (a cold compile, like JAX's
with its persistent cache off); ``torch.compile`` compiles on the first call, so ``compile_s`` is
that first call of the step minus a second, steady call on the same inputs, after a once-per-process
warm-up (:func:`warm_up`: Inductor's imports and workers, not the step's compile). ``torch_eager``
compiles nothing: ``compile_s`` = 0. A run ends with ``torch.cuda.synchronize()`` on CUDA, and a
recompile of the step during a run (a guard that failed) raises :class:`StepRecompiledError`, one
line naming the guard, rather than being timed as a step.
The plain ``call`` of ``torch_compile`` is cold too (TorchDynamo reset, compiled at its first step):
what a naive timer sees, and why a second untimed fit compiles again (dynamo's per-function cache
would otherwise fill up with the closures of every fit and fall back to eager without a word).

Layout: every tensor of the state is row-major (:func:`row_major`) when a run starts and after every
step, so that the state a step returns passes the guards ``torch.compile`` put on the one it was
first called with, strides included: ``Tensor.contiguous()`` does not ensure this (a LAPACK solve's
column-major ``1 x p`` B, strides ``(1, 1)``, is already "contiguous" to it), and a guard on
``(p, 1)`` fails on it at the second step (seen on oaks, whose d = 1).

Threads: torch's intra-op pool is set, for the length of a call, to the CPUs this process may use
(``os.sched_getaffinity``: the pool XLA:CPU uses), then restored; nothing is changed at import.
"""

from __future__ import annotations

import re
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, NamedTuple
from collections.abc import Callable

import jax
import jax.numpy as jnp
import torch

from ...core.arrays import Arrays
from ...core.problem import GRADIENTS as JAX_GRADIENTS
from ...core.problem import FitState, Output, Problem
from ...system.machine import usable_cores
from ..base import Compiled, OneDevice
from ..torch_compat import error_on_recompile
from .model import GRADIENTS, MODELS, Arrays as TensorArrays, PLNState as TensorState
from .optim import OPTIMIZERS, apply_updates

if TYPE_CHECKING:

    class TensorFitState(NamedTuple):
        """:class:`~plnexp.core.problem.FitState` holding tensors (:func:`to_torch`): the same class at run time."""

        pln: TensorState
        opt_state: Any

else:
    TensorFitState = FitState

CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that use CUDA graphs on CUDA


def make_step(problem: Problem):
    """``step(state, data) -> (state, elbo)`` in torch for the JAX ``problem``: its model, its
    optimizer (``problem.optimizer``, name and learning rate) and its gradient (analytic|autodiff)."""
    if problem.optimizer is None:
        raise ValueError(
            "a torch strategy needs the optimizer's name: build the Problem with plnexp.fitting.engine.make_problem"
        )
    model = MODELS[problem.model.name]
    gradient = GRADIENTS[next(k for k, v in JAX_GRADIENTS.items() if v is problem.gradient)]
    update = OPTIMIZERS[problem.optimizer.name](problem.optimizer.lr)

    def step(state: TensorFitState, data: TensorArrays):
        params = model.free(state.pln)
        loss, grads = gradient(model, params, state.pln, data)
        updates, opt_state = update(grads, state.opt_state, params)
        new = TensorFitState(model.complete(apply_updates(params, updates), data), opt_state)
        return row_major_tree(new), -loss  # the layout of the state it was given: no recompile

    def final_elbo(state: TensorFitState, data: TensorArrays):
        return model.state_elbo(state.pln, data)

    return step, final_elbo


class StepRecompiledError(RuntimeError):
    """``torch.compile`` recompiled the step inside a run: a guard on the state the previous step
    returned failed (its layout, dtype or shape is not the one the step was compiled for). The
    step returns the state in the layout, dtype and shape it takes: this is a plnexp bug."""


def row_major_strides(shape) -> tuple[int, ...]:
    """The strides of a dense row-major tensor of ``shape``, size-1 dimensions included (what
    ``torch.empty(shape)`` has)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def row_major(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself if its strides are :func:`row_major_strides` of its shape, else a row-major copy.

    ``t.contiguous()`` is not enough: a tensor whose only other strides are those of size-1
    dimensions counts as contiguous and is returned as it is, e.g. ``cholesky_solve``'s column-major
    ``1 x p`` result with strides ``(1, 1)``; TorchDynamo's guards compare every stride. The check
    reads static strides, so inside ``torch.compile`` it costs nothing at run time (a copy is traced
    only where the layout differs)."""
    if t.stride() == row_major_strides(t.shape):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def row_major_tree(tree):
    """:func:`row_major` on every tensor of a state: NamedTuples (FitState, PLNState, optax's
    states), tuples and dicts, rebuilt with the same types. Plain Python, which TorchDynamo traces
    (``jax.tree.map`` it cannot); a small cost a step in ``torch_eager`` (docs/results.md, "PyTorch
    baselines")."""
    if isinstance(tree, torch.Tensor):
        return row_major(tree)
    if isinstance(tree, dict):
        return {k: row_major_tree(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        items = [row_major_tree(v) for v in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else tuple(items)
    return tree


def to_torch(tree):
    """JAX arrays -> row-major tensors (DLPack views, same device; a copy only for an array JAX
    exports with other strides), keeping the tree's structure."""
    return jax.tree.map(lambda a: row_major(torch.from_dlpack(a)), tree)


def to_jax(tree):
    """Tensors -> JAX arrays (DLPack views), keeping the tree's structure."""
    return jax.tree.map(lambda t: jnp.from_dlpack(t.contiguous()), tree)


def _torch_data(data: Arrays) -> TensorArrays:
    """Y, O, X as tensors (the log-factorial constant, only used by while_loop's rule, is left out)."""
    return TensorArrays(*to_torch(tuple(data[:3])))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def threads():
    """torch's intra-op threads = the CPUs this process may use, restored on exit."""
    previous = torch.get_num_threads()
    torch.set_num_threads(usable_cores())
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextmanager
def cold_compile():
    """TorchDynamo's caches cleared, Inductor's on-disk caches (FX graphs, AOTAutograd, autotuning)
    off while inside: every compile in the block is a cold one. Two warnings torch 2.13 prints on
    every such compile, and one at the import of a module it loads, all about its own internals, are
    silenced."""
    torch.compiler.reset()
    with torch.compiler.config.patch(force_disable_caches=True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*force disabled by torch.compiler.config.force_disable_caches")
        warnings.filterwarnings("ignore", message=".*torch._prims_common.check. is deprecated")
        warnings.filterwarnings("ignore", message=".*torch.jit.script_method. is deprecated")
        yield


@cache
def warm_up(device_type: str) -> float:
    """Once per process and device type: a trivial ``torch.compile`` (seconds of imports, Inductor's
    compile workers and a first C++ or Triton build), so that ``compile_s`` is the step's own compile,
    as JAX's excludes starting its backend. Returns the seconds it took."""
    t0 = time.perf_counter()
    with cold_compile():
        x = torch.zeros(8, device=device_type)
        torch.compile(lambda a: torch.exp(a).sum(), fullgraph=True)(x)
        _synchronize(x.device)
    torch.compiler.reset()
    return time.perf_counter() - t0


@contextmanager
def no_recompiles(where: Callable[[], str]):
    """A recompile of the step inside the block raises :class:`StepRecompiledError` (one line:
    ``where()`` it happened, the guard that failed, a plnexp bug) instead of being timed as a step.
    Entered once per run, not per step (``where`` is called only on a recompile)."""
    with error_on_recompile() as RecompileError:
        try:
            yield
        except RecompileError as e:
            raise StepRecompiledError(
                f"torch_compile recompiled the step {where()} ({guard_failures(str(e))}): "
                "a plnexp bug, please report it"
            ) from None


def guard_failures(message: str) -> str:
    """The guard(s) that failed, in one line, from the text of TorchDynamo's ``RecompileError``
    (torch 2.13: "Recompiling function step in FILE:LINE", "triggered by the following guard
    failure(s):", then one "- COMPILE_ID: REASON" line per failure, maybe with a user stack after)."""
    reasons = []
    for line in message.splitlines():
        line = line.strip()
        if not line.startswith("- "):
            continue
        line = line[2:].strip()
        if line.startswith("User stack trace:"):
            break
        reasons.append(re.sub(r"^[!\[\]\d/]+:\s*", "", line))  # "0/0: " compile id
    reasons = [r for r in reasons if r]
    return f"guard failed: {'; '.join(reasons)}" if reasons else "torch reported no failed guard"


@dataclass(frozen=True)
class TorchProgram(OneDevice):
    """``torch_eager`` (``compiled=False``) or ``torch_compile`` (``compiled=True``, ``mode``)."""

    problem: Problem
    n_iter: int
    compiled: bool = False
    mode: str = "default"
    _step: Callable[[TensorFitState, TensorArrays], Any] = field(init=False, repr=False, compare=False)
    _final_elbo: Callable[[TensorFitState, TensorArrays], torch.Tensor] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        step, final_elbo = make_step(self.problem)
        object.__setattr__(self, "_step", step)
        object.__setattr__(self, "_final_elbo", final_elbo)

    def _run(self, step, state, data) -> Output:
        """Converted in, ``n_iter`` steps, converted out: the whole of a run."""
        tstate, tdata = to_torch(state), _torch_data(data)
        device = tdata.Y.device
        cudagraphs = self.compiled and self.mode in CUDAGRAPH_MODES and device.type == "cuda"
        curve, i = [], 0
        with threads(), no_recompiles(lambda: f"at iteration {i + 1} of {self.n_iter}"):  # entered once
            for i in range(self.n_iter):  # noqa: B007 - i is read by no_recompiles' message above
                if cudagraphs:  # the previous step's outputs are this step's inputs
                    torch.compiler.cudagraph_mark_step_begin()
                tstate, elbo = step(tstate, tdata)
                curve.append(elbo.clone() if cudagraphs else elbo)
            if cudagraphs:
                tstate = jax.tree.map(torch.clone, tstate)
            final = self._final_elbo(tstate, tdata)
            elbos = torch.stack(curve)
            _synchronize(device)
        return Output(to_jax(tstate), to_jax(elbos), jnp.asarray(self.n_iter, jnp.int32), to_jax(final))

    def _compiled_step(self):
        return torch.compile(self._step, mode=self.mode, fullgraph=True)

    def call(self, state, data) -> Output:
        """The plain path: op by op, or ``torch.compile`` (cold: compiles on the first step) and run."""
        if not self.compiled:
            return self._run(self._step, state, data)
        with cold_compile():
            return self._run(self._compiled_step(), state, data)

    def compile(self, state, data) -> Compiled:
        if not self.compiled:
            return Compiled(lambda s, d: self._run(self._step, s, d), 0.0)
        tstate, tdata = to_torch(state), _torch_data(data)
        device = tdata.Y.device
        warm_up(device.type)
        step = self._compiled_step()
        seconds = []
        with cold_compile(), threads():
            # the first call compiles and runs a step
            for recompile in (nullcontext(), no_recompiles(lambda: "at its second call on the same inputs")):
                t0 = time.perf_counter()
                with recompile:
                    step(tstate, tdata)
                _synchronize(device)
                seconds.append(time.perf_counter() - t0)
        return Compiled(lambda s, d: self._run(step, s, d), seconds[0] - seconds[1])
