"""The JIT strategy registry: every strategy runs the same fit, stops where it should, compiles once.

Tolerances (relative; for arrays, max |x - ref| <= tol * max |ref|):

- float64: 1e-9 everywhere. Measured differences are <= 5e-13 (eager / jit_per_function /
  scan_unrolled fuse differently from scan; the other scans and the loops compile to the same
  XLA and agree bit for bit).
- float32: curves and parameters 1e-5, measured <= 3e-7. Eager dispatches op by op, and
  jit_per_function / scan_unrolled fuse the step differently, so every reduction is summed in
  another order: ~1e-7 per evaluation, which an optimiser that does not amplify it keeps at that
  level over 50 iterations. The float32 table therefore uses ``adam`` (lr 1e-2): ``radam_clip``
  has no learning rate, its normalised RAdam step m/sqrt(v) is ~+-1 per coordinate and only the
  0.1 clip bounds it, so the step is set by the *sign* of the moments; for a coordinate whose
  gradient is near zero a one-ulp change flips a 0.1 step and the trajectory amplifies it.
  Measured in float32: eager vs scan drifts to 3e-4 (curve) on this data and to O(1) in S on
  oaks. ``radam_clip`` (the study's optimizer) is kept for float64, where rounding is 1e-16 and
  eager agrees to 5e-13 on this data (on oaks even float64 eager drifts to 2e-8 in S).
- float32 ELBO vs the float64 host reference: 1e-5 for the small simulated data (measured
  <= 6e-8) and 2e-5 for oaks at random parameters; both far below the 13% of the known XLA:CPU
  miscompile (see ``test_miscompile_is_reproduced_and_would_be_caught``).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import plnexp
from plnexp.measure import timing
from plnexp.fitting.engine import make_problem
from plnexp.core.arrays import Arrays
from plnexp.core.initial_state import init_state
from plnexp.core.model import MODELS
from plnexp.core.pln_elbo import PLNState, full_elbo, profiled_elbo
from plnexp.core.optim import OptimizerSpec
from plnexp.core.problem import FitState
from plnexp.strategies import NATIVE_STRATEGIES, TORCH_STRATEGIES, StrategySpec, build, torch_loops
from plnexp.strategies.scans import CONTAINERS, FIELDS, DataclassCarry, NamedTupleCarry, PytreeCarry

N_ITER = 50
RTOL = {"float64": 1e-9, "float32": 1e-5}  # curves, parameters (see module docstring)
ELBO_RTOL = {"float64": 1e-9, "float32": 1e-5}  # jitted ELBO vs float64 host value, small data
OAKS_ELBO_RTOL = {"float64": 1e-9, "float32": 2e-5}  # jitted ELBO vs numpy on oaks (n p = 13224)
OPTIMIZER = {"float64": "radam_clip", "float32": "adam"}  # see module docstring
LR = {"radam_clip": None, "adam": 1e-2, "rprop": None}  # pinned: the tests must not move with the defaults
STIRLING_GOOD, STIRLING_BAD = 1285968.2, 1113766.9  # the documented jaxlib 0.10.2 miscompile


@pytest.fixture(scope="module")
def small():
    return plnexp.simulate(n=60, p=8, d=2, seed=1)


@pytest.fixture(scope="module")
def oaks():
    return plnexp.load_oaks(replication=1)


@pytest.fixture(scope="module")
def scan_reference(small):
    """``scan``'s fit per (model, precision), computed once on first use."""
    cache = {}

    def get(model, precision):
        if (model, precision) not in cache:
            cache[model, precision] = plnexp.fit(
                small,
                model=model,
                optimizer=OPTIMIZER[precision],
                n_iter=N_ITER,
                precision=precision,
                strategy="scan",
                timed=False,
                lr=LR[OPTIMIZER[precision]],
            )
        return cache[model, precision]

    return get


def assert_close(actual, desired, rtol, what):
    """max |actual - desired| <= rtol * max |desired| (a scale-aware check for whole arrays)."""
    actual, desired = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
    assert actual.shape == desired.shape, f"{what}: shape {actual.shape} != {desired.shape}"
    assert np.all(np.isfinite(actual)), f"{what}: non-finite values"
    err = np.max(np.abs(actual - desired)) / np.max(np.abs(desired))
    assert err <= rtol, f"{what}: relative difference {err:.3e} > {rtol:g}"


# ------------------------------------------------------------------ 1. every strategy = scan
# the fast subset: one case per mechanism (scan's both models, the others one model), float64
FAST_CASES = {
    ("scan", "full", "float64"),
    ("scan", "profiled", "float64"),
    ("scan_pytree", "full", "float64"),
    ("fori_loop", "full", "float64"),
    ("while_loop", "profiled", "float64"),
}


def _case(name, model, precision):
    param = _strategy(name)
    marks = list(param.marks)
    if (name, model, precision) not in FAST_CASES and not any(m.name == "slow" for m in marks):
        marks.append(pytest.mark.slow)
    return pytest.param(name, model, precision, marks=marks, id=f"{name}-{model}-{precision}")


def _strategy(name):
    """eager: op by op, ~15 s in all; jit_per_function: ~2 s a case; torch_compile: a cold
    torch.compile (~4 s) per case; the namedtuple, dataclass and unrolled scans (~1.3 s a case) vary
    the scan's carry or body, as scan_pytree (kept fast: the tutorial's carry bug) does: these run in
    the full suite only. The torch strategies need the optional extra (tests/test_torch.py compares
    them with scan in depth, torch_eager in the fast subset)."""
    slow = ("eager", "jit_per_function", "scan_namedtuple", "scan_dataclass", "scan_unrolled", *TORCH_STRATEGIES)
    marks = [pytest.mark.slow] if name in slow else []
    if name in TORCH_STRATEGIES and not torch_loops.torch_available():
        marks.append(pytest.mark.skip(reason="PyTorch not installed: pip install -e '.[torch]'"))
    if name in NATIVE_STRATEGIES:
        marks.append(pytest.mark.native)  # skips, saying why, where the kernel was not built
    return pytest.param(name, marks=marks)


# The strategies that only change how the loop is driven or its state held (eager op by op, ~5 s a
# case; jit_per_function; the namedtuple and dataclass carries; the unrolled body) run on the
# diagonal of model x precision: each model once, each precision once. What they change does not
# depend on the model or the precision, which every other strategy, scan itself included, covers
# in all four pairs (the other two pairs each added ~10 s of CI without a new check).
DIAGONAL = {"eager", "jit_per_function", "scan_namedtuple", "scan_dataclass", "scan_unrolled"}
DIAGONAL_PAIRS = {("full", "float64"), ("profiled", "float32")}


# torch_compile is compared with scan in tests/test_torch.py (every optimizer, both models, float64;
# float32 and autodiff pairs): the same comparison here would add ~40 s of cold compiles to CI
@pytest.mark.parametrize(
    "strategy,model,precision",
    [
        _case(s, m, p)
        for s in plnexp.STRATEGIES
        if s != "torch_compile"
        for m in ("full", "profiled")
        for p in ("float64", "float32")
        if s not in DIAGONAL or (m, p) in DIAGONAL_PAIRS
    ],
)
def test_strategy_matches_scan(strategy, model, precision, small, scan_reference):
    ref = scan_reference(model, precision)
    # tol=0: while_loop's rule (relative change < 0) can never fire, so it runs all N_ITER steps.
    # unroll=3 (not the default 8): 50 = 16*3 + 2 exercises the remainder, and compiles faster.
    # Other strategies keep the default spec, so the "scan" row reuses the cached program (a
    # run-to-run determinism check) instead of compiling it again.
    extra = {"while_loop": {"tol": 0.0}, "scan_unrolled": {"unroll": 3}}.get(strategy, {})
    res = plnexp.fit(
        small,
        model=model,
        optimizer=OPTIMIZER[precision],
        n_iter=N_ITER,
        precision=precision,
        strategy=strategy,
        timed=False,
        lr=LR[OPTIMIZER[precision]],
        **extra,
    )
    rtol = RTOL[precision]
    assert res.n_iter == N_ITER and res.elbo.shape == (N_ITER,)
    # the fit actually moved (otherwise "equal curves" would be vacuous)
    assert ref.elbo[-1] > ref.elbo[0] + 0.1 * abs(ref.elbo[0])
    assert_close(res.elbo, ref.elbo, rtol, f"{strategy} ELBO curve")
    for name in ("B", "M", "S", "Sigma"):
        assert_close(res.params[name], ref.params[name], rtol, f"{strategy} final {name}")
    # the jitted ELBO at the final state agrees with the float64 host reference
    np.testing.assert_allclose(res.extra["final_elbo_jit"], res.loglik, rtol=ELBO_RTOL[precision])


@pytest.mark.parametrize("precision", ["float64", pytest.param("float32", marks=pytest.mark.slow)])
@pytest.mark.parametrize("model", ["full", "profiled"])
def test_analytic_gradient_fit_matches_autodiff(model, precision, small, scan_reference):
    """The default hand-written gradient gives the curve and parameters of jax.value_and_grad's
    (the reference fit above runs with the default, gradient="analytic")."""
    ref = scan_reference(model, precision)
    res = plnexp.fit(
        small,
        model=model,
        optimizer=OPTIMIZER[precision],
        n_iter=N_ITER,
        precision=precision,
        strategy="scan",
        timed=False,
        lr=LR[OPTIMIZER[precision]],
        gradient="autodiff",
    )
    assert ref.elbo[-1] > ref.elbo[0] + 0.1 * abs(ref.elbo[0])
    assert_close(res.elbo, ref.elbo, RTOL[precision], "autodiff ELBO curve")
    for name in ("B", "M", "S", "Sigma"):
        assert_close(res.params[name], ref.params[name], RTOL[precision], f"autodiff final {name}")


# ------------------------------------------------------------------ 2. while_loop stopping rule
def reference_stop(full_elbo_curve, tol, patience) -> int:
    """Iterations run by the stopping rule, replayed in numpy float64 on a full-ELBO curve."""
    calm = 0
    for i, e in enumerate(full_elbo_curve):
        if i > 0 and abs(e - full_elbo_curve[i - 1]) / abs(full_elbo_curve[i - 1]) < tol:
            calm += 1
        else:
            calm = 0
        if calm >= patience:
            return i + 1
    return len(full_elbo_curve)


@pytest.mark.slow  # ~2.5 s a case; test_strategy_matches_scan[while_loop-*] stays fast
@pytest.mark.parametrize(
    "optimizer,model,n_iter,tol,patience",
    [
        ("rprop", "profiled", 100, 1e-5, 5),  # reference stop: 66
        ("adam", "full", 150, 3e-3, 3),  # reference stop: 94
    ],
)
def test_while_loop_stops_like_reference(optimizer, model, n_iter, tol, patience, small):
    kw = dict(model=model, optimizer=optimizer, lr=LR[optimizer], precision="float64", timed=False)
    scan = plnexp.fit(small, n_iter=n_iter, strategy="scan", **kw)
    # the decisions must not sit on the threshold, or 1-ulp differences could flip them
    rel = np.abs(np.diff(scan.elbo)) / np.abs(scan.elbo[:-1])
    assert np.all(np.abs(rel[rel > 0] / tol - 1) > 1e-6)
    want = reference_stop(scan.elbo, tol, patience)
    assert want < 0.7 * n_iter, "tol chosen so that the rule fires well before n_iter"
    if optimizer == "rprop":
        assert scan.elbo[1] == scan.elbo[0], "rprop's first step is exactly zero"
        assert reference_stop(scan.elbo, tol, 1) == 2, "so a one-shot rule (patience 1) stops at 2"

    res = plnexp.fit(small, n_iter=n_iter, strategy="while_loop", tol=tol, patience=patience, **kw)
    assert res.n_iter == want
    assert res.n_iter != 2
    assert np.all(np.isnan(res.elbo[want:])) and not np.any(np.isnan(res.elbo[:want]))
    same = plnexp.fit(small, n_iter=want, strategy="scan", **kw)
    assert_close(res.elbo[:want], same.elbo, RTOL["float64"], "while_loop curve")
    assert_close(res.elbo[:want], scan.elbo[:want], RTOL["float64"], "while_loop curve vs long scan")
    for name in ("B", "M", "S", "Sigma"):
        assert_close(res.params[name], same.params[name], RTOL["float64"], f"while_loop final {name}")


# ------------------------------------------------------------------ 3. no retracing
class _CompileLog(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.messages = []

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith(("Compiling", "Finished tracing")):
            self.messages.append(msg)


def _fit_logging_compiles(data, strategy):
    handler = _CompileLog()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            res = plnexp.fit(
                data, model="full", optimizer="adam", n_iter=13, precision="float32", strategy=strategy, timed=False
            )
    finally:
        logger.removeHandler(handler)
    return res, handler.messages


# eager is left out: it has no program of its own, and whether its per-primitive kernels are
# already cached depends on which tests ran before, so "the first fit compiles" cannot be asserted.
@pytest.mark.parametrize(
    "strategy,names",
    [
        ("scan", ("fit",)),  # fori_loop / while_loop / the other scans are SingleProgram jits like scan
        ("jit_per_function", ("loss_and_grad", "update", "complete")),
    ],
)
def test_second_fit_compiles_nothing(strategy, names):
    # n_iter=13 is used nowhere else, so the first fit is this program's first compilation
    first_data = plnexp.simulate(n=60, p=8, d=2, seed=11)
    second_data = plnexp.simulate(n=60, p=8, d=2, seed=12)
    first, first_log = _fit_logging_compiles(first_data, strategy)
    for name in names:
        assert any(f"jit({name})" in m or f"tracing {name} " in m for m in first_log), (
            f"first fit should compile {name}: the check below could not fail otherwise"
        )
    second, second_log = _fit_logging_compiles(second_data, strategy)
    assert second_log == [], f"second fit of the same shapes traced/compiled: {second_log[:3]}"
    assert first.elbo[-1] != second.elbo[-1], "the second fit really used the new data"


# ------------------------------------------------------------------ 4. pytree carries
def _random_fit_state(rng) -> FitState:
    n, p, d = (int(v) for v in rng.integers(1, 9, size=3))
    arr = lambda *shape: rng.standard_normal(shape).astype([np.float32, np.float64][int(rng.integers(2))])
    pln = PLNState(arr(d, p), arr(n, p), arr(n, p), arr(p, p), arr(p, p))
    tx = [optax.adam(1e-2), optax.rprop(1e-2), plnexp.core.optim.radam_clip()][int(rng.integers(3))]
    params = {"B": pln.B, "M": pln.M, "S": pln.S}
    opt_state = jax.tree_util.tree_map(
        lambda a: (
            np.asarray(rng.standard_normal(np.shape(a)), np.asarray(a).dtype)
            if np.issubdtype(np.asarray(a).dtype, np.floating)
            else np.asarray(a)
        ),
        tx.init(params),
    )
    return FitState(pln, opt_state)


def _assert_tree_identical(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(x, y)


@pytest.mark.parametrize("carry_cls", [PytreeCarry, DataclassCarry, NamedTupleCarry])
def test_carry_flatten_unflatten_keeps_every_field(carry_cls):
    rng = np.random.default_rng(0)
    for _ in range(25):
        state = _random_fit_state(rng)
        fields = {**state.pln._asdict(), "opt_state": state.opt_state}
        carry = carry_cls(**fields)
        leaves, treedef = jax.tree_util.tree_flatten(carry)
        # every array leaf is a leaf of the carry (nothing moved to static aux data, nothing dropped)
        expected_leaves = [leaf for f in FIELDS for leaf in jax.tree_util.tree_leaves(fields[f])]
        assert len(leaves) == len(expected_leaves)
        assert all(x is y for x, y in zip(leaves, expected_leaves))
        # unflatten with *new* leaves: each field must come back from the leaves, not from aux data
        bumped = [np.asarray(x) + 1 for x in leaves]
        back = jax.tree_util.tree_unflatten(treedef, bumped)
        assert type(back) is carry_cls
        for f in FIELDS:
            _assert_tree_identical(getattr(back, f), jax.tree_util.tree_map(lambda x: np.asarray(x) + 1, fields[f]))
        for f in ("Sigma", "Omega"):
            np.testing.assert_array_equal(getattr(back, f), fields[f] + 1)


@pytest.mark.parametrize("container", list(CONTAINERS))
def test_container_pack_unpack_roundtrips_fit_state(container):
    pack, unpack = CONTAINERS[container]
    rng = np.random.default_rng(1)
    for _ in range(25):
        state = _random_fit_state(rng)
        direct = unpack(pack(state))
        assert type(direct) is FitState and type(direct.pln) is PLNState
        _assert_tree_identical(direct, state)
        # through a flatten/unflatten of the packed carry, as lax.scan does
        leaves, treedef = jax.tree_util.tree_flatten(pack(state))
        _assert_tree_identical(unpack(jax.tree_util.tree_unflatten(treedef, leaves)), state)


# ------------------------------------------------------------------ 5. jitted ELBO vs numpy float64
def numpy_full_elbo(Y, O, X, B, M, S, Sigma) -> float:
    """Partial ELBO (no log y!) at (B, centred M, S, Sigma), written independently of plnexp:
    slogdet and a general linear solve instead of Cholesky factors."""
    Y, O, X, B, M, S, Sigma = (np.asarray(a, np.float64) for a in (Y, O, X, B, M, S, Sigma))
    n, p = M.shape
    Z = O + X @ B + M
    poisson = np.sum(Y * Z) - np.sum(np.exp(Z + S**2 / 2)) + np.sum(np.log(np.abs(S)))
    sign, logdet_sigma = np.linalg.slogdet(Sigma)
    assert sign > 0
    second_moment = M.T @ M + np.diag(np.sum(S**2, axis=0))
    trace = np.trace(np.linalg.solve(Sigma, second_moment))
    return float(poisson - 0.5 * n * logdet_sigma - 0.5 * trace + 0.5 * n * p)


def numpy_profiled_elbo(Y, O, X, M, S) -> float:
    """Profiled partial ELBO for uncentred M: B and Sigma at their closed forms (lstsq), then the
    *general* formula (the trace is not assumed to cancel)."""
    M, S, X = (np.asarray(a, np.float64) for a in (M, S, X))
    B = np.linalg.lstsq(X, M, rcond=None)[0]
    R = M - X @ B
    Sigma = (R.T @ R + np.diag(np.sum(S**2, axis=0))) / len(R)
    return numpy_full_elbo(Y, O, X, B, R, S, Sigma)


def random_point(data, seed=0):
    """Realistic random parameters for ``data``: near log(1 + Y) - O, S in [0.2, 0.8], SPD Sigma."""
    rng = np.random.default_rng(seed)
    n, p = data.Y.shape
    Z0 = np.log1p(data.Y) - data.O
    B = np.linalg.lstsq(data.X, Z0, rcond=None)[0] + 0.05 * rng.standard_normal((data.d, p))
    M = Z0 - data.X @ B + 0.1 * rng.standard_normal((n, p))  # centred-ish residual (full model)
    S = rng.uniform(0.2, 0.8, size=(n, p))
    A = rng.standard_normal((p, p))
    Sigma = A @ A.T / p + 0.5 * np.eye(p)
    return B, M, S, Sigma


def _point(data, dtype):
    """Data and ``random_point`` rounded to ``dtype`` (as float64 numpy): both sides see the same numbers."""
    r = lambda a: np.asarray(np.asarray(a, dtype), np.float64)
    B, M, S, Sigma = (r(a) for a in random_point(data))
    return r(data.Y), r(data.O), r(data.X), B, M, S, Sigma


def jitted_elbos(data, dtype):
    """(jit(full_elbo), jit(profiled_elbo)) at ``random_point`` in ``dtype``, as Python floats."""
    Y, O, X, B, M, S, Sigma = _point(data, dtype)
    c = lambda a: jnp.asarray(a, dtype)
    arrays = Arrays(c(Y), c(O), c(X))
    state = PLNState(c(B), c(M), c(S), c(Sigma), c(np.linalg.inv(Sigma)))
    full = jax.jit(full_elbo)({"B": c(B), "M": c(M), "S": c(S)}, state, arrays)
    profiled = jax.jit(profiled_elbo)({"M": c(M + X @ B), "S": c(S)}, state, arrays)
    return float(full), float(profiled)


def numpy_elbos(data, dtype):
    """The same two values from the numpy float64 implementations above."""
    Y, O, X, B, M, S, Sigma = _point(data, dtype)
    Mu = np.asarray(np.asarray(M + X @ B, dtype), np.float64)  # what jitted_elbos passes
    return numpy_full_elbo(Y, O, X, B, M, S, Sigma), numpy_profiled_elbo(Y, O, X, Mu, S)


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_jitted_elbo_matches_numpy_on_oaks(precision, oaks):
    dtype = np.float64 if precision == "float64" else np.float32
    with jax.enable_x64(precision == "float64"):
        got = jitted_elbos(oaks, dtype)
    want = numpy_elbos(oaks, dtype)
    for g, w, name in zip(got, want, ("full", "profiled")):
        assert np.isfinite(w) and abs(w) > 1e4
        np.testing.assert_allclose(g, w, rtol=OAKS_ELBO_RTOL[precision], err_msg=f"{name} ELBO, {precision}")


_SUBPROCESS = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {tests!r})
    import numpy as np, jax, jax.numpy as jnp
    import plnexp, test_strategies as t
    oaks = plnexp.load_oaks(replication=1)
    k = np.where(oaks.Y == 0, 1.0, oaks.Y)
    stirling = lambda k: jnp.sum(jnp.log(jnp.sqrt(2 * jnp.pi * k)) + k * jnp.log(k / jnp.e))
    out = dict(flags=os.environ.get("XLA_FLAGS"),
               stirling_jit=float(jax.jit(stirling)(jnp.asarray(k, jnp.float32))),
               stirling_np=float(np.sum(np.log(np.sqrt(2 * np.pi * k)) + k * np.log(k / np.e))),
               elbo_jit=t.jitted_elbos(oaks, np.float32), elbo_np=t.numpy_elbos(oaks, np.float32))
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_miscompile_is_reproduced_and_would_be_caught(oaks):
    """With the bug-enabling flag value (plnexp then leaves that flag alone, since its name is
    present) the jitted Stirling sum comes out 13% wrong; a reference comparison at the float32
    tolerance flags it. In this process (plnexp appended the fix) the same jit is right."""
    bad_flag = "--xla_cpu_experimental_ynn_fusion_type=reduce"
    env = {**os.environ, "XLA_FLAGS": bad_flag}
    proc = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS.format(tests=str(Path(__file__).parent))],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    ynn = [f for f in out["flags"].split() if f.startswith("--xla_cpu_experimental_ynn_fusion_type")]
    assert ynn == [bad_flag], "plnexp must not override a flag the user set"
    rtol = ELBO_RTOL["float32"]
    assert abs(out["stirling_np"] - STIRLING_GOOD) < 0.1
    if abs(out["stirling_jit"] - out["stirling_np"]) <= rtol * abs(out["stirling_np"]):
        pytest.skip(
            f"XLA_FLAGS={bad_flag} no longer reproduces the miscompile on this CPU/jaxlib "
            f"(got {out['stirling_jit']}); nothing to detect"
        )
    assert abs(out["stirling_jit"] - STIRLING_BAD) < 1.0, out  # the documented wrong value
    # ... and the comparison used in this file would catch it (13% >> float32 tolerance)
    assert abs(out["stirling_jit"] - out["stirling_np"]) > 1e3 * rtol * abs(out["stirling_np"])
    # In this process the fix is active and the same computation is right.
    assert "--xla_cpu_experimental_ynn_fusion_type=-reduce" in os.environ["XLA_FLAGS"]  # (,-individual_dot)
    k = np.where(oaks.Y == 0, 1.0, oaks.Y)
    good = float(
        jax.jit(lambda k: jnp.sum(jnp.log(jnp.sqrt(2 * jnp.pi * k)) + k * jnp.log(k / jnp.e)))(
            jnp.asarray(k, jnp.float32)
        )
    )
    np.testing.assert_allclose(good, out["stirling_np"], rtol=rtol)


# ------------------------------------------------------------------ 6. timing (last: it clears jit caches)
@pytest.mark.parametrize("strategy,repeats", [pytest.param("eager", 2, marks=pytest.mark.slow), ("scan", 3)])
def test_measure_reports_consistent_times(strategy, repeats, small, monkeypatch):
    """For eager, ``jax.clear_caches`` is replaced by a counting no-op: after a real clear, eager
    re-compiles every primitive it dispatches (~10 s on this machine, twice per measure), and
    nothing asserted here depends on cold caches. scan gets the real clear (and a real compile)."""
    n_iter = 2
    cleared = []
    if strategy == "eager":
        monkeypatch.setattr(timing.jax, "clear_caches", lambda: cleared.append(1))
    problem = make_problem(MODELS["full"], OptimizerSpec(OPTIMIZER["float32"], LR[OPTIMIZER["float32"]]))
    arrays = small.to_device(np.float32, jax.devices("cpu")[0])
    state = problem.init(init_state(problem.model, arrays, "seed"))
    program = build(problem, n_iter, StrategySpec(strategy))
    # owns_process: measure clears JAX's caches as it does in a job of the command line (a library
    # call never does: test_timing)
    out, t = timing.measure(program, state, arrays, timing.TimingSpec(repeats, 1, True), owns_process=True)
    if strategy == "eager":
        assert len(cleared) == 2, "measure clears the caches before the first call and before compiling"
    if strategy == "eager":
        assert t.compile_s == 0.0
        assert t.cost_analysis == {}  # nothing compiled as a whole, nothing to analyse
    else:
        assert t.compile_s > 0.0
        ((label, cost),) = t.cost_analysis.items()
        assert cost["flops"] > 0 and cost["counted"].startswith("the whole program")  # scan body counted once
        # one iteration: the loop alone (the final ELBO and the copies around the loop left out),
        # worked out on first use (t.program.xla) and then kept beside the whole program's cost
        assert "per_iteration" not in cost
        flops_per_iter = t.program.xla["xla_flops_per_iter"]
        assert cost["per_iteration"]["counted"].startswith("one trip of loop")
        assert 0 < flops_per_iter == cost["per_iteration"]["flops"] < cost["flops"]
        assert t.memory_analysis[label]["argument_size_in_bytes"] > 0
    assert t.first_call_s > 0.0 and t.run_s > 0.0
    assert len(t.runs_s) == repeats and all(r > 0 for r in t.runs_s)
    assert min(t.runs_s) <= t.run_s <= max(t.runs_s)
    assert int(out.n_run) == n_iter
    assert t.ms_per_iter == pytest.approx(1e3 * t.run_s / n_iter, rel=1e-12)
    assert np.all(np.isfinite(np.asarray(out.elbo)))
