"""``plnexp.fit``: resolve names once into objects, run a strategy, check and package the result."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import jax
import numpy as np

from . import reference, strategies, timing
from .data import Data
from .model import MODELS, Model, init_state
from .optim import OptimizerSpec
from .problem import GRADIENTS, Problem
from .strategies import StrategySpec

PRECISIONS = {"float32": np.float32, "float64": np.float64}
DEVICES = ("cpu", "gpu", "auto")
INITS = ("seed", "data")
# |jitted ELBO - float64 host ELBO| / |host ELBO| allowed. float32: a sum of n*p terms of size up
# to ~1e4 carries relative rounding ~1e-6 (measured <= 3e-6 on oaks x100); 1e-4 leaves margin and
# still catches a miscompiled reduction (the jaxlib 0.10.2 one is off by 13%).
CHECK_RTOL = {np.float32: 1e-4, np.float64: 1e-9}


def check_tolerance(host: float, dtype, size: int) -> float:
    """How far a compiled ELBO may be from the float64 host reference: ``CHECK_RTOL * |host|`` plus an
    absolute floor ``size * eps * |log eps|`` (``size`` = n*p entries). The ELBO sums n*p entries
    whose terms (log S^2 against log det Sigma, Y*Z against exp(Z + S^2/2)) can each be as large as
    |log eps| and cancel, so where the ELBO tends to 0 (all-zero counts) a purely relative test fails
    on rounding alone: 20x4 zeros, float64, measured 1.4e-13 absolute (floor 6.4e-13); float32
    3.8e-5 (floor 1.5e-4). On oaks x100 (float32) the floor is 2.5 nats, far below the 1.7e5 of the
    jaxlib 0.10.2 miscompile."""
    eps = float(np.finfo(dtype).eps)
    return CHECK_RTOL[dtype] * abs(host) + size * eps * abs(np.log(eps))


class NumericsError(RuntimeError):
    """The compiled ELBO disagrees with the float64 host reference: a compiler or numerics bug."""


@dataclass(frozen=True)
class FitResult:
    """A finished fit. ``elbo[i]``: ELBO (with the exact log y!) before update i; NaN past
    ``n_iter``. ``params``: B (d, p), M (n, p, centred residual), S (n, p), Sigma (p, p)."""

    elbo: np.ndarray
    loglik: float
    params: dict
    n_iter: int
    timing: timing.Timing
    model: str
    strategy: str
    optimizer: str
    precision: str
    device: str
    extra: dict = field(default_factory=dict)


def resolve_device(name: str) -> jax.Device:
    """'cpu', 'gpu' or 'auto' (JAX's default backend) -> a jax.Device, with a one-line error."""
    if name not in DEVICES:
        raise ValueError(f"device={name!r}: allowed values are {', '.join(DEVICES)}")
    if name == "auto":
        return jax.devices()[0]
    try:
        return jax.devices(name)[0]
    except RuntimeError:
        found = sorted({d.platform for d in jax.devices()})
        raise ValueError(f"device={name!r}: no {name.upper()} visible to JAX on this machine "
                         f"(found: {', '.join(found)}); use device=cpu or device=auto") from None


@lru_cache(maxsize=32)
def make_problem(model: Model, optimizer: OptimizerSpec, gradient: str = "analytic") -> Problem:
    """Cached so that equal choices give the *same* Problem (and jit caches hit across fits)."""
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient={gradient!r}: allowed values are {', '.join(GRADIENTS)}")
    return Problem(model, optimizer.make(), GRADIENTS[gradient], optimizer)


def _host(tree):
    return jax.tree_util.tree_map(lambda a: np.asarray(a, dtype=np.float64), tree)


def fit(data: Data, model: str = "profiled", optimizer: str = "rprop", n_iter: int = 1000,
        precision: str = "float32", device: str = "cpu", strategy: str = "scan", *, lr: float | None = None,
        init: str = "seed", gradient: str = "analytic", unroll: int = 8, tol: float = 1e-6, patience: int = 10,
        mode: str = "default",
        repeats: int = 1, warmup: int = 0, first_call: bool = False, compile_cache: bool = False,
        compile_cache_dir: str | Path | None = None, timed: bool = True) -> FitResult:
    """Fit a PLN model by variational inference and time it.

    ``strategy="torch_eager"`` or ``"torch_compile"`` (``mode``: torch.compile's; needs the optional
    extra ``.[torch]``) runs the same fit in PyTorch from the same initial state.
    ``timed=True`` (see :mod:`plnexp.timing`) costs one cold AOT compile and one run by default;
    ``first_call=True`` adds a cold plain call, ``warmup``/``repeats`` add runs (median of
    ``repeats`` after ``warmup``). ``timed=False`` makes one plain call.
    ``compile_cache=True`` uses JAX's persistent compilation cache in ``compile_cache_dir``
    (default ``<outputs>/jax_cache``, see :func:`plnexp.config.outputs_dir`) and also times a
    second compile served by it; otherwise the persistent cache is off during the fit.
    Raises ``ValueError`` (one line, naming the argument and its allowed values) on a bad choice,
    and :class:`NumericsError` if the compiled ELBO disagrees with the float64 host reference.
    """
    if model not in MODELS:
        raise ValueError(f"model={model!r}: allowed values are {', '.join(MODELS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: allowed values are {', '.join(PRECISIONS)}")
    if init not in INITS:
        raise ValueError(f"init={init!r}: allowed values are {', '.join(INITS)}")
    if not (isinstance(n_iter, int) and n_iter >= 1):
        raise ValueError(f"n_iter={n_iter!r}: must be an integer >= 1")
    for key, value in (("first_call", first_call), ("compile_cache", compile_cache)):
        if not isinstance(value, bool):
            raise ValueError(f"{key}={value!r}: allowed values are True, False")
    cache_dir = None
    if compile_cache:
        from .config import outputs_dir  # the API's default; the command line passes its own

        cache_dir = Path(compile_cache_dir) if compile_cache_dir is not None else outputs_dir() / "jax_cache"
    problem = make_problem(MODELS[model], OptimizerSpec(optimizer, lr), gradient)
    spec = StrategySpec(strategy, unroll, tol, patience, mode)
    if strategy in strategies.TORCH_STRATEGIES:
        strategies.check_torch(strategy, compile_cache)
    dtype = PRECISIONS[precision]
    dev = resolve_device(device)
    if strategy in strategies.TORCH_STRATEGIES:
        strategies.check_torch_device(strategy, dev.platform)
    log_fact = reference.log_factorial_sum(data.Y)

    with jax.enable_x64(dtype == np.float64):
        arrays = data.to_device(dtype, dev)._replace(log_factorial=jax.device_put(dtype(log_fact), dev))
        state = problem.init(init_state(problem.model, arrays, init))
        program = strategies.build(problem, n_iter, spec)
        if timed:
            out, times = timing.measure(program, state, arrays, repeats=repeats, warmup=warmup,
                                        first_call=first_call, compile_cache_dir=cache_dir)
        else:
            out, times = timing.untimed(program, state, arrays, compile_cache_dir=cache_dir)
        curve = np.asarray(out.elbo, dtype=np.float64)
        n_run = int(out.n_run)
        # the host reference converts to float64 a block of rows at a time: no n x p float64 copy
        first = state.pln
        start = reference.elbo(data.Y, data.O, data.X, first.B, problem.model.centred_m(first, arrays),
                               first.S, first.Sigma)
        del first, state
        check_against_host(curve[0] - log_fact, start, dtype, "initial state", data.Y.size)
        pln = _host(out.state.pln)
        centred_m = np.asarray(problem.model.centred_m(out.state.pln, arrays), dtype=np.float64)

    params = {"B": pln.B, "M": centred_m, "S": pln.S, "Sigma": pln.Sigma}
    loglik = reference.elbo(data.Y, data.O, data.X, pln.B, centred_m, pln.S, pln.Sigma)
    check_against_host(float(out.final_elbo) - log_fact, loglik, dtype, "final state", data.Y.size)
    return FitResult(curve - log_fact, loglik, params, n_run, times, model, strategy, optimizer, precision,
                     str(dev), {"final_elbo_jit": float(out.final_elbo) - log_fact, "log_factorial": log_fact})


def check_against_host(jitted: float, host: float, dtype, where: str, size: int) -> None:
    """Refuse to report an ELBO that the compiled code got wrong (see plnexp.runtime), beyond
    :func:`check_tolerance` for data of ``size`` = n*p entries."""
    if not np.isfinite(jitted) or not np.isfinite(host):
        return  # a diverged fit is reported as such by its caller, not as a compiler bug
    tol = check_tolerance(host, dtype, size)
    if abs(jitted - host) > tol:
        raise NumericsError(
            f"compiled ELBO at the {where} is {jitted:.9g} but the float64 host reference gives {host:.9g} "
            f"(error {abs(jitted - host):.2e} > {tol:.2e} = {CHECK_RTOL[dtype]:g} relative + the absolute "
            f"floor of {size} entries); XLA_FLAGS={__import__('os').environ.get('XLA_FLAGS', '')!r}")
