"""The optional native kernel of ``strategy=scan_fused`` (``plnexp/native/pln_fused_step.cc``).

Everything else about the package is declared in pyproject.toml. The kernel is built at install
time when a C++ compiler is there (``g++``/``c++``, or ``$CXX``), against the XLA FFI headers that
ship with jaxlib (a build requirement, pyproject's ``[build-system]``); where it cannot be built,
plnexp installs without it (a warning in pip's log) and ``scan_fused`` says so in one line.

One library for every x86-64 CPU, no ``-march``: the kernel's code is compiled three times in one
translation unit, for AVX-512 (x86-64-v4), AVX2 (x86-64-v3) and the x86-64 baseline, each under
its own ``#pragma GCC target``, and ``plnexp/strategies/fused.py`` picks, when it loads the
library, the best path the CPU runs (``PLNEXP_FUSED_ISA`` forces one). A library built on a login
node with AVX-512 thus runs on AVX2-only compute nodes, and a wheel built here runs anywhere. On
other architectures (or with a compiler without GCC's target pragmas) the baseline path alone is
built, with the compiler's default flags. ``-fno-math-errno``: sqrt without errno;
``-fno-trapping-math``: no floating-point trap is assumed observable (none is read), so that both
arms of exp's and log's special cases may be computed and blended: without them the elementwise
loop vectorises on the AVX-512 path only (masked operations), with them on every path. Neither
changes a result (``-std=c++17`` also keeps FMA contraction off: every path rounds alike).

Why setuptools rather than scikit-build-core + nanobind: the kernel is one C++ file with no Python
bindings (fused.py loads it with ctypes and hands its handlers to XLA as ``jax.ffi.pycapsule``), so
there is no binding library to build and no CMake project to keep; setuptools' Extension compiles
and links it with the interpreter's own flags and extension suffix, and the per-ISA code paths
live in the source (target pragmas), not in build-system logic, so the result is as portable as a
CMake build would be. ``optional=True`` keeps an install without a compiler working.
"""

import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py


class BuildWithConf(build_py):
    """A wheel carries the repository's top-level ``conf/`` as ``plnexp/conf`` (plnexp.system.paths finds it
    there); an editable install reads ``conf/`` where it is, so the copy is made for wheels only."""

    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            target = Path(self.build_lib) / "plnexp" / "conf"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree("conf", target, ignore=shutil.ignore_patterns("__pycache__"))


def _ffi_include_dir() -> str:
    """The XLA FFI headers of the build environment's jax (pinned like the runtime one): its public
    ``jax.ffi.include_dir()`` (jax 0.10.2 has it); with a jax that lacks it, jaxlib's ``include``
    folder found by path (where jaxlib 0.10.2 ships them). ImportError where neither is importable."""
    try:
        import jax.ffi

        return str(jax.ffi.include_dir())
    except (ImportError, AttributeError):
        import jaxlib

        return str(Path(jaxlib.__file__).resolve().parent / "include")


class BuildKernel(build_ext):
    def build_extension(self, ext):
        try:
            ext.include_dirs.append(_ffi_include_dir())
        except ImportError as err:
            print(f"plnexp: the scan_fused kernel is not built: jaxlib not importable at build time ({err})")
            return
        super().build_extension(ext)  # optional=True: a compiler error is a warning, the install goes on


setup(
    ext_modules=[
        Extension(
            "plnexp._pln_fused",
            sources=["plnexp/native/pln_fused_step.cc"],
            depends=["plnexp/native/pln_fused_kernel.inc"],  # included once per code path
            language="c++",
            # no -march: the code paths' instructions come from the source's target pragmas
            # -g0 and -s: no debug information (Python's own CFLAGS ask for -g), a 5.5 MB library otherwise
            extra_compile_args=["-std=c++17", "-O3", "-fno-math-errno", "-fno-trapping-math", "-w", "-g0"],
            extra_link_args=["-s"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": BuildKernel, "build_py": BuildWithConf},
)
