"""The PyTorch baselines (torch_eager, torch_compile): the same fit as JAX's ``scan``, from the same
state, with the same optimizer formulas; and the optional extra's edges (no torch: one line).

Every comparison runs both Programs on the same JAX FitState and data and compares whole Outputs:
the 50 ELBO values, every parameter and closed form, every leaf of optax's optimizer state (the
torch optimizers return optax's own state structure) and the final ELBO. Relative, scale-aware
(max |x - ref| <= tol * max |ref| per array), on small simulated data (n=60, p=8, d=2):

- float64: 1e-9. Measured <= 1e-15 for every model, optimizer and gradient (the two sides differ
  only in the order of their sums).
- float32: 1e-5, measured <= 7e-7 here for all four optimizers. Torch sums in another order than
  XLA (~1e-7 relative per ELBO evaluation) and its ``decay ** count`` in the bias corrections can
  differ from XLA's ``pow(f32, s32)`` by an ulp. On oaks the sign-driven optimizers (radam_clip's
  clipped steps, rprop) amplify such float32 differences to O(1) in S within 50 iterations, as
  they do between JAX's own differently fused strategies (tests/test_strategies.py), while the
  curves stay within 2e-6: hence the small data here.

Oaks itself (d = 1 covariate: B is 1 x p, a layout the simulated d = 2 data never has) is fitted
for 10 iterations in float64 by every strategy, model and optimizer (measured <= 2e-14 against scan).

torch.compile's compiles (seconds each) are in the slow tests; the fast ones run torch_eager, but
for one oaks case, the run that recompiled the step before its state was kept row-major.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import plnexp
from plnexp.experiment import plan as cli
from plnexp.experiment import job_task
from plnexp.jobs.spec import JobSpec
from plnexp.jobs import config as C
from plnexp.fitting.engine import make_problem
from plnexp.core.initial_state import init_state
from plnexp.core.model import MODELS
from plnexp.core.optim import OptimizerSpec
from plnexp.strategies import StrategySpec, build, torch_loops

NO_TORCH = "PyTorch not installed: pip install -e '.[torch]'"
needs_torch = pytest.mark.skipif(not torch_loops.torch_available(), reason=NO_TORCH)

N_ITER = 50
# torch.compile's tests on one xdist worker: its first compile in a process starts inductor's
# compile workers and builds its headers (~10 s), paid once instead of once per worker
ONE_WORKER = pytest.mark.xdist_group("torch_compile")
COMPILING = {"torch_eager": [], "torch_compile": [ONE_WORKER]}
RTOL = {"float64": 1e-9, "float32": 1e-5}  # see the module docstring
LR = {"radam_clip": None, "adam": 1e-2, "rprop": 1e-2, "sgd": 1e-3}  # pinned; sgd's default 1e-4 barely moves here
OPTIMIZERS = list(LR)
MODEL_NAMES = ["full", "profiled"]


@pytest.fixture(scope="module")
def small():
    return plnexp.simulate(n=60, p=8, d=2, seed=1)


def run_program(data, strategy, model, optimizer, precision, gradient="analytic", n_iter=N_ITER, lr=LR):
    """The Output of ``strategy``'s plain call on the FitState plnexp.fit starts from, as float64 numpy."""
    problem = make_problem(MODELS[model], OptimizerSpec(optimizer, lr[optimizer]), gradient)
    with jax.enable_x64(precision == "float64"):
        arrays = data.to_device(np.dtype(precision), jax.devices("cpu")[0])
        state = problem.init(init_state(problem.model, arrays, "seed"))
        out = build(problem, n_iter, StrategySpec(strategy)).call(state, arrays)
        return jax.tree.map(np.asarray, out)


@pytest.fixture(scope="module")
def scan_output(small):
    cache = {}

    def get(*key):
        if key not in cache:
            cache[key] = run_program(small, "scan", *key)
        return cache[key]

    return get


def assert_close(actual, desired, rtol, what):
    actual, desired = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
    assert actual.shape == desired.shape, f"{what}: shape {actual.shape} != {desired.shape}"
    assert np.all(np.isfinite(actual)), f"{what}: non-finite values"
    scale = np.max(np.abs(desired))
    err = np.max(np.abs(actual - desired)) / scale if scale > 0 else np.max(np.abs(actual))
    assert err <= rtol, f"{what}: relative difference {err:.3e} > {rtol:g}"


def assert_same_fit(out, ref, precision, label, n_iter=N_ITER):
    rtol = RTOL[precision]
    curve = ref.elbo
    assert curve[-1] > curve[0] + 0.1 * abs(curve[0]), "the fit moved (else equal curves prove little)"
    assert out.elbo.dtype == ref.elbo.dtype == np.dtype(precision)
    assert_close(out.elbo, ref.elbo, rtol, f"{label} ELBO curve")
    assert int(out.n_run) == int(ref.n_run) == n_iter
    assert_close(out.final_elbo, ref.final_elbo, rtol, f"{label} final ELBO")
    for name in ref.state.pln._fields:
        assert_close(getattr(out.state.pln, name), getattr(ref.state.pln, name), rtol, f"{label} {name}")
    assert jax.tree.structure(out.state.opt_state) == jax.tree.structure(ref.state.opt_state), (
        "the torch optimizer returns optax's state structure"
    )
    leaves = jax.tree_util.tree_leaves_with_path(ref.state.opt_state)
    for (path, want), got in zip(leaves, jax.tree.leaves(out.state.opt_state)):
        where = f"{label} opt_state{jax.tree_util.keystr(path)}"
        if np.issubdtype(want.dtype, np.integer):
            assert got.dtype == want.dtype and np.array_equal(got, want), where
        else:
            assert_close(got, want, rtol, where)


# ------------------------------------------------------------------ 1. the same fit as scan
# torch_eager, whose code torch.compile compiles, runs all eight (model, optimizer) pairs in both
# precisions and both gradients. torch_compile's rows need only show that compiling keeps the maths
# (a cold torch.compile costs ~5 s of CPU, its first in a process ~14 s more): across this file's
# torch_compile tests each optimizer runs once, each model, precision and gradient at least once
# (radam_clip full float64 and rprop profiled float32 autodiff here; sgd on oaks; adam in the
# timed and logged run).
COMPILED = {
    ("full", "radam_clip", "float64", "analytic"),
    ("profiled", "rprop", "float32", "autodiff"),
}
FAST_SUBSET = {("full", "radam_clip")}  # torch_eager, float64, analytic: the one case in the fast subset
# torch_eager: every (model, optimizer) pair in float64 with the analytic gradient; float32 and the
# autodiff gradient each once per optimizer, the two together once per pair (each case compiles its
# own scan reference: the full cross added 8 compiles of a second or two and no new check)
EAGER_FLOAT32 = {
    (m, o, "float32", "analytic")
    for m, o in [("full", "radam_clip"), ("profiled", "adam"), ("full", "rprop"), ("profiled", "sgd")]
}
EAGER_AUTODIFF = {
    (m, o, "float64", "autodiff")
    for m, o in [("profiled", "radam_clip"), ("full", "adam"), ("profiled", "rprop"), ("full", "sgd")]
}


def _grid(strategy, precisions, gradients=("analytic",), slow=False, cases=None):
    """``cases``: only these (model, optimizer, precision, gradient) rows (torch_compile's: COMPILED)."""
    return [
        pytest.param(
            strategy,
            m,
            o,
            p,
            g,
            id=f"{strategy}-{m}-{o}-{p}-{g}",
            marks=[needs_torch, *COMPILING[strategy]]
            + ([pytest.mark.slow] if slow or (m, o) not in FAST_SUBSET else []),
        )
        for p in precisions
        for g in gradients
        for m in MODEL_NAMES
        for o in OPTIMIZERS
        if cases is None or (m, o, p, g) in cases
    ]


@pytest.mark.parametrize(
    "strategy,model,optimizer,precision,gradient",
    [
        *_grid("torch_eager", ["float64"]),  # ~0.1 s a fit; the scan reference compiles in ~0.5 s
        *_grid("torch_eager", ["float32"], slow=True, cases=EAGER_FLOAT32),
        *_grid("torch_eager", ["float64"], ["autodiff"], slow=True, cases=EAGER_AUTODIFF),
        *_grid("torch_compile", ["float64", "float32"], ["analytic", "autodiff"], slow=True, cases=COMPILED),
    ],
)
def test_torch_matches_scan(strategy, model, optimizer, precision, gradient, scan_output, small):
    out = run_program(small, strategy, model, optimizer, precision, gradient)
    assert_same_fit(out, scan_output(model, optimizer, precision, gradient), precision, strategy)


# ------------------------------------------------------------------ 1b. on oaks: d = 1 covariate
# B is 1 x p: a layout torch treats as contiguous whatever its first stride, which torch.compile's
# guards do not (cholesky_solve's column-major B, strides (1, 1), recompiled the step at its second
# call: RecompileError on every oaks run of the profiled model). Few iterations, float64.
OAKS_ITER = 10
OAKS_LR = {**LR, "sgd": 1e-4}  # plnexp's default: 1e-3 overflows exp() on oaks within 10 iterations
# every oaks case runs in the full suite; the layout invariant that made torch_compile recompile on
# oaks (d=1) is checked in the fast subset by test_the_step_returns_its_state_row_major_on_oaks


@pytest.fixture(scope="module")
def oaks_scan(oaks):
    cache = {}

    def get(model, optimizer):
        if (model, optimizer) not in cache:
            cache[model, optimizer] = run_program(
                oaks, "scan", model, optimizer, "float64", n_iter=OAKS_ITER, lr=OAKS_LR
            )
        return cache[model, optimizer]

    return get


@needs_torch
@pytest.mark.parametrize("model", [pytest.param("full", marks=pytest.mark.slow), "profiled"])
def test_the_step_returns_its_state_row_major_on_oaks(model, oaks):
    """torch_compile guards every stride of the state it was first called with: the step must
    return each tensor in the layout it takes (row-major), also where d=1 makes B 1 x p (a LAPACK
    solve's column-major B passed Tensor.contiguous() and recompiled the step at its second call)."""
    import torch

    from plnexp.strategies.torch_pln import program as tp

    with jax.enable_x64(True):
        problem = make_problem(MODELS[model], OptimizerSpec("radam_clip"), "analytic")
        arrays = oaks.to_device(np.float64, jax.devices("cpu")[0])
        state = tp.to_torch(problem.init(init_state(problem.model, arrays, "seed")))
        step, _ = tp.make_step(problem)
        new, _ = step(state, tp._torch_data(arrays))
    tensors = [
        t for t in jax.tree.leaves(new, is_leaf=lambda x: isinstance(x, torch.Tensor)) if isinstance(t, torch.Tensor)
    ]
    assert tensors and all(t.stride() == tp.row_major_strides(t.shape) for t in tensors)
    assert new.pln.B.shape == (1, 114) and new.pln.B.stride() == (114, 1)


# On oaks (d=1, p=114): torch_eager with every (model, optimizer) pair; torch_compile, which compiles
# the code torch_eager runs (a cold torch.compile of ~5-15 s per case), with the pair whose step
# recompiled on oaks before the state was kept row-major (the profiled model's cholesky_solve), with
# the optimizer no other torch_compile test runs
@pytest.mark.parametrize(
    "strategy,model,optimizer",
    [
        pytest.param(s, m, o, id=f"{s}-{m}-{o}", marks=[needs_torch, pytest.mark.slow, *COMPILING[s]])
        for s in ("torch_eager", "torch_compile")
        for m in MODEL_NAMES
        for o in OPTIMIZERS
        if s == "torch_eager" or (m, o) == ("profiled", "sgd")
    ],
)
def test_torch_on_oaks_matches_scan(strategy, model, optimizer, oaks, oaks_scan):
    assert oaks.X.shape[1] == 1, "oaks: intercept only"
    out = run_program(oaks, strategy, model, optimizer, "float64", n_iter=OAKS_ITER, lr=OAKS_LR)
    assert_same_fit(out, oaks_scan(model, optimizer), "float64", f"{strategy} on oaks", n_iter=OAKS_ITER)


@needs_torch
def test_a_recompile_in_a_run_is_one_plnexp_line(small, outputs, monkeypatch):
    """A step whose output has another layout than its input (here: B column-major) fails a guard at
    its second call in the run: plnexp's StepRecompiledError, one line with the guard, not torch's
    RecompileError. TorchDynamo with its ``eager`` backend (guards, no Inductor compile): cheap."""
    import torch

    from plnexp.strategies.torch_pln import program

    def flaky(state, data):
        B = state.pln.B.mT.contiguous().mT  # d = 2: strides (1, 2), not (p, 1)
        return state._replace(pln=state.pln._replace(B=B)), torch.sum(data.Y * state.pln.M)

    monkeypatch.setattr(
        program.TorchProgram, "_compiled_step", lambda self: torch.compile(flaky, backend="eager", fullgraph=True)
    )
    monkeypatch.setattr(program, "warm_up", lambda device_type: 0.0)  # an Inductor compile, not needed here
    message = (
        r"^torch_compile recompiled the step at iteration 2 of 5 \(guard failed: tensor 'state\.pln\.B' "
        r"stride mismatch at index 0\. expected 8, actual 1\): a plnexp bug, please report it$"
    )
    with pytest.raises(program.StepRecompiledError, match=message) as err:  # the timed path: compile, then run
        plnexp.fit(
            small,
            model="profiled",
            optimizer="rprop",
            n_iter=5,
            precision="float64",
            strategy="torch_compile",
            repeats=1,
        )
    assert "\n" not in str(err.value) and err.value.__cause__ is None and err.value.__suppress_context__

    (job,) = cli.plan([*TINY, "strategy=torch_compile"], multirun=False)  # what a run reports (p = 5)
    out = job_task.run_job(JobSpec(job.config, job.name, overrides=job.overrides))
    assert out.status == "FAILED"
    assert re.match(
        r"^StepRecompiledError: torch_compile recompiled the step at iteration 2 of 5 \(guard failed: "
        r"tensor 'state\.pln\.B' stride mismatch at index 0\. expected 5, actual 1\): a plnexp bug, "
        r"please report it$",
        out.reason,
    ), out.reason


# ------------------------------------------------------------------ 2. timing fields
@needs_torch
@pytest.mark.slow  # the fast subset keeps one torch_eager fit (test_torch_matches_scan)
def test_torch_eager_timing_compiles_nothing(small):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = plnexp.fit(
            small,
            model="full",
            optimizer="radam_clip",
            n_iter=5,
            precision="float32",
            strategy="torch_eager",
            repeats=2,
            warmup=1,
        )
        assert torch.get_num_threads() == 1, "a fit restores torch's thread count"
    finally:
        torch.set_num_threads(threads)
    t = res.timing
    assert t.compile_s == 0.0 and np.isnan(t.first_call_s) and len(t.runs_s) == 2
    assert t.run_s > 0 and t.ms_per_iter == pytest.approx(1e3 * t.run_s / 5, rel=1e-12)
    assert res.strategy == "torch_eager" and res.n_iter == 5 and np.all(np.isfinite(res.elbo))
    assert res.extra["final_elbo_jit"] == pytest.approx(res.loglik, rel=1e-5)  # checked against the host


# ------------------------------------------------------------------ 3. one run through the runner and MLflow
TINY = ["dataset=synthetic", "dataset.n=40", "dataset.p=5", "n_iter=5"]


def _logged_like_any_other(outputs, out, strategy: str, mode: str | None, n_iter: int) -> dict:
    """The run of ``out`` in ``outputs``' store, logged as any run is: its strategy and only that
    strategy's options (torch_compile its mode, torch_eager none), torch's version, its timings (a
    compile for torch_compile alone) and its ELBO curve, one value a step. Returns its metrics."""
    from conftest import store_client

    assert out.status == "FINISHED", out.reason
    run = store_client(outputs).get_run(out.run_id)
    assert run.data.params["strategy.name"] == strategy
    assert run.data.params.get("strategy.mode") == mode
    assert run.data.tags["torch_version"].startswith("2.13.0")
    m = run.data.metrics
    assert (m["compile_s"] > 0) == (strategy == "torch_compile") and m["run_s"] > 0 and m["n_iter_run"] == n_iter
    assert np.isfinite(m["final_elbo"]) and np.isfinite(m["loglik"])
    history = store_client(outputs).get_metric_history(out.run_id, "elbo")
    assert sorted(h.step for h in history) == list(range(n_iter))
    return m


@needs_torch
@pytest.mark.slow
def test_a_torch_eager_run_is_logged_like_any_other(outputs):
    (job,) = cli.plan([*TINY, "strategy=torch_eager"], multirun=False)
    _logged_like_any_other(
        outputs, job_task.run_job(JobSpec(job.config, job.name, overrides=job.overrides)), "torch_eager", None, 5
    )


@needs_torch
@pytest.mark.slow
@ONE_WORKER
def test_a_torch_compile_run_is_timed_and_logged_like_any_other(outputs, monkeypatch):
    """A torch_compile run through the runner, logged as torch_eager's above, in one mode other than
    the default (which every other torch_compile test runs) and with the cold first call timed too:
    the mode reaches torch.compile (seen there), both timings are measured, and the curve is scan's
    (the same job with strategy=scan). One run for both: each compile of the step is seconds of C++
    builds. reduce-overhead: on the CPU, default's compile (its CUDA graphs are CUDA's);
    max-autotune-no-cudagraphs compiled the same step in about twice the CPU and checked nothing more."""
    import torch

    modes = []
    compile_ = torch.compile

    def spy(*args, **kwargs):
        modes.append(kwargs.get("mode"))
        return compile_(*args, **kwargs)

    monkeypatch.setattr(torch, "compile", spy)
    n_iter = 20
    case = [*TINY[:-1], f"n_iter={n_iter}", "optimizer=adam", "precision=float64", "repeats=2", "time_budget_s=0"]
    (job,) = cli.plan([*case, "first_call=true", "strategy=torch_compile", "strategy.mode=reduce-overhead"], False)
    out = job_task.run_job(JobSpec(job.config, job.name, overrides=job.overrides))
    m = _logged_like_any_other(outputs, out, "torch_compile", "reduce-overhead", n_iter)
    assert "reduce-overhead" in modes, modes  # the step's compile (the warm-up's own compile takes the default)
    t = out.result.timing
    assert t.compile_s > 0 and t.run_s > 0 and len(t.runs_s) == 2 and m["n_runs"] == 2
    assert t.first_call_s > 0 and m["first_call_s"] == pytest.approx(t.first_call_s)
    assert t.ms_per_iter == pytest.approx(1e3 * t.run_s / n_iter, rel=1e-12)
    (ref,) = cli.plan([*case, "strategy=scan"], multirun=False)
    scan = job_task.run_job(JobSpec(ref.config, ref.name, overrides=ref.overrides))
    assert scan.status == "FINISHED", scan.reason
    curve = scan.result.elbo
    assert curve[-1] > curve[0], "the fit moved"
    assert_close(out.result.elbo, curve, RTOL["float64"], "torch_compile mode=reduce-overhead curve")


# ------------------------------------------------------------------ 4. without torch, and bad options
WITHOUT_TORCH = (
    "strategy=torch_eager: PyTorch is not installed; install the optional extra: "
    "pip install -e '.[torch]' (torch==2.13.0)"
)


@pytest.fixture
def no_torch(monkeypatch):
    monkeypatch.setattr(torch_loops, "torch_available", lambda: False)


def test_without_torch_a_torch_job_fails_before_any_work(no_torch, small):
    with pytest.raises(C.ConfigError) as err:
        cli.plan(["strategy=torch_eager"], multirun=False)
    assert str(err.value) == WITHOUT_TORCH
    with pytest.raises(C.ConfigError, match=r"^strategy=torch_compile: PyTorch is not installed; .*\.\[torch\]"):
        cli.plan(["strategy=scan,torch_compile"], multirun=True)  # a sweep: refused as a whole
    with pytest.raises(ValueError, match=r"^strategy=torch_eager: PyTorch is not installed"):
        plnexp.fit(small, strategy="torch_eager", n_iter=2)
    assert {"torch_eager", "torch_compile"} <= set(plnexp.STRATEGIES), "listed all the same"
    (job,) = cli.plan(["strategy=scan"], multirun=False)  # JAX jobs are unaffected
    assert job.config.strategy.name == "scan"


_BLOCKED = textwrap.dedent("""
    import sys
    sys.modules["torch"] = None  # as if not installed: import torch raises ImportError
    import plnexp
    from plnexp.__main__ import main
    res = plnexp.fit(plnexp.simulate(n=20, p=3, d=1, seed=0), strategy="scan", n_iter=3, timed=False)
    assert res.n_iter == 3
    code = main(["run", "strategy=torch_eager"])
    print("torch imported:", any(m == "torch" or m.startswith("torch.") for m in sys.modules if sys.modules[m]))
    sys.exit(code)
""")


@pytest.mark.slow  # a fresh interpreter (~3 s): the in-process check above runs in the fast subset
def test_plnexp_works_without_torch(outputs, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", _BLOCKED],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stdout.strip() == "torch imported: False"
    assert proc.stderr.strip() == f"plnexp: error: {WITHOUT_TORCH}"


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["strategy=torch_compile", "strategy.mode=fast"],
            "strategy.mode='fast': allowed values are default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs",
        ),
        (
            ["strategy=torch_eager", "strategy.mode=max-autotune"],
            "strategy.mode: unknown key; allowed keys under strategy are name",
        ),
        (
            ["strategy=torch_compile", "compile_cache=true"],
            "compile_cache=true: strategy=torch_compile has no persistent compilation cache",
        ),
    ],
)
def test_bad_torch_options_are_one_line(overrides, message):
    if "compile_cache=true" in overrides and not torch_loops.torch_available():
        pytest.skip(NO_TORCH)
    with pytest.raises(C.ConfigError) as err:
        cli.plan(overrides, multirun=False)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
