"""The compiled programs of a sweep's groups (``report.md``'s compiler table, ``bytes.png``'s points):
one row per program (a contender: strategies that share one ``hlo_fingerprint``, or one strategy
without one), fastest first as the group's verdict ranks them (:mod:`plnexp.report.speed`), with what
XLA said of it (instructions, fusions, bytes and flops per iteration, peak memory, compile time split
into trace, lower and XLA's compile; :data:`plnexp.report.entries.COMPILER`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from . import speed
from .entries import COMPILER, DASH, DIFFER, md_table, median, num, Report


# ---------------------------------------------------------------- the compiler table
BYTES = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))
FLOPS = (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3), ("FLOP", 1))


def _in_units(v: float, units: tuple[tuple[str, float], ...], places: int) -> str:
    """``v`` in the largest of ``units`` it reaches, with ``places`` decimals (none in the last, the unit
    itself); DASH where not measured."""
    if not np.isfinite(v):
        return DASH
    unit, size = next(((u, s) for u, s in units if v >= s), units[-1])
    return f"{v / size:.{places if size > 1 else 0}f} {unit}"


COUNT, SECONDS = partial(num, fmt="{:,.0f}", missing=DASH), partial(num, fmt="{:.3f}", missing=DASH)
CELLS: dict[str, Callable[[float], str]] = {
    "xla_instructions": COUNT,
    "xla_fusions": COUNT,
    "xla_bytes_per_iter": partial(_in_units, units=BYTES, places=1),
    "xla_flops_per_iter": partial(_in_units, units=FLOPS, places=2),
    "peak_bytes": partial(_in_units, units=BYTES, places=1),
    **dict.fromkeys(("compile_s", "trace_s", "lower_s", "xla_compile_s"), SECONDS),
}


@dataclass(frozen=True)
class Program:
    """A row of the compiler table: one program of a group and what XLA said of it."""

    program: str  # the hlo_fingerprint's first 8 characters; DASH without one (eager, PyTorch)
    strategies: str  # the strategies that compiled to it (``a = b``)
    ms_per_iter: float  # its ms/iter as the ranking's source gives it (plnexp.report.speed: the rounds')
    values: dict  # each COMPILER metric: the median over the program's runs, NaN where none logged it
    bytes_x_floor: float  # XLA's bytes per iteration over the floor's (Entry.bytes_x_floor)
    span: tuple = (np.nan, np.nan)  # its ms/iter interval: the paired ratio's (rounds), else its runs'


def compiler_rows(report: Report, group: tuple) -> list[Program]:
    """One row per program of the group (a contender: its strategies share one ``hlo_fingerprint``,
    or one strategy without one), fastest first as the group's verdict ranks them
    (:mod:`plnexp.report.speed`); the control job left out."""
    rows, ratios = [], []
    for c in report.contenders[group]:
        runs = [e for e in report.groups[group] if e.ok and not e.control and e.strategy in c.names]
        sp = [speed.of(report, e) for e in runs]
        ms, ratio = median([x.ms_per_iter for x in sp]), median([x.ratio for x in sp])
        rounds = all(x.basis == speed.ROUNDS for x in sp)
        lo, hi = (min(x.low for x in sp), max(x.high for x in sp)) if rounds else (c.lo, c.hi)
        rows.append(
            Program(
                (runs[0].tags.get("hlo_fingerprint", "") or "")[:8] or DASH,
                c.label.removesuffix(" (one program)"),
                ms if np.isfinite(ms) else c.ms,
                {k: median([e.m(k) for e in runs]) for k in COMPILER},
                median([e.bytes_x_floor for e in runs]),
                (ms * lo / ratio, ms * hi / ratio) if rounds else (lo, hi),
            )
        )
        ratios.append(ratio if np.isfinite(ratio) else np.inf)
    return [r for _, r in sorted(zip(ratios, rows), key=lambda x: x[0])]


def differences(report: Report, group: tuple, tied: tuple) -> str:
    """What still differs between tied contenders (labels ``tied``) by :data:`DIFFER` or more, from
    their programs' rows (:func:`compiler_rows`): ``; they differ in compile time (scan_unrolled 2.3×
    scan's) and peak memory (...)``; ""."""
    rows = {r.strategies: r.values for r in compiler_rows(report, group)}
    values = {label: rows[name] for label in tied if (name := label.removesuffix(" (one program)")) in rows}
    said = []
    for key, what in (("compile_s", "compile time"), ("peak_bytes", "peak memory")):
        got = {k: v[key] for k, v in values.items() if np.isfinite(v[key]) and v[key] > 0}
        if len(got) < 2:
            continue
        hi, lo = max(got, key=got.__getitem__), min(got, key=got.__getitem__)
        if got[hi] / got[lo] >= DIFFER:
            said.append(f"{what} ({hi} {got[hi] / got[lo]:.1f}× {lo}'s)")
    return f"; they differ in {' and '.join(said)}" if said else ""


def compiler_table(report: Report) -> list[str]:
    """The compiled programs of each group (:func:`compiler_rows`) as Markdown lines; [] when no run
    logged any of XLA's figures (eager and PyTorch only, or runs older than them)."""
    if not any(np.isfinite(e.m(k)) for e in report.entries for k in COMPILER if k != "compile_s"):
        return []
    keys = list(COMPILER)
    head = ["program", "strategies", "ms/iter", *(COMPILER[k] for k in keys)]
    head.insert(6, "bytes/iter ÷ floor bytes")
    lines: list[str] = []
    for group in report.groups:
        rows = compiler_rows(report, group)
        if not rows:
            continue
        cells = []
        for r in rows:
            cells.append([r.program, r.strategies, f"{r.ms_per_iter:.2f}", *(CELLS[k](r.values[k]) for k in keys)])
            cells[-1].insert(6, num(r.bytes_x_floor, "{:.2f}", DASH))
        lines += [
            f"{report.group_label(group)}:",
            "",
            *md_table(head, cells, "|---|---|" + "---:|" * (len(head) - 2)),
            "",
        ]
    return lines
