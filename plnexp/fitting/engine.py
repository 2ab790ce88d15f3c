"""``plnexp.fit``: a typed :class:`~plnexp.fitting.spec.FitSpec` -> run a strategy, check and package the result.

:func:`run` takes the spec (what the command line builds from its config); :func:`fit` is the thin
parser of strings (and of counts in memory: :func:`plnexp.core.inputs.as_data`) for Python users.

A fit is a good citizen of the caller's process: it applies plnexp's process settings only while
JAX has not started (:func:`plnexp.system.runtime.configure_or_warn`), never clears JAX's caches (a cold
compile is one of functions built for it: :mod:`plnexp.measure.timing`), and leaves JAX's configuration
(x64, the persistent compilation cache) as it found it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from dataclasses import replace
from functools import lru_cache

import jax
import numpy as np

from ..system import runtime
from .. import strategies
from ..measure import convergence, timing
from ..core.data import Data
from ..core.inputs import to_data
from ..core import reference
from ..core.model import PCA_NAME, Model
from ..core.optim import OptimizerSpec
from ..core.precision import TERMS_ULPS, Precision
from ..core.problem import GRADIENTS, Problem
from ..core.device import resolve_device
from .prepared import Prepared
from . import progress as progress_bar, saved
from .result import DataNames, FitResult
from ..strategies.sharded import across_processes_sum
from .spec import FitSpec, check_rank, parse


class NumericsError(RuntimeError):
    """The compiled ELBO disagrees with the float64 host reference: a compiler or numerics bug."""


@lru_cache(maxsize=32)
def make_problem(model: Model, optimizer: OptimizerSpec, gradient: str = "analytic") -> Problem:
    """Cached so that equal choices give the *same* Problem (and jit caches hit across fits)."""
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient={gradient!r}: allowed values are {', '.join(GRADIENTS)}")
    return Problem(model, optimizer.make(), GRADIENTS[gradient], optimizer)


def _host(tree):
    return jax.tree_util.tree_map(lambda a: np.asarray(a, dtype=np.float64), tree)


def _readable(tree):
    """The tree with its arrays spread over other JAX processes' devices (a fit across processes: M
    and S, split by rows) gathered whole into this one (``process_allgather``, which every process
    calls at the same point); the rest as it is (in one process: the tree itself)."""
    from jax.experimental import multihost_utils

    def one(a):
        if isinstance(a, jax.Array) and not a.is_fully_addressable and not a.is_fully_replicated:
            return multihost_utils.process_allgather(a, tiled=True)
        return a

    return jax.tree_util.tree_map(one, tree)


def _local_rows(state, data: Data):
    """The PLN state with its M and S as this process's rows of them, ``data.part``'s, NumPy arrays
    made of this process's shards alone (split by rows across JAX processes, padding rows dropped; or
    replicated); B, Sigma, Omega as they are. Nothing gathered."""
    part = data.part
    assert part is not None

    def rows(a):
        if not isinstance(a, jax.Array) or a.is_fully_replicated:
            whole = np.asarray(a.addressable_data(0) if isinstance(a, jax.Array) else a)
            return whole[part.start : part.stop]
        shards = sorted(a.addressable_shards, key=lambda s: s.index[0].start or 0)
        first = shards[0].index[0].start or 0
        held = np.concatenate([np.asarray(s.data) for s in shards])
        if first > part.start or first + held.shape[0] < part.stop:
            raise ValueError(f"rows {part.start}:{part.stop}: this process holds rows {first}:{first + held.shape[0]}")
        return held[part.start - first : part.stop - first]

    return state._replace(M=rows(state.M), S=rows(state.S))


def _host_reference_of_parts(model, params: dict, data: Data) -> tuple[float, float]:
    """The float64 host ELBO, and the magnitude of its terms, of a data set whose rows are held apart,
    one process's each (``data``: this process's, ``params``' M and S its rows): every process calls it
    at the same point. PLN-PCA's sums over the rows alone; the full model's sums its row terms and
    M'M + diag(S'S), then Sigma's terms once, with the whole n."""
    assert data.part is not None
    if model.name == PCA_NAME:
        elbo, terms = across_processes_sum(np.array(model.host_reference(params, data)))
        return float(elbo), float(terms)
    poisson, second, log_fact, terms = reference.elbo_sums(
        data.Y, data.O, data.X, params["B"], params["M"], params["S"]
    )
    total = across_processes_sum(np.concatenate([[poisson, log_fact, terms], second.reshape(-1)]))
    second = total[3:].reshape(second.shape)
    return reference.elbo_of_sums(total[0], second, total[1], total[2], params["Sigma"], data.part.n)


def fit(
    data,
    model: str = "profiled",
    optimizer: str | None = None,
    n_iter: int | None = None,
    precision: str = "float32",
    device: str = "cpu",
    strategy: str = "scan",
    *,
    offsets=None,
    covariates=None,
    layer: str | None = None,
    lr: float | None = None,
    rank: int | None = None,
    block_rows: int | None = None,
    init: str | None = None,
    gradient: str = "analytic",
    repeats: int = 1,
    warmup: int = 0,
    first_call: bool = False,
    compile_cache: bool | None = None,
    compile_cache_dir=None,
    time_budget_s: float = 0.0,
    seed: int = 0,
    timed: bool = True,
    progress: bool | None = None,
    **options,
) -> FitResult:
    """Fit a PLN model by variational inference and time it.

    ``model``: ``"profiled"``, ``"full"`` (one PLN, two parametrisations) or ``"pca"``, the PLN-PCA
    of rank ``rank`` (an integer from 1 to p; see :mod:`plnexp.core.model`), whose ``params`` are B, C,
    M, S. ``optimizer``: None is the model's default, ``"newton"`` for pca (block Newton rounds:
    no learning rate; :func:`plnexp.core.model.pca_newton_step`), ``"rprop"`` otherwise.
    ``block_rows`` (pca only): each step walks the rows in blocks of that many, so that its
    temporaries are a few ``block_rows x p`` arrays instead of ``n x p`` ones (same result; None,
    the default: every row at once; see docs/concepts/memory.md).

    ``options``: the strategy's own options (``unroll`` for scan_unrolled, ``tol`` and ``patience``
    for while_loop, ``mode`` for torch_compile: ``plnexp.STRATEGIES[name].options``); those of other
    strategies are ignored. ``strategy="torch_eager"`` or ``"torch_compile"`` (needs the optional
    extra ``.[torch]``) runs the same fit in PyTorch from the same initial state.
    ``timed=True`` (see :mod:`plnexp.measure.timing`) costs one cold AOT compile and one run by default;
    ``first_call=True`` adds a cold plain call, ``warmup``/``repeats`` add runs (median and spread of
    at least ``repeats``, more while they took less than ``time_budget_s`` seconds, after ``warmup``).
    ``timed=False`` makes one plain call. ``progress``: a progress bar on stderr (iterations per second,
    the ELBO) for an untimed fit, run in chunks; None (default): where stderr is a terminal; a timed fit
    never shows one, its program stays the one timed (:mod:`plnexp.fitting.progress`).
    ``init``: the start, ``"seed"`` (the tutorial's), ``"data"`` or ``"random"``; None: ``"data"``.
    ``seed``: the noise of ``init="random"``.

    ``n_iter``: None is the model's default (4000; 1000 for pca: :func:`plnexp.fitting.spec.default_n_iter`).
    The defaults (no optimizer, init or n_iter named) converge: they end within 1e-4 of the float64
    optimum and at their best on the data sets of docs/results.md, "Defaults that converge"; every
    result says how it ended (``converged``, ``gap_to_best``, ``at_best``:
    :func:`plnexp.measure.convergence.ending`).
    By default (``compile_cache=None``) the fit's compile goes through JAX's persistent compilation
    cache in ``compile_cache_dir`` (default ``<outputs>/jax_cache``, see
    :func:`plnexp.system.paths.outputs_dir`): the first process writes the program, a later one reads it
    back instead of compiling (``res.timing.compile_cache_hits`` >= 1). ``compile_cache=True`` also
    times a second compile served by it (``compile_warm_s``, the timing study's switch);
    ``compile_cache=False`` keeps the cache off (a cold compile). A cache folder that cannot be
    written is a one-line :class:`plnexp.measure.timing.CacheWarning`, and the fit runs without it.

    The caller's process: the fit applies plnexp's process settings (:mod:`plnexp.system.runtime`) if
    JAX has not started yet; if it has, it runs as the process is, with one
    :class:`plnexp.system.runtime.SettingsWarning` (once per process) when settings are missing. It never
    clears JAX's caches, and restores JAX's configuration (x64, the compilation cache) on return.

    Args:
        data: the counts: an ``(n, p)`` NumPy array of non-negative integers (samples in rows,
            variables in columns), a pandas DataFrame of them (its column names are kept), or a
            ``anndata.AnnData`` (read as :func:`plnexp.load_anndata` reads it: ``layer``, and
            ``covariates`` and ``offsets`` as obs column names, offsets by default the library size), or a
            :class:`plnexp.Data` (from :func:`plnexp.load_oaks`, :func:`plnexp.load_csv`,
            :func:`plnexp.simulate` or :func:`plnexp.as_data`, which converts the others).
        offsets: with counts as an array or DataFrame: raw positive totals, ``(n, p)`` or one per
            row ``(n,)``, logged here (for offsets already on the log scale, build the data with
            ``plnexp.as_data(counts, offsets, log_offsets=True)``). Default: none.
        covariates: with counts as an array or DataFrame: ``(n, d)`` covariates (text columns
            one-hot); an intercept is always added. Default: the intercept only.
        layer: with an AnnData: the layer holding the counts (None: ``adata.X``).

    Raises:
        TypeError: ``data`` is none of the above (a list, a file name, ...): one line naming what
            is accepted.
        plnexp.DataError: a value that cannot be fitted (a negative, non-integer, missing or too
            large count, a shape that does not match the counts'): one line naming the argument, row and column.
        ValueError: a bad choice: one line naming the argument and its allowed values.
        NumericsError: the compiled ELBO disagrees with the float64 host reference.
    """
    spec = parse(
        model,
        optimizer,
        n_iter,
        precision,
        device,
        strategy,
        lr=lr,
        rank=rank,
        block_rows=block_rows,
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
    # an AnnData's counts stay sparse where the fit reads them so (PLN-PCA with block_rows: check_sparse)
    sparse = spec.model.name == PCA_NAME and spec.model.block_rows is not None
    sparse = sparse and spec.strategy.entry.sparse_refusal(spec.strategy.options) is None
    return run(to_data(data, offsets, covariates, layer=layer, sparse=sparse), spec, timed=timed, progress=progress)


def fit_replicates(
    data, replicates: int, *, offsets=None, covariates=None, seed: int = 0, timed: bool = True, **kwargs
) -> list[FitResult]:
    """``replicates`` fits in one compiled program (``jax.vmap`` of the strategy's fit), one
    :class:`FitResult` each: of one data set from the initial seeds ``seed, seed+1, ...`` (use
    ``init="random"``, or they are all the same fit), or replicate k of ``data[k]`` (a list of
    ``replicates`` data sets of one shape). Each data set is what :func:`fit` accepts (counts as an
    array or DataFrame, with ``offsets`` and ``covariates`` shared by all, or a :class:`Data`).
    Every other argument is :func:`fit`'s; the strategy must be one whose fit is one function
    (``scan``, its carries, ``fori_loop``, ``while_loop``)."""
    spec = parse(seed=seed, replicates=replicates, **kwargs)
    if isinstance(data, (list, tuple)):
        datas: Data | list[Data] = [to_data(d, offsets, covariates) for d in data]
    else:
        datas = to_data(data, offsets, covariates)
    return run_all(datas, spec, timed=timed)


def run(
    data: Data, spec: FitSpec, *, timed: bool = True, owns_process: bool = False, progress: bool | None = None
) -> FitResult:
    """The fit ``spec`` describes (one replicate; see :func:`run_all`)."""
    if spec.replicates != 1:
        raise ValueError(f"replicates={spec.replicates}: plnexp.fitting.engine.run is one fit; use run_all")
    (result,) = run_all(data, spec, timed=timed, owns_process=owns_process, progress=progress)
    return result


def run_all(
    data: Data | list[Data] | tuple[Data, ...],
    spec: FitSpec,
    *,
    timed: bool = True,
    owns_process: bool = False,
    hold: Callable[[Prepared], None] | None = None,
    progress: bool | None = None,
) -> list[FitResult]:
    """The ``spec.replicates`` fits ``spec`` describes, in one program: on one data set ``data``
    (replicate k from initial seed ``spec.seed + k``), or replicate k on ``data[k]``. Placed as the
    strategy's program places them (on the spec's device, resolved here where it runs), timed together
    (``timed=False``: one plain call), each checked against the float64 host reference. Returns one
    :class:`FitResult` per replicate, with the batch's timing.

    ``owns_process``: True only where plnexp owns the process (a job of its command line): the timed
    measurement may then also clear JAX's in-memory caches (see :mod:`plnexp.measure.timing`); never in a
    library call. ``hold``: given the timed program, compiled, with its data and initial state, to run
    it again (a sweep's interleaved rounds: :mod:`plnexp.fitting.rounds`). ``progress``: an untimed
    fit's progress bar (:mod:`plnexp.fitting.progress`; a timed fit never shows one)."""
    # before anything starts JAX's backend (resolve_device does): see plnexp.system.runtime
    runtime.configure_or_warn()
    # whether this strategy's compiles go through JAX's cache is decided once, by spec.cache_choice
    datas, problem, dev = checked(data, spec, spec.timing.compile_cache_dir is not None)
    dtype = spec.precision.dtype
    t = spec.timing
    # a folder that cannot be written: one warning, and the fit runs without the cache
    cache_dir = timing.usable_cache_dir(t.compile_cache_dir)

    # the cache also serves the initial state's program (the timed compile sets its own, see timing)
    with jax.enable_x64(dtype == np.float64), timing.persistent_cache(cache_dir):
        program, arrays, state = placed(problem, datas, spec, dev)
        # the host reference converts to float64 a block of rows at a time: no n x p float64 copy
        starts = [s.pln for s in program.split(state, arrays)]
        kept: list = []  # the compiled program, for hold
        if timed:

            def fresh():
                # make_problem and strategies.build are cached so that equal fits share compiled code;
                # a cold compile needs functions JAX has never traced, so both are made anew (a fresh
                # Problem too: the bound methods jit_per_function jits compare equal across equal Problems)
                problem_now = make_problem.__wrapped__(spec.model, spec.optimizer, spec.gradient)
                return strategies.make(problem_now, spec.n_iter, spec.strategy, spec.replicates)

            out, times = timing.measure(
                program,
                state,
                arrays,
                # across JAX processes every run is collective: each process runs the same number of
                # them (repeats), never as many as its own clock allows
                replace(
                    t, compile_cache_dir=cache_dir, time_budget_s=t.time_budget_s if jax.process_count() == 1 else 0.0
                ),
                fresh=fresh,
                owns_process=owns_process,
                keep=kept,
            )
            if hold is not None and kept:
                n_run = max(int(np.max(np.asarray(out.n_run))), 1)
                x64 = dtype == np.float64
                hold(Prepared(spec.strategy.name, n_run, times.fingerprint, x64, kept[0], state, arrays))
        elif progress_bar.wanted(progress) and progress_bar.can_chunk(
            spec.strategy.name, spec.replicates, datas[0].part is not None
        ):  # the same iterations in chunks, the bar updated between them (never a timed program's)
            out, times = progress_bar.run_chunks(
                lambda k: strategies.build(problem, k, spec.strategy, spec.replicates),
                state,
                arrays,
                spec.n_iter,
                log_factorial=datas[0].log_factorial,
                compile_cache_dir=cache_dir,
            )
        else:
            out, times = timing.untimed(program, state, arrays, compile_cache_dir=cache_dir)
        del state
        results = []
        for replicate, (one, first) in enumerate(zip(program.unbatch(out, arrays), starts)):
            d = datas[replicate] if len(datas) > 1 else datas[0]
            model = problem.model
            if d.part is None:
                log_fact = d.log_factorial
                start = model.host_reference(model.params(_readable(first), d), d)
                params = _host(model.params(_host(_readable(one.state.pln)), d))
                loglik, terms = model.host_reference(params, d)
                size = d.n * d.p
            else:  # this process's rows of a fit across processes: its M and S rows, the sums across processes
                log_fact = across_processes_sum(d.log_factorial)
                start = _host_reference_of_parts(model, model.params(_host(_local_rows(first, d)), d), d)
                params = _host(model.params(_host(_local_rows(one.state.pln, d)), d))
                loglik, terms = _host_reference_of_parts(model, params, d)
                size = d.part.n * d.p
            curve = np.asarray(one.elbo, dtype=np.float64)
            check_against_host(curve[0] - log_fact, start[0], spec.precision, "initial state", size, terms=start[1])
            final = float(one.final_elbo) - log_fact
            check_against_host(final, loglik, spec.precision, "final state", size, terms=terms)
            converged, gap, at_best = convergence.ending(
                curve[: int(one.n_run)] - log_fact, final, spec.precision.eps, size, log_fact
            )
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
                    {"final_elbo_jit": final, "log_factorial": log_fact, "spec": saved.describe(spec)},
                    replicate,
                    names=DataNames.of(d),
                    converged=converged,
                    gap_to_best=gap,
                    at_best=at_best,
                )
            )
    return results


def checked(data: Data | Sequence[Data], spec: FitSpec, cached: bool) -> tuple[list[Data], Problem, Any]:
    """The data sets of :func:`run_all` (one, or one per replicate), each checked against ``spec``
    (rank, sparse counts), the spec's problem, and its device, resolved here, where the strategy is
    checked for it (``cached``: its compiles go through JAX's persistent cache)."""
    datas: list[Data] = list(data) if isinstance(data, (list, tuple)) else [data]  # type: ignore[list-item]
    if len(datas) not in (1, spec.replicates):
        raise ValueError(f"replicates={spec.replicates}: got {len(datas)} data sets (give 1 or {spec.replicates})")
    for d in datas:
        check_rank(spec.model.rank, d.p)
        check_sparse(spec, d)
    problem = make_problem(spec.model, spec.optimizer, spec.gradient)
    dev = resolve_device(spec.device)
    spec.strategy.check(cached, dev.platform, spec.replicates, model=spec.model.name)
    return datas, problem, dev


def placed(problem: Problem, datas: list[Data], spec: FitSpec, dev):
    """The strategy's program for ``spec``, its data placed on ``dev`` (the program owns where its
    data goes) and its initial state (replicate k from seed ``spec.seed + k``), within the caller's
    x64 and compilation-cache settings."""
    program = strategies.build(problem, spec.n_iter, spec.strategy, spec.replicates)
    arrays = program.place(datas, spec.precision.dtype, dev)
    state = program.initial(problem, arrays, spec.init, [spec.seed + k for k in range(spec.replicates)])
    return program, arrays, state


def check_sparse(spec: FitSpec, data: Data) -> None:
    """One-line ValueError where sparse counts (:attr:`plnexp.Data.sparse`) meet a fit that would
    densify all n x p of them: they are fitted by ``model="pca"`` with ``block_rows`` (each block of
    rows densified on the device only while it is used; so a gradient optimizer, rprop by default,
    as newton takes every row at once) and a strategy, with options, that reads them as placed
    (``Strategy.sparse_counts`` in the registry: :meth:`~plnexp.strategies.Strategy.sparse_refusal`)."""
    if not data.sparse:
        return
    if spec.model.name != "pca" or spec.model.block_rows is None:
        raise ValueError(
            f"sparse counts with model={spec.model.name!r}, block_rows={spec.model.block_rows!r}: they are read a "
            "block of rows at a time; allowed is model='pca' with block_rows (e.g. block_rows=1000)"
        )
    refusal = spec.strategy.entry.sparse_refusal(spec.strategy.options)
    if refusal is not None:
        raise ValueError(f"sparse counts with strategy={spec.strategy.name!r}{refusal}")


def check_against_host(
    jitted: float, host: float, precision: Precision, where: str, size: int, *, terms: float
) -> None:
    """Refuse to report an ELBO that the compiled code got wrong (see plnexp.system.runtime): a
    one-line :class:`NumericsError` beyond :meth:`Precision.check_tolerance` for data of ``size`` =
    n*p entries, whose ELBO's terms sum to ``terms`` in magnitude."""
    if not np.isfinite(jitted) or not np.isfinite(host):
        return  # a diverged fit is reported as such by its caller, not as a compiler bug
    tol = precision.check_tolerance(host, size, terms)
    if abs(jitted - host) > tol:
        raise NumericsError(
            f"compiled {precision.name} ELBO at the {where} is {jitted:.9g}, the float64 host reference "
            f"{host:.9g}: off by {abs(jitted - host):.2e}, beyond the bound {tol:.2e} ({precision.check_rtol:g} of "
            f"|ELBO| + {TERMS_ULPS} eps of its terms' magnitude {terms:.2e} + a floor for {size} entries); a "
            "compiler or numerics bug: `python -m plnexp doctor` checks this machine's jitted ELBO"
        )
