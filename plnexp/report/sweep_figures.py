"""A sweep report's PNGs (:mod:`plnexp.report.summary` writes them): what each figure shows, from the
report's entries, drawn by :mod:`plnexp.report.sweep_plots`: ``elbo_curves.png`` (one panel per
group), ``timings.png`` (each group's strategies as its verdict ranks them: :func:`timing_panel`), ``bytes.png`` (one point per program: :func:`plnexp.report.compiler_table.compiler_rows`)
and, when the sweep varies the data size, ``scaling.png``; then the presets' own
(:mod:`plnexp.report.tradeoffs`, :mod:`plnexp.report.convergence_figures`, :mod:`plnexp.report.rank_report`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import convergence_figures, rank_report, speed, sweep_plots, tradeoffs  # (the presets' own figures)
from .compiler_table import compiler_rows
from .entries import median, varying as varying_fields, Entry, Report


def figures(report: Report, folder: Path) -> list[str]:
    """Write the report's PNGs into ``folder``; returns their names."""
    ok = [e for e in report.grid if e.ok]  # the control job: not drawn (its original is)
    if not ok:
        return []
    names = []
    each: tuple[tuple[str, Callable[[Report, tuple], Any], Callable[[list, Path], Path]], ...] = (
        ("elbo_curves.png", curve_panel, sweep_plots.elbo_curves_png),
        ("timings.png", timing_panel, sweep_plots.timings_png),
        ("bytes.png", bytes_panel, sweep_plots.bytes_png),
    )
    for name, panel, draw in each:  # one panel per group: never two precisions or models
        found = [p for p in (panel(report, g) for g in report.groups) if p is not None]
        if found:
            draw(found, folder / name)
            names.append(name)
    size = _size_axis(ok)
    if size is not None:
        label, get = size
        series: dict[str, tuple[list, list]] = {}
        rest = varying_fields([e.group for e in ok], 1)
        for e in ok:
            x, y = series.setdefault(", ".join([e.strategy, *(str(e.group[i]) for i in rest)]), ([], []))
            x.append(get(e))
            y.append(speed.of(report, e).ms_per_iter)  # the rounds' where its group had them
        sweep_plots.scaling_png(
            series, label, f"ms per iteration against the data size ({report.experiment})", folder / "scaling.png"
        )
        names.append("scaling.png")
    names += tradeoffs.figures(report, folder)
    names += convergence_figures.figures(report, folder)
    names += rank_report.figures(report, folder)
    return names


def curve_panel(report: Report, group: tuple) -> sweep_plots.CurvePanel | None:
    """The group's panel of ``elbo_curves.png``: the ELBO curve of each finished strategy (the control
    job left out), how far they are from scan's, the best final ELBO. None without one."""
    entries = [e for e in report.groups[group] if e.ok and not e.control]
    if not entries:
        return None
    agree = [e.vs_scan for e in entries if np.isfinite(e.vs_scan)]
    k = min(len(e.curve) for e in entries)
    same = [e.strategy for e in entries if e.strategy != "scan" and e.vs_scan == 0.0]
    note = f"all within {max(agree):.1e} (relative) of scan" if agree else ""
    if same and len(same) == len(entries) - 1:
        note = "every curve equals scan's bit for bit"
    elif same:
        note += f"; {len(same)} of {len(entries) - 1} bit for bit equal to scan (no line below)"
    if len({len(e.curve) for e in entries}) > 1:
        note = (note + "; " if note else "") + f"common length {k}"
    # the float64 ELBO at the final parameters where logged: the compiled one rounds in its precision
    finals = [e.m("loglik") for e in entries if np.isfinite(e.m("loglik"))] or [
        e.m("final_elbo") for e in entries if np.isfinite(e.m("final_elbo"))
    ]
    return sweep_plots.CurvePanel(
        report.group_label(group),
        {e.strategy: e.curve for e in entries},  # (one group: its runs differ by strategy alone)
        note,
        max(finals, default=np.nan),
    )


def timing_panel(report: Report, group: tuple) -> sweep_plots.TimingPanel | None:
    """The group's panel of ``timings.png``: its finished strategies (the control job left out) ranked
    as the verdict ranks them (:func:`plnexp.report.speed.ranked`), each with its compile time and its
    run time: the interleaved rounds' (their ms/iter, whiskers the paired ratio's interval) where the
    verdict timed them all, else each job's own (whiskers its timed runs' spread). None without one."""
    entries = [e for e in speed.ranked(report, group) if e.ok and not e.control]
    if not entries:
        return None
    lengths = {int(e.m("n_iter_run")) for e in entries if np.isfinite(e.m("n_iter_run"))}
    shared = report.shared(group)
    letter = {n: chr(ord("A") + i) for i, c in enumerate(shared) for n in c.names}
    name = lambda e: f"{e.strategy} (program {letter[e.strategy]})" if e.strategy in letter else e.strategy
    programs = "".join(
        f"\nprogram {chr(ord('A') + i)}: one compiled program for {', '.join(c.names)}" for i, c in enumerate(shared)
    )
    sp = {e.run_id: speed.of(report, e) for e in entries}
    rounds = all(s.basis == speed.ROUNDS for s in sp.values())
    if rounds:  # the interleaved rounds' figures, which the verdict rests on (not each job's own run)
        run_s = {name(e): sp[e.run_id].ms_per_iter * e.m("n_iter_run") / 1e3 for e in entries}
        span = {name(e): tuple(ms * e.m("n_iter_run") / 1e3 for ms in sp[e.run_id].span_ms()) for e in entries}
    else:
        run_s = {name(e): e.m("run_s") for e in entries}
        span = {name(e): (e.m("run_s_lo"), e.m("run_s_hi")) for e in entries}
    return sweep_plots.TimingPanel(
        report.group_label(group) + programs,
        {name(e): e.m("compile_s") for e in entries},
        run_s,
        lengths.pop() if len(lengths) == 1 else None,
        span,
        rounds,
    )


def bytes_panel(report: Report, group: tuple) -> sweep_plots.BytesPanel | None:
    """The group's panel of ``bytes.png``: one point per program (:func:`compiler_rows`) that logged
    XLA's bytes per iteration, at its median ms/iter with its interval; the floor's bytes and ms/iter
    as lines; the programs without the figure named. None when no program of the group logged it."""
    rows = compiler_rows(report, group)
    points = {
        r.strategies: (r.values["xla_bytes_per_iter"], r.ms_per_iter)
        for r in rows
        if np.isfinite(r.values["xla_bytes_per_iter"]) and r.values["xla_bytes_per_iter"] > 0
    }
    if not points:
        return None
    spans = {r.strategies: r.span for r in rows if np.isfinite(r.span[0]) and np.isfinite(r.span[1])}
    runs = [e for e in report.groups[group] if e.ok and not e.control]
    return sweep_plots.BytesPanel(
        report.group_label(group),
        points,
        {k: spans[k] for k in points if k in spans},
        median([e.floor_bytes for e in runs]),
        median([e.m("floor_ms_per_iter") for e in runs]),
        [r.strategies for r in rows if r.strategies not in points],
    )


def _size_axis(entries: list[Entry]):
    """What the scaling plot puts on x: n if the sweep varies n, p if it varies p, n·p if both."""
    if any(e.n is None for e in entries):
        return None
    ns, ps = {e.n for e in entries}, {e.p for e in entries}
    if len(ns) > 1 and len(ps) > 1:
        return "n·p (cells)", lambda e: e.n * e.p
    if len(ns) > 1:
        return "n (rows)", lambda e: e.n
    if len(ps) > 1:
        return "p (columns)", lambda e: e.p
    return None
