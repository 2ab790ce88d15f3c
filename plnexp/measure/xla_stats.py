"""What XLA made of a program: counts read from its optimized HLO text.

Pure functions of the text of ``jax.stages.Compiled.as_text()`` (or of a run's logged
``program.hlo.txt``), so that they serve a program just compiled and a run read back from the store
alike; only :func:`module_cost` calls XLA (its cost analysis of a module given as text).

**Which instructions are counted.** The *counted computations* are those reached from the entry
computation through control flow: a ``while``'s body and condition, a ``conditional``'s branches, a
``call``'s computation, an async op's or a custom call's called computations. Each is counted once,
however many call sites reach it (a loop's body and the code around the loop: each once, whatever
the trip count). Not counted: the computations *inside* a fusion (a ``fusion`` instruction counts
as one instruction, its fused computation none) and the scalar computations that an operation
applies (a ``reduce``'s, ``sort``'s, ``scatter``'s or ``all-reduce``'s ``to_apply``). So:

- ``instructions``: every instruction of the counted computations (parameters, constants, tuples,
  ``get-tuple-element`` and ``ROOT`` included: one per line of HLO);
- ``fusions``: the ``fusion`` instructions among them (kernels XLA:CPU emits as one loop nest each);
- ``opcodes``: the same instructions by opcode (``instructions`` is its sum);
- ``loops``: every ``while`` among them, with the computation that holds it, its nesting depth (0: not
  inside another loop's body), its trip count where XLA knows it (``known_trip_count`` in its
  backend config: a scan or a ``fori_loop`` with static bounds; ``None`` for a ``while_loop`` that
  stops on a condition) and the instructions of its body (counted as above, the body and what it
  reaches). A scan unrolled ``k`` times is a loop of ``length // k`` trips whose body holds ``k``
  steps; its ``length % k`` remaining steps are peeled out of the loop, and a scan with ``k >=
  length`` (or of length 1) has no loop left at all.

**Cost per iteration** (:func:`module_cost`, :func:`loop_modules`). XLA's cost analysis
(``compiled.cost_analysis()``: "flops", "bytes accessed") counts, as measured on jax 0.10.2 CPU,
every computation once: a ``while`` body once whatever its trip count (a scan of 10 or 100 steps of
``x * 2 + 1`` over 1000 float32 values: 2002 flops either way), an unrolled body once with its ``k``
steps inside (``unroll=5``: 10002 flops), plus the code around the loop (the copy of ``x`` into the
loop's buffer: 8000 of the 16061 bytes). The cost of *one iteration* is therefore taken from the
loop alone: the loop's body and condition, each made the entry of a module of its own (with the
computations it calls), costed by XLA, summed, and divided by the steps one trip runs (the scan's
unroll factor, 1 for ``fori_loop`` and ``while_loop``). Where the program has no loop left (fully
unrolled, or one step), it is the whole program's cost divided by its steps, which then includes
the code around them (the fit's final ELBO). Measured on that scan: 2N flops and 8N bytes per
iteration within 0.2% (the loop counter and the condition); with ``unroll=4``, 2N flops and 2N
bytes (XLA fuses the 4 elementwise steps into one pass over ``x``). XLA cannot see into a custom call
(LAPACK's Cholesky, ``scan_fused``'s kernel): it counts one as -1 flops and -1 bytes, so that
work is missing from these figures.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from ..system import jax_compat
from .fingerprint import DEBUG_ATTRS

# one function of a program made of several (jit_per_function), in its logged artifact
FUNCTION_HEADER = "# plnexp function: "

_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([A-Za-z_][\w.\-]*)\s+\(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(ROOT\s+)?%?([A-Za-z_][\w.\-]*)\s+=\s+(.*)$")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-]*)\(")
_ONE = r"%?([A-Za-z_][\w.\-]*)"
_CALL_ATTRS = re.compile(rf"\b(calls|to_apply|body|condition|true_computation|false_computation|select|scatter)={_ONE}")
_CALL_LISTS = re.compile(r"\b(branch_computations|called_computations|calls)=\{([^{}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
# the computations an instruction runs as code: a loop's, a conditional's branches (any op), and those
# that a call, a custom call or an async op calls (_CONTROL); not a fusion's, nor the scalar functions
# that reduce, sort, scatter, map, all-reduce or select-and-scatter apply
_BRANCHES = ("body", "condition", "true_computation", "false_computation", "branch_computations")
_CONTROL = ("call", "custom-call", "async-start", "async-update", "async-done")


@dataclass(frozen=True)
class Instruction:
    name: str
    opcode: str
    calls: tuple[tuple[str, str], ...]  # (attribute, computation): calls=, body=, to_apply=, ...
    text: str


@dataclass(frozen=True)
class Computation:
    name: str
    entry: bool
    lines: tuple[str, ...]  # the header, the instructions, the closing brace
    instructions: tuple[Instruction, ...]


@dataclass(frozen=True)
class Module:
    """An HLO module's computations, in the order of the text (callees before their callers)."""

    computations: dict[str, Computation]
    entry: str

    def called(self, instruction: Instruction) -> list[str]:
        """The computations that ``instruction`` runs as code (see the module's doc): a fusion's and
        an applied scalar function's are not."""
        return [
            c
            for attr, c in instruction.calls
            if c in self.computations and (attr in _BRANCHES or instruction.opcode in _CONTROL)
        ]

    def reached(self, start: str, every: bool = False) -> list[str]:
        """``start`` and every computation it reaches through :meth:`called` (``every``: through
        every call, fused and applied computations too), each once."""
        seen: dict[str, None] = {}
        stack = [start]
        while stack:
            name = stack.pop()
            if name in seen or name not in self.computations:
                continue
            seen[name] = None
            for ins in self.computations[name].instructions:
                stack.extend(reversed([c for _, c in ins.calls] if every else self.called(ins)))
        return list(seen)


@dataclass(frozen=True)
class Loop:
    name: str
    computation: str  # the computation holding the while instruction
    body: str
    condition: str
    trip_count: int | None  # XLA's known_trip_count; None where it stops on a condition
    depth: int  # 0: not inside another loop's body
    body_instructions: int  # the body and what it reaches, counted as the module's doc says


@dataclass(frozen=True)
class Stats:
    instructions: int
    fusions: int
    opcodes: dict[str, int] = field(default_factory=dict)
    loops: tuple[Loop, ...] = ()

    def __add__(self, other: Stats) -> Stats:
        return Stats(
            self.instructions + other.instructions,
            self.fusions + other.fusions,
            dict(Counter(self.opcodes) + Counter(other.opcodes)),
            self.loops + other.loops,
        )


def _shape_end(rest: str) -> int:
    """Where the result shape at the start of ``rest`` ends (a tuple shape holds spaces)."""
    if not rest.startswith("("):
        space = rest.find(" ")
        return len(rest) if space < 0 else space
    depth = 0
    for i, ch in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return i + 1
    return len(rest)


def _instruction(line: str) -> Instruction | None:
    m = _INSTRUCTION.match(line)
    if m is None:
        return None
    rest = m.group(3)
    op = _OPCODE.match(rest[_shape_end(rest) :])
    if op is None:
        return None
    calls = [(a, c) for a, c in _CALL_ATTRS.findall(line)]
    for attr, names in _CALL_LISTS.findall(line):
        calls += [(attr, n.strip().lstrip("%")) for n in names.split(",") if n.strip()]
    return Instruction(m.group(2), op.group(1), tuple(calls), line)


def parse(text: str) -> Module:
    """The computations of one HLO module's text (``ValueError`` where it has no entry)."""
    computations: dict[str, Computation] = {}
    entry = ""
    current: list[str] | None = None
    name, is_entry = "", False
    for line in text.splitlines():
        if current is None:
            m = _COMPUTATION.match(line)
            if m is not None:
                current, name, is_entry = [line], m.group(2), bool(m.group(1))
            continue
        current.append(line)
        if line.strip() == "}":
            ins = tuple(i for i in map(_instruction, current[1:-1]) if i is not None)
            computations[name] = Computation(name, is_entry, tuple(current), ins)
            entry = name if is_entry else entry
            current = None
    if not entry:
        raise ValueError("not an HLO module's text: no ENTRY computation")
    return Module(computations, entry)


def _count(module: Module, names: list[str]) -> tuple[int, int, Counter]:
    opcodes: Counter = Counter()
    for name in names:
        opcodes.update(i.opcode for i in module.computations[name].instructions)
    return sum(opcodes.values()), opcodes["fusion"], opcodes


def loops(module: Module) -> tuple[Loop, ...]:
    """Every ``while`` of the counted computations, outer loops first (see the module's doc)."""
    out: list[Loop] = []
    seen: set[str] = set()

    def visit(computation: str, depth: int) -> None:
        if computation in seen:
            return
        seen.add(computation)
        for ins in module.computations[computation].instructions:
            if ins.opcode == "while":
                attrs = dict(ins.calls)
                body, cond = attrs.get("body", ""), attrs.get("condition", "")
                trip = _TRIP_COUNT.search(ins.text)
                n, _, _ = _count(module, module.reached(body)) if body in module.computations else (0, 0, None)
                out.append(Loop(ins.name, computation, body, cond, int(trip.group(1)) if trip else None, depth, n))
                for c in (cond, body):
                    if c in module.computations:
                        visit(c, depth + 1)
            else:
                for c in module.called(ins):
                    visit(c, depth)

    visit(module.entry, 0)
    return tuple(sorted(out, key=lambda loop: loop.depth))


def stats(text: str) -> Stats:
    """Instructions, fusions, opcodes and loops of one module's text (see the module's doc)."""
    module = parse(text)
    n, fusions, opcodes = _count(module, module.reached(module.entry))
    return Stats(n, fusions, dict(opcodes), loops(module))


def main_loop(module: Module) -> Loop | None:
    """The program's loop: of its outermost loops, the one whose body holds the most instructions
    (a fit's iterations; None where XLA left no loop)."""
    outer = [loop for loop in loops(module) if loop.depth == 0]
    return max(outer, key=lambda loop: loop.body_instructions, default=None)


def _module_of(module: Module, root: str) -> str:
    """The text of a module whose entry is ``root``, with the computations it calls (fused ones
    included), in the original order; metadata left out."""
    wanted = set(module.reached(root, every=True))
    parts = ["HloModule loop_part", ""]
    for name, comp in module.computations.items():
        if name not in wanted:
            continue
        header = comp.lines[0]
        if name == root:
            header = "ENTRY " + header.removeprefix("ENTRY ").lstrip()
        elif comp.entry:
            header = header.removeprefix("ENTRY ").lstrip()
        # metadata left out: it points into source tables left out of a module cut from this one
        parts += [DEBUG_ATTRS.sub("", line) for line in (header, *comp.lines[1:])] + [""]
    return "\n".join(parts)


def loop_modules(text: str) -> tuple[Loop, list[str]] | None:
    """The program's loop (:func:`main_loop`) and the texts of two modules, its body's and its
    condition's, each one the entry of its own (what :func:`module_cost` costs); None without a loop."""
    module = parse(text)
    loop = main_loop(module)
    if loop is None:
        return None
    return loop, [_module_of(module, c) for c in (loop.body, loop.condition) if c in module.computations]


def module_cost(text: str, client=None) -> dict[str, float]:
    """XLA's cost analysis ("flops", "bytes accessed", ...) of a module given as HLO text, by the
    backend of ``client`` (default: JAX's default device's). Reaches into jaxlib's private modules
    (:func:`plnexp.system.jax_compat.hlo_module_cost`): raises where the text does not parse."""
    import jax

    client = client if client is not None else jax.devices()[0].client
    cost = jax_compat.hlo_module_cost(text, client)
    return {k: float(v) for k, v in cost.items()}


def split_functions(text: str) -> dict[str, str]:
    """A logged ``program.hlo.txt`` by function: each ``FUNCTION_HEADER NAME`` line starts one; a text
    without them is one function, ``""``."""
    if not text.startswith(FUNCTION_HEADER):
        return {"": text}
    out: dict[str, str] = {}
    for part in text.split("\n" + FUNCTION_HEADER):
        head, _, body = part.removeprefix(FUNCTION_HEADER).partition("\n")
        out[head.strip()] = body
    return out


def join_functions(texts: dict[str, str]) -> str:
    """The artifact's text of a program: one function's HLO as it is, several each after a
    ``FUNCTION_HEADER NAME`` line (in the given order)."""
    if len(texts) <= 1:
        return next(iter(texts.values()), "")
    return "\n".join(f"{FUNCTION_HEADER}{name}\n{text.rstrip()}" for name, text in texts.items()) + "\n"
