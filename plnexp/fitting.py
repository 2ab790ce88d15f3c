"""``plnexp.fit``: a typed :class:`~plnexp.spec.FitSpec` -> run a strategy, check and package the result.

:func:`run` takes the spec (what the command line builds from its config); :func:`fit` is the thin
parser of strings for Python users.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import jax
import numpy as np

from . import reference, strategies, timing
from .data import Data
from .model import Model
from .optim import OptimizerSpec
from .precision import PRECISIONS, Precision
from .problem import GRADIENTS, Problem
from .spec import DEVICES, INITS, FitSpec, parse, resolve_device

__all__ = [
    "DEVICES",
    "INITS",
    "PRECISIONS",
    "FitResult",
    "NumericsError",
    "fit",
    "run",
    "run_all",
    "resolve_device",
    "make_problem",
    "check_against_host",
]


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
    replicate: int = 0  # its place in the program's batch (runs are identified by config hash and replicate)


@lru_cache(maxsize=32)
def make_problem(model: Model, optimizer: OptimizerSpec, gradient: str = "analytic") -> Problem:
    """Cached so that equal choices give the *same* Problem (and jit caches hit across fits)."""
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient={gradient!r}: allowed values are {', '.join(GRADIENTS)}")
    return Problem(model, optimizer.make(), GRADIENTS[gradient], optimizer)


def _host(tree):
    return jax.tree_util.tree_map(lambda a: np.asarray(a, dtype=np.float64), tree)


def fit(
    data: Data,
    model: str = "profiled",
    optimizer: str = "rprop",
    n_iter: int = 1000,
    precision: str = "float32",
    device: str = "cpu",
    strategy: str = "scan",
    *,
    lr: float | None = None,
    init: str = "seed",
    gradient: str = "analytic",
    repeats: int = 1,
    warmup: int = 0,
    first_call: bool = False,
    compile_cache: bool | None = None,
    compile_cache_dir=None,
    time_budget_s: float = 0.0,
    seed: int = 0,
    timed: bool = True,
    **options,
) -> FitResult:
    """Fit a PLN model by variational inference and time it.

    ``options``: the strategy's own options (``unroll`` for scan_unrolled, ``tol`` and ``patience``
    for while_loop, ``mode`` for torch_compile: ``plnexp.STRATEGIES[name].options``); those of other
    strategies are ignored. ``strategy="torch_eager"`` or ``"torch_compile"`` (needs the optional
    extra ``.[torch]``) runs the same fit in PyTorch from the same initial state.
    ``timed=True`` (see :mod:`plnexp.timing`) costs one cold AOT compile and one run by default;
    ``first_call=True`` adds a cold plain call, ``warmup``/``repeats`` add runs (median and spread of
    at least ``repeats``, more while they took less than ``time_budget_s`` seconds, after ``warmup``).
    ``timed=False`` makes one plain call. ``seed``: the noise of ``init="random"``.
    By default (``compile_cache=None``) the fit's compile goes through JAX's persistent compilation
    cache in ``compile_cache_dir`` (default ``<outputs>/jax_cache``, see
    :func:`plnexp.paths.outputs_dir`): the first process writes the program, a later one reads it
    back instead of compiling (``res.timing.compile_cache_hits`` >= 1). ``compile_cache=True`` also
    times a second compile served by it (``compile_warm_s``, the timing study's switch);
    ``compile_cache=False`` keeps the cache off (a cold compile). A cache folder that cannot be
    written is a one-line :class:`plnexp.timing.CacheWarning`, and the fit runs without it.
    Raises ``ValueError`` (one line, naming the argument and its allowed values) on a bad choice,
    and :class:`NumericsError` if the compiled ELBO disagrees with the float64 host reference.
    """
    spec = parse(
        model,
        optimizer,
        n_iter,
        precision,
        device,
        strategy,
        lr=lr,
        init=init,
        gradient=gradient,
        repeats=repeats,
        warmup=warmup,
        first_call=first_call,
        compile_cache=compile_cache,
        compile_cache_dir=compile_cache_dir,
        time_budget_s=time_budget_s,
        seed=seed,
        **options,
    )
    return run(data, spec, timed=timed)


def fit_replicates(
    data: Data | list[Data] | tuple[Data, ...], replicates: int, *, seed: int = 0, timed: bool = True, **kwargs
) -> list[FitResult]:
    """``replicates`` fits in one compiled program (``jax.vmap`` of the strategy's fit), one
    :class:`FitResult` each: of one data set from the initial seeds ``seed, seed+1, ...`` (use
    ``init="random"``, or they are all the same fit), or replicate k of ``data[k]`` (a list of
    ``replicates`` data sets of one shape). Every other argument is :func:`fit`'s; the strategy must
    be one whose fit is one function (``scan``, its carries, ``fori_loop``, ``while_loop``)."""
    spec = parse(seed=seed, replicates=replicates, **kwargs)
    return run_all(data, spec, timed=timed)


def run(data: Data, spec: FitSpec, *, timed: bool = True) -> FitResult:
    """The fit ``spec`` describes (one replicate; see :func:`run_all`)."""
    if spec.replicates != 1:
        raise ValueError(f"replicates={spec.replicates}: plnexp.fitting.run is one fit; use run_all")
    (result,) = run_all(data, spec, timed=timed)
    return result


def run_all(data: Data | list[Data] | tuple[Data, ...], spec: FitSpec, *, timed: bool = True) -> list[FitResult]:
    """The ``spec.replicates`` fits ``spec`` describes, in one program: on one data set ``data``
    (replicate k from initial seed ``spec.seed + k``), or replicate k on ``data[k]``. Placed as the
    strategy's program places them (on the spec's device, resolved here where it runs), timed together
    (``timed=False``: one plain call), each checked against the float64 host reference. Returns one
    :class:`FitResult` per replicate, with the batch's timing."""
    datas = list(data) if isinstance(data, (list, tuple)) else [data]
    if len(datas) not in (1, spec.replicates):
        raise ValueError(f"replicates={spec.replicates}: got {len(datas)} data sets (give 1 or {spec.replicates})")
    problem = make_problem(spec.model, spec.optimizer, spec.gradient)
    dtype = spec.precision.dtype
    dev = resolve_device(spec.device)
    # whether this strategy's compiles go through JAX's cache is decided once, by spec.cache_choice
    spec.strategy.check(spec.timing.compile_cache_dir is not None, dev.platform, spec.replicates)
    t = spec.timing
    # a folder that cannot be written: one warning, and the fit runs without the cache
    cache_dir = timing.usable_cache_dir(t.compile_cache_dir)
    seeds = [spec.seed + k for k in range(spec.replicates)]

    # the cache also serves the initial state's program (the timed compile sets its own, see timing)
    with jax.enable_x64(dtype == np.float64), timing.persistent_cache(cache_dir):
        program = strategies.build(problem, spec.n_iter, spec.strategy, spec.replicates)
        arrays = program.place(datas, dtype, dev)  # the program owns where its data goes
        state = program.initial(problem, arrays, spec.init, seeds)
        # the host reference converts to float64 a block of rows at a time: no n x p float64 copy
        starts = [s.pln for s in program.split(state, arrays)]
        if timed:
            out, times = timing.measure(
                program,
                state,
                arrays,
                repeats=t.repeats,
                warmup=t.warmup,
                budget_s=t.time_budget_s,
                first_call=t.first_call,
                compile_cache_dir=cache_dir,
                warm_compile=t.warm_compile,
            )
        else:
            out, times = timing.untimed(program, state, arrays, compile_cache_dir=cache_dir)
        del state
        results = []
        for replicate, (one, first) in enumerate(zip(program.unbatch(out, arrays), starts)):
            d = datas[replicate] if len(datas) > 1 else datas[0]
            log_fact = d.log_factorial
            start = reference.elbo(d.Y, d.O, d.X, first.B, problem.model.centred_m(first, d), first.S, first.Sigma)
            curve = np.asarray(one.elbo, dtype=np.float64)
            check_against_host(curve[0] - log_fact, start, spec.precision, "initial state", d.Y.size)
            pln = _host(one.state.pln)
            centred_m = np.asarray(problem.model.centred_m(pln, d), dtype=np.float64)
            params = {"B": pln.B, "M": centred_m, "S": pln.S, "Sigma": pln.Sigma}
            loglik = reference.elbo(d.Y, d.O, d.X, pln.B, centred_m, pln.S, pln.Sigma)
            final = float(one.final_elbo) - log_fact
            check_against_host(final, loglik, spec.precision, "final state", d.Y.size)
            results.append(
                FitResult(
                    curve - log_fact,
                    loglik,
                    params,
                    int(one.n_run),
                    times,
                    spec.model.name,
                    spec.strategy.name,
                    spec.optimizer.name,
                    spec.precision.name,
                    str(dev),
                    {"final_elbo_jit": final, "log_factorial": log_fact},
                    replicate,
                )
            )
    return results


def check_against_host(jitted: float, host: float, precision: Precision, where: str, size: int) -> None:
    """Refuse to report an ELBO that the compiled code got wrong (see plnexp.runtime), beyond
    :meth:`Precision.check_tolerance` for data of ``size`` = n*p entries."""
    if not np.isfinite(jitted) or not np.isfinite(host):
        return  # a diverged fit is reported as such by its caller, not as a compiler bug
    tol = precision.check_tolerance(host, size)
    if abs(jitted - host) > tol:
        raise NumericsError(
            f"compiled ELBO at the {where} is {jitted:.9g} but the float64 host reference gives {host:.9g} "
            f"(error {abs(jitted - host):.2e} > {tol:.2e} = {precision.check_rtol:g} relative + the absolute "
            f"floor of {size} entries); XLA_FLAGS={__import__('os').environ.get('XLA_FLAGS', '')!r}"
        )
