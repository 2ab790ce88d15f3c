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

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


from .differences import _contended, aa_noise
from .entries import by, Entry, Report
from .dispatch_overhead import dispatch, dispatch_png
from .loop_forms import loop, loop_png
from .unroll_cost import unroll, unroll_png

# Per preset: the results of one set of runs compared together (its entries, label, the between-job
# noise, report.min_speedup): a result, a list of them, or a line saying why there is none; each result
# has ``lines()``. And the preset's figure of its results.
Analyse = Callable[[Sequence[Entry], str, float, float], Any]
PRESETS: dict[str, tuple[Analyse, Callable[[list[Any], Path], Path]]] = {
    "unroll": (lambda es, label, noise, _: unroll(es, label, noise), unroll_png),
    "dispatch": (lambda es, label, noise, _: dispatch(es, label, noise), dispatch_png),
    "loop": (loop, loop_png),
}


def preset(report: Report) -> str | None:
    """The preset a sweep ran: its parent's ``sweep`` tag, else its experiment's name; None for others."""
    return next((name for name in (report.parent.sweep or "", report.experiment) if name in PRESETS), None)


def compared(report: Report, name: str) -> dict[str, list[Entry]]:
    """The runs each result of preset ``name`` compares, by their label: a comparison group's; for
    dispatch, the runs of every data size with one device, precision and set of other values."""
    if name != "dispatch":
        return {report.group_label(g): es for g, es in report.groups.items()}
    sizes = by([e for e in report.entries if not e.peer], lambda e: e.group[1:])  # (device, precision, *others)
    extra = lambda g: [f"{k}={v}" for k, v in zip(report.extra_keys, g[2:])]
    return {", ".join([g[1], g[0], *extra(g)]): es for g, es in sizes.items()}


def results(report: Report) -> tuple[str | None, list[Any]]:
    """The preset and its results, one or more per set of runs compared (a line of text where there is none)."""
    name = preset(report)
    if name is None:
        return None, []
    noise = aa_noise(report.entries)
    out: list[Any] = []
    for label, es in compared(report, name).items():
        r = PRESETS[name][0](es, label, noise, report.min_speedup)
        out += r if isinstance(r, list) else [r]
    return name, out


def lines(report: Report) -> list[str]:
    """The preset's headline lines ([] for a sweep that is not one of :data:`PRESETS`)."""
    name, found = results(report)
    out = [line for r in found for line in ([r] if isinstance(r, str) else r.lines())]
    if name is None or not out:
        return out
    out[-1] += "".join(dict.fromkeys(_contended(es, report.contended) for es in compared(report, name).values()))
    return out


def figures(report: Report, folder: Path) -> list[str]:
    """The preset's own figure in ``folder`` (``unroll.png``, ``dispatch.png``, ``loop.png``); its name,
    or [] where there is none."""
    name, found = results(report)
    drawable = [r for r in found if not isinstance(r, str)]
    if name is None or not drawable:
        return []
    PRESETS[name][1](drawable, Path(folder) / f"{name}.png")
    return [f"{name}.png"]
