"""The report's one source of speed: which figures rank a group's strategies, and in what order.

Where the sweep timed a group in interleaved rounds (its verdict, ``verdict.json``:
:mod:`plnexp.jobs.verdicts`), every table, figure, metric and headline of the report ranks by the
verdict's figures: each strategy's **paired ratio** to the reference (time ÷ the reference's time,
the median over the kept rounds, with its interval) and its **rounds' ms/iter** (the median of its
own ms/iter over those rounds). A job's own timed run (often one run: ``repeats=1``) is shown, if at
all, as that one run, never as a ranking. Without rounds (``report.rounds=0``, or a sweep older than
them) the jobs' own timings are all there is, and they are said to be so
(:attr:`Speed.basis`).

One speed convention throughout: **time ÷ reference** (below 1: faster than the reference).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .entries import run_of

ROUNDS = "rounds"  # Speed.basis: the verdict's figures
OWN = "own runs"  # Speed.basis: the job's own timed runs (no rounds)


@dataclass(frozen=True)
class Speed:
    """One run's speed as every table shows it."""

    ms_per_iter: float  # the rounds' median ms/iter (basis ROUNDS), else the job's own median
    ratio: float  # time ÷ the reference's: the paired ratio (ROUNDS), else the ratio of the medians
    low: float  # the ratio's interval (ROUNDS; -inf/inf: too few rounds); NaN for OWN
    high: float
    verdict: str  # faster, tied, slower, unresolved, reference (ROUNDS); "" for OWN
    rounds: int  # the kept rounds its ratio rests on (0 for OWN)
    basis: str

    def interval(self) -> str:
        """``0.95–1.04``, ``unbounded`` (too few rounds) or "-" (no interval: own runs)."""
        if math.isnan(self.low) or math.isnan(self.high):
            return "-"
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            return "unbounded"
        return f"{self.low:.2f}–{self.high:.2f}"

    def span_ms(self) -> tuple[float, float]:
        """The ratio's interval in ms/iter: its bounds times the ms/iter the ratio stands for."""
        return self.ms_per_iter * self.low / self.ratio, self.ms_per_iter * self.high / self.ratio


NONE = Speed(math.nan, math.nan, math.nan, math.nan, "", 0, OWN)


def of(report, e) -> Speed:
    """The speed of the entry ``e`` of ``report`` (:class:`plnexp.report.entries.Report`): its verdict's
    figures where its group had rounds, else its own timings against its group's reference (scan's)."""
    if not e.ok:
        return NONE
    v = report.verdict_of(e.group)
    if v is not None:  # none for a run the rounds did not time (the control job): no figure of its own is ranked
        s = next((s for s in v.strategies if e.run_id in s.runs), None)
        return NONE if s is None else Speed(s.ms_per_iter, s.ratio, s.low, s.high, s.verdict, s.rounds, ROUNDS)
    ref = run_of(report.groups[e.group], reference(report, e.group))
    ratio = e.m("ms_per_iter") / ref.m("ms_per_iter") if ref is not None else math.nan
    return Speed(e.m("ms_per_iter"), ratio, math.nan, math.nan, "", 0, OWN)


def reference(report, group: tuple) -> str:
    """The strategy the group's ratios divide by: its verdict's reference, else scan."""
    v = report.verdict_of(group)
    return v.reference if v is not None else "scan"


def ranked(report, group: tuple) -> list:
    """The group's entries fastest first, as its verdict ranks them (by paired ratio; without rounds,
    by the jobs' own medians); the control job and runs without a figure after, in their order."""
    entries = report.groups[group]
    key = {e.run_id: of(report, e).ratio for e in entries if not e.control}
    timed = sorted((e for e in entries if math.isfinite(key.get(e.run_id, math.nan))), key=lambda e: key[e.run_id])
    return timed + [e for e in entries if e not in timed]


def ordered(report) -> list:
    """Every entry of the report, group by group (in the report's order), each group ranked."""
    seen = [e for g in report.groups for e in ranked(report, g)]
    return seen + [e for e in report.entries if e not in seen]  # (the peers: in no group)
