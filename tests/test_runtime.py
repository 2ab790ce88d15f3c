"""plnexp.runtime: XLA flags only for a checked jaxlib, never over the user's; SciPy's OpenBLAS threads."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import spawn

from plnexp import runtime


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
        pytest.skip("SciPy's OpenBLAS not found in this process (not Linux, or another BLAS)")
    assert before == [1]  # import plnexp set it
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
