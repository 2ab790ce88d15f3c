"""Paired ratios of interleaved rounds, their interval, and the verdict they support.

A group's programs are timed in **rounds** (:mod:`plnexp.fitting.rounds`): each round runs every
program once, in a fresh random order. A program's **paired ratio** in a round is its time divided
by the reference program's time in the *same* round; a neighbour that slows the machine for a
while slows both sides of most pairs alike, so it widens the spread of the ratios instead of
biasing them (as Google Benchmark's random interleaving and asv's rounds do).

Per program, the result is the **median** of its paired ratios with the exact, distribution-free
confidence interval of a median from order statistics (:func:`median_interval`): the k-th smallest
and k-th largest ratio, k the largest such that a Binomial(n, 1/2) falls below k with probability
at most (1 - confidence) / 2. No normality is assumed, which matters for timings (skewed, with
outliers when the machine is shared).

The **verdict** (:func:`verdict`) compares that interval with the minimum effect ``m``
(``report.min_speedup``, 1.10 by default): ``slower`` when the whole interval lies at or above
``m``, ``faster`` when it lies at or below ``1/m``, ``tied`` when it lies strictly between ``1/m``
and ``m``, and ``unresolved`` when it straddles one of the bounds (more rounds, or a quieter
machine, would decide it). A difference smaller than the minimum effect is never called a result.

Pure functions of floats: no JAX, no store.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95  # of each ratio's interval


def min_rounds(confidence: float = CONFIDENCE) -> int:
    """The fewest values whose median has an order-statistic interval at ``confidence``: the
    interval [min, max] holds the median with probability 1 - 2 / 2**n."""
    return _fewest(1, confidence)


def robust_rounds(confidence: float = CONFIDENCE) -> int:
    """The fewest values whose median's interval at ``confidence`` leaves out the smallest and the
    largest value (9 at 95%): below it the interval is the values' range, so that one round that
    went wrong (a neighbour's burst on one side of a pair) decides whether a verdict is reached."""
    return _fewest(2, confidence)


def _fewest(k: int, confidence: float) -> int:
    """The fewest values whose median's interval at ``confidence`` is [x_(k), x_(n + 1 - k)] or narrower."""
    n = 1
    while _order_k(n, confidence) < k:
        n += 1
    return n


def _order_k(n: int, confidence: float) -> int:
    """k of the interval [x_(k), x_(n + 1 - k)] (1-based) of a median of n values; 0: none."""
    alpha, mid, k = (1 - confidence) / 2, n // 2, 0
    while k + 1 <= mid and _binom_cdf_half(k, n) <= alpha:
        k += 1
    return k


def _binom_cdf_half(k: int, n: int) -> float:
    """P(Binomial(n, 1/2) <= k)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(median, low, high) of ``values``: the interval from order statistics that holds the
    population median with probability at least ``confidence`` (distribution-free). With fewer
    values than :func:`min_rounds` the interval is unbounded (-inf, inf): nothing is decided."""
    xs = sorted(float(v) for v in values if math.isfinite(v))
    n = len(xs)
    if n == 0:
        return math.nan, -math.inf, math.inf
    med = statistics.median(xs)
    k = _order_k(n, confidence)  # the largest k with P(B <= k - 1) <= alpha: [x_(k), x_(n + 1 - k)] (1-based)
    if k == 0:
        return med, -math.inf, math.inf
    return med, xs[k - 1], xs[n - k]


def verdict(low: float, high: float, min_effect: float) -> str:
    """What an interval of a ratio (program / reference) supports, beyond the minimum effect
    ``min_effect`` >= 1 (see the module docstring)."""
    if not min_effect >= 1:
        raise ValueError(f"min_effect={min_effect!r}: allowed values are numbers >= 1")
    if low >= min_effect:
        return "slower"
    if high <= 1 / min_effect:
        return "faster"
    if 1 / min_effect < low and high < min_effect:
        return "tied"
    return "unresolved"


@dataclass(frozen=True)
class Ratio:
    """One program's paired ratio to the reference over the kept rounds."""

    median: float
    low: float
    high: float
    n: int  # rounds it rests on
    verdict: str


def paired_ratio(
    times: Sequence[float], reference: Sequence[float], min_effect: float, confidence: float = CONFIDENCE
) -> Ratio:
    """The paired ratio of a program's round times ``times`` to the reference's ``reference``
    (same rounds, same order; a round where either is not finite is left out)."""
    if len(times) != len(reference):
        raise ValueError(f"{len(times)} round times against {len(reference)} of the reference: pair them by round")
    ratios = [t / r for t, r in zip(times, reference) if math.isfinite(t) and math.isfinite(r) and r > 0]
    med, lo, hi = median_interval(ratios, confidence)
    return Ratio(med, lo, hi, len(ratios), verdict(lo, hi, min_effect))
