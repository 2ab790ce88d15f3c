"""The doctor's checks of the machine: package versions, JAX's devices per platform, float64 (x64),
the XLA flags plnexp set (:mod:`plnexp.system.runtime`), SciPy's OpenBLAS threads, and SLURM (the
client and a controller that answers, for ``hydra/launcher=slurm``)."""

from __future__ import annotations

import os
import platform
from importlib import metadata

from ...system import runtime
from ...system.paths import install_command
from .check import finding

PACKAGES = ("jax", "jaxlib", "optax", "numpy", "scipy", "mlflow", "hydra-core", "plnexp")


@finding
def versions() -> tuple[bool | None, str]:
    found = [f"python {platform.python_version()}"]
    for name in PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    return None, ", ".join(found)


def all_devices() -> list:
    """Every device of every JAX backend this process initialised (the default one and the others)."""
    import jax
    from jax.extend.backend import backends

    jax.devices()  # initialises the backends
    return [d for client in backends().values() for d in client.devices()]


def device_label(device) -> str:
    return f"{device.platform}:{device.id}"


@finding
def devices() -> tuple[bool | None, str]:
    import jax

    by_platform: dict[str, list[str]] = {}
    for d in all_devices():
        by_platform.setdefault(d.platform, []).append(f"{device_label(d)} {d.device_kind}")
    if not by_platform:
        return False, "JAX found no device"
    detail = "; ".join(f"{p}: {len(ds)} ({', '.join(ds)})" for p, ds in by_platform.items())
    return True, f"{detail}; default backend {jax.default_backend()}"


def x64_works() -> bool:
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(True):
        out = jax.jit(lambda a: a * 2.0)(jnp.arange(3, dtype=jnp.float64))
        return out.dtype == jnp.float64


@finding
def x64() -> tuple[bool | None, str]:
    if x64_works():
        return True, "float64 computations available under jax.enable_x64(True)"
    return False, "jax.enable_x64(True) still computes in float32: precision=float64 is unavailable"


@finding
def xla_flags(environ=os.environ, version: str | None = None) -> tuple[bool | None, str]:
    """XLA_FLAGS now, and the flags plnexp adds for this jaxlib (none for an unchecked one)."""
    version = version or runtime.jaxlib_version()
    current = environ.get("XLA_FLAGS", "")
    shown = f"XLA_FLAGS={current!r}"
    if version not in runtime.CHECKED_JAXLIB:
        return None, (
            f"plnexp added no XLA flags (jaxlib {version} is not among the checked "
            f"versions {', '.join(runtime.CHECKED_JAXLIB)}); {shown}"
        )
    missing = runtime._absent_flags(environ, version)
    if missing:
        return False, (
            f"jaxlib {version} is checked but XLA_FLAGS lacks {' '.join(missing)} "
            f"(was plnexp.runtime.configure() called before JAX started?); {shown}"
        )
    present = dict((f.split("=", 1) + [""])[:2] for f in current.split())
    for flag in runtime.SAFETY_FLAGS:  # a user's own value for a safety flag's name is kept: does it keep the safety?
        name, value = flag.split("=", 1)
        if not set(value.split(",")) <= set(present[name].split(",")):
            return False, (
                f"XLA_FLAGS sets {name}={present[name]}, without plnexp's safety "
                f"setting {value} (see plnexp/system/runtime.py); {shown}"
            )
    added = runtime.plnexp_flags(environ, version)
    return True, f"jaxlib {version} is checked; plnexp's flags: {' '.join(added)}; {shown}"


@finding
def lapack_threads() -> tuple[bool | None, str]:
    threads = runtime.lapack_threads()
    if not threads:
        return None, "SciPy's OpenBLAS not found in this process (a SciPy built on another BLAS)"
    return None, f"SciPy's OpenBLAS (jaxlib's CPU LAPACK) runs {','.join(map(str, threads))} thread(s)"


@finding
def slurm(run=None) -> tuple[bool | None, str]:
    """Whether ``hydra/launcher=slurm`` can submit from here: the cluster extra, the SLURM client
    (sbatch, squeue, scancel) and a controller that answers (``sinfo``: its partitions)."""
    import importlib.util
    import shutil
    import subprocess

    run = run or subprocess.run
    missing = [tool for tool in ("sbatch", "squeue", "scancel") if shutil.which(tool) is None]
    if missing:
        return None, (
            f"no SLURM client here ({', '.join(missing)} not on PATH): sweeps run on this "
            "machine (hydra/launcher=slurm needs a login node)"
        )
    if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
        # plnexp's own sweeps still run here: the cluster is an option this install does not use
        return None, (
            "SLURM client found but plnexp's cluster extra is not installed (hydra/launcher=slurm "
            f"needs it: {install_command('cluster')}); sweeps run on this machine"
        )
    try:
        out = run(["sinfo", "-h", "-o", "%P %a %D %t"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"sinfo failed: {e}"
    if out.returncode != 0:  # a client with no cluster configured: nothing this machine must do
        first = (out.stderr or out.stdout).strip().splitlines()
        return None, (
            f"warning: SLURM client found but no controller answers "
            f"({first[0] if first else out.returncode}): hydra/launcher=slurm cannot submit "
            "from here"
        )
    parts = sorted({line.split()[0] for line in out.stdout.splitlines() if line.strip()})
    return True, (
        f"controller answers; partitions: {', '.join(parts) or '(none)'} "
        "(hydra/launcher=slurm hydra.launcher.partition=NAME)"
    )
