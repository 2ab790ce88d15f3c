"""The report's figures of a sweep (:func:`plnexp.report.sweep_figures.figures` decides what is in them):
the ELBO curves (:func:`elbo_curves_png`), compile and run time (:func:`timings_png`), ms/iter against
XLA's bytes per iteration (:func:`bytes_png`) and against the data size (:func:`scaling_png`). Each takes
plain data (panels of curves and numbers), draws one figure with :func:`plnexp.measure.plots.figure`
(matplotlib's object API on the Agg canvas: no pyplot, no GUI state) and saves it as a PNG.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..measure.plots import figure, log_axis, panels_figure, save


LINESTYLES = ("-", "--", "-.", ":")


@dataclass
class CurvePanel:
    """One panel of :func:`elbo_curves_png`: a title and the ELBO curve of each labelled run."""

    title: str
    curves: dict[str, np.ndarray] = field(default_factory=dict)
    note: str = ""  # a line under the title (e.g. how far the curves are apart)
    final: float = float("nan")  # the best final ELBO of the panel's runs (after their last step, as tables show:
    # the float64 ELBO at their final parameters where logged)


def converged(curve, tail: float = 0.1, rtol: float = 1e-5) -> bool:
    """Whether an ELBO curve has flattened: over its last ``tail`` of iterations it gained less than
    ``rtol`` of its best value. Then the gap to the best value reads well on a log axis; before that,
    the gap dives to zero at the last iteration (the best so far) and misleads."""
    c = np.asarray(curve, dtype=float)
    c = c[np.isfinite(c)]
    if len(c) < 10:
        return False
    best = c.max()
    return best - c[int(len(c) * (1 - tail))] <= rtol * max(abs(best), 1.0)


def elbo_curves_png(panels: list[CurvePanel], path: str | Path, reference: str = "scan") -> Path:
    """The ELBO against the iteration for every run, one panel per comparison group (never two
    precisions or models in one). On a log axis: the gap to the panel's best ELBO (its best final
    ELBO, after the last step, as the tables show it; else the curves' best) when the curves have
    flattened (:func:`converged`), else -ELBO (the ELBO
    spans decades in the first iterations, which flattens every curve on a linear axis). Curves that
    agree lie on top of each other, so under each panel a second one shows how far each curve is
    from ``reference``'s (relative difference per iteration, log axis), when the panel has one that
    differs from it (none where every curve equals it bit for bit: the caller's note says so)."""
    every = [{k: np.asarray(c, dtype=float) for k, c in panel.curves.items() if len(c)} for panel in panels]
    refs = [next((c for k, c in curves.items() if k.split(",")[0] == reference), None) for curves in every]
    refs = [
        r if r is not None and any(_differs(c, r) for c in cs.values() if c is not r) else None
        for r, cs in zip(refs, every)
    ]
    wide = len(panels) > 1  # two panels a row
    height = 5.2 if any(r is not None for r in refs) else 3.9
    fig, subs = panels_figure(len(panels), 11 if wide else 8, height, subfigures=True)
    for sub, panel, curves, ref in zip(subs, panels, every, refs):
        ax, dax = sub.subplots(2, 1, sharex=True, height_ratios=(2, 1)) if ref is not None else (sub.subplots(), None)
        finite = [c[np.isfinite(c)] for c in curves.values()]
        best = max((c.max() for c in finite if len(c)), default=np.nan)
        best = best if not np.isfinite(panel.final) else max(best, panel.final) if np.isfinite(best) else panel.final
        gap = np.isfinite(best) and all(converged(c) for c in curves.values())
        negative = all(len(c) and c.max() < 0 for c in finite)
        floor = max(abs(best), 1.0) * 1e-12 if np.isfinite(best) else 1e-12
        for i, (label, c) in enumerate(curves.items()):
            style = dict(lw=1.4, ls=LINESTYLES[i % len(LINESTYLES)], color=f"C{i % 10}", alpha=0.9)
            y = np.maximum(best - c, floor) if gap else (-c if negative else c)
            ax.plot(np.arange(1, len(c) + 1), y, label=label, **style)
            if dax is not None and ref is not None and c is not ref:  # dax: there is a ref
                k = min(len(c), len(ref))
                rel = np.abs(c[:k] - ref[:k]) / np.maximum(np.abs(ref[:k]), np.finfo(float).tiny)
                dax.plot(np.arange(1, k + 1), np.where(rel > 0, rel, np.nan), **style)
        if gap or negative:
            ax.set_yscale("log")
        ax.set_ylabel("best ELBO − ELBO (nats, log)" if gap else "−ELBO (nats, log)" if negative else "ELBO (nats)")
        # the title's value: the panel's best final ELBO as the tables show it (float32 curves can round above it)
        what, shown = ("best final ELBO", panel.final) if np.isfinite(panel.final) else ("best ELBO", best)
        title = panel.title + (f"; {what} {shown:,.1f}" if np.isfinite(shown) else "")
        width = 70 if wide else 100  # characters a panel's title holds at fontsize 9
        ax.set_title(
            textwrap.fill(title, width) + ("\n" + textwrap.fill(panel.note, width) if panel.note else ""), fontsize=9
        )
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        bottom = ax
        if dax is not None:
            dax.set_yscale("log")
            dax.set_ylabel(f"|ELBO − {reference}| / |{reference}|\n(log; 0 not drawn)", fontsize=8)
            dax.grid(alpha=0.3, which="both")
            bottom = dax
        bottom.set_xlabel("iteration")
    return save(fig, path, "ELBO against iteration, per strategy")


def _differs(curve: np.ndarray, ref: np.ndarray) -> bool:
    """Whether ``curve`` differs from ``ref`` anywhere over their common length (NaN equal to NaN)."""
    k = min(len(curve), len(ref))
    return not np.array_equal(curve[:k], ref[:k], equal_nan=True)


@dataclass
class TimingPanel:
    """One panel of :func:`timings_png`: per labelled run, its compile and steady run time (s)."""

    title: str
    compile_s: dict[str, float] = field(default_factory=dict)
    run_s: dict[str, float] = field(default_factory=dict)
    n_iter: int | None = None  # the runs' common length, for the axis label
    run_span: dict[str, tuple[float, float]] = field(default_factory=dict)  # the run times' interval (error bar)
    rounds: bool = False  # the run times are the interleaved rounds' medians, the spans their paired ratio's interval


def timings_png(panels: list[TimingPanel], path: str | Path) -> Path:
    """Compile time against steady run time per strategy, as grouped horizontal bars with the value
    at each bar's end, the run time's interval as an error bar; a log axis when the times span more
    than :data:`plnexp.measure.plots.LOG_RANGE`. Labels name the program group (``a = b``) where the caller joined them."""
    rows = max((len(p.run_s) for p in panels), default=1)
    fig, axes = panels_figure(len(panels), 11, 0.42 * rows + 1.4, sharex=True)  # one time axis for all
    every = [v for p in panels for v in [*p.compile_s.values(), *p.run_s.values()]]  # one scale for every panel
    for ax, panel in zip(axes, panels):
        labels = list(panel.run_s)
        y = np.arange(len(labels))
        values = [
            np.array([panel.compile_s.get(k, np.nan) for k in labels], dtype=float),
            np.array([panel.run_s[k] for k in labels], dtype=float),
        ]
        runs = f"steady run ({panel.n_iter} iterations)" if panel.n_iter else "steady run"
        if panel.rounds:
            runs = runs.replace("steady run", "steady run in the rounds") + (
                ":\nmedian, whiskers: the paired\nratio's 95% interval" if panel.run_span else ""
            )
        elif panel.run_span:
            runs += ":\nmedian, whiskers: IQR\n(range below 5 runs)"
        for j, (v, name, color) in enumerate(zip(values, ("compile", runs), ("tab:orange", "tab:blue"))):
            shown = np.where(np.isfinite(v) & (v > 0), v, np.nan)
            err = None
            if j == 1 and panel.run_span:
                spans = np.array([panel.run_span.get(k, (np.nan, np.nan)) for k in labels], dtype=float)
                err = np.nan_to_num(np.abs(spans.T - shown), nan=0.0)
            bars = ax.barh(
                y + (j - 0.5) * 0.4,
                shown,
                height=0.4,
                color=color,
                label=name,
                xerr=err,
                error_kw=dict(lw=1, capsize=2, ecolor="0.2"),
            )
            ax.bar_label(bars, labels=["" if not np.isfinite(s) else f"{s:.3g}" for s in shown], fontsize=7, padding=2)
            for yi, vi in zip(y + (j - 0.5) * 0.4, v):
                if vi == 0:  # nothing to draw: say so (eager compiles nothing ahead of time)
                    ax.annotate(
                        "0",
                        (0, yi),
                        xycoords=("axes fraction", "data"),
                        xytext=(3, 0),
                        textcoords="offset points",
                        va="center",
                        fontsize=7,
                    )
        ax.set_yticks(y, labels, fontsize=8)
        ax.invert_yaxis()
        log = log_axis(ax, "x", every)
        ax.xaxis.set_tick_params(labelbottom=True)
        ax.set_xlabel("seconds" + (", log scale" if log else ""))
        ax.set_title(panel.title, fontsize=9)
        ax.grid(alpha=0.3, axis="x", which="both")
        ax.margins(x=0.15)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return save(fig, path, "Compile time and steady run time, per strategy")


@dataclass
class BytesPanel:
    """One panel of :func:`bytes_png`: per labelled program, XLA's bytes per iteration and its ms/iter."""

    title: str
    points: dict[str, tuple[float, float]] = field(default_factory=dict)  # label -> (bytes/iter, ms/iter)
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)  # label -> its ms/iter interval
    floor_bytes: float = float("nan")  # the bytes one iteration must stream at least (plnexp.measure.floor)
    floor_ms: float = float("nan")  # the machine's floor ms/iter, where the runs logged it
    missing: list[str] = field(default_factory=list)  # programs without the figure (eager, PyTorch)


BYTES_LOG_RANGE = 10.0  # bytes spanning more than this ratio get a log axis
UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))


def _callouts(ax, labels: list[str], x, y, fontsize: float = 8, *, drawn: bool = False) -> None:
    """Each point's label in a column right of the axes, at its point's height where there is room,
    else moved just enough that no two labels overlap (in order of height: the leader lines do not
    cross), with a thin leader line to its point. No label covers a point or another label, however
    close the points lie. ``drawn``: the figure was drawn since the axes got their final limits and
    scales (one draw serves every panel of a figure: each costs a layout of the whole figure)."""
    if not labels:
        return
    if not drawn:
        ax.figure.draw_without_rendering()  # the axes' final limits and scales
    to_axes = ax.transAxes.inverted()
    desired = [to_axes.transform(ax.transData.transform((xi, yi)))[1] for xi, yi in zip(x, y)]
    order = sorted(range(len(labels)), key=lambda i: -desired[i])
    height_in = ax.get_position().height * ax.figure.get_figheight()
    step = min(
        1.6 * fontsize / 72 / max(height_in, 1e-6), 1.0 / len(labels)
    )  # one line of text, as a share of the axes
    slots: list[float] = []
    for i in order:
        want = min(max(desired[i], 0.0), 1.0)
        slots.append(min(want, slots[-1] - step) if slots else want)
    low = slots[-1] if slots else 0.0
    if low < step / 2:  # the column ran out at the bottom: lift it, no higher than the top
        lift = step / 2 - low
        slots = [s + lift for s in slots]
        over = slots[0] - 1.0
        if over > 0:
            slots = [1.0 - k * (1.0 - step / 2) / max(len(slots) - 1, 1) for k in range(len(slots))]
    for i, slot in zip(order, slots):
        ax.annotate(
            labels[i],
            (x[i], y[i]),
            xytext=(1.03, slot),
            textcoords="axes fraction",
            fontsize=fontsize,
            va="center",
            ha="left",
            arrowprops=dict(arrowstyle="-", lw=0.6, color="0.55", shrinkA=2, shrinkB=4),
        )


def bytes_png(panels: list[BytesPanel], path: str | Path) -> Path:
    """ms per iteration against the bytes XLA says one iteration accesses, one point per program
    (whiskers: its ms/iter interval), each labelled in a column beside the axes (:func:`_callouts`),
    one panel per comparison group; the floor's bytes (a vertical line) and ms/iter (a horizontal one)
    where known; a log x axis when the bytes span more than :data:`BYTES_LOG_RANGE`. The programs
    without the figure (no XLA program) are named under the title."""
    fig, axes = panels_figure(len(panels), 10, 4.4, ncols=1)
    callouts = []
    for ax, panel in zip(axes, panels):
        labels = list(panel.points)
        raw = np.array([panel.points[k][0] for k in labels], dtype=float)
        y = np.array([panel.points[k][1] for k in labels], dtype=float)
        every = raw[np.isfinite(raw) & (raw > 0)]
        floor_b = panel.floor_bytes if np.isfinite(panel.floor_bytes) and panel.floor_bytes > 0 else np.nan
        if np.isfinite(floor_b):
            every = np.append(every, floor_b)
        top = every.max() if len(every) else 1.0
        unit, size = next((u, v) for u, v in UNITS if top >= v or v == 1)
        x, every = raw / size, every / size
        spans = np.array([panel.spans.get(k, (v, v)) for k, v in zip(labels, y)], dtype=float)
        err = np.nan_to_num(np.abs(spans.T - y), nan=0.0)
        ax.errorbar(
            x,
            y,
            yerr=err,
            fmt="o",
            ms=5,
            lw=1,
            capsize=2,
            color="tab:blue",
            ecolor="0.3",
            zorder=3,
            label="median ms/iter, whiskers: IQR (range below 5 runs)",
        )
        if np.isfinite(floor_b):
            ax.axvline(
                floor_b / size,
                ls="--",
                lw=1,
                color="tab:green",
                label="floor's bytes: the arrays an iteration must stream",
            )
        if np.isfinite(panel.floor_ms) and panel.floor_ms > 0:
            ax.axhline(panel.floor_ms, ls=":", lw=1, color="tab:red", label="the machine's floor ms/iter")
        log = log_axis(ax, "x", every, BYTES_LOG_RANGE)
        if log:
            ax.set_xlim(every.min() / 1.5, every.max() * 1.5)
        elif len(every):
            lo, hi = every.min(), every.max()
            pad = 0.1 * (hi - lo) if hi > lo else 0.1 * hi
            ax.set_xlim(max(lo - pad, 0.0), hi + pad)
        tops = [v for v in (*spans.ravel(), *y, panel.floor_ms) if np.isfinite(v)]
        ax.set_ylim(0, 1.15 * max(tops, default=1.0))
        ax.set_xlabel(f"{unit} XLA accesses per iteration" + (", log scale" if log else ""))
        ax.set_ylabel("ms per iteration")
        title = textwrap.fill(panel.title, 90)
        if panel.missing:
            title += "\n" + textwrap.fill(f"not drawn (no XLA program): {', '.join(panel.missing)}", 100)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, which="major")
        ax.legend(fontsize=7, loc="best", frameon=True, framealpha=0.8)
        callouts.append((ax, labels, x, y))
    fig.draw_without_rendering()  # every panel's final limits and scales, in one layout (no pixels)
    for ax, labels, x, y in callouts:
        _callouts(ax, labels, x, y, drawn=True)
    return save(fig, path, "ms per iteration against the bytes one iteration accesses, one point per program")


def loglog_slope(x, y) -> float:
    """The least-squares slope of log y against log x (NaN with fewer than two distinct x)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if len(np.unique(x[ok])) < 2:
        return float("nan")
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


def common_slopes(series: dict[str, tuple[list, list]]) -> tuple[dict[str, float], dict[str, list], tuple]:
    """Per label, the log-log slope of y against x over the sizes every label has (finite y), and
    the sizes others have that it lacks; and those common sizes' (min, max)."""
    sizes = {k: {float(a) for a, b in zip(x, y) if np.isfinite(b)} for k, (x, y) in series.items()}
    every = set().union(*sizes.values()) if sizes else set()
    common = set.intersection(*sizes.values()) if sizes else set()
    slopes = {}
    for k, (x_list, y_list) in series.items():
        x, y = np.asarray(x_list, dtype=float), np.asarray(y_list, dtype=float)
        keep = np.isin(x, sorted(common))
        slopes[k] = loglog_slope(x[keep], y[keep])
    return (
        slopes,
        {k: sorted(every - s) for k, s in sizes.items()},
        (min(common, default=np.nan), max(common, default=np.nan)),
    )


def scaling_png(series: dict[str, tuple[list, list]], xlabel: str, title: str, path: str | Path) -> Path:
    """ms/iteration against the data size, log-log, one line per label. Each label's fitted slope
    (legend) is over the sizes every label has, so that slopes compare; a size another label has but
    this one lacks (a failed or missing run) is named in its legend entry and marked x on the axis."""
    fig = figure(8, 4.8)
    ax = fig.add_subplot()
    slopes, missing_of, (lo, hi) = common_slopes(series)
    span = f" over {lo:g}–{hi:g}" if any(missing_of.values()) and lo < hi else ""
    for i, (label, (x_list, y_list)) in enumerate(series.items()):
        order = np.argsort(x_list)
        x, y = np.asarray(x_list, dtype=float)[order], np.asarray(y_list, dtype=float)[order]
        slope, missing = slopes[label], missing_of[label]
        text = label + (f" (slope {slope:.2f}{span})" if np.isfinite(slope) else "")
        text += f"; missing {', '.join(f'{m:g}' for m in missing)}" if missing else ""
        (line,) = ax.plot(x, y, marker="o", ms=4, lw=1.4, ls=LINESTYLES[i % len(LINESTYLES)], label=text)
        if missing:
            ax.plot(
                missing,
                [0.0] * len(missing),
                ls="",
                marker="x",
                ms=7,
                color=line.get_color(),
                transform=ax.get_xaxis_transform(),
                clip_on=False,
            )
    for i, which in enumerate("xy"):  # log-log, whatever the span
        log_axis(ax, which, np.concatenate([np.asarray(xy[i], dtype=float) for xy in series.values()]), span=0)
    ax.set_xlabel(f"{xlabel}, log scale")
    ax.set_ylabel("ms per iteration, log scale")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return save(fig, path)
