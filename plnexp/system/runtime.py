"""Process-wide settings for fast and correct CPU fits, applied only when asked: :func:`configure`.

``import plnexp`` changes nothing in the process. Two settings decide how fast (and how correctly)
a fit runs on a CPU, and both belong to the whole process, so plnexp applies them only where it
owns the process or where nothing has used JAX yet:

- the command line (``python -m plnexp``, and each job of a sweep, in whatever process its
  launcher runs it) calls :func:`configure` before JAX starts;
- :func:`plnexp.fit` calls :func:`configure` when JAX has not started its backend yet; when it has,
  the fit runs as the process is and one :class:`SettingsWarning` (once per process) says what is
  missing and how to fix it: call ``plnexp.runtime.configure()`` before any JAX computation.

1. **XLA flags.** XLA reads ``XLA_FLAGS`` once, when JAX creates its CPU client (lazily, at the
   first computation), so a flag set later has no effect in this process: :func:`configure` then
   leaves ``XLA_FLAGS`` alone (the run tags would otherwise claim flags that are not in effect). An
   unknown flag makes XLA abort the process, so flags are only added for a jaxlib on which they
   were checked (:data:`CHECKED_JAXLIB`); on any other version plnexp adds none and says so in
   :func:`describe` (``python -m plnexp doctor`` later). A flag the user already set in
   ``XLA_FLAGS`` is never overridden (nor reported missing).

   - :data:`SAFETY_FLAGS`: jaxlib 0.10.2 on x86 CPUs miscompiles at least one fused reduction
     (``jit`` of ``sum(log(sqrt(2*pi*k)) + k*log(k/e))`` over the oaks counts returns 1113766.9
     instead of 1285968.2); turning off the experimental YNN reduce fusion avoids it. Every fit
     also checks its compiled ELBO against a float64 host reference (``fitting.check_against_host``).
   - :data:`SPEED_FLAGS`: measured on the PLN step (``benchmarks/flags.py``); opt out with
     ``PLNEXP_SPEED_FLAGS=0`` in the environment.

2. **LAPACK threads.** On CPU, jaxlib runs Cholesky and triangular solves through SciPy's bundled
   OpenBLAS. A 114 x 114 factorisation gains nothing from threads, but OpenBLAS's idle worker
   then spins on one of the cores while XLA's own fusions and dots want both: on a 2-core machine
   the whole PLN step ran much slower (docs/results.md, "Where the time goes, and other
   figures"). :func:`configure` sets that OpenBLAS to one thread
   (:func:`set_lapack_threads`, at run time through its C API by threadpoolctl, so it works even if SciPy was
   imported first, and even after JAX started); call ``plnexp.system.runtime.set_lapack_threads(n)`` to
   undo it. NumPy's own OpenBLAS (a different library, ILP64) is left alone.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import FrameType

from . import jax_compat
from .versions import installed

CHECKED_JAXLIB = ("0.10.2",)
SAFETY_FLAGS = ("--xla_cpu_experimental_ynn_fusion_type=-reduce",)
# benchmarks/flags.py measures them on W1 (scan, analytic gradient); figures in docs/results.md,
# "Where the time goes, and other figures". Multi-output fusion is the flag that matters most; the
# others add a little each. The last one keeps the safety setting (-reduce) and also routes single
# dots to Eigen instead of YNN.
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
    return installed("jaxlib") or "not installed"


def plnexp_flags(environ=os.environ, version: str | None = None) -> tuple[str, ...]:
    """The XLA flags plnexp adds for this jaxlib (none on a version it has not checked)."""
    if (version or jaxlib_version()) not in CHECKED_JAXLIB:
        return ()
    speed = environ.get("PLNEXP_SPEED_FLAGS", "1") not in ("0", "false", "no")
    chosen = {_flag_name(f): f for f in SAFETY_FLAGS}
    if speed:  # a speed flag may refine a safety flag of the same name (it then keeps its setting)
        chosen.update({_flag_name(f): f for f in SPEED_FLAGS})
    return tuple(chosen.values())


def _absent_flags(environ=os.environ, version: str | None = None) -> tuple[str, ...]:
    """Those of :func:`plnexp_flags` whose name ``XLA_FLAGS`` does not set (a user's own value for a
    name counts as set: plnexp never overrides it)."""
    present = {_flag_name(f) for f in environ.get("XLA_FLAGS", "").split()}
    return tuple(f for f in plnexp_flags(environ, version) if _flag_name(f) not in present)


def set_xla_flags(environ=os.environ, version: str | None = None) -> str:
    """Append :func:`plnexp_flags` to ``XLA_FLAGS``, skipping any flag name the user already set.

    Only edits ``environ``: whether XLA reads them is :func:`configure`'s business."""
    added = _absent_flags(environ, version)
    if added:
        environ["XLA_FLAGS"] = " ".join([environ.get("XLA_FLAGS", ""), *added]).strip()
    return environ.get("XLA_FLAGS", "")


# ---------------------------------------------------------------- LAPACK (SciPy's OpenBLAS) threads
def _scipy_openblas():
    """SciPy's OpenBLAS, the library jaxlib's CPU LAPACK kernels call (loaded by importing SciPy), as
    threadpoolctl finds it among the libraries loaded in this process (a selection of its
    ``ThreadpoolController``); NumPy's own OpenBLAS (ILP64, ``openblas64``) is not ours to change."""
    import scipy.linalg.cython_lapack  # noqa: F401 - loads it; jaxlib itself imports it too
    from threadpoolctl import ThreadpoolController

    found = ThreadpoolController().select(internal_api="openblas")
    return found.select(filepath=[i["filepath"] for i in found.info() if "openblas64" not in Path(i["filepath"]).name])


def lapack_threads() -> list[int]:
    """The thread count SciPy's OpenBLAS reports now, per library found (usually one)."""
    return [i["num_threads"] for i in _scipy_openblas().info()]


def set_lapack_threads(n: int) -> list[int]:
    """Set SciPy's OpenBLAS to ``n`` threads; returns :func:`lapack_threads` afterwards."""
    _scipy_openblas().limit(limits=n)  # not undone on return: threadpoolctl's limit as a plain call
    return lapack_threads()


# ---------------------------------------------------------------- applying them
LAPACK_THREADS = 1  # what configure() sets SciPy's OpenBLAS to (see the module's doc)


class SettingsWarning(UserWarning):
    """JAX started its CPU backend without plnexp's process settings; the fit runs without them
    (one line saying what is missing and how to fix it, once per process)."""


def backend_started() -> bool:
    """Whether JAX has created its backends (and XLA has read ``XLA_FLAGS``), found without starting
    them (:func:`plnexp.system.jax_compat.backends_initialized`); False while JAX is not even imported."""
    return jax_compat.backends_initialized()


def missing(environ=os.environ) -> list[str]:
    """plnexp's settings that this process lacks now, each in words (empty: none lacks)."""
    lacking = []
    flags = _absent_flags(environ)
    if flags:
        lacking.append(f"XLA_FLAGS lacks {' '.join(flags)}")
    threads = lapack_threads()
    if any(t != LAPACK_THREADS for t in threads):
        lacking.append(f"SciPy's OpenBLAS runs {','.join(map(str, threads))} threads instead of {LAPACK_THREADS}")
    return lacking


@dataclass(frozen=True)
class Settings:
    """What :func:`configure` did: the XLA flags it added to ``XLA_FLAGS``, those it could not make
    take effect (JAX had already started its backend: ``backend_started``), and SciPy's OpenBLAS
    thread count afterwards (one per library found; empty where none was)."""

    xla_flags_added: tuple[str, ...]
    xla_flags_missing: tuple[str, ...]
    lapack_threads: tuple[int, ...]
    backend_started: bool
    xla_flags: str  # XLA_FLAGS afterwards


def configure(environ=os.environ) -> Settings:
    """Apply plnexp's process settings (see the module's doc): its XLA flags, if JAX has not started
    its backend yet, and one SciPy OpenBLAS thread. Idempotent: a second call changes nothing.

    Call it before any JAX computation (the command line does, in every process it runs fits in).
    Where JAX has already started, ``XLA_FLAGS`` is left alone (the flags could no longer take
    effect in this process), the flags are reported in ``xla_flags_missing``, and one
    :class:`SettingsWarning` says so (once per process)."""
    started = backend_started()
    added = () if started else _absent_flags(environ)
    if added:
        set_xla_flags(environ)
    threads = tuple(set_lapack_threads(LAPACK_THREADS))
    settings = Settings(added, _absent_flags(environ), threads, started, environ.get("XLA_FLAGS", ""))
    if settings.xla_flags_missing:
        _warn_once(f"XLA_FLAGS lacks {' '.join(settings.xla_flags_missing)}")
    return settings


def configure_or_warn(environ=os.environ) -> Settings | None:
    """For a library call (:func:`plnexp.fit`): :func:`configure` while JAX has not started its
    backend (nothing in the process can have depended on these settings yet); else leave the process
    as it is, with one :class:`SettingsWarning` (once per process) if it lacks any of them. Returns
    what :func:`configure` did, or None when it was not called."""
    if not backend_started():
        return configure(environ)
    lacking = missing(environ)
    if lacking:
        _warn_once("; ".join(lacking))
    return None


@cache  # once per process and problem: the warning is about the process, whose backend stays as it started
def _warn_once(lacking: str) -> None:
    warnings.warn(
        f"JAX started its backend without plnexp's process settings ({lacking}), so fits may run slower "
        "(or, without the safety flag, hit a jaxlib miscompile that plnexp's host check refuses); call "
        "plnexp.runtime.configure() before any JAX computation",
        SettingsWarning,
        stacklevel=caller_stacklevel(),
    )


def caller_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside plnexp, for a warning raised by the caller of
    this function: it points at the user's line (``plnexp.fit(...)``), not at plnexp's."""
    package = str(Path(__file__).resolve().parent.parent)
    frame: FrameType | None
    frame, level = sys._getframe(2), 2  # 1: the function that warns, 2: its caller
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def describe(environ=os.environ) -> dict[str, str]:
    """plnexp's process settings as they are now, for run tags and reports."""
    version = jaxlib_version()
    checked = version in CHECKED_JAXLIB
    return {
        "xla_flags": environ.get("XLA_FLAGS", ""),
        "plnexp_xla_flags": " ".join(plnexp_flags(environ, version))
        if checked
        else f"none (jaxlib {version} not in the checked versions {', '.join(CHECKED_JAXLIB)})",
        "plnexp_xla_flags_missing": " ".join(_absent_flags(environ, version)) or "none",
        "lapack_threads": ",".join(str(c) for c in lapack_threads()) or "unknown",
    }
