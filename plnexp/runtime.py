"""Process-wide settings that ``import plnexp`` applies before JAX starts its CPU backend.

Two things decide how fast (and how correctly) a fit runs on a CPU, and both must be set before
the first computation, so they live here and nowhere else:

1. **XLA flags.** XLA reads ``XLA_FLAGS`` once, when JAX creates its CPU client (lazily, at the
   first computation). An unknown flag makes XLA abort the process, so flags are only added for a
   jaxlib on which they were checked (:data:`CHECKED_JAXLIB`); on any other version plnexp adds
   none and says so in :func:`describe` (``python -m plnexp doctor`` later). A flag the user
   already set in ``XLA_FLAGS`` is never overridden.

   - :data:`SAFETY_FLAGS`: jaxlib 0.10.2 on x86 CPUs miscompiles at least one fused reduction
     (``jit`` of ``sum(log(sqrt(2*pi*k)) + k*log(k/e))`` over the oaks counts returns 1113766.9
     instead of 1285968.2); turning off the experimental YNN reduce fusion avoids it. Every fit
     also checks its compiled ELBO against a float64 host reference (``fitting.check_against_host``).
   - :data:`SPEED_FLAGS`: measured on the PLN step (``benchmarks/flags.py``); opt out with
     ``PLNEXP_SPEED_FLAGS=0`` in the environment.

2. **LAPACK threads.** On CPU, jaxlib runs Cholesky and triangular solves through SciPy's bundled
   OpenBLAS. A 114 x 114 factorisation gains nothing from threads, but OpenBLAS's idle worker
   then spins on one of the cores while XLA's own fusions and dots want both: on a 2-core machine
   the whole PLN step ran about twice as slow. ``import plnexp`` sets that OpenBLAS to one thread
   (:func:`set_lapack_threads`, at run time through its C API, so it works even if SciPy was
   imported first); call ``plnexp.runtime.set_lapack_threads(n)`` to undo it. NumPy's own
   OpenBLAS (a different library, ILP64) is left alone.
"""

from __future__ import annotations

import ctypes
import os
from importlib import metadata

CHECKED_JAXLIB = ("0.10.2",)
SAFETY_FLAGS = ("--xla_cpu_experimental_ynn_fusion_type=-reduce",)
# Measured with benchmarks/flags.py on W1 (scan, analytic gradient, 2-core x86 CPU): 9.68 -> 7.88
# ms/iter together (multi-output fusion alone 1.15x; the others 1.01-1.03x alone). The last one
# keeps the safety setting (-reduce) and also routes single dots to Eigen instead of YNN.
SPEED_FLAGS = (
    "--xla_backend_extra_options=xla_cpu_use_multi_output_fusion",
    "--xla_cpu_copy_insertion_use_region_analysis=true",
    "--xla_cpu_prefer_vector_width=512",
    "--xla_cpu_experimental_ynn_fusion_type=-reduce,-individual_dot",
)


def _flag_name(flag: str) -> str:
    return flag.split("=", 1)[0]


def jaxlib_version() -> str:
    """The installed jaxlib's version, read from its metadata (importing jaxlib is not needed)."""
    try:
        return metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        return "not installed"


def plnexp_flags(environ=os.environ, version: str | None = None) -> tuple[str, ...]:
    """The XLA flags plnexp adds for this jaxlib (none on a version it has not checked)."""
    if (version or jaxlib_version()) not in CHECKED_JAXLIB:
        return ()
    speed = environ.get("PLNEXP_SPEED_FLAGS", "1") not in ("0", "false", "no")
    chosen = {_flag_name(f): f for f in SAFETY_FLAGS}
    if speed:  # a speed flag may refine a safety flag of the same name (it then keeps its setting)
        chosen.update({_flag_name(f): f for f in SPEED_FLAGS})
    return tuple(chosen.values())


def set_xla_flags(environ=os.environ, version: str | None = None) -> str:
    """Append :func:`plnexp_flags` to ``XLA_FLAGS``, skipping any flag name the user already set."""
    current = environ.get("XLA_FLAGS", "")
    present = {_flag_name(f) for f in current.split()}
    added = [f for f in plnexp_flags(environ, version) if _flag_name(f) not in present]
    if added:
        environ["XLA_FLAGS"] = " ".join([current, *added]).strip()
    return environ.get("XLA_FLAGS", "")


# ---------------------------------------------------------------- LAPACK (SciPy's OpenBLAS) threads
_SETTERS = ("scipy_openblas_set_num_threads", "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads", "openblas_get_num_threads")


def _lapack_libraries() -> list[ctypes.CDLL]:
    """SciPy's OpenBLAS, the library jaxlib's CPU LAPACK kernels call (loaded by importing SciPy)."""
    import scipy.linalg.cython_lapack  # noqa: F401 - loads it; jaxlib itself imports it too

    found: list[ctypes.CDLL] = []
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "openblas" in line.lower()}
    except OSError:  # not Linux: leave the library's own default
        return found
    for path in sorted(paths):
        if "openblas64" in os.path.basename(path):  # NumPy's ILP64 build: not ours to change
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if any(hasattr(lib, s) for s in _SETTERS):
            found.append(lib)
    return found


def lapack_threads() -> list[int]:
    """The thread count SciPy's OpenBLAS reports now, per library found (usually one)."""
    counts = []
    for lib in _lapack_libraries():
        getter = next((getattr(lib, g) for g in _GETTERS if hasattr(lib, g)), None)
        if getter is not None:
            getter.restype = ctypes.c_int
            counts.append(int(getter()))
    return counts


def set_lapack_threads(n: int) -> list[int]:
    """Set SciPy's OpenBLAS to ``n`` threads; returns :func:`lapack_threads` afterwards."""
    for lib in _lapack_libraries():
        next(getattr(lib, s) for s in _SETTERS if hasattr(lib, s))(ctypes.c_int(n))
    return lapack_threads()


def describe(environ=os.environ) -> dict[str, str]:
    """What this module did, for run tags and reports."""
    version = jaxlib_version()
    checked = version in CHECKED_JAXLIB
    return {
        "xla_flags": environ.get("XLA_FLAGS", ""),
        "plnexp_xla_flags": " ".join(plnexp_flags(environ, version))
        if checked
        else f"none (jaxlib {version} not in the checked versions {', '.join(CHECKED_JAXLIB)})",
        "lapack_threads": ",".join(str(c) for c in lapack_threads()) or "unknown",
    }
