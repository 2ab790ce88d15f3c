"""The PyTorch baselines as Programs (:mod:`plnexp.strategies.base`): ``torch_eager`` runs the step op
by op, ``torch_compile`` runs ``torch.compile`` of the whole step; both loop in Python.

A Program takes and returns what the JAX strategies do: the JAX :class:`~plnexp.problem.FitState`
made by ``Problem.init`` (parameters, closed forms and optax's optimizer state) and the data's
:class:`~plnexp.model.Arrays`, and returns an :class:`~plnexp.problem.Output` of JAX arrays. The
conversions are DLPack views (no copy; the step never writes into its inputs), made once at the
start of a run and once at its end, never inside the loop. Device and dtype are the arrays': a
JAX array on a GPU becomes a CUDA tensor.

Timing (the conventions of :mod:`plnexp.timing`): ``torch_compile``'s ``compile`` resets
TorchDynamo's caches and compiles with Inductor's on-disk caches off (a cold compile, like JAX's
with its persistent cache off); ``torch.compile`` compiles on the first call, so ``compile_s`` is
that first call of the step minus a second, steady call on the same inputs, after a once-per-process
warm-up (:func:`warm_up`: Inductor's imports and workers, not the step's compile). ``torch_eager``
compiles nothing: ``compile_s`` = 0. A run ends with ``torch.cuda.synchronize()`` on CUDA, and a
recompile of the step during a run (a guard that failed) raises rather than being timed as a step.
The plain ``call`` of ``torch_compile`` is cold too (TorchDynamo reset, compiled at its first step):
what a naive timer sees, and why a second untimed fit compiles again (dynamo's per-function cache
would otherwise fill up with the closures of every fit and fall back to eager without a word).

Threads: torch's intra-op pool is set, for the length of a call, to the CPUs this process may use
(``os.sched_getaffinity``: the pool XLA:CPU uses), then restored; nothing is changed at import.
"""

from __future__ import annotations

import os
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import lru_cache

import jax
import jax.numpy as jnp
import torch

from ..model import Arrays
from ..problem import GRADIENTS as JAX_GRADIENTS
from ..problem import FitState, Output, Problem
from ..strategies.base import Compiled
from .model import GRADIENTS, MODELS
from .optim import OPTIMIZERS, apply_updates

CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that use CUDA graphs on CUDA


def make_step(problem: Problem):
    """``step(state, data) -> (state, elbo)`` in torch for the JAX ``problem``: its model, its
    optimizer (``problem.optimizer``, name and learning rate) and its gradient (analytic|autodiff)."""
    if problem.optimizer is None:
        raise ValueError("a torch strategy needs the optimizer's name: build the Problem with "
                         "plnexp.fitting.make_problem")
    model = MODELS[problem.model.name]
    gradient = GRADIENTS[next(k for k, v in JAX_GRADIENTS.items() if v is problem.gradient)]
    update = OPTIMIZERS[problem.optimizer.name](problem.optimizer.lr)

    def step(state: FitState, data):
        params = model.free(state.pln)
        loss, grads = gradient(model, params, state.pln, data)
        updates, opt_state = update(grads, state.opt_state, params)
        return FitState(model.complete(apply_updates(params, updates), data), opt_state), -loss

    def final_elbo(state: FitState, data):
        return model.state_elbo(state.pln, data)

    return step, final_elbo


def to_torch(tree):
    """JAX arrays -> tensors (DLPack views, same device), keeping the tree's structure."""
    return jax.tree.map(torch.from_dlpack, tree)


def to_jax(tree):
    """Tensors -> JAX arrays (DLPack views), keeping the tree's structure."""
    return jax.tree.map(lambda t: jnp.from_dlpack(t.contiguous()), tree)


def _torch_data(data: Arrays) -> Arrays:
    """Y, O, X as tensors (the log-factorial constant, only used by while_loop's rule, is left out)."""
    return Arrays(*to_torch(tuple(data[:3])))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def threads():
    """torch's intra-op threads = the CPUs this process may use, restored on exit."""
    previous = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
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
    with torch._inductor.config.patch(force_disable_caches=True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*force disabled by torch.compiler.config.force_disable_caches")
        warnings.filterwarnings("ignore", message=".*torch._prims_common.check. is deprecated")
        warnings.filterwarnings("ignore", message=".*torch.jit.script_method. is deprecated")
        yield


@lru_cache(maxsize=None)
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


def no_recompiles():
    """A recompile of the step inside a run raises instead of being timed as if it were a step."""
    return torch._dynamo.config.patch(error_on_recompile=True)


@dataclass(frozen=True)
class TorchProgram:
    """``torch_eager`` (``compiled=False``) or ``torch_compile`` (``compiled=True``, ``mode``)."""

    problem: Problem
    n_iter: int
    compiled: bool = False
    mode: str = "default"

    def __post_init__(self):
        step, final_elbo = make_step(self.problem)
        object.__setattr__(self, "_step", step)
        object.__setattr__(self, "_final_elbo", final_elbo)

    def _run(self, step, state, data) -> Output:
        """Converted in, ``n_iter`` steps, converted out: the whole of a run."""
        tstate, tdata = to_torch(state), _torch_data(data)
        device = tdata.Y.device
        cudagraphs = self.compiled and self.mode in CUDAGRAPH_MODES and device.type == "cuda"
        curve = []
        with threads(), no_recompiles():
            for _ in range(self.n_iter):
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
            for recompile in (nullcontext(), no_recompiles()):  # the first call compiles and runs a step
                t0 = time.perf_counter()
                with recompile:
                    step(tstate, tdata)
                _synchronize(device)
                seconds.append(time.perf_counter() - t0)
        return Compiled(lambda s, d: self._run(step, s, d), seconds[0] - seconds[1])
