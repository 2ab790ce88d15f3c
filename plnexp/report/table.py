"""The report's one compact table: per group, its strategies fastest first as the verdict ranks them,
in at most ten columns and one speed convention (time ÷ the reference's: :mod:`plnexp.report.speed`).

report.md, report.html and the terminal show this table; report.csv keeps every column of every run
(:func:`plnexp.report.csv_table.csv_text`), in this table's order.
"""

from __future__ import annotations

from . import speed
from .entries import num

MAX_COLUMNS = 10


def head(report, group: tuple) -> list[str]:
    """The group's columns (at most :data:`MAX_COLUMNS`)."""
    ref = speed.reference(report, group)
    if report.verdict_of(group) is not None:
        cols = ["strategy", "ms/iter (rounds)", f"time ÷ {ref}", "95% interval", "verdict", "rounds"]
    else:
        cols = ["strategy", "ms/iter (own runs)", f"time ÷ {ref}", "runs", "timing"]
    return cols + ["compile s", "final ELBO", f"curve vs {ref}"]


def row(report, e) -> list[str]:
    """One run's cells, in :func:`head`'s order."""
    s = speed.of(report, e)
    name = e.label
    others = [n for n in report.program(e).split(" = ") if n not in ("-", e.strategy)]
    if others:  # one compiled program: timed as one
        name += f" (= {', '.join(others)})"
    if report.verdict_of(e.group) is not None:
        if not e.ok:
            verdict = e.status
        elif e.control:
            verdict = "control (A/A, not ranked)"
        else:
            verdict = s.verdict or "-"
        rounds = str(s.rounds) if s.rounds else "-"
        cells = [name, num(s.ms_per_iter, "{:.2f}"), num(s.ratio, "{:.3f}"), s.interval(), verdict, rounds]
    else:
        runs = e.m("n_runs")
        timing = "contended" if e.run_id in report.contended else "ok" if e.ok else e.status
        cells = [name, num(s.ms_per_iter, "{:.2f}"), num(s.ratio, "{:.3f}"), num(runs, "{:.0f}"), timing]
    return cells + [num(e.m("compile_s"), "{:.3f}"), num(e.m("final_elbo"), "{:.1f}"), num(e.vs_scan, "{:.1e}")]


def rows(report, group: tuple) -> list[list[str]]:
    """The group's rows, fastest first (:func:`plnexp.report.speed.ranked`)."""
    return [row(report, e) for e in speed.ranked(report, group)]


def aligned(rows: list, rule: bool = False) -> list[str]:
    """Rows of cells as text columns, the first left-aligned, the others right-aligned (a plain string:
    a line of its own); ``rule``: dashes under the first row."""
    cells = [r for r in rows if not isinstance(r, str)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
    out = [r if isinstance(r, str) else fmt(r) for r in rows]
    return out[:1] + ["  ".join("-" * w for w in widths)] + out[1:] if rule else out


def text(report, group: tuple) -> str:
    """The group's table for the terminal: columns aligned, fastest first."""
    return "\n".join(aligned([head(report, group), *rows(report, group)], rule=True))
