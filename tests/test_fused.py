"""strategy=scan_fused: its curve is scan's (the kernel repeats the maths and optax's formulas).

Independent reference: the ``scan`` strategy (XLA's step, optax's optimizers). Tolerances:

- float64: 1e-9 relative on every iteration of the curve (measured: <= 2e-13 on oaks and on
  simulated data, every optimizer and model, 100 iterations);
- float32: the kernel's exp/log and sums round differently from XLA's, and a fit amplifies
  rounding the same way whichever program runs it; the yardstick is float32 itself: the fused
  float32 curve must be as close to scan's float32 curve as scan's float32 curve is to its float64
  one (x2, plus 1e-6). Measured on oaks, 100 iterations: fused-vs-scan <= 6.5e-3 (rprop's early,
  sign-driven steps) where scan32-vs-scan64 is 4.1e-3; final ELBOs 1e-5 or closer.

The oaks ``sgd`` fit of the full model at its default rate (1e-4) is chaotic (a 1e-16 change
grows x100 per 10 iterations: scan's own float32 and float64 curves differ by 20%); it is tested
at lr 1e-5, where it is not.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import plnexp
from plnexp.data import simulate
from plnexp.strategies import StrategySpec, fused

pytestmark = pytest.mark.native
if fused.library_path() is None:
    if shutil.which("g++") or shutil.which("c++"):
        pytest.fail(
            "a C++ compiler is here but the scan_fused kernel was not built: reinstall (pip install -e .)",
            pytrace=False,
        )
    pytest.skip("the scan_fused kernel is not built here (no C++ compiler at install time)", allow_module_level=True)

OPTIMIZERS = ("radam_clip", "adam", "rprop", "sgd")


def _curve_rdiff(a, b) -> float:
    return float(np.nanmax(np.abs(a.elbo - b.elbo) / np.abs(b.elbo)))


def _final_rdiff(a, b) -> float:
    return abs(a.loglik - b.loglik) / abs(b.loglik)


def _pair(data, precision, **kw):
    return (
        plnexp.fit(data, strategy="scan_fused", precision=precision, timed=False, **kw),
        plnexp.fit(data, strategy="scan", precision=precision, timed=False, **kw),
    )


def _check_float64(data, model, optimizer, n_iter, lr=None):
    fused_fit, scan_fit = _pair(data, "float64", model=model, optimizer=optimizer, n_iter=n_iter, lr=lr)
    assert fused_fit.n_iter == scan_fit.n_iter == n_iter
    assert _curve_rdiff(fused_fit, scan_fit) < 1e-9
    for key in ("B", "Sigma"):
        np.testing.assert_allclose(fused_fit.params[key], scan_fit.params[key], rtol=1e-7, atol=1e-9)


def _check_float32(data, model, optimizer, n_iter, lr=None):
    kw = dict(model=model, optimizer=optimizer, n_iter=n_iter, lr=lr)
    fused32, scan32 = _pair(data, "float32", **kw)
    scan64 = plnexp.fit(data, strategy="scan", precision="float64", timed=False, **kw)
    assert _curve_rdiff(fused32, scan32) <= 2 * _curve_rdiff(scan32, scan64) + 1e-6
    assert _final_rdiff(fused32, scan32) <= 2 * _final_rdiff(scan32, scan64) + 1e-6


# odd n (101: not a multiple of the kernel's row blocks or tiles), odd p, d = 2
SIM = dict(n=101, p=7, d=2, seed=3)


@pytest.mark.parametrize("model, optimizer", [("full", "radam_clip"), ("profiled", "rprop")])
def test_float64_curve_equals_scan_simulated(model, optimizer):
    _check_float64(simulate(**SIM), model, optimizer, n_iter=30)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("model", ["full", "profiled"])
def test_float64_curve_equals_scan_every_optimizer(model, optimizer, oaks):
    _check_float64(simulate(**SIM), model, optimizer, n_iter=100)
    lr = 1e-5 if (model, optimizer) == ("full", "sgd") else None
    _check_float64(oaks, model, optimizer, n_iter=100, lr=lr)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("model", ["full", "profiled"])
def test_float32_within_float32_rounding_of_scan(model, optimizer, oaks):
    _check_float32(simulate(**SIM), model, optimizer, n_iter=100)
    lr = 1e-5 if (model, optimizer) == ("full", "sgd") else None
    _check_float32(oaks, model, optimizer, n_iter=100, lr=lr)


def test_deterministic_and_large_blocks():
    # n = 1001 rows: 16 chunks of 63 rows, blocks of 48 and tails; two runs give the same bits
    data = simulate(n=1001, p=40, d=3, seed=1)
    a = plnexp.fit(data, strategy="scan_fused", model="full", optimizer="adam", n_iter=20, precision="float64")
    b = plnexp.fit(data, strategy="scan_fused", model="full", optimizer="adam", n_iter=20, precision="float64")
    np.testing.assert_array_equal(a.elbo, b.elbo)
    ref = plnexp.fit(data, strategy="scan", model="full", optimizer="adam", n_iter=20, precision="float64")
    assert _curve_rdiff(a, ref) < 1e-9


def test_refuses_what_the_kernel_does_not_compute():
    with pytest.raises(
        ValueError, match=r"^strategy=scan_fused with gradient=autodiff: .*allowed gradients are analytic$"
    ):
        plnexp.fit(simulate(n=20, p=3), strategy="scan_fused", gradient="autodiff", n_iter=2)
    with pytest.raises(
        ValueError,
        match=r"^strategy=scan_fused with optimizer=lbfgs: .*allowed optimizers are "
        r"sgd, adam, radam_clip, rprop$",
    ):
        fused.check_fit("scan_fused", "lbfgs", "analytic")
    with pytest.raises(ValueError, match=r"^strategy=scan_fused with device=gpu: .*allowed devices are cpu$"):
        StrategySpec.of("scan_fused").check(platform="gpu")


def test_rules_name_registry_optimizers():
    from plnexp.optim import OPTIMIZERS as REGISTRY

    assert set(fused.RULES) <= set(REGISTRY)


def test_missing_kernel_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(fused, "library_path", lambda: None)
    fused._register.cache_clear()
    try:
        with pytest.raises(
            ValueError,
            match=r"^strategy=scan_fused: its native kernel was not built .*choose another "
            r"strategy$",
        ):
            StrategySpec.of("scan_fused").check()
    finally:
        monkeypatch.undo()
        fused._register.cache_clear()
        assert fused._register() is None


VECTOR_BUILDS = {"256-bit vectors (AVX2)": "-march=x86-64-v3"}


@pytest.mark.slow
@pytest.mark.parametrize("build", list(VECTOR_BUILDS))
def test_other_vector_width_build_equals_scan(build, tmp_path):
    """The kernel's tiles depend on the vector width it is built for (8-row tiles with AVX-512, 6-row
    tiles with AVX2: a Gram tile once ran past its buffer there). Build it for the other width, where
    this CPU runs it, and check it against scan in a process that loads that build."""
    import subprocess
    import sys

    import jax

    from plnexp.paths import REPO

    flags = VECTOR_BUILDS[build]
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler here to build the kernel for another vector width")
    if "avx2" not in open("/proc/cpuinfo").read():
        pytest.skip(f"this CPU cannot run a {build} build")
    lib = tmp_path / "pln_fused_other.so"
    subprocess.run(
        [
            cxx,
            "-std=c++17",
            "-O2",
            flags,
            "-fno-math-errno",
            "-w",
            "-fPIC",
            "-shared",
            f"-I{jax.ffi.include_dir()}",
            str(REPO / "plnexp" / "native" / "pln_fused_step.cc"),
            "-o",
            str(lib),
        ],
        check=True,
        capture_output=True,
    )
    code = """
import sys, numpy as np, plnexp
from plnexp.data import simulate
worst = 0.0
for data in (simulate(n=101, p=7, d=2, seed=3), simulate(n=1001, p=40, d=3, seed=1), plnexp.load_oaks()):
    for model, opt in (("full", "radam_clip"), ("profiled", "rprop")):
        kw = dict(model=model, optimizer=opt, n_iter=20, precision="float64")
        f = plnexp.fit(data, strategy="scan_fused", **kw)
        s = plnexp.fit(data, strategy="scan", **kw)
        worst = max(worst, float(np.nanmax(np.abs(f.elbo - s.elbo) / np.abs(s.elbo))))
print(worst)
"""
    env = {**__import__("os").environ, fused.LIBRARY_ENV: str(lib)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip().splitlines()[-1]) < 1e-9
