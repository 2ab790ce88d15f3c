"""The table a sweep prints when it ends: one line per job, in job order.

Where the sweep timed its groups in interleaved rounds (the runs carry the verdict's figures:
``round_ms_per_iter``, ``paired_ratio`` and its interval, ``rounds_used``,
:meth:`plnexp.jobs.verdicts.StrategyResult.metrics`), its speed columns are the verdict's, the very
figures the report ranks by; a job's own timed run (often one run) is not shown as a speed at all.
Without rounds, the jobs' own timings (:func:`plnexp.experiment.runner.summary_table`).
"""

from __future__ import annotations

import math

from . import runner

HEAD = (
    "job",
    "status",
    "iter",
    "compile_s",
    "ms/iter (rounds)",
    "time ÷ ref",
    "95% interval",
    "rounds",
    "final ELBO",
    "wall_s",
)


def _num(fmt: str, x) -> str:
    return fmt.format(x) if x is not None and math.isfinite(x) else "-"


def with_rounds(rows) -> bool:
    """Whether any row carries a verdict's paired ratio."""
    return any(math.isfinite(r.metrics.get("paired_ratio", math.nan)) for r in rows)


def line(r) -> tuple[str, ...]:
    m = r.metrics
    lo, hi = m.get("paired_ratio_lo", math.nan), m.get("paired_ratio_hi", math.nan)
    interval = f"{lo:.2f}–{hi:.2f}" if math.isfinite(lo) and math.isfinite(hi) else "-"
    return (
        r.name,
        r.status,
        _num("{:.0f}", m.get("n_iter_run")),
        _num("{:.3f}", m.get("compile_s")),
        _num("{:.2f}", m.get("round_ms_per_iter")),
        _num("{:.3f}", m.get("paired_ratio")),
        interval,
        _num("{:.0f}", m.get("rounds_used")),
        _num("{:.1f}", m.get("final_elbo")),
        f"{r.wall_s:.1f}",
    )


def table(rows) -> str:
    """The sweep's table (see the module docstring)."""
    rows = [r.row() if hasattr(r, "row") else r for r in rows]
    if not with_rounds(rows):
        return runner.summary_table(rows)
    lines = [HEAD, *(line(r) for r in rows)]
    widths = [max(len(x[i]) for x in lines) for i in range(len(HEAD))]
    fmt = lambda x: "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(x, widths)))
    note = (
        "(ms/iter and time ÷ ref: the interleaved rounds' figures the verdict rests on, ref its reference; "
        "the verdict and the ranking follow)"
    )
    return "\n".join([fmt(HEAD), "  ".join("-" * w for w in widths), *map(fmt, lines[1:]), note])
