"""``scan_fused``: the ``scan`` loop with its n x p work as one hand-fused custom call.

XLA:CPU splits a PLN iteration's elementwise work into ~12 passes over n x p arrays, each writing
its result to memory, and cannot fuse the reductions with their producers. The kernel
(``plnexp/native/pln_fused_step.cc``, called through ``jax.ffi``) does, per block of rows held in
cache: R Omega, A = exp(Z + S^2/2), the ELBO's column sums, the gradient, the optimizer's
elementwise update of M and S, and the statistics of the next Sigma from the *new* rows (C'C,
sum S^2, X'C). What is left is p x p work, here in XLA: the value's other terms, the closed forms
(Sigma, Omega; B), and the full model's B update (d x p) through optax itself.

The kernel repeats optax's formulas for the optimizers declared in :data:`RULES` (each updates
every coordinate on its own, with scalars of the shared step count computed here exactly as optax
computes them); another optimizer is refused in one line. The native library is built at install
time when a C++ compiler is present (``setup.py``); where it was not, ``scan_fused`` is refused in
one line and every other strategy is unaffected.

Code paths: the library holds the kernel compiled for AVX-512, AVX2 and the x86-64 baseline
(elsewhere: the baseline only) and says which of them this CPU runs; a program runs the best of
those (:func:`isa`), or the one ``$PLNEXP_FUSED_ISA`` forces, which is refused in one line where
the CPU lacks it. The path is read when a program is made (``plnexp.strategies.build`` keeps a
program per forced path). Each path has custom-call targets of its own, so
that programs of different paths never share a compiled executable, in memory or on disk.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.scipy.linalg import cho_solve

from ..core.arrays import Arrays
from ..core.model import FULL
from ..core.pln_elbo import PLNState, logdet_from_cholesky
from ..core.problem import FitState, Output, Problem, analytic
from .base import SingleProgram, scanned

LIBRARY = "_pln_fused"  # plnexp/_pln_fused<extension suffix>, built by setup.py
# The library's interface (PLNEXP_FUSED_ABI_VERSION in pln_fused_step.cc): a library of another
# version, left by an earlier install, is refused rather than called with arguments it misreads.
KERNEL_VERSION = 2
# per precision: the custom-call target's name and the handler's symbol, each + "_<code path>"
TARGETS = {"float32": "plnexp_pln_fused_step_f32", "float64": "plnexp_pln_fused_step_f64"}
SYMBOLS = {"float32": "PlnFusedStepF32", "float64": "PlnFusedStepF64"}
N_COEFFICIENTS = 10  # the kernel's kCoefficients (its struct Coef)

# The kernel's code paths, best first, as bits of the library's plnexp_fused_isas() (enum Isa)
ISA_BITS = {"avx512": 4, "avx2": 2, "baseline": 1}
ISAS = tuple(ISA_BITS)
ISA_ENV = "PLNEXP_FUSED_ISA"  # forces a code path (unset or empty: the best this CPU runs)


def library_path() -> Path | None:
    """The built kernel next to this package, or None."""
    package = Path(__file__).resolve().parent.parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = package / f"{LIBRARY}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def target(precision: str, isa: str) -> str:
    """The custom-call target of ``precision``'s step on code path ``isa``."""
    return f"{TARGETS[precision]}_{isa}"


def _abi_version(lib: ctypes.CDLL) -> int:
    try:
        return int(lib.plnexp_fused_abi_version())
    except AttributeError:
        return 1  # the builds before the version was exported


@lru_cache(maxsize=1)
def _register() -> tuple[tuple[str, ...], str | None]:
    """Load the kernel and register the targets of the code paths this CPU runs with XLA (once per
    process): ``(those paths, best first; None)``, or ``((), the reason it cannot be used)``."""
    path = library_path()
    if path is None:
        return (), (
            "its native kernel was not built (no C++ compiler when plnexp was installed?): reinstall with "
            "g++ on PATH (pip install -e .) or choose another strategy"
        )
    try:
        lib = ctypes.CDLL(str(path))
        version = _abi_version(lib)
        if version != KERNEL_VERSION:
            return (), (
                f"its native kernel {path.name} is version {version}, this plnexp needs version {KERNEL_VERSION} "
                "(a stale build from an earlier install): rebuild it with pip install -e . (or reinstall plnexp)"
            )
        bits = int(lib.plnexp_fused_isas())
        runnable = tuple(isa for isa in ISAS if bits & ISA_BITS[isa])
        # only these: a handler of a path the CPU lacks is never handed to XLA (which calls a handler
        # when it registers it, for its metadata)
        for isa in runnable:
            for precision in TARGETS:
                capsule = jax.ffi.pycapsule(getattr(lib, f"{SYMBOLS[precision]}_{isa}"))
                jax.ffi.register_ffi_target(target(precision, isa), capsule, platform="cpu")
    except (OSError, AttributeError) as err:
        return (), f"its native kernel {path.name} could not be loaded ({err}): reinstall plnexp"
    return runnable, None


def cpu_isas() -> tuple[str, ...]:
    """The kernel's code paths that this CPU runs, best first (ValueError where the kernel is unusable)."""
    runnable, reason = _register()
    if reason is not None:
        raise ValueError(reason)
    return runnable


def isa(forced: str | None = None, runnable: tuple[str, ...] | None = None) -> str:
    """The code path a ``scan_fused`` program runs: ``forced`` (default ``$PLNEXP_FUSED_ISA``; unset
    or empty: none) where ``runnable`` (default :func:`cpu_isas`) has it, else the best of
    ``runnable``. A forced path that is unknown or not runnable is a one-line ValueError: running it
    would be SIGILL."""
    if forced is None:
        forced = os.environ.get(ISA_ENV, "")
    forced = forced.strip()
    if forced and forced not in ISAS:
        raise ValueError(f"{ISA_ENV}={forced}: unknown code path; allowed values are {', '.join(ISAS)}")
    if runnable is None:
        runnable = cpu_isas()
    if not forced:
        return runnable[0]
    if forced not in runnable:
        raise ValueError(
            f"{ISA_ENV}={forced}: this CPU cannot run the kernel's {forced} code path, it runs "
            f"{', '.join(runnable)}; allowed values are {', '.join(ISAS)} (or unset for the best)"
        )
    return forced


def check(name: str, compile_cache: bool | None = False) -> None:
    """One-line ValueError where the kernel is missing or stale, or where ``$PLNEXP_FUSED_ISA``
    forces a code path this CPU lacks (a ``Strategy.requires``)."""
    del compile_cache  # a custom call is cached like any other program
    try:
        isa()
    except ValueError as err:
        raise ValueError(f"strategy={name}: {err}") from None


def check_device(name: str, platform: str) -> None:
    if platform != "cpu":
        raise ValueError(f"strategy={name} with device={platform}: its kernel is CPU code; allowed devices are cpu")


# --- the optimizers' elementwise rules --------------------------------------------------------


def _count_inc(opt_state) -> jax.Array:
    return optax.safe_increment(optax.tree.get(opt_state, "count"))


def _moments(count_inc, dtype, b2: float = 0.999, b1: float = 0.9, eps: float = 1e-8) -> list:
    """adam's and radam's first seven coefficients: their moments' weights and bias corrections, eps."""
    bc1 = (1 - b1**count_inc).astype(dtype)  # optax.tree.bias_correction's cast
    bc2 = (1 - b2**count_inc).astype(dtype)
    weights = [jnp.asarray(v, dtype) for v in (1 - b1, b1, 1 - b2, b2)]
    return weights + [bc1, bc2, jnp.asarray(eps, dtype)]


def _adam(opt_state, lr, dtype):
    c = _moments(_count_inc(opt_state), dtype)
    return c + [jnp.asarray(-lr, dtype), jnp.zeros((), dtype), jnp.zeros((), dtype)]


def _radam_clip(opt_state, lr, dtype):
    del lr
    b2, threshold = 0.999, 5.0
    count_inc = _count_inc(opt_state)
    ro_inf = 2.0 / (1.0 - b2) - 1.0  # optax.scale_by_radam, line for line
    b2t = b2**count_inc
    ro = ro_inf - 2 * count_inc * b2t / (1 - b2t)
    r = jnp.sqrt((ro - 4.0) * (ro - 2.0) * ro_inf / ((ro_inf - 4.0) * (ro_inf - 2.0) * ro))
    c = _moments(count_inc, dtype, b2)
    return c + [jnp.zeros((), dtype), (ro >= threshold).astype(dtype), r.astype(dtype)]


def _rprop(opt_state, lr, dtype):
    del opt_state, lr  # optax.rprop's defaults: eta_plus, eta_minus, min_step_size, max_step_size
    return [jnp.asarray(v, dtype) for v in (1.2, 0.5, 1e-6, 50.0)]


def _sgd(opt_state, lr, dtype):
    del opt_state
    return [jnp.asarray(-lr, dtype)]


@dataclass(frozen=True)
class Rule:
    """An optimizer that updates every coordinate on its own: the kernel's id for it (``enum Rule``
    in pln_fused_step.cc), how many per-coordinate arrays its state holds for each parameter, in
    the order optax's state flattens them, and its per-step scalars ``coefficients(opt_state, lr,
    dtype)`` (from the state *before* the step, as optax computes them)."""

    kernel_id: int
    slots: int
    coefficients: Callable


# Keys: the names of plnexp.core.optim.OPTIMIZERS. Every optimizer of the registry is elementwise today;
# one added without an entry here is refused by scan_fused in one line.
RULES: dict[str, Rule] = {
    "sgd": Rule(0, 0, _sgd),
    "adam": Rule(1, 2, _adam),
    "radam_clip": Rule(2, 2, _radam_clip),
    "rprop": Rule(3, 2, _rprop),
}


def check_fit(strategy: str, optimizer: str, gradient: str) -> None:
    """One-line ValueError for an optimizer or gradient the kernel does not compute."""
    if optimizer not in RULES:
        raise ValueError(
            f"strategy={strategy} with optimizer={optimizer}: its kernel updates elementwise optimizers "
            f"only; allowed optimizers are {', '.join(RULES)}"
        )
    if gradient != "analytic":
        raise ValueError(
            f"strategy={strategy} with gradient={gradient}: its kernel computes the analytic gradient; "
            "allowed gradients are analytic"
        )


# --- the step ---------------------------------------------------------------------------------


def _is_param_dict(node) -> bool:
    return isinstance(node, dict) and "M" in node and "S" in node


def _param_dicts(opt_state) -> list[dict]:
    """The optimizer state's per-parameter dicts ({"B", "M", "S"} or {"M", "S"}), in flatten order."""
    return [leaf for leaf in jax.tree.leaves(opt_state, is_leaf=_is_param_dict) if _is_param_dict(leaf)]


def _without_rows(opt_state):
    """The optimizer state restricted to the parameters that are not (n, p): B or nothing."""
    return jax.tree.map(
        lambda node: {k: v for k, v in node.items() if k not in ("M", "S")} if _is_param_dict(node) else node,
        opt_state,
        is_leaf=_is_param_dict,
    )


def _with_rows(small_state, m_slots: list, s_slots: list):
    """``small_state`` (from :func:`_without_rows`) with M's and S's slots put back, in order."""
    it = iter(zip(m_slots, s_slots))

    def put(node):
        if isinstance(node, dict):
            m, s = next(it)
            return {**node, "M": m, "S": s}
        return node

    # the dicts were emptied of M and S: find them as the dict nodes of the small state
    return jax.tree.map(put, small_state, is_leaf=lambda x: isinstance(x, dict))


def fused_step(
    problem: Problem,
    rule: Rule,
    code_path: str,
    consts: dict,
    state: FitState,
    logdet_sigma: jax.Array,
    data: Arrays,
) -> tuple[tuple[FitState, jax.Array], jax.Array]:
    """:meth:`Problem.step` with the n x p work in the kernel (on its code path ``code_path``, one of
    :data:`ISAS`): ``(new state, log det of its Sigma)`` and the ELBO at the old state, whose Sigma's
    log det is ``logdet_sigma`` (carried from the step that made that Sigma: one Cholesky factor per
    step serves the new Omega and the next value)."""
    pln, opt_state = state
    assert problem.optimizer is not None  # fused_program read its name (check_fit, RULES)
    model_full = problem.model is FULL
    dtype = pln.M.dtype
    n, p = pln.M.shape
    lr = problem.optimizer.lr if problem.optimizer.lr is not None else 0.0
    values = rule.coefficients(opt_state, lr, dtype)
    coef = jnp.stack(values + [jnp.zeros((), dtype)] * (N_COEFFICIENTS - len(values)))
    dicts = _param_dicts(opt_state)
    if len(dicts) != rule.slots:
        raise ValueError(
            f"optimizer={problem.optimizer.name}: its state has {len(dicts)} per-parameter arrays, "
            f"the kernel's rule expects {rule.slots}"
        )
    empty = jnp.zeros((0, 0), dtype)
    m_slots = [d["M"] for d in dicts] + [empty] * (2 - rule.slots)
    s_slots = [d["S"] for d in dicts] + [empty] * (2 - rule.slots)
    d = data.X.shape[1]
    vec = lambda *shape: jax.ShapeDtypeStruct(shape, dtype)
    slot_shapes = [jax.ShapeDtypeStruct(a.shape, dtype) for a in m_slots + s_slots]
    call = jax.ffi.ffi_call(
        target(jnp.dtype(dtype).name, code_path),
        [vec(n, p), vec(n, p), *slot_shapes, vec(p), vec(d, p), vec(p, p), vec(p), vec(d, p)],
        input_output_aliases={4: 0, 5: 1, 8: 2, 9: 3, 10: 4, 11: 5},
    )
    M, S, um, vm, us, vs, colsum, xta, gram, s2, xtc = call(
        data.Y,
        data.O,
        data.X,
        pln.B,
        pln.M,
        pln.S,
        pln.Omega,
        coef,
        *m_slots,
        *s_slots,
        model=np.int32(0 if model_full else 1),
        rule=np.int32(rule.kernel_id),
    )

    # the value at the old state: the kernel's column sums and the p x p terms (model._value_and_grad_given_omega)
    yz_rest = consts["sum_yo"] + (jnp.sum(consts["xty"] * pln.B) if model_full else 0.0)
    value = (
        jnp.sum(colsum) + yz_rest - 0.5 * n * logdet_sigma - 0.5 * (n * jnp.sum(pln.Omega * pln.Sigma)) + 0.5 * n * p
    )

    # the optimizer's update of B (full model) and of its step count, through optax itself
    small = _without_rows(opt_state)
    if model_full:
        grad_b = jnp.negative(consts["xty"] - xta)
        updates, small = problem.tx.update({"B": grad_b}, small, {"B": pln.B})
        B = optax.apply_updates({"B": pln.B}, updates)["B"]
        Sigma = (gram + jnp.diag(s2)) / n
    else:
        _, small = problem.tx.update({}, small, {})
        # C = M_new - X B_old; B_new = B_old + (X'X)^-1 X'C; Sigma from the residual C - X (B_new - B_old)
        delta = cho_solve((consts["xtx_chol"], True), xtc)
        B = pln.B + delta
        Sigma = (gram - xtc.T @ delta + jnp.diag(s2)) / n
    new_opt = _with_rows(small, [um, vm][: rule.slots], [us, vs][: rule.slots])
    chol = jnp.linalg.cholesky(Sigma)
    Omega = cho_solve((chol, True), jnp.eye(p, dtype=dtype))  # model.inverse_spd, sharing its factor
    return (FitState(PLNState(B, M, S, Sigma, Omega), new_opt), logdet_from_cholesky(chol)), value


def fused_program(problem: Problem, n_iter: int) -> SingleProgram:
    """The ``scan`` strategy's loop around :func:`fused_step`."""
    assert problem.optimizer is not None  # made by plnexp.fitting.engine.make_problem, which names it
    check_fit("scan_fused", problem.optimizer.name, "analytic" if problem.gradient is analytic else "autodiff")
    rule = RULES[problem.optimizer.name]
    code_path = isa()  # when the program is made (see the module's doc)

    def fit(state: FitState, data: Arrays) -> Output:
        if data.rows is not None:
            raise ValueError("strategy=scan_fused: the kernel fits all rows on one device (no padding rows)")
        # The one consumer of a full (n, p) O: the kernel reads O[i, j] (pln_fused_step.cc checks its
        # shape). Offsets one per row reach the device as an (n, 1) column (Data.to_device): broadcast
        # here, once per fit, outside the loop (a loop-invariant operand of every step's call).
        data = data._replace(O=jnp.broadcast_to(data.O, data.Y.shape))
        consts = {
            "sum_yo": jnp.sum(data.Y * data.O),
            "xty": data.X.T @ data.Y,
            "xtx_chol": jnp.linalg.cholesky(data.X.T @ data.X),
        }

        def step(carry, data):
            return fused_step(problem, rule, code_path, consts, *carry, data)

        logdet0 = logdet_from_cholesky(jnp.linalg.cholesky(state.pln.Sigma))
        return scanned(problem, n_iter, step, (state, logdet0), data, final=lambda carry: carry[0])

    return SingleProgram(fit, label="scan_fused")
