"""The JIT strategy registry: each strategy declared once, as a :class:`Strategy` entry.

An entry owns its options (a frozen dataclass whose fields carry their defaults, what values they
allow and how a run name shows them), its builder ``(problem, n_iter, options) -> Program`` and what
it needs to run (``requires``: torch for the PyTorch baselines). The config (``conf/strategy/<name>.yaml``
holds only the entry's options), validation, hashing and run names all iterate over the options'
fields: adding a strategy with a new option touches its entry, its yaml and its tests only.

Every strategy runs the same maths and optimizer (``Problem.step``) and returns the same
:class:`~plnexp.core.problem.Output`; they differ only in how JAX traces and compiles the loop. The
PyTorch baselines (``torch_eager``, ``torch_compile``: :mod:`.torch_loops`) run the same maths and
optimizer formulas written in torch, from the same initial state, and return the same Output.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from functools import lru_cache, partial
from typing import Any, cast
from collections.abc import Callable

from ..core.problem import Problem
from .base import Compiled, Program, SingleProgram
from . import fused
from .batched import Batched
from .loops import fori_program, while_program
from .python_loops import PythonLoop
from .scans import scan_program
from .sharded import VIA, RowSharded, mesh_of
from .torch_loops import COMPILE_MODES, check as check_torch, check_device as check_torch_device, torch_program


def option(default, allowed: str, valid: Callable[[Any], bool], in_name: str = "{key}{value}", doc: str = ""):
    """A strategy option: its default, the allowed values in words (for the one-line error), the
    test a value must pass, and how a run name shows it when it is set (``{key}``, ``{value}``)."""
    return field(default=default, metadata={"allowed": allowed, "valid": valid, "in_name": in_name, "doc": doc})


def _int_at_least(low: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _number_at_least(low: float) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= low


@dataclass(frozen=True)
class NoOptions:
    """A strategy without options of its own."""


@dataclass(frozen=True)
class Unrolled:
    unroll: int = option(8, "integers >= 1", _int_at_least(1), doc="steps per scan body")


@dataclass(frozen=True)
class EarlyStop:
    tol: float = option(1e-6, "numbers >= 0", _number_at_least(0), doc="stop when the relative ELBO change < tol ...")
    patience: int = option(10, "integers >= 1", _int_at_least(1), doc="... for this many iterations in a row")


@dataclass(frozen=True)
class Sharded:
    devices: int = option(
        0,
        "integers >= 0 (0: every device of the platform)",
        _int_at_least(0),
        in_name="{value}dev",
        doc="devices the rows are split across",
    )
    via: str = option(
        "jit",
        ", ".join(VIA),
        lambda v: v in VIA,
        in_name="{value}",
        doc="jit: NamedSharding, XLA partitions; shard_map: per device, explicit psum",
    )


@dataclass(frozen=True)
class TorchCompile:
    mode: str = option(
        "default", ", ".join(COMPILE_MODES), lambda v: v in COMPILE_MODES, in_name="{value}", doc="torch.compile mode"
    )


def make_options(strategy: str, options: type, values: dict, key: str = "strategy"):
    """``options(**values)``, every value checked: one-line ValueError naming the key and the allowed
    values (an unknown key names the keys this strategy has)."""
    known = {f.name: f for f in fields(options)}
    for name in values:
        if name not in known:
            allowed = ", ".join(["name", *known]) if known else "name (it has no options)"
            raise ValueError(
                f"{key}.{name}: unknown key for strategy={strategy}; allowed keys under {key} are {allowed}"
            )
    for name, value in values.items():
        meta = known[name].metadata
        if not meta["valid"](value):
            raise ValueError(f"{key}.{name}={value!r}: allowed values are {meta['allowed']}")
    return options(**values)


@dataclass(frozen=True)
class Strategy:
    """A registry entry. ``build(problem, n_iter, options) -> Program``; ``requires(compile_cache)``
    raises a one-line ValueError where the strategy cannot run (None: always can);
    ``check_device(spec, platform)`` likewise for a device platform (and the options' fit to it);
    ``check_fit(name, optimizer, gradient)`` likewise for the optimizer and gradient it is asked to
    run. ``batches``: its fit is one function of (state, data) that ``replicates=K`` can ``vmap``
    (a :class:`SingleProgram`). ``jax_cache``: JAX's persistent compilation cache serves its compiles
    (``compile_cache``; False for the PyTorch baselines, which compile outside JAX). ``models``: the
    models it runs (None: every model; the step of ``scan_fused`` and of the torch baselines is
    written for the PLN state of ``full`` and ``profiled``). ``sparse_counts``: its program reads
    sparse counts (a ``SparseCounts`` Y) as the model's blocked step reads them, each device those of
    its own rows: True with any options, False where it places dense counts itself, or the options
    it needs for them, as ``(option, value)`` pairs (``scan_sharded``: ``(("via", "shard_map"),)``,
    whose per-device program sees each device's rows; :meth:`sparse_refusal`). ``processes``: the
    models it fits across several JAX processes (``processes=N``, :mod:`.sharded`; empty: one
    process only)."""

    name: str
    options: type
    build: Callable[[Problem, int, Any], Program]
    requires: Callable[[str, bool | None], None] | None = None
    check_device: Callable[[StrategySpec, str], object] | None = None  # what it returns is ignored
    batches: bool = False
    check_fit: Callable[[str, str, str], None] | None = None
    jax_cache: bool = True
    models: tuple[str, ...] | None = None
    sparse_counts: bool | tuple[tuple[str, Any], ...] = True
    processes: tuple[str, ...] = ()

    def sparse_refusal(self, options) -> str | None:
        """Why this strategy with ``options`` does not read sparse counts, as the end of a one-line
        error that starts ``sparse counts with strategy=NAME`` (None: it reads them)."""
        if self.sparse_counts is False:
            allowed = (s.sparse_name() for s in STRATEGIES.values() if s.sparse_counts is not False)
            return f": it places the dense counts; allowed are {', '.join(allowed)}"
        for key, value in () if self.sparse_counts is True else self.sparse_counts:
            if getattr(options, key) != value:
                return (
                    f" and strategy.{key}={getattr(options, key)!r}: it places the dense counts; allowed value "
                    f"with sparse counts is strategy.{key}={value!r}"
                )
        return None

    def sparse_name(self) -> str:
        """Its name, with the options sparse counts need: ``scan_sharded (strategy.via='shard_map')``."""
        if isinstance(self.sparse_counts, bool):
            return self.name
        return f"{self.name} ({', '.join(f'strategy.{k}={v!r}' for k, v in self.sparse_counts)})"


PLN_MODELS = ("full", "profiled")  # the models whose state is the p-dimensional PLN's (not pca)
# the PyTorch baselines: torch required, their step written for the PLN state, dense counts placed by them
_torch = partial(
    Strategy,
    requires=check_torch,
    check_device=lambda spec, platform: check_torch_device(spec.name, platform),
    jax_cache=False,
    models=PLN_MODELS,
    sparse_counts=False,
)

STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        # eager: refused with sparse counts, as docs/how-to/experiments.md says (#62)
        Strategy("eager", NoOptions, lambda pb, n, o: PythonLoop(pb, n), sparse_counts=False),
        Strategy("jit_per_function", NoOptions, lambda pb, n, o: PythonLoop(pb, n, jit=True)),
        Strategy("scan", NoOptions, lambda pb, n, o: scan_program(pb, n, "dict"), batches=True),
        Strategy("scan_namedtuple", NoOptions, lambda pb, n, o: scan_program(pb, n, "namedtuple"), batches=True),
        Strategy("scan_pytree", NoOptions, lambda pb, n, o: scan_program(pb, n, "pytree"), batches=True),
        Strategy("scan_dataclass", NoOptions, lambda pb, n, o: scan_program(pb, n, "dataclass"), batches=True),
        Strategy(
            "scan_unrolled", Unrolled, lambda pb, n, o: scan_program(pb, n, "dict", unroll=o.unroll), batches=True
        ),
        Strategy("fori_loop", NoOptions, lambda pb, n, o: fori_program(pb, n), batches=True),
        Strategy("while_loop", EarlyStop, lambda pb, n, o: while_program(pb, n, o.tol, o.patience), batches=True),
        Strategy(
            "scan_sharded",
            Sharded,
            lambda pb, n, o: RowSharded(pb, n, o.devices, o.via),
            check_device=lambda spec, platform: mesh_of(platform, spec.options.devices) and None,
            sparse_counts=(("via", "shard_map"),),
            processes=("full", "pca"),
        ),
        Strategy(
            "scan_fused",
            NoOptions,
            lambda pb, n, o: fused.fused_program(pb, n),
            fused.check,
            lambda spec, platform: fused.check_device(spec.name, platform),
            check_fit=fused.check_fit,
            models=PLN_MODELS,
            sparse_counts=False,
        ),
        _torch("torch_eager", NoOptions, lambda pb, n, o: torch_program(pb, n, compiled=False)),
        _torch("torch_compile", TorchCompile, lambda pb, n, o: torch_program(pb, n, compiled=True, mode=o.mode)),
    )
}
TORCH_STRATEGIES = tuple(name for name, s in STRATEGIES.items() if s.requires is check_torch)
# strategies whose step is native code built at install time (absent where no compiler was): like
# the torch baselines, asked for by name (sweep=fused), never in a preset that must run everywhere
NATIVE_STRATEGIES = tuple(name for name, s in STRATEGIES.items() if s.requires is fused.check)


@dataclass(frozen=True)
class StrategySpec:
    """A resolved strategy choice: the entry's name and its options (an instance of
    ``STRATEGIES[name].options``). ``StrategySpec.of(name, **values)`` validates both, in one line."""

    name: str = "scan"
    options: Any = None

    def __post_init__(self):
        if self.name not in STRATEGIES:
            raise ValueError(f"strategy={self.name!r}: allowed values are {', '.join(STRATEGIES)}")
        entry = STRATEGIES[self.name]
        if self.options is None:
            object.__setattr__(self, "options", entry.options())
        elif not isinstance(self.options, entry.options):
            raise TypeError(f"strategy {self.name}: options must be {entry.options.__name__}")

    @classmethod
    def of(cls, name: str, **values) -> StrategySpec:
        if name not in STRATEGIES:
            raise ValueError(f"strategy={name!r}: allowed values are {', '.join(STRATEGIES)}")
        return cls(name, make_options(name, STRATEGIES[name].options, values))

    @property
    def entry(self) -> Strategy:
        return STRATEGIES[self.name]

    def as_dict(self) -> dict[str, Any]:
        """``{"name": ..., **options}``: the config's ``strategy`` section."""
        return {"name": self.name, **{f.name: getattr(self.options, f.name) for f in fields(self.options)}}

    def name_parts(self) -> list[str]:
        """How a run name shows the options set away from their defaults (``unroll4``, ``max-autotune``)."""
        return [
            f.metadata["in_name"].format(key=f.name, value=value)
            for f in fields(self.options)
            if (value := getattr(self.options, f.name)) != f.default  # (MISSING, no default, equals no value)
        ]

    def check(
        self,
        compile_cache: bool | None = False,
        platform: str | None = None,
        replicates: int = 1,
        optimizer: str | None = None,
        gradient: str | None = None,
        model: str | None = None,
        processes: int = 1,
    ) -> None:
        """One-line ValueError where this strategy cannot run here (torch missing, a device torch
        does not see, an option it has not, replicates it cannot batch, an optimizer or gradient
        its kernel does not compute, a model its step is not written for, a model it does not fit
        across ``processes`` > 1 JAX processes)."""
        entry = self.entry
        if processes > 1 and (model or "full") not in entry.processes:
            across = ", ".join(
                f"strategy={s.name} with model={'|'.join(s.processes)}" for s in STRATEGIES.values() if s.processes
            )
            raise ValueError(
                f"processes={processes}: strategy={self.name} with model={model or 'full'} runs in one process; "
                f"allowed with processes > 1: {across}"
            )
        if model is not None and entry.models is not None and model not in entry.models:
            raise ValueError(
                f"strategy={self.name} with model={model}: its step is written for the PLN state of "
                f"{' and '.join(entry.models)}; allowed models are {', '.join(entry.models)}"
            )
        if replicates > 1 and not entry.batches:
            batching = ", ".join(s.name for s in STRATEGIES.values() if s.batches)
            raise ValueError(
                f"replicates={replicates}: strategy={self.name} runs one fit per program; allowed "
                f"strategies with replicates > 1 are {batching}"
            )
        if entry.requires is not None:
            entry.requires(self.name, compile_cache)
        if platform is not None and entry.check_device is not None:
            entry.check_device(self, platform)
        if entry.check_fit is not None and optimizer is not None and gradient is not None:
            entry.check_fit(self.name, optimizer, gradient)


def all_option_names() -> dict[str, tuple[str, ...]]:
    """option name -> the strategies that have it."""
    out: dict[str, tuple[str, ...]] = {}
    for s in STRATEGIES.values():
        for f in fields(s.options):
            out[f.name] = out.get(f.name, ()) + (s.name,)
    return out


PLUGIN_GROUP = "plnexp.strategies"  # entry points naming a Strategy: strategies other packages add


def register(strategy: Strategy) -> Strategy:
    """Adds ``strategy`` to the registry (what a plugin's entry point does, see :func:`load_plugins`);
    a name already taken is refused in one line. It is then chosen like any other strategy, with
    ``strategy.name=NAME`` (or ``strategy=NAME`` where a ``strategy/NAME.yaml`` is on Hydra's search path)."""
    if strategy.name in STRATEGIES:
        raise ValueError(
            f"strategy {strategy.name!r} is registered already; allowed new names are any but {', '.join(STRATEGIES)}"
        )
    STRATEGIES[strategy.name] = strategy
    return strategy


def load_plugins() -> None:
    """Registers the strategies that installed packages declare in the entry-point group
    ``plnexp.strategies`` (each entry point names a :class:`Strategy`); run once, at import. The
    test suite's ``blocking`` strategy comes this way into the processes the tests start."""
    from importlib.metadata import entry_points

    for point in entry_points(group=PLUGIN_GROUP):
        if point.name not in STRATEGIES:
            strategy = point.load()
            if not isinstance(strategy, Strategy) or strategy.name != point.name:
                raise TypeError(
                    f"entry point {point.name} = {point.value} (group {PLUGIN_GROUP}): allowed values "
                    f"are a plnexp.strategies.Strategy named {point.name!r}"
                )
            register(strategy)


def make(problem: Problem, n_iter: int, spec: StrategySpec, replicates: int = 1) -> Program:
    """A new Program for this (problem, n_iter, strategy, replicates), never seen by JAX (the cold
    compiles of plnexp.measure.timing); ``replicates > 1``: the strategy's fit ``vmap``-ed over that many
    fits (:mod:`.batched`)."""
    spec.check(replicates=replicates)
    program = spec.entry.build(problem, n_iter, spec.options)
    # spec.check: replicates > 1 only for the strategies that batch, whose whole fit is one SingleProgram
    return Batched(cast(SingleProgram, program), replicates) if replicates > 1 else program


@lru_cache(maxsize=64)
def _cached(problem: Problem, n_iter: int, spec: StrategySpec, replicates: int, code_path: str) -> Program:
    return make(problem, n_iter, spec, replicates)


def build(problem: Problem, n_iter: int, spec: StrategySpec, replicates: int = 1) -> Program:
    """:func:`make`, cached so that a second fit of the same shapes reuses the jitted functions and
    compiles nothing; a native kernel's program also per forced code path (``$PLNEXP_FUSED_ISA``,
    read when the program is made)."""
    code_path = os.environ.get(fused.ISA_ENV, "") if spec.name in NATIVE_STRATEGIES else ""
    return _cached(problem, n_iter, spec, replicates, code_path)


__all__ = [
    "Batched",
    "RowSharded",
    "STRATEGIES",
    "TORCH_STRATEGIES",
    "NATIVE_STRATEGIES",
    "Strategy",
    "StrategySpec",
    "build",
    "make",
    "Compiled",
    "Program",
    "SingleProgram",
    "NoOptions",
    "option",
    "all_option_names",
    "register",
    "load_plugins",
]

load_plugins()
