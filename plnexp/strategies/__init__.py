"""The JIT strategy registry: a plain dict from name to a builder ``(problem, n_iter, spec) -> Program``.

Every strategy runs the same maths and optimizer (``Problem.step``) and returns the same
:class:`~plnexp.problem.Output`; they differ only in how JAX traces and compiles the loop. The
PyTorch baselines (``torch_eager``, ``torch_compile``: :mod:`.torch_loops`) run the same maths and
optimizer formulas written in torch, from the same initial state, and return the same Output.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from ..problem import Problem
from .base import Compiled, Program, SingleProgram
from .loops import fori_program, while_program
from .python_loops import EagerProgram, JitPerFunctionProgram
from .scans import scan_program
from .torch_loops import COMPILE_MODES, check as check_torch, check_device as check_torch_device, torch_program


@dataclass(frozen=True)
class StrategySpec:
    """A resolved strategy choice. ``unroll`` is used by scan_unrolled; ``tol`` and ``patience``
    by while_loop (relative ELBO change below ``tol`` for ``patience`` iterations in a row); ``mode``
    by torch_compile (``torch.compile(..., mode=mode)``). A torch strategy without torch installed
    is refused here, in one line."""

    name: str = "scan"
    unroll: int = 8
    tol: float = 1e-6
    patience: int = 10
    mode: str = "default"

    def __post_init__(self):
        if self.name not in STRATEGIES:
            raise ValueError(f"strategy={self.name!r}: allowed values are {', '.join(STRATEGIES)}")
        if self.mode not in COMPILE_MODES:
            raise ValueError(f"strategy.mode={self.mode!r}: allowed values are {', '.join(COMPILE_MODES)}")
        if self.name in TORCH_STRATEGIES:
            check_torch(self.name)
        if not (isinstance(self.unroll, int) and self.unroll >= 1):
            raise ValueError(f"strategy.unroll={self.unroll!r}: must be an integer >= 1")
        if not (isinstance(self.tol, (int, float)) and self.tol >= 0):
            raise ValueError(f"strategy.tol={self.tol!r}: must be a number >= 0")
        if not (isinstance(self.patience, int) and self.patience >= 1):
            raise ValueError(f"strategy.patience={self.patience!r}: must be an integer >= 1")


Builder = Callable[[Problem, int, StrategySpec], Program]

STRATEGIES: dict[str, Builder] = {
    "eager": lambda pb, n, s: EagerProgram(pb, n),
    "jit_per_function": lambda pb, n, s: JitPerFunctionProgram(pb, n),
    "scan": lambda pb, n, s: scan_program(pb, n, "dict"),
    "scan_namedtuple": lambda pb, n, s: scan_program(pb, n, "namedtuple"),
    "scan_pytree": lambda pb, n, s: scan_program(pb, n, "pytree"),
    "scan_dataclass": lambda pb, n, s: scan_program(pb, n, "dataclass"),
    "scan_unrolled": lambda pb, n, s: scan_program(pb, n, "dict", unroll=s.unroll),
    "fori_loop": lambda pb, n, s: fori_program(pb, n),
    "while_loop": lambda pb, n, s: while_program(pb, n, s.tol, s.patience),
    "torch_eager": lambda pb, n, s: torch_program(pb, n, compiled=False),
    "torch_compile": lambda pb, n, s: torch_program(pb, n, compiled=True, mode=s.mode),
}
TORCH_STRATEGIES = ("torch_eager", "torch_compile")  # need the optional extra .[torch]


@lru_cache(maxsize=64)
def build(problem: Problem, n_iter: int, spec: StrategySpec) -> Program:
    """The Program for this (problem, n_iter, strategy); cached so that a second fit of the same
    shapes reuses the jitted functions and compiles nothing."""
    return STRATEGIES[spec.name](problem, n_iter, spec)


__all__ = ["STRATEGIES", "TORCH_STRATEGIES", "StrategySpec", "build", "Compiled", "Program", "SingleProgram"]
