"""``convergence.png`` in a sweep's report (:mod:`plnexp.report.convergence_report` says what reaches ε
first): the relative gap to the optimum against seconds, one curve per run, for ``sweep=convergence``
and any sweep that varies the precision (:func:`plnexp.report.convergence_report.drawn`). What goes in
each panel (:func:`panels`: one per data set and value of the grouping keys but the optimizer) and the
drawing itself (:func:`gaps_png`, on :func:`plnexp.measure.plots.figure`).
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..measure import convergence
from ..measure.plots import log_axis, panels_figure, save
from .convergence_report import _data_label, _fields, drawn, optimum
from .entries import by, varying, Entry, Report


FLOOR = 1e-10  # the figure draws a gap at or below this (float32 can end above the optimum) at this value
MAX_LINES = 8  # curves a panel of gaps_png holds before the caller splits it further
PRECISION_STYLES = {"float64": "-", "float32": "--"}  # gaps_png: one line style per precision


@dataclass
class GapLine:
    """One curve of :func:`gaps_png`: a run's relative gap to the optimum against seconds."""

    label: str  # the legend's entry for its colour (the run's config but its precision)
    color_key: str  # runs of one key share a colour across panels ("peer": black)
    precision: str  # its line style (PRECISION_STYLES); "" for none
    x: np.ndarray  # seconds at each iteration
    gap: np.ndarray  # (optimum - ELBO) / |optimum| at each iteration (may be <= 0: float32 rounding)
    resolution: float = 0.0  # the gap its precision cannot tell from 0: drawn no lower (below it, rounding)


@dataclass
class GapPanel:
    """One panel of :func:`gaps_png`."""

    title: str
    lines: list[GapLine] = field(default_factory=list)


def gaps_png(
    panels: list[GapPanel],
    path: str | Path,
    epsilons: tuple[float, ...] = (),
    resolutions: dict[str, float] | None = None,
    floor: float = 1e-10,
) -> Path:
    """The relative gap to the optimum (log) against seconds, one curve per run, the panels sharing
    both axes (float32 against float64 at a glance): a run's colour is its config, its line style its
    precision (solid float64, dashed float32), the peer black. Each ε a grey dotted line, each
    precision's resolution (the gap it cannot tell from 0) a dash-dotted one where above ``floor``; a
    curve is drawn no lower than its own resolution (below it, its rounding: a flat line there has
    reached what its precision can tell), nor than ``floor``. One legend for the figure, below the panels."""
    from matplotlib.lines import Line2D

    resolutions = {p: r for p, r in (resolutions or {}).items() if r > floor}  # float64's: under the axis
    ncols = min(2, len(panels))
    keys = list(dict.fromkeys(line.color_key for p in panels for line in p.lines if line.color_key != "peer"))
    colors = {k: f"C{i % 10}" for i, k in enumerate(keys)}
    colors["peer"] = "black"
    labels = {line.color_key: line.label for p in panels for line in p.lines}
    precisions = list(dict.fromkeys(line.precision for p in panels for line in p.lines if line.precision))
    legend_rows = -(-(len(labels) + len(precisions) + len(resolutions) + 1) // 3)
    fig, axes = panels_figure(
        len(panels), 11 if ncols > 1 else 8, 3.8, 0.9 + 0.2 * legend_rows, sharex=True, sharey=True
    )
    xs = np.concatenate([line.x for p in panels for line in p.lines] or [np.ones(1)])
    for i, (ax, panel) in enumerate(zip(axes, panels)):
        for line in panel.lines:
            y = np.maximum(np.asarray(line.gap, dtype=float), max(floor, line.resolution))
            style = PRECISION_STYLES.get(line.precision, ":")
            ax.plot(line.x, y, ls=style, lw=1.0 if line.color_key == "peer" else 1.4, color=colors[line.color_key])
        for eps in epsilons:
            ax.axhline(eps, color="0.5", ls=":", lw=0.8)
            ax.annotate(
                f"ε={eps:.0e}", (1.0, eps), xycoords=("axes fraction", "data"), fontsize=7, color="0.35", ha="right"
            )
        for r in resolutions.values():
            ax.axhline(r, color="tab:red", ls="-.", lw=0.8)
        ax.set_yscale("log")
        log_x = log_axis(ax, "x", xs)
        ax.set_title(textwrap.fill(panel.title, 60 if ncols > 1 else 90), fontsize=9)
        ax.grid(alpha=0.3, which="major")
        ax.xaxis.set_tick_params(labelbottom=True)
        ax.set_xlabel("seconds: compile, then steady run" + (" (log)" if log_x else ""))
        if i % ncols == 0:  # the panels share the axis
            ax.set_ylabel("(optimum − ELBO) / |optimum|, log")
    handles = [Line2D([], [], color=colors[k], lw=1.4, label=labels[k]) for k in [*keys, "peer"] if k in labels]
    handles += [Line2D([], [], color="0.2", ls=PRECISION_STYLES.get(p, ":"), label=p) for p in precisions]
    handles += [
        Line2D([], [], color="tab:red", ls="-.", lw=0.8, label=f"{p}'s resolution ({r:.1e})")
        for p, r in resolutions.items()
    ]
    handles.append(Line2D([], [], color="0.5", ls=":", lw=0.8, label="ε"))
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    title = (
        "Relative gap to the optimum against seconds (each curve starts at its compile time, and is drawn no "
        f"lower than its precision's resolution or {floor:.0e})"
    )
    return save(fig, path, textwrap.fill(title, 120 if ncols > 1 else 90), fontsize=10)


def panels(report: Report) -> list[GapPanel]:
    """The panels of ``convergence.png``: one per data set and value of the other grouping keys but the
    optimizer (and per strategy where a panel would hold more than :data:`MAX_LINES` curves);
    in each, float32 and float64 runs of one config in one colour (:func:`gaps_png`)."""
    runs = [e for e in report.entries if e.ok and not e.control and not e.peer and len(e.curve)]
    if not runs:
        return []
    differ = varying([_fields(e) for e in runs])
    optimizer = {3 + i for i, k in enumerate(report.extra_keys) if k.startswith("optimizer.")}
    split = [i for i in differ if i != 2 and i not in optimizer and i != 0]  # precision and optimizer: in a panel
    out = []
    for key, members in _panel_split(runs, differ, split).items():
        peers = [e for e in report.entries if e.ok and e.peer and e.data == members[0].data and len(e.curve)]
        fields = [i for i in differ if i not in key[0]]  # what tells the panel's runs apart
        series = [line for e in members + peers if (line := _line(e, optimum(report, e.data)[0], fields))]
        title = ", ".join(f"{_FIELD_NAMES.get(i, report.extra_keys[i - 3] if i >= 3 else i)}={v}" for i, v in key[1])
        out.append(GapPanel(title or _data_label(report, members[0].data), series))
    return out


_FIELD_NAMES = {0: "strategy", 1: "data", 2: "precision"}


def _panel_split(runs: list[Entry], differ: list[int], split: list[int]) -> dict[tuple, list[Entry]]:
    """Runs by the panel fields ``split``; strategy (field 0) added where a panel would hold too many."""
    panel = lambda fields: by(runs, lambda e: (tuple(fields), tuple((i, _fields(e)[i]) for i in fields)))
    panels = panel(split)
    if 0 in differ and max(len(es) for es in panels.values()) > MAX_LINES:
        panels = panel([0, *split])
    return panels


def _line(e: Entry, optimum_elbo: float, fields: list[int]) -> GapLine | None:
    """The run's gap curve against seconds: ``curve[i]`` (the ELBO after i updates) at
    compile_s + i × run_s / n_iter_run, so that the curve starts at its compile time."""
    n, run_s = e.m("n_iter_run"), e.m("run_s")
    if not (math.isfinite(optimum_elbo) and n > 0 and math.isfinite(run_s)):
        return None
    curve = np.asarray(e.curve, dtype=float)
    compile_s = e.m("compile_s") if math.isfinite(e.m("compile_s")) else 0.0
    x = compile_s + np.arange(len(curve)) * run_s / n
    gap = convergence.gap_rel(curve, optimum_elbo)
    resolution = e.m("gap_resolution_rel") if math.isfinite(e.m("gap_resolution_rel")) else 0.0
    if e.peer:
        return GapLine(f"{e.peer} (peer)", "peer", "", x, gap, resolution)
    name = ", ".join(_fields(e)[i] for i in fields if i != 2) or e.strategy
    return GapLine(name, name, e.precision, x, gap, resolution)


def figures(report: Report, folder: Path) -> list[str]:
    """``convergence.png`` in ``folder`` where the report has it (:func:`drawn`); its name, or []."""
    if not drawn(report):
        return []
    found = panels(report)
    if not any(p.lines for p in found):
        return []
    resolutions: dict[str, float] = {}
    for e in report.entries:
        r = e.m("gap_resolution_rel")
        if e.ok and math.isfinite(r):
            resolutions[e.precision] = max(resolutions.get(e.precision, 0.0), r)
    gaps_png(found, Path(folder) / "convergence.png", convergence.EPSILONS, resolutions, FLOOR)
    return ["convergence.png"]
