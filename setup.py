"""The optional native kernel of ``strategy=scan_fused`` (``plnexp/native/pln_fused_step.cc``).

Everything else about the package is declared in pyproject.toml. The kernel is built at install
time when a C++ compiler is there (``g++``/``c++``, or ``$CXX``), against the XLA FFI headers that
ship with jaxlib (a build requirement, pyproject's ``[build-system]``); where it cannot be built,
plnexp installs without it (a warning in pip's log) and ``scan_fused`` says so in one line.

``-march=native``: the kernel is built for the machine that installs it (a source install; a
wheel built here is not portable to older CPUs). ``-fno-math-errno``: sqrt without errno, so that
the elementwise loop vectorises (results unchanged).
"""

import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py


class BuildWithConf(build_py):
    """A wheel carries the repository's top-level ``conf/`` as ``plnexp/conf`` (plnexp.paths finds it
    there); an editable install reads ``conf/`` where it is, so the copy is made for wheels only."""

    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            target = Path(self.build_lib) / "plnexp" / "conf"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree("conf", target, ignore=shutil.ignore_patterns("__pycache__"))


class BuildKernel(build_ext):
    def build_extension(self, ext):
        try:
            import jaxlib  # the build environment's, pinned like the runtime one

            ext.include_dirs.append(str(Path(jaxlib.__file__).resolve().parent / "include"))
        except ImportError as err:
            print(f"plnexp: the scan_fused kernel is not built: jaxlib not importable at build time ({err})")
            return
        super().build_extension(ext)  # optional=True: a compiler error is a warning, the install goes on


setup(
    ext_modules=[
        Extension(
            "plnexp._pln_fused",
            sources=["plnexp/native/pln_fused_step.cc"],
            language="c++",
            extra_compile_args=["-std=c++17", "-O3", "-march=native", "-fno-math-errno", "-w"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": BuildKernel, "build_py": BuildWithConf},
)
