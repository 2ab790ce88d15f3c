"""Figures written as files (matplotlib's object API with the Agg canvas: no pyplot, no GUI state).

Each function takes plain data, draws one figure and saves it as a PNG; what to plot is decided by the
caller. Here: the figure itself (:func:`figure`), its axes' helpers, and one run's ELBO curve
(:func:`elbo_png`, which the store draws for every run, :mod:`plnexp.store.writes`). The report's own
figures are drawn in :mod:`plnexp.report.sweep_plots` and :mod:`plnexp.report.convergence_figures`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


LOG_RANGE = 30.0  # bars spanning more than this ratio get a log axis


def figure(width: float, height: float, margins: tuple[float, float, float, float] | None = None):
    """A new Matplotlib figure of ``width`` x ``height`` inches (100 dpi) on its own Agg canvas, outside
    pyplot: no global state, no GUI backend (the report's figures are drawn the same way). Laid out by
    constrained layout, which measures every label at each save (most of a small figure's cost), or,
    given ``margins`` (left, bottom, right, top, as fractions of the figure), by those fixed margins:
    for a figure whose decorations have a known size (one axes, one title line, ticks of at most seven
    characters)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout=None if margins else "constrained")
    if margins:
        left, bottom, right, top = margins
        fig.subplots_adjust(left=left, bottom=bottom, right=right, top=top)
    FigureCanvasAgg(fig)
    return fig


def _plain_log(axis, span: float) -> None:
    """Log-axis ticks written as plain numbers (0.05, 2, 500), no minor labels: at 1, 2, 5 x 10^k
    when the values span at most two decades (``span``: largest / smallest), else at 10^k."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if span <= 100 else (1.0,)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def panels_figure(
    n: int, width: float, row_height: float, extra: float = 0.4, ncols: int = 2, *, subfigures=False, **kw
):
    """A figure of ``n`` panels in rows of ``ncols`` (fewer with fewer panels): ``width`` inches wide,
    ``row_height`` per row plus ``extra`` (a title), and its ``n`` panels, flat: axes (``kw``: as
    :meth:`~matplotlib.figure.Figure.subplots` takes them, ``sharex``...), or subfigures where a panel
    holds several axes; the grid's unused cells hidden."""
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    fig = figure(width, row_height * nrows + extra)
    cells = (fig.subfigures if subfigures else fig.subplots)(nrows, ncols, squeeze=False, **kw).ravel()
    for cell in cells[n:]:
        cell.set_visible(False)
    return fig, cells[:n]


def log_axis(ax, which: str, values, span: float = LOG_RANGE) -> bool:
    """``ax``'s ``which`` axis ("x" or "y") on a log scale with plain ticks (:func:`_plain_log`) when the
    finite positive ``values`` span more than ``span`` (largest / smallest; ``span`` 0: always);
    whether it is."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    ratio = v.max() / v.min() if len(v) else 1.0
    log = span <= 0 or (len(v) > 0 and ratio > span)
    if log:
        getattr(ax, f"set_{which}scale")("log")
        _plain_log(getattr(ax, f"{which}axis"), ratio)
    return log


def save(fig, path: str | Path, title: str = "", fontsize: float = 11) -> Path:
    """The figure, under its ``title`` (none where ""), saved as a PNG at ``path``."""
    if title:
        fig.suptitle(title, fontsize=fontsize)
    fig.savefig(path)
    return Path(path)


ELBO_MARGINS = (0.17, 0.14, 0.97, 0.89)  # elbo_png's: room for 7-character ticks and a title over an offset


def elbo_figure(curve, title: str):
    """One run's ELBO curve against the iteration (:func:`elbo_png`'s figure), in fixed margins: every
    run draws one, and its ticks (at most seven characters: the formatter writes larger numbers with
    an offset) and one-line title need no layout."""
    curve = np.asarray(curve, dtype=float)
    fig = figure(6, 3.5, margins=ELBO_MARGINS)
    ax = fig.add_subplot()
    ax.plot(np.arange(len(curve)), curve, lw=1.2)
    ax.set_xlabel("iteration")
    ax.set_ylabel("ELBO (nats)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    return fig


def elbo_png(curve, title: str, path: str | Path) -> Path:
    """One run's ELBO curve against the iteration, saved as a PNG."""
    return save(elbo_figure(curve, title), path)
