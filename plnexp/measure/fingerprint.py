"""Which compiled programs are the same: a fingerprint of XLA's optimized HLO.

Strategies that differ only in how Python holds the loop's state (a dict, a NamedTuple, a registered
pytree class, a dataclass) can compile to one and the same XLA program; their timings then differ by
noise only, and plnexp's report groups them instead of ranking them (:mod:`plnexp.report.summary`).

The fingerprint is a hash of the optimized HLO text with what does not change the program taken out:
the module's name, each instruction's ``metadata`` (Python source lines, op names) and the tables
of source locations it points into, and the names of
instructions and computations, renumbered in order of first appearance. A program made of several
compiled functions (``jit_per_function``) is fingerprinted as the set of its functions' fingerprints.
A strategy with no XLA program (``eager``, which dispatches op by op, and the PyTorch ones) has
none (``""``).
"""

from __future__ import annotations

import hashlib
import re

_MODULE = re.compile(r"^HloModule\s+\S+", re.MULTILINE)
# what changes no program: metadata (Python source lines, op names) and frontend attributes
DEBUG_ATTRS = re.compile(r",?\s*(metadata|frontend_attributes)=\{[^{}]*\}")
# instruction and computation names: %-prefixed, or (parameters in a computation's signature) a word
# with a numeric suffix (opcodes and attributes have none)
_NAME = re.compile(r"%[A-Za-z_][\w.\-]*|\b[A-Za-z_][\w\-.]*\.\d+\b")
# the tables of Python source locations that metadata points into (after the HloModule line)
_DEBUG_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def _without_debug_tables(text: str) -> str:
    out, skipping = [], False
    for line in text.splitlines():
        if line.strip() in _DEBUG_TABLES:
            skipping = True
        elif skipping and not line.strip():
            skipping = False
        if not skipping:
            out.append(line)
    return "\n".join(out)


def canonical(hlo_text: str) -> str:
    """The HLO text without module name, metadata and names (see the module docstring)."""
    text = _MODULE.sub("HloModule m", _without_debug_tables(hlo_text))
    text = DEBUG_ATTRS.sub("", text)
    names: dict[str, str] = {}
    return _NAME.sub(lambda m: names.setdefault(m.group(0), f"%v{len(names)}"), text)


def of_text(hlo_text: str) -> str:
    return hashlib.sha256(canonical(hlo_text).encode()).hexdigest()[:12]


def of_executables(executables: dict) -> str:
    """The fingerprint of a program's compiled functions (``jax.stages.Compiled`` by name): one
    function's own, or the hash of the set of several; ``""`` for none."""
    prints = sorted(of_text(e.as_text()) for e in executables.values())
    if not prints:
        return ""
    if len(prints) == 1:
        return prints[0]
    return hashlib.sha256(",".join(prints).encode()).hexdigest()[:12]
