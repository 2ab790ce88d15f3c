"""The sweep's parent run's summary metrics and tags: the verdict's, never a best-of it refused.

Of the report's main group (:meth:`plnexp.report.entries.Report.main_group`):

- with interleaved rounds (its verdict): ``fastest_strategy`` is the program the verdict names
  fastest (:meth:`plnexp.jobs.verdicts.GroupVerdict.fastest`), or "" (none); only when there is one,
  ``best_ms_per_iter`` (its rounds' ms/iter), ``best_speedup_vs_<reference>`` (1 / its paired ratio)
  with ``best_speedup_lo``/``_hi`` (the interval, as speed-ups) and ``best_speedup_vs_eager`` (eager's
  paired ratio over its own). Always ``n_faster``, ``n_tied``, ``n_slower``, ``n_unresolved``: the
  verdict's programs of each kind;
- without rounds: the winner the jobs' own timings name beyond the noise
  (:func:`plnexp.jobs.ranking.rank`), and its figures only then.
"""

from __future__ import annotations


from . import speed
from .entries import median
from ..jobs import verdicts as V


def from_verdict(v: V.GroupVerdict) -> tuple[dict, dict]:
    """The metrics and tags of a group's verdict (see the module docstring)."""
    metrics = {f"n_{k}": float(len(v.of(k))) for k in ("faster", "tied", "slower", "unresolved")}
    label = v.fastest()
    tags = {"fastest_strategy": label}
    if not label:
        return metrics, tags
    p = min((p for p in v.programs if p.verdict == "faster"), key=lambda p: p.ratio, default=None)
    if p is None:  # (fastest() names a faster program; the reference alone is never one)
        return metrics, {"fastest_strategy": ""}
    ms = median([s.ms_per_iter for s in v.strategies if s.strategy in p.names])
    eager = median([s.ratio for s in v.strategies if s.strategy == "eager"])
    metrics.update(
        {
            "best_ms_per_iter": ms,
            f"best_speedup_vs_{v.reference}": 1 / p.ratio,
            "best_speedup_lo": 1 / p.high,
            "best_speedup_hi": 1 / p.low,
            "best_speedup_vs_eager": eager / p.ratio,
        }
    )
    return metrics, tags


def metrics_and_tags(report) -> tuple[dict, dict]:
    """The parent's summary metrics and the ``fastest_strategy`` tag (see the module docstring)."""
    metrics = {"n_jobs": float(len(report.grid)), "n_failed": float(len(report.failed))}
    group = report.main_group()
    if group is None:
        return metrics, {}
    v = report.verdict_of(group)
    if v is not None:
        more, tags = from_verdict(v)
        return {**metrics, **more}, tags
    winner = report.ranked(group).winner
    tags = {"fastest_strategy": winner}
    best = next(
        (
            e
            for e in speed.ranked(report, group)
            if e.ok and not e.control and e.strategy in winner.removesuffix(" (one program)").split(" = ")
        ),
        None,
    )
    if winner and best is not None:
        metrics.update(
            best_ms_per_iter=best.m("ms_per_iter"),
            best_speedup_vs_scan=best.speedup_scan,
            best_speedup_vs_eager=best.speedup_eager,
        )
    return metrics, tags
