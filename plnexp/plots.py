"""Figures written as files (matplotlib's object API with the Agg canvas: no pyplot, no GUI state)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def elbo_png(curve, title: str, path: str | Path) -> Path:
    """The ELBO curve against the iteration, saved as a PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    curve = np.asarray(curve, dtype=float)
    fig = Figure(figsize=(6, 3.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(np.arange(len(curve)), curve, lw=1.2)
    ax.set_xlabel("iteration")
    ax.set_ylabel("ELBO")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return Path(path)
