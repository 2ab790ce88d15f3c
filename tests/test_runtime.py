"""plnexp.system.runtime: XLA flags only for a checked jaxlib, never over the user's; SciPy's OpenBLAS threads;
applied only when asked (configure, the command line, a fit before JAX starts), never by ``import plnexp``."""

import json
import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import spawn

from plnexp.system import runtime


def test_flags_added_for_the_checked_jaxlib_only():
    env = {}
    runtime.set_xla_flags(env, version=runtime.CHECKED_JAXLIB[0])
    names = {f.split("=")[0] for f in env["XLA_FLAGS"].split()}
    assert "--xla_cpu_experimental_ynn_fusion_type" in names
    # the speed setting of the YNN flag still turns the miscompiled reduce fusion off
    assert (
        "-reduce" in dict(f.split("=", 1) for f in env["XLA_FLAGS"].split())["--xla_cpu_experimental_ynn_fusion_type"]
    )
    env = {}
    runtime.set_xla_flags(env, version="99.0.0")  # XLA aborts on unknown flags: add none
    assert env.get("XLA_FLAGS", "") == ""


def test_user_flags_are_kept_and_speed_flags_can_be_turned_off():
    env = {
        "XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=-reduce,-eltwise --xla_force_host_platform_device_count=2"
    }
    runtime.set_xla_flags(env, version=runtime.CHECKED_JAXLIB[0])
    flags = env["XLA_FLAGS"].split()
    assert flags[:2] == [
        "--xla_cpu_experimental_ynn_fusion_type=-reduce,-eltwise",
        "--xla_force_host_platform_device_count=2",
    ]
    assert sum(f.startswith("--xla_cpu_experimental_ynn_fusion_type") for f in flags) == 1
    env = {"PLNEXP_SPEED_FLAGS": "0"}
    runtime.set_xla_flags(env, version=runtime.CHECKED_JAXLIB[0])
    assert env["XLA_FLAGS"].split() == list(runtime.SAFETY_FLAGS)


def test_this_process_runs_with_plnexp_flags():
    if runtime.jaxlib_version() not in runtime.CHECKED_JAXLIB:
        pytest.skip(f"jaxlib {runtime.jaxlib_version()} is not a checked version: plnexp adds no flags")
    current = os.environ.get("XLA_FLAGS", "").split()
    for flag in runtime.plnexp_flags():
        assert any(c.split("=")[0] == flag.split("=")[0] for c in current), flag


def test_lapack_threads_can_be_set_and_restored():
    before = runtime.lapack_threads()
    if not before:
        pytest.skip("SciPy's OpenBLAS not found in this process (a SciPy built on another BLAS)")
    assert before == [1]  # conftest's plnexp.runtime.configure() set it
    try:
        assert runtime.set_lapack_threads(2) == [2]
        # a Cholesky through jaxlib's LAPACK still agrees with numpy either way
        a = np.random.default_rng(0).normal(size=(50, 50))
        spd = a @ a.T + 50 * np.eye(50)
        np.testing.assert_allclose(
            np.asarray(jax.jit(jnp.linalg.cholesky)(spd)), np.linalg.cholesky(spd), rtol=1e-4, atol=1e-4
        )
    finally:
        runtime.set_lapack_threads(1)
    assert runtime.lapack_threads() == [1]


@pytest.mark.slow
def test_checked_flags_are_accepted_by_this_jaxlib():
    """XLA aborts the process on an unknown flag: a computation under exactly plnexp's flags runs. A
    fresh process, as the point: XLA reads its flags once, when JAX starts its CPU backend."""
    if runtime.jaxlib_version() not in runtime.CHECKED_JAXLIB:
        pytest.skip(f"jaxlib {runtime.jaxlib_version()} is not a checked version")
    env = {**os.environ, "XLA_FLAGS": " ".join(runtime.plnexp_flags())}
    code = "import jax, jax.numpy as jnp; print(float(jax.jit(lambda a: (a @ a).sum())(jnp.ones((64, 64)))))"
    proc = spawn([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = proc.communicate(timeout=120)  # ended at teardown (conftest's reap) if it outlives this
    assert proc.returncode == 0, err[-500:]
    assert float(out.strip()) == 64.0**3


def _python(code: str, **env: str) -> dict:
    """Run ``code`` in a fresh Python (XLA_FLAGS unset: as a user's process starts) and return the
    JSON it prints last."""
    environ = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | env
    proc = spawn([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
    out, err = proc.communicate(timeout=300)  # ended at teardown (conftest's reap) if it outlives this
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_import_changes_nothing_and_configure_applies_the_settings_once():
    """A fresh process: ``import plnexp`` leaves the environment, every jax.config value, SciPy's
    OpenBLAS threads and JAX's backend as they were; configure() then adds the flags before JAX
    starts, sets one thread, and a second call changes nothing."""
    code = """
import json, os
import jax  # jax's own import sets variables of its own: not plnexp's doing
env, config = dict(os.environ), dict(jax.config.values)
import plnexp
from plnexp import runtime
out = {"env_same": dict(os.environ) == env, "config_same": dict(jax.config.values) == config,
       "threads_after_import": runtime.lapack_threads(), "started": runtime.backend_started()}
first = runtime.configure()
flags = os.environ.get("XLA_FLAGS", "")
jax.numpy.ones(3).block_until_ready()
second = runtime.configure()
out.update(added=list(first.xla_flags_added), flags=flags, threads=list(first.lapack_threads),
           started_then=runtime.backend_started(), again=list(second.xla_flags_added),
           flags_again=os.environ.get("XLA_FLAGS", ""), missing_again=list(second.xla_flags_missing),
           config_same_after=dict(jax.config.values) == config)
print(json.dumps(out))
"""
    got = _python(code, OPENBLAS_NUM_THREADS="2")
    assert got["env_same"] and got["config_same"] and got["config_same_after"], got
    assert got["threads_after_import"] in ([2], []), "import plnexp left SciPy's OpenBLAS alone"
    assert got["started"] is False and got["started_then"] is True
    if runtime.jaxlib_version() in runtime.CHECKED_JAXLIB:
        assert got["added"] == list(runtime.plnexp_flags()) and got["flags"].split() == got["added"]
    assert got["threads"] in ([1], [])
    assert got["again"] == [] and got["flags_again"] == got["flags"] and got["missing_again"] == []


@pytest.mark.slow
def test_the_command_line_applies_the_settings():
    """A command applies plnexp's settings before its handler runs (a command line naming no command
    is refused before them: nothing of it runs)."""
    code = """
import json, os
from plnexp import runtime
from plnexp.__main__ import main
before = os.environ.get("XLA_FLAGS")
code = main(["report", "--no-such-option"])  # a command's bad option: exit status 2, after the settings
print(json.dumps({"before": before, "code": code, "flags": os.environ.get("XLA_FLAGS", ""),
                  "threads": runtime.lapack_threads()}))
"""
    got = _python(code, OPENBLAS_NUM_THREADS="2")
    assert got["before"] is None and got["code"] == 2
    assert got["flags"].split() == list(runtime.plnexp_flags()) and got["threads"] in ([1], [])


@pytest.mark.slow  # fast subset under 2 minutes: CI runs it
def test_a_fit_before_jax_starts_applies_the_settings_without_a_warning():
    code = """
import json, os, warnings
warnings.simplefilter("error")  # a SettingsWarning would end the process
import plnexp
res = plnexp.fit(plnexp.simulate(n=20, p=4, d=1).Y, n_iter=3, timed=False, compile_cache=False)
print(json.dumps({"flags": os.environ.get("XLA_FLAGS", ""), "threads": plnexp.system.runtime.lapack_threads()}))
"""
    got = _python(code, OPENBLAS_NUM_THREADS="2")
    assert got["flags"].split() == list(runtime.plnexp_flags()) and got["threads"] in ([1], [])


@pytest.fixture
def warnings_anew():
    """The once-per-process SettingsWarning may be shown again in this test, and is not after it."""
    runtime._warn_once.cache_clear()
    yield
    runtime._warn_once.cache_clear()


def test_a_fit_after_jax_started_without_the_flags_warns_once(monkeypatch, warnings_anew):
    """JAX started (this process's backend is), and XLA_FLAGS lacks plnexp's flags: the fits run as
    the process is, with one warning line naming what is missing and the fix, pointing at the
    caller's line; XLA_FLAGS is left alone (the flags could no longer take effect)."""
    if runtime.jaxlib_version() not in runtime.CHECKED_JAXLIB:
        pytest.skip(f"jaxlib {runtime.jaxlib_version()} is not a checked version: plnexp adds no flags")
    import plnexp

    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    data = plnexp.simulate(n=20, p=4, d=1)
    assert runtime.backend_started()
    with pytest.warns(runtime.SettingsWarning) as caught:
        plnexp.fit(data, n_iter=2, timed=False, compile_cache=False)
        plnexp.fit(data, n_iter=2, timed=False, compile_cache=False)
    (w,) = [c for c in caught if issubclass(c.category, runtime.SettingsWarning)]
    text = str(w.message)
    assert "\n" not in text and w.filename == __file__
    assert text.startswith("JAX started its backend without plnexp's process settings (XLA_FLAGS lacks --xla_")
    assert text.endswith("call plnexp.runtime.configure() before any JAX computation")
    assert all(flag in text for flag in runtime.plnexp_flags())
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=1"
    # configure() now: it cannot add the flags either; it says so, in the same once-per-process line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settings = runtime.configure()
    assert settings.backend_started and settings.xla_flags_added == ()
    assert settings.xla_flags_missing == runtime.plnexp_flags()


def test_flags_that_already_have_plnexps_values_need_no_warning(monkeypatch, warnings_anew):
    import plnexp

    monkeypatch.setenv("XLA_FLAGS", " ".join(runtime.plnexp_flags()))
    with warnings.catch_warnings():
        warnings.simplefilter("error", runtime.SettingsWarning)
        plnexp.fit(plnexp.simulate(n=20, p=4, d=1), n_iter=2, timed=False, compile_cache=False)
    assert runtime.missing() == []
    assert runtime.describe()["plnexp_xla_flags_missing"] == "none"


def test_usable_cores_are_the_affinity_else_the_machines_count(monkeypatch):
    """The one count of cores a process may use (the draw's threads, torch's, the floor's record)."""
    from plnexp.system import machine

    assert machine.usable_cores() == len(os.sched_getaffinity(0))
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    assert machine.usable_cores() == 7
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert machine.usable_cores() == 1
