"""What the trade-off presets' headlines (:mod:`plnexp.report.tradeoffs`) are made of: a run's median
ms/iter with its interval (:class:`Timed`), the difference of two runs (:class:`Diff`: measurable only
where its interval excludes zero and it exceeds the between-job noise), that noise (:func:`aa_noise`,
from the sweep's control job), a least-squares line (:func:`least_squares`); their figures are drawn on
:func:`plnexp.measure.plots.figure`.
Computed from the report's entries; nothing is measured here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..jobs import ranking
from .entries import num, Entry


# ---------------------------------------------------------------- shared pieces
@dataclass(frozen=True)
class Timed:
    """A median ms/iter and its interval: one run's (:meth:`of`, from its timed runs), or a figure of two
    runs' (``a - b``, ``a / b``: the widest interval the two runs' allow)."""

    ms: float
    lo: float
    hi: float

    @classmethod
    def of(cls, e: Entry) -> Timed:
        lo, hi, _ = ranking.interval_ms(e)
        return cls(e.m("ms_per_iter"), lo, hi)

    def __sub__(self, b: Timed) -> Timed:
        return Timed(self.ms - b.ms, self.lo - b.hi, self.hi - b.lo)

    def __truediv__(self, b: Timed) -> Timed:
        return Timed(self.ms / b.ms, self.lo / b.hi, self.hi / b.lo)

    def text(self) -> str:
        return f"{num(self.ms, '{:.3g}')} [{num(self.lo, '{:.3g}')}–{num(self.hi, '{:.3g}')}] ms/iter"


def whiskers(timed: Sequence[Timed]) -> tuple[np.ndarray, np.ndarray]:
    """The medians of ``timed`` and their intervals as error bars (below, above)."""
    ms = np.array([t.ms for t in timed])
    return ms, np.clip([ms - [t.lo for t in timed], [t.hi for t in timed] - ms], 0, None)


@dataclass(frozen=True)
class Diff(Timed):
    """``a - b`` in ms/iter, its interval (the widest the two runs' intervals allow) and as a share of
    ``b``'s median."""

    base: float  # b's median ms/iter
    noise: float = math.nan  # the between-job noise, a share of b's (NaN: not measured)
    min_effect: float = ranking.MIN_SPEEDUP  # the factor a difference needs to be a result (report.min_speedup)

    @classmethod
    def between(cls, a: Timed, b: Timed, noise: float = math.nan, min_effect: float = ranking.MIN_SPEEDUP) -> Diff:
        d = a - b
        return cls(d.ms, d.lo, d.hi, b.ms, noise, min_effect)

    @property
    def factor(self) -> float:
        """How many times slower the slower of the two is (>= 1)."""
        a = self.base + self.ms
        return max(a, self.base) / min(a, self.base) if min(a, self.base) > 0 else math.inf

    @property
    def measurable(self) -> bool:
        """The interval excludes zero (the runs' intervals do not overlap), and the difference exceeds
        the between-job noise where it was measured."""
        beyond = not math.isfinite(self.noise) or abs(self.share) > self.noise
        return (self.lo > 0 or self.hi < 0) and beyond

    def verdict(self, name: str) -> str:
        """What the difference says of ``name`` (a's strategy): no measurable cost, a cost, or faster."""
        if not (self.lo > 0 or self.hi < 0):
            return "no measurable cost (within the runs' spread)"
        if not self.measurable:
            return f"no measurable cost (within the A/A noise between jobs, {100 * self.noise:.1f}%)"
        beyond = "beyond the runs' spread" + (" and the A/A noise" if math.isfinite(self.noise) else "")
        if self.factor < self.min_effect:  # measurable, but too small to be a result (as ranking's winners)
            what = f"{name} faster" if self.ms < 0 else "a cost"
            return (
                f"no result: {what} by {self.factor:.2f}×, {beyond} but under the minimum effect "
                f"{self.min_effect:.2f}× (report.min_speedup)"
            )
        return f"{name} faster, {beyond}" if self.ms < 0 else f"a cost, {beyond}"

    @property
    def share(self) -> float:
        return self.ms / self.base if self.base > 0 else math.nan

    def text(self) -> str:
        lo, hi = self.lo / self.base, self.hi / self.base
        return (
            f"{num(self.ms, '{:+.3g}')} [{num(self.lo, '{:+.3g}')} to {num(self.hi, '{:+.3g}')}] ms/iter "
            f"({_pct(self.share)} [{_pct(lo)} to {_pct(hi)}])"
        )


def _pct(share: float) -> str:
    """A share as a signed percentage: one decimal below 100%, whole percents above."""
    return f"{100 * share:+.1f}%" if abs(share) < 1 else f"{100 * share:+,.0f}%"


def _ok(entries: Sequence[Entry]) -> list[Entry]:
    """The finished runs that are compared (the control job is not one)."""
    return [e for e in entries if e.ok and not e.control]


def aa_noise(entries: Sequence[Entry]) -> float:
    """The between-job noise the sweep measured: |a / b - 1| of the median ms/iter of a control job
    (a) and its original (b: the run of the same strategy, data and other values), the largest over
    the controls among ``entries``; NaN without one."""
    worst = math.nan
    for c in (e for e in entries if e.ok and e.control):
        o = next((e for e in _ok(entries) if e.strategy == c.strategy and e.group == c.group), None)
        if o is not None and o.m("ms_per_iter") > 0:
            d = abs(c.m("ms_per_iter") / o.m("ms_per_iter") - 1)
            worst = d if not math.isfinite(worst) else max(worst, d)
    return worst


def _noise_text(noise: float) -> str:
    return f"; A/A noise between jobs {100 * noise:.1f}% (the control job)" if math.isfinite(noise) else ""


def _contended(entries: Sequence[Entry], contended: dict[str, list[str]]) -> str:
    bad = sum(e.run_id in contended for e in entries)
    return (
        f" (timings contended in {bad} of these {len(entries)} runs: see the notes; measure again alone)" if bad else ""
    )


def least_squares(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float]:
    """The line ``y = a + b x`` fitted by least squares: ``(b, a, standard error of b)`` (NaN error
    with fewer than 3 points)."""
    xs, ys = np.asarray(x, float), np.asarray(y, float)
    xm, ym = xs.mean(), ys.mean()
    sxx = float(((xs - xm) ** 2).sum())
    b = float(((xs - xm) * (ys - ym)).sum() / sxx)
    a = float(ym - b * xm)
    resid = ys - (a + b * xs)
    se = math.sqrt(float((resid**2).sum()) / (len(xs) - 2) / sxx) if len(xs) > 2 else math.nan
    return b, a, se
