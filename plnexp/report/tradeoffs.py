"""The headlines of the trade-off presets (``sweep=unroll``, ``sweep=dispatch``, ``sweep=loop``): what
each one measured, with its spread, in a few lines and one figure.

A report (:mod:`plnexp.report.summary`) asks :func:`lines` and :func:`figures`; both read the preset from
the parent run's ``sweep`` tag (the sweep file's name; the experiment's name where the tag names
no preset) and return nothing for any other sweep. Everything here is computed from the report's
entries (median ms/iter, its interval from ``run_s_lo``/``run_s_hi``: :func:`plnexp.jobs.ranking.interval_ms`,
``compile_s``, the XLA counts where logged); nothing is measured. A difference whose interval
contains zero (the two runs' intervals overlap) is "no measurable" difference; so is one within
the between-job noise where the sweep ran a control job (its reference job again at its end, tagged
``plnexp.control``: :mod:`plnexp.experiment.sweep`): how far the control's median lies from its original's
(:func:`plnexp.report.differences.aa_noise`). The control job itself is never one of the compared runs.

- ``unroll`` (:mod:`plnexp.report.unroll_cost`): the compile seconds (and XLA instructions) each extra unrolled step adds, from a
  least-squares line over the unroll factors; the unroll with the lowest ms/iter and its gain over
  unroll 1; the break-even for a fit of :data:`~plnexp.report.unroll_cost.FIT_ITERS` iterations: the unroll ``u`` at which the
  compile time added, ``slope * (u - 1)``, equals the most run time any unroll saved.
- ``dispatch`` (:mod:`plnexp.report.dispatch_overhead`): per data size, ``jit_per_function - scan`` and ``eager - scan`` in ms/iter and as a
  share of scan's, and the size from which that share stays under :data:`~plnexp.report.dispatch_overhead.THRESHOLD`; the overhead
  split by least squares over the sizes into a fixed part (the dispatch itself) and one that grows
  with the data, and the size from which the fixed part is under the threshold.
- ``loop`` (:mod:`plnexp.report.loop_forms`): ``fori_loop - scan`` (the loop form), ``while_loop - fori_loop`` (the stopping
  condition) and ``while_loop - scan``, per data size; whether every run did all its iterations.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


from .differences import _contended, aa_noise
from .entries import by, Entry, Report
from .dispatch_overhead import dispatch, dispatch_png
from .loop_forms import loop, loop_png
from .unroll_cost import Unroll, unroll, unroll_png


PRESETS = ("unroll", "dispatch", "loop")


def preset(report: Report) -> str | None:
    """The preset a sweep ran: its parent's ``sweep`` tag, else its experiment's name; None for others."""
    tag = report.parent.sweep or ""
    for name in (tag, report.experiment):
        if name in PRESETS:
            return name
    return None


def _dispatch_groups(report: Report) -> dict[tuple, list[Entry]]:
    """The report's entries by everything but the data set (device, precision, the other values)."""
    return by(report.entries, lambda e: e.group[1:])


def _dispatch_label(report: Report, entries: list[Entry]) -> str:
    e = entries[0]
    return ", ".join([e.precision, e.device, *(f"{k}={v}" for k, v in zip(report.extra_keys, e.extra))])


def results(report: Report) -> tuple[str | None, list[Any]]:
    """The preset and its results, one per comparison group (a line of text where there is none)."""
    name = preset(report)
    if name is None:
        return None, []
    noise = aa_noise(report.entries)
    if name == "unroll":
        return name, [unroll(es, report.group_label(g), noise) for g, es in report.groups.items()]
    if name == "loop":
        return name, [loop(es, report.group_label(g), noise, report.min_speedup) for g, es in report.groups.items()]
    if name == "dispatch":
        out: list[Any] = []
        for es in _dispatch_groups(report).values():
            r = dispatch(es, _dispatch_label(report, es), noise)
            out += [r] if isinstance(r, str) else r
        return name, out
    return None, []


def lines(report: Report) -> list[str]:
    """The preset's headline lines ([] for a sweep that is not one of :data:`PRESETS`)."""
    name, found = results(report)
    if not found:
        return []
    out: list[str] = []
    groups = _dispatch_groups(report) if name == "dispatch" else report.groups
    caveat = "".join(dict.fromkeys(_contended(es, report.contended) for es in groups.values()))
    for r in found:
        if isinstance(r, str):
            out.append(r)
        elif isinstance(r, Unroll):
            out += r.lines()
        else:
            out.append(r.line())
    if out and caveat:
        out[-1] += caveat
    return out


def figures(report: Report, folder: Path) -> list[str]:
    """The preset's own figure in ``folder`` (``unroll.png``, ``dispatch.png``, ``loop.png``); its name,
    or [] where there is none."""
    name, found = results(report)
    drawable = [r for r in found if not isinstance(r, str)]
    if name is None or not drawable:
        return []
    draw: dict[str, Callable[[list[Any], Path], Path]] = {
        "unroll": unroll_png,
        "dispatch": dispatch_png,
        "loop": loop_png,
    }
    draw[name](drawable, Path(folder) / f"{name}.png")
    return [f"{name}.png"]
