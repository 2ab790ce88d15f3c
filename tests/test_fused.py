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

Code paths: the library holds the kernel for AVX-512, AVX2 and the x86-64 baseline, with register
tiles of their own (8 rows of 2 x 512 bits, 6 of 2 x 256, 6 of 2 x 128: a Gram tile once ran past
its buffer with 256-bit vectors only). Each path this CPU runs is forced in turn
(``$PLNEXP_FUSED_ISA``) and checked against scan; a path it lacks is refused, tested with a faked
set of the CPU's paths.
"""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import plnexp
from plnexp.core.simulation import simulate
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


# every rule with each model on oaks (d = 1); on simulated data (d >= 2) every rule runs too, in the
# tests around this one: radam_clip and rprop above, adam in test_deterministic_and_large_blocks
# and the wider tiles, sgd in the float32 pairs (the same rules once more on SIM added ~20 s of CI)
@pytest.mark.slow
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("model", ["full", "profiled"])
def test_float64_curve_equals_scan_every_optimizer(model, optimizer, oaks):
    lr = 1e-5 if (model, optimizer) == ("full", "sgd") else None
    _check_float64(oaks, model, optimizer, n_iter=100, lr=lr)


# float32: each optimizer's rule once, each model twice (every pair runs in float64 above, where
# the kernel's formulas are checked to 1e-9; float32 adds the rounding of the same code: the other
# four pairs cost ~20 s of CI for no new check)
FLOAT32_PAIRS = [("full", "radam_clip"), ("profiled", "rprop"), ("full", "adam"), ("profiled", "sgd")]


@pytest.mark.slow
@pytest.mark.parametrize("model, optimizer", FLOAT32_PAIRS)
def test_float32_within_float32_rounding_of_scan(model, optimizer, oaks):
    _check_float32(simulate(**SIM), model, optimizer, n_iter=100)
    lr = 1e-5 if (model, optimizer) == ("full", "sgd") else None
    _check_float32(oaks, model, optimizer, n_iter=100, lr=lr)


@pytest.mark.slow  # ~2-3 s: in CI; the fast subset stays under 2 minutes
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
    from plnexp.core.optim import OPTIMIZERS as REGISTRY

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
        assert fused._register()[1] is None


# --- code paths ---------------------------------------------------------------------------------


@pytest.fixture
def force(monkeypatch):
    """``force(code_path)``: that path for the programs made from now on, or a skip saying why this
    CPU cannot run it. Returns a list that collects the path of every custom call traced from then
    on: a fit served by a program of another path would show there (strategies.build keeps programs
    per forced path)."""

    def force_path(code_path: str) -> list[str]:
        runs = fused.cpu_isas()
        if code_path not in runs:
            pytest.skip(f"this CPU cannot run the kernel's {code_path} code path (it runs {', '.join(runs)})")
        monkeypatch.setenv(fused.ISA_ENV, code_path)
        traced: list[str] = []
        real = fused.target
        monkeypatch.setattr(fused, "target", lambda precision, isa: traced.append(isa) or real(precision, isa))
        return traced

    return force_path


@pytest.mark.parametrize("code_path", fused.ISAS)
@pytest.mark.parametrize("model, optimizer", [("full", "radam_clip"), ("profiled", "rprop")])
def test_each_code_path_equals_scan(code_path, model, optimizer, force):
    traced = force(code_path)
    assert fused.isa() == code_path
    _check_float64(simulate(**SIM), model, optimizer, n_iter=30)  # n = 101: odd
    assert set(traced) == {code_path}


@pytest.mark.slow
@pytest.mark.parametrize("code_path", fused.ISAS)
def test_each_code_path_equals_scan_at_wider_tiles(code_path, force, oaks):
    """p = 40 and 114 (oaks): rows of several register tiles and a padded last one, on each path's
    tile sizes; n = 1001: 16 chunks of 63 rows, blocks of 48 and tails."""
    traced = force(code_path)
    wide = simulate(n=1001, p=40, d=3, seed=1)
    for data, model, optimizer in ((wide, "full", "adam"), (oaks, "profiled", "radam_clip")):
        _check_float64(data, model, optimizer, n_iter=20)
    _check_float32(wide, "full", "radam_clip", n_iter=20)
    assert set(traced) == {code_path}


def test_best_code_path_is_picked_and_a_missing_one_refused(monkeypatch):
    assert fused.isa("", runnable=("avx2", "baseline")) == "avx2"
    assert fused.isa("baseline", runnable=("avx512", "avx2", "baseline")) == "baseline"
    with pytest.raises(
        ValueError,
        match=r"^PLNEXP_FUSED_ISA=avx512: this CPU cannot run the kernel's avx512 code path, it runs avx2, "
        r"baseline; allowed values are avx512, avx2, baseline \(or unset for the best\)$",
    ):
        fused.isa("avx512", runnable=("avx2", "baseline"))
    with pytest.raises(
        ValueError, match=r"^PLNEXP_FUSED_ISA=sse4: unknown code path; allowed values are avx512, avx2, baseline$"
    ):
        fused.isa("sse4", runnable=("avx2", "baseline"))
    # through the strategy's check and a fit, on a CPU faked to run the baseline only: never SIGILL
    monkeypatch.setattr(fused, "cpu_isas", lambda: ("baseline",))
    monkeypatch.setenv(fused.ISA_ENV, "avx2")
    refusal = (
        r"^strategy=scan_fused: PLNEXP_FUSED_ISA=avx2: this CPU cannot run the kernel's avx2 code path, "
        r"it runs baseline; allowed values are avx512, avx2, baseline \(or unset for the best\)$"
    )
    with pytest.raises(ValueError, match=refusal):
        StrategySpec.of("scan_fused").check()
    with pytest.raises(ValueError, match=refusal):
        plnexp.fit(simulate(n=20, p=3), strategy="scan_fused", n_iter=2)


def test_stale_library_is_refused_in_one_line(monkeypatch):
    assert fused._abi_version(object()) == 1  # a library from before the version was exported
    monkeypatch.setattr(fused, "KERNEL_VERSION", fused.KERNEL_VERSION + 1)
    fused._register.cache_clear()
    try:
        with pytest.raises(
            ValueError,
            match=rf"^strategy=scan_fused: its native kernel _pln_fused\S* is version {fused.KERNEL_VERSION - 1}, "
            rf"this plnexp needs version {fused.KERNEL_VERSION} \(a stale build from an earlier install\): "
            r"rebuild it with pip install -e \. \(or reinstall plnexp\)$",
        ):
            StrategySpec.of("scan_fused").check()
    finally:
        monkeypatch.undo()
        fused._register.cache_clear()
        assert fused._register()[1] is None


def _call_handler(n=5, p=3, d=2, shapes=None, dtypes=None, rule=1):
    """The float32 handler of this CPU's best path called directly with ``shapes``/``dtypes``
    overriding the arguments' (by name), outside any fit."""
    names = ("Y", "O", "X", "B", "M", "S", "Omega", "coef", "um", "vm", "us", "vs")
    want = dict(Y=(n, p), O=(n, p), X=(n, d), B=(d, p), M=(n, p), S=(n, p), Omega=(p, p), coef=(10,))
    want.update({k: (n, p) for k in ("um", "vm", "us", "vs")})
    want.update(shapes or {})
    args = [jnp.ones(want[k], (dtypes or {}).get(k, jnp.float32)) for k in names]
    out = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    call = jax.ffi.ffi_call(
        fused.target("float32", fused.isa()),
        [out(n, p)] * 6 + [out(p), out(d, p), out(p, p), out(p), out(d, p)],
    )
    return jax.block_until_ready(call(*args, model=np.int32(0), rule=np.int32(rule)))


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(shapes={"M": (6, 3)}), "M has shape (6, 3), expected (n, p) = (5, 3) (n, p from Y; d from X)"),
        (dict(shapes={"B": (3, 3)}), "B has shape (3, 3), expected (d, p) = (2, 3) (n, p from Y; d from X)"),
        (dict(shapes={"coef": (4,)}), "coef has shape (4,), expected (10,) = (10,) (n, p from Y; d from X)"),
        (dict(shapes={"vs": (5, 2)}), "S's slot v has shape (5, 2), expected (n, p) = (5, 3) (n, p from Y; d from X)"),
        (dict(dtypes={"O": jnp.int32}), "O has dtype int32, expected float32 (this handler's)"),
        (dict(rule=7), "rule=7: allowed values are 0 (sgd), 1 (adam), 2 (radam_clip), 3 (rprop)"),
    ],
)
def test_handler_refuses_a_malformed_call_in_one_line(kw, message):
    _call_handler()  # well formed: runs
    with pytest.raises(Exception) as err:
        _call_handler(**kw)
    text = str(err.value)
    assert f"pln_fused_step: {message}" in text
    assert "\n" not in text.strip(), text
