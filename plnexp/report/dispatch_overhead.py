"""``sweep=dispatch``'s headline and figure (:mod:`plnexp.report.tradeoffs` asks): per data size,
``jit_per_function - scan`` and ``eager - scan`` in ms/iter and as a share of scan's, the size from
which that share stays under :data:`THRESHOLD`, and the overhead split by least squares into a fixed
part (the dispatch itself) and one that grows with the data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


from ..measure.plots import _plain_log, figure
from .differences import Diff, Timed, _noise_text, _ok, least_squares, whiskers
from .entries import num, Entry


THRESHOLD = 0.10  # dispatch overhead under this share of scan's ms/iter "stops mattering"
# ---------------------------------------------------------------- sweep=dispatch
OVERHEAD_OF = {
    "jit_per_function": "each step three jitted calls from Python",
    "eager": "each operation dispatched alone, nothing fused",
}


@dataclass(frozen=True)
class Size:
    n: int
    p: int
    data: str
    diff: Diff
    timed: Timed  # the strategy's
    scan: Timed


def crossing(sizes: Sequence[float], shares: Sequence[float], threshold: float) -> tuple[int | None, float]:
    """Where ``shares`` (one per size, sizes ascending) fall under ``threshold`` for good: the index
    of the smallest size from which every share is under it (None: the largest size's is not), and
    the size where the share crosses it, linear in log size between that size and the one before
    (NaN where every share is under it)."""
    k = len(shares)
    while k > 0 and shares[k - 1] < threshold:
        k -= 1
    if k == len(shares):
        return None, math.nan
    if k == 0:
        return 0, math.nan
    (xa, xb), (ra, rb) = sizes[k - 1 : k + 1], shares[k - 1 : k + 1]
    t = (ra - threshold) / (ra - rb)
    return k, math.exp(math.log(xa) + t * (math.log(xb) - math.log(xa)))


@dataclass(frozen=True)
class Overhead:
    """One strategy's overhead over scan across the data sizes of a group (:func:`dispatch`).

    The overhead is also split by least squares over the sizes, ``overhead ≈ fixed + per_row * n``:
    ``fixed``, the part that does not grow with the data, is the dispatch itself; ``per_row``, the
    part that does, is work the strategy does beyond the scan's one fused program."""

    label: str
    strategy: str
    sizes: tuple[Size, ...]  # ascending n·p
    threshold: float = THRESHOLD
    noise: float = math.nan  # the between-job noise (aa_noise)

    @property
    def crossing(self) -> tuple[int | None, float]:
        """Where the overhead's share of scan's ms/iter falls under the threshold (:func:`crossing`)."""
        return crossing([s.n for s in self.sizes], [s.diff.share for s in self.sizes], self.threshold)

    @property
    def split(self) -> tuple[float, float]:
        """``(fixed, per_row)`` in ms/iter and ms/iter per row; NaN below two sizes."""
        if len({s.n for s in self.sizes}) < 2:
            return math.nan, math.nan
        per_row, fixed, _ = least_squares([s.n for s in self.sizes], [s.diff.ms for s in self.sizes])
        return fixed, per_row

    @property
    def fixed_crossing(self) -> tuple[int | None, float]:
        """Where the fixed part's share of scan's ms/iter falls under the threshold (:func:`crossing`);
        where it does not within the sizes swept, the size (rows) at which it would, from scan's
        ms/iter extrapolated along its own least-squares line (NaN where it would not)."""
        fixed = self.split[0]
        k, at = crossing([s.n for s in self.sizes], [fixed / s.scan.ms for s in self.sizes], self.threshold)
        if k is None:
            slope, intercept, _ = least_squares([s.n for s in self.sizes], [s.scan.ms for s in self.sizes])
            at = (fixed / self.threshold - intercept) / slope if slope > 0 else math.nan
        return k, at

    def _split_text(self) -> str:
        fixed, per_row = self.split
        if not math.isfinite(fixed) or len({s.p for s in self.sizes}) > 1:
            return ""
        pct = f"{100 * self.threshold:.0f}%"
        grows = f"{num(1e3 * per_row, '{:+.3g}')} ms/iter per 1000 rows that grows with the data (work beyond the scan's fused program)"
        if fixed <= 0:
            return f"; least squares over n: no part independent of the size (intercept {fixed:.3g} ms/iter), {grows}"
        k, at = self.fixed_crossing
        if k is None:
            where = f"is over {pct} of scan's ms/iter at every size swept" + (
                f" (under it past n ≈ {at:,.0f}, scan's ms/iter extrapolated linearly)" if math.isfinite(at) else ""
            )
        elif k == 0:
            where = f"is under {pct} of scan's ms/iter at every size swept"
        else:
            where = (
                f"falls under {pct} of scan's ms/iter from n={self.sizes[k].n} on (crossing at n ≈ {at:,.0f}, "
                "interpolated in log n)"
            )
        return (
            f"; least squares over n: {fixed:.3g} ms/iter whatever the size (the dispatch itself), {grows}; "
            f"that fixed part {where}"
        )

    def lines(self) -> list[str]:
        return [self.line()]

    def line(self) -> str:
        what = OVERHEAD_OF.get(self.strategy, "its dispatch")
        per = "; ".join(f"n={s.n} ({s.data}): {s.diff.text()}" for s in self.sizes)
        k, at = self.crossing
        pct = f"{100 * self.threshold:.0f}%"
        if k is None:
            last = self.sizes[-1]
            verdict = (
                f"it never falls under {pct} of scan's ms/iter in the sizes swept (still "
                f"{100 * last.diff.share:,.0f}% at n={last.n}): it matters at every size here"
            )
        elif k == 0:
            verdict = (
                f"under {pct} of scan's ms/iter at every size swept (from n={self.sizes[0].n}): it does not matter here"
            )
        else:
            verdict = (
                f"it stops mattering (under {pct} of scan's ms/iter) from n={self.sizes[k].n} on; "
                f"the threshold is crossed at n ≈ {at:,.0f} (interpolated in log n between "
                f"n={self.sizes[k - 1].n} and n={self.sizes[k].n})"
            )
        return (
            f"dispatch on {self.label}: {self.strategy} − scan ({what}) per iteration: {per}; {verdict}"
            f"{self._split_text()}{_noise_text(self.noise)}"
        )


def dispatch(entries: Sequence[Entry], label: str, noise: float = math.nan) -> list[Overhead] | str:
    """Per strategy other than scan, its overhead over scan at each data size of ``entries`` (one
    device, precision and set of other values; several sizes)."""
    ok = [e for e in _ok(entries) if e.n]
    scans = {(e.n, e.p): e for e in ok if e.strategy == "scan"}
    if not scans:
        return f"dispatch on {label}: no scan run finished: no overhead to measure"
    out = []
    for name in sorted(
        {e.strategy for e in ok if e.strategy != "scan"},
        key=lambda s: (list(OVERHEAD_OF).index(s) if s in OVERHEAD_OF else len(OVERHEAD_OF), s),
    ):
        sizes = []
        for e in ok:
            scan = scans.get((e.n, e.p))
            if e.strategy == name and scan is not None:
                a, b = Timed.of(e), Timed.of(scan)
                sizes.append(Size(int(e.n or 0), int(e.p or 0), e.data, Diff.between(a, b, noise), a, b))
        if sizes:
            out.append(Overhead(label, name, tuple(sorted(sizes, key=lambda s: (s.n * s.p, s.n))), noise=noise))
    return out or f"dispatch on {label}: no run beside scan's finished at a size scan also ran"


def dispatch_png(results: list[Overhead], path: Path) -> Path:
    """Two panels against the data size (log-log): each strategy's ms/iter over scan's, the timed
    runs' intervals as bars, the threshold dashed; and its overhead in ms/iter with the least-squares
    split (fixed + per row), the fixed part dotted."""
    fig = figure(12, 4.4)
    left, right = fig.subplots(1, 2)
    one = len({x.label for x in results}) == 1
    for i, r in enumerate(results):
        n = np.array([s.n for s in r.sizes], float)
        ratio, err = whiskers([s.timed / s.scan for s in r.sizes])
        style = "o-" if one else ["o-", "s--", "^-.", "v:"][i % 4]
        name = r.strategy if one else f"{r.strategy}, {r.label}"
        left.errorbar(n, ratio, yerr=err, fmt=style, capsize=3, lw=1.2, label=name)
        over, err = whiskers([s.diff for s in r.sizes])
        right.errorbar(n, over, yerr=err, fmt="o", color=f"C{i}", capsize=3, label=f"{name} − scan")
        fixed, per_row = r.split
        if math.isfinite(fixed) and fixed > 0:
            line = np.geomspace(n[0], n[-1], 100)
            right.plot(
                line,
                fixed + per_row * line,
                "-",
                color=f"C{i}",
                lw=1,
                label=f"{fixed:.3g} + {1e3 * per_row:.3g} per 1000 rows",
            )
            right.axhline(fixed, color=f"C{i}", ls=":", lw=1)
    left.axhline(1 + THRESHOLD, color="k", ls="--", lw=1, label=f"overhead = {100 * THRESHOLD:.0f}% of scan's ms/iter")
    left.axhline(1, color="grey", lw=0.8)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # ticks at 1, 2 and 5 times powers of ten, written plainly
            _plain_log(axis, 1.0)
        ax.grid(alpha=0.3, which="major")
        ax.set_xlabel("n (rows)")
        ax.legend(fontsize=8)
    left.set_ylabel("ms/iter ÷ scan's ms/iter")
    left.set_title("against scan (median, interval of the timed runs)", fontsize=9)
    right.set_ylabel("overhead over scan (ms/iter)")
    right.set_title("the overhead, least squares: fixed (dotted) + per row", fontsize=9)
    fig.suptitle(f"Python dispatch against scan ({results[0].label})", fontsize=10)
    fig.savefig(path)
    return path
