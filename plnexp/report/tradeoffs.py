"""The headlines of the trade-off presets (``sweep=unroll``, ``sweep=dispatch``, ``sweep=loop``): what
each one measured, with its spread, in a few lines and one figure.

A report (:mod:`plnexp.report.summary`) asks :func:`lines` and :func:`figures`; both read the preset from
the parent run's ``sweep`` tag (the sweep file's name; the experiment's name where the tag names
no preset) and return nothing for any other sweep. Everything here is computed from the report's
entries (median ms/iter, its interval from ``run_s_lo``/``run_s_hi``: :func:`plnexp.jobs.ranking.interval_ms`,
``compile_s``, the XLA counts where logged); nothing is measured. A difference whose interval
contains zero (the two runs' intervals overlap) is "no measurable" difference; so is one within
the between-job noise where the sweep ran a control job (its reference job again at its end, tagged
``plnexp.control``: :mod:`plnexp.experiment.sweep`): how far the control's median lies from its original's
(:func:`aa_noise`). The control job itself is never one of the compared runs.

- ``unroll``: the compile seconds (and XLA instructions) each extra unrolled step adds, from a
  least-squares line over the unroll factors; the unroll with the lowest ms/iter and its gain over
  unroll 1; the break-even for a fit of :data:`FIT_ITERS` iterations: the unroll ``u`` at which the
  compile time added, ``slope * (u - 1)``, equals the most run time any unroll saved.
- ``dispatch``: per data size, ``jit_per_function - scan`` and ``eager - scan`` in ms/iter and as a
  share of scan's, and the size from which that share stays under :data:`THRESHOLD`; the overhead
  split by least squares over the sizes into a fixed part (the dispatch itself) and one that grows
  with the data, and the size from which the fixed part is under the threshold.
- ``loop``: ``fori_loop - scan`` (the loop form), ``while_loop - fori_loop`` (the stopping
  condition) and ``while_loop - scan``, per data size; whether every run did all its iterations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..jobs import ranking
from ..jobs.tags import CONTROL_TAG

if TYPE_CHECKING:
    from .entries import Entry, Report

FIT_ITERS = 1000  # the fit length the unroll break-even is stated for
THRESHOLD = 0.10  # dispatch overhead under this share of scan's ms/iter "stops mattering"
NOT_LOGGED = "not logged (runs from before it was)"


# ---------------------------------------------------------------- shared pieces
@dataclass(frozen=True)
class Timed:
    """One run's median ms/iter and the interval of its timed runs."""

    ms: float
    lo: float
    hi: float

    @classmethod
    def of(cls, e: Entry) -> Timed:
        lo, hi, _ = ranking.interval_ms(e)
        return cls(e.m("ms_per_iter"), lo, hi)

    def text(self) -> str:
        return f"{_g(self.ms)} [{_g(self.lo)}–{_g(self.hi)}] ms/iter"


@dataclass(frozen=True)
class Diff:
    """``a - b`` in ms/iter, its interval (the widest the two runs' intervals allow) and as a share of
    ``b``'s median."""

    ms: float
    lo: float
    hi: float
    base: float  # b's median ms/iter
    noise: float = math.nan  # the between-job noise, a share of b's (NaN: not measured)
    min_effect: float = ranking.MIN_SPEEDUP  # the factor a difference needs to be a result (report.min_speedup)

    @classmethod
    def of(cls, a: Timed, b: Timed, noise: float = math.nan, min_effect: float = ranking.MIN_SPEEDUP) -> Diff:
        return cls(a.ms - b.ms, a.lo - b.hi, a.hi - b.lo, b.ms, noise, min_effect)

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
            f"{_signed(self.ms)} [{_signed(self.lo)} to {_signed(self.hi)}] ms/iter "
            f"({_pct(self.share)} [{_pct(lo)} to {_pct(hi)}])"
        )


def _g(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else "-"


def _pct(share: float) -> str:
    """A share as a signed percentage: one decimal below 100%, whole percents above."""
    return f"{100 * share:+.1f}%" if abs(share) < 1 else f"{100 * share:+,.0f}%"


def _signed(x: float) -> str:
    return f"{x:+.3g}" if math.isfinite(x) else "-"


def _control(e: Entry) -> bool:
    return e.tags.get(CONTROL_TAG) == "true"


def _ok(entries: Sequence[Entry]) -> list[Entry]:
    """The finished runs that are compared (the control job is not one)."""
    return [e for e in entries if e.ok and not _control(e)]


def aa_noise(entries: Sequence[Entry]) -> float:
    """The between-job noise the sweep measured: |a / b - 1| of the median ms/iter of a control job
    (a) and its original (b: the run of the same strategy, data and other values), the largest over
    the controls among ``entries``; NaN without one."""
    worst = math.nan
    for c in (e for e in entries if e.ok and _control(e)):
        o = next((e for e in _ok(entries) if e.strategy == c.strategy and e.group == c.group), None)
        if o is not None and o.m("ms_per_iter") > 0:
            d = abs(c.m("ms_per_iter") / o.m("ms_per_iter") - 1)
            worst = d if not math.isfinite(worst) else max(worst, d)
    return worst


def _noise_text(noise: float) -> str:
    return f"; A/A noise between jobs {100 * noise:.1f}% (the control job)" if math.isfinite(noise) else ""


def _by(entries: Sequence[Entry], key: Callable[[Entry], tuple]) -> dict[tuple, list[Entry]]:
    out: dict[tuple, list[Entry]] = {}
    for e in entries:
        out.setdefault(key(e), []).append(e)
    return out


def _base_name(e: Entry) -> str:
    """The registry name of the run's strategy (the report labels a swept option: ``scan_unrolled unroll=4``)."""
    return str(e.params.get("strategy.name") or e.strategy.split(" ", 1)[0])


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


# ---------------------------------------------------------------- sweep=unroll
@dataclass(frozen=True)
class Unroll:
    """What a group of scan_unrolled runs over several unroll factors shows (:func:`unroll`)."""

    label: str
    unrolls: tuple[int, ...]  # ascending
    compile_s: tuple[float, ...]
    timed: tuple[Timed, ...]
    instructions: tuple[float, ...]  # NaN where not logged
    slope_s: float  # compile seconds per extra unrolled step
    intercept_s: float
    slope_se: float
    slope_instr: float  # NaN where not logged
    best: int  # the unroll with the lowest median ms/iter
    gain: float  # ms/iter at the smallest unroll / at best
    gain_lo: float
    gain_hi: float
    beyond_noise: bool  # best's interval lies wholly below the smallest unroll's
    saved_s: tuple[float, float, float]  # run time best saves on a FIT_ITERS fit: median, low, high
    break_even: tuple[float, float, float]  # the unroll where the added compile equals saved_s; NaN: none
    totals: tuple[float, ...]  # compile_s + FIT_ITERS x ms/iter, per unroll (seconds)
    noise: float = math.nan  # the between-job noise (aa_noise)

    @property
    def base(self) -> int:
        return self.unrolls[0]

    def lines(self) -> list[str]:
        u0, un = self.unrolls[0], self.unrolls[-1]
        ms = 1e3 * self.slope_s
        places = min(4, max(0, 2 - math.floor(math.log10(abs(ms))))) if ms else 1  # 3 significant digits
        se = f" ± {1e3 * self.slope_se:.{places}f}" if math.isfinite(self.slope_se) else ""
        instr = (
            f"XLA instructions +{self.slope_instr:.3g} per step ({self.instructions[0]:.0f} at unroll {u0}, "
            f"{self.instructions[-1]:.0f} at {un})"
            if math.isfinite(self.slope_instr)
            else f"XLA instruction count {NOT_LOGGED}"
        )
        first = (
            f"unroll on {self.label}: compile time {ms:+.{places}f}{se} ms per extra unrolled step "
            f"(least squares over unroll {u0}–{un}: {self.compile_s[0]:.2f} s at {u0}, {self.compile_s[-1]:.2f} s "
            f"at {un}); {instr}"
        )
        i = self.unrolls.index(self.best)
        if self.best == u0:
            second = f"unroll on {self.label}: no unroll runs faster than unroll {u0} ({self.timed[0].text()})"
        elif self.beyond_noise:
            second = (
                f"unroll on {self.label}: fastest at unroll {self.best}, {self.timed[i].text()} against "
                f"{self.timed[0].text()} at unroll {u0}: {self.gain:.2f}× ({self.gain_lo:.2f}–{self.gain_hi:.2f}×)"
                f"{_noise_text(self.noise)}"
            )
        else:
            second = (
                f"unroll on {self.label}: no unroll runs faster than unroll {u0} beyond the noise (lowest median: "
                f"unroll {self.best}, {self.timed[i].text()} against {self.timed[0].text()}, "
                f"{self.gain:.2f}× ({self.gain_lo:.2f}–{self.gain_hi:.2f}×)){_noise_text(self.noise)}"
            )
        t = int(np.argmin(self.totals))
        cheapest = f"compile + run lowest at unroll {self.unrolls[t]} ({self.totals[t]:.2f} s" + (
            f" against {self.totals[0]:.2f} s at unroll {u0})" if t else ")"
        )
        fit = f"unroll on {self.label}, a fit of {FIT_ITERS} iterations"
        if not self.slope_s > 0:
            third = f"{fit}: compile time does not grow with the unroll here, so no break-even; {cheapest}"
        elif not (self.beyond_noise and self.best != u0):
            third = (
                f"{fit}: break-even at unroll {u0}: unrolling saves no measurable run time, and each extra "
                f"step adds {1e3 * self.slope_s:.3g} ms of compile; {cheapest}"
            )
        else:
            mid, lo, hi = self.break_even
            beyond = f", beyond the largest unroll swept ({un})" if mid > un else ""
            third = (
                f"{fit}: break-even at unroll ≈ {mid:.1f} ({lo:.1f}–{hi:.1f}){beyond}: past it the compile time "
                f"added ({1e3 * self.slope_s:.3g} ms per step) outweighs the most run time unrolling saved "
                f"({self.saved_s[0]:.3g} s, unroll {self.best}'s gain); {cheapest}"
            )
        return [first, second, third]


def unroll(entries: Sequence[Entry], label: str, noise: float = math.nan) -> Unroll | str:
    """The unroll trade-off of one comparison group's scan_unrolled runs; a line saying why not
    where fewer than two unroll factors finished."""
    runs: dict[int, Entry] = {}
    for e in _ok(entries):
        if _base_name(e) == "scan_unrolled":
            try:
                runs.setdefault(int(str(e.params.get("strategy.unroll"))), e)
            except ValueError:
                continue
    if len(runs) < 2:
        return f"unroll on {label}: fewer than two unroll factors of scan_unrolled finished: no trade-off to fit"
    us = tuple(sorted(runs))
    es = [runs[u] for u in us]
    compile_s = tuple(e.m("compile_s") for e in es)
    timed = tuple(Timed.of(e) for e in es)
    instructions = tuple(e.m("xla_instructions") for e in es)
    b, a, se = least_squares(us, compile_s)
    bi = least_squares(us, instructions)[0] if all(math.isfinite(v) for v in instructions) else math.nan
    i = int(np.argmin([t.ms for t in timed]))
    base, best = timed[0], timed[i]
    gain = base.ms / best.ms
    gain_lo, gain_hi = base.lo / best.hi, base.hi / best.lo
    beyond = i > 0 and best.hi < base.lo and not gain - 1 <= noise
    saved = tuple(FIT_ITERS * d / 1e3 for d in (base.ms - best.ms, base.lo - best.hi, base.hi - best.lo))
    even = tuple(us[0] + s / b if s > 0 else float(us[0]) for s in saved) if b > 0 and beyond else (math.nan,) * 3
    totals = tuple(c + FIT_ITERS * t.ms / 1e3 for c, t in zip(compile_s, timed))
    return Unroll(
        label,
        us,
        compile_s,
        timed,
        instructions,
        b,
        a,
        se,
        bi,
        us[i],
        gain,
        gain_lo,
        gain_hi,
        beyond,
        (saved[0], saved[1], saved[2]),
        (even[0], even[1], even[2]),
        totals,
        noise,
    )


def unroll_png(results: list[Unroll], path: Path) -> Path:
    """Per group, three panels against the unroll factor: compile time (and XLA instructions) with
    the least-squares line, ms/iter with the timed runs' interval, and compile + run for a fit of
    :data:`FIT_ITERS` iterations with the break-even."""
    fig = _figure(13, 3.9 * len(results))
    axes = fig.subplots(len(results), 3, squeeze=False)
    for row, r in zip(axes, results):
        x = np.asarray(r.unrolls, float)
        ax = row[0]
        ax.plot(x, r.compile_s, "o", color="C0", label="compile s")
        line = np.geomspace(x[0], x[-1], 100)
        ax.plot(
            line,
            r.intercept_s + r.slope_s * line,
            "-",
            color="C0",
            lw=1,
            label=f"least squares: {1e3 * r.slope_s:+.3g} ms/step",
        )
        ax.set_ylabel("compile time (s)")
        handles, labels = ax.get_legend_handles_labels()
        if math.isfinite(r.slope_instr):
            tw = ax.twinx()
            tw.plot(
                x, r.instructions, "s--", color="C1", ms=4, lw=1, label=f"XLA instructions (+{r.slope_instr:.3g}/step)"
            )
            tw.set_ylabel("XLA instructions", color="C1")
            h2, l2 = tw.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        ax.legend(handles, labels, fontsize=8, loc="upper left")
        ax.set_title("compile time against unroll", fontsize=9)
        ax = row[1]
        ms = np.array([t.ms for t in r.timed])
        err = np.array([[t.ms - t.lo for t in r.timed], [t.hi - t.ms for t in r.timed]])
        ax.errorbar(x, ms, yerr=np.clip(err, 0, None), fmt="o-", color="C2", capsize=3, lw=1)
        ax.axhspan(r.timed[0].lo, r.timed[0].hi, color="C2", alpha=0.12, label=f"unroll {r.base}'s interval")
        ax.set_ylabel("ms per iteration")
        ax.legend(fontsize=8, loc="upper left")
        ax.set_title(f"ms/iter (median, interval of the timed runs); best: unroll {r.best}", fontsize=9)
        ax = row[2]
        ax.plot(x, r.totals, "o-", color="C3", lw=1)
        ax.axhline(r.totals[0], color="C3", ls="--", lw=0.8, label=f"unroll {r.base}'s")
        ax.set_ylabel(f"compile + {FIT_ITERS} iterations (s)")
        mid = r.break_even[0]
        if math.isfinite(mid):
            ax.axvline(mid, color="k", ls=":", lw=1, label=f"break-even ≈ {mid:.1f}")
        ax.legend(fontsize=8, loc="upper left")
        ax.set_title(f"a fit of {FIT_ITERS} iterations", fontsize=9)
        for ax in row:
            ax.set_xscale("log", base=2)
            ax.set_xticks(x, [str(u) for u in r.unrolls])
            ax.minorticks_off()
            ax.set_xlabel("unroll (steps per scan body)")
            ax.grid(alpha=0.3)
        if len(results) > 1:  # one row per group: its label over the row's first panel
            row[0].set_title(f"{r.label}\n{row[0].get_title()}", fontsize=9, loc="left")
    if len(results) == 1:
        fig.suptitle(f"scan_unrolled on {results[0].label}", fontsize=10)
    fig.savefig(path, bbox_inches="tight")
    return path


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
        grows = f"{_signed(1e3 * per_row)} ms/iter per 1000 rows that grows with the data (work beyond the scan's fused program)"
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
                sizes.append(Size(int(e.n or 0), int(e.p or 0), e.data, Diff.of(a, b, noise), a, b))
        if sizes:
            out.append(Overhead(label, name, tuple(sorted(sizes, key=lambda s: (s.n * s.p, s.n))), noise=noise))
    return out or f"dispatch on {label}: no run beside scan's finished at a size scan also ran"


def _plain_log(ax) -> None:
    """Log-log axes whose ticks read as plain numbers, at 1, 2 and 5 times powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3, which="major")


def dispatch_png(results: list[Overhead], path: Path) -> Path:
    """Two panels against the data size (log-log): each strategy's ms/iter over scan's, the timed
    runs' intervals as bars, the threshold dashed; and its overhead in ms/iter with the least-squares
    split (fixed + per row), the fixed part dotted."""
    fig = _figure(12, 4.4)
    left, right = fig.subplots(1, 2)
    one = len({x.label for x in results}) == 1
    for i, r in enumerate(results):
        n = np.array([s.n for s in r.sizes], float)
        ratio = np.array([s.timed.ms / s.scan.ms for s in r.sizes])
        lo = np.array([s.timed.lo / s.scan.hi for s in r.sizes])
        hi = np.array([s.timed.hi / s.scan.lo for s in r.sizes])
        style = "o-" if one else ["o-", "s--", "^-.", "v:"][i % 4]
        name = r.strategy if one else f"{r.strategy}, {r.label}"
        left.errorbar(
            n, ratio, yerr=np.clip([ratio - lo, hi - ratio], 0, None), fmt=style, capsize=3, lw=1.2, label=name
        )
        over = np.array([s.diff.ms for s in r.sizes])
        err = np.clip([over - [s.diff.lo for s in r.sizes], [s.diff.hi for s in r.sizes] - over], 0, None)
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
        _plain_log(ax)
        ax.set_xlabel("n (rows)")
        ax.legend(fontsize=8)
    left.set_ylabel("ms/iter ÷ scan's ms/iter")
    left.set_title("against scan (median, interval of the timed runs)", fontsize=9)
    right.set_ylabel("overhead over scan (ms/iter)")
    right.set_title("the overhead, least squares: fixed (dotted) + per row", fontsize=9)
    fig.suptitle(f"Python dispatch against scan ({results[0].label})", fontsize=10)
    fig.savefig(path)
    return path


# ---------------------------------------------------------------- sweep=loop
LOOP_PAIRS = (
    ("fori_loop", "scan", "the loop form"),
    ("while_loop", "fori_loop", "the stopping condition"),
    ("while_loop", "scan", "both"),
)


@dataclass(frozen=True)
class Loop:
    """The loop forms of one comparison group (:func:`loop`)."""

    label: str
    timed: dict[str, Timed]
    compile_s: dict[str, float]
    iterations: dict[str, tuple[float, float]]  # iterations each run did, and asked for
    same_program: tuple[str, ...]  # strategies that compiled to one program (one hlo_fingerprint)
    noise: float = math.nan  # the between-job noise (aa_noise)
    min_effect: float = ranking.MIN_SPEEDUP  # report.min_speedup

    def diffs(self) -> list[tuple[str, str, str, Diff]]:
        have = set(self.timed)
        return [
            (a, b, what, Diff.of(self.timed[a], self.timed[b], self.noise, self.min_effect))
            for a, b, what in LOOP_PAIRS
            if {a, b} <= have
        ]

    def line(self) -> str:
        parts = []
        for a, b, what, d in self.diffs():
            parts.append(f"{what}, {a} − {b} = {d.text()}: {d.verdict(a)}")
        if not parts:
            return f"loop on {self.label}: fewer than two of scan, fori_loop, while_loop finished: nothing to compare"
        short = [f"{s} {run:.0f} of {asked:.0f}" for s, (run, asked) in self.iterations.items() if run < asked]
        runs = {run for run, _ in self.iterations.values()}
        work = (
            f"not the same work: stopped early: {', '.join(short)} iterations (ms/iter still per iteration run)"
            if short
            else f"every run did all {runs.pop():.0f} iterations"
            if len(runs) == 1
            else "every run did all its iterations"
        )
        same = f"; {' = '.join(self.same_program)}: one compiled program" if len(self.same_program) > 1 else ""
        compile_s = ", ".join(f"{s} {c:.2f} s" for s, c in self.compile_s.items())
        return f"loop on {self.label}: {'; '.join(parts)}; {work}{same}; compile {compile_s}{_noise_text(self.noise)}"


def _asked(e: Entry) -> float:
    """The iterations the run was asked for (its config's n_iter, after any cap)."""
    try:
        return float(str(e.params.get("n_iter")))
    except ValueError:
        return e.m("n_iter_run")


def loop(
    entries: Sequence[Entry], label: str, noise: float = math.nan, min_effect: float = ranking.MIN_SPEEDUP
) -> Loop:
    """scan, fori_loop and while_loop of one comparison group, side by side."""
    runs = {e.strategy: e for e in _ok(entries) if e.strategy in ("scan", "fori_loop", "while_loop")}
    order = [s for s in ("scan", "fori_loop", "while_loop") if s in runs]
    prints = _by([runs[s] for s in order], lambda e: (e.tags.get("hlo_fingerprint", ""),))
    same = next((tuple(e.strategy for e in es) for (fp,), es in prints.items() if fp and len(es) > 1), ())
    return Loop(
        label,
        {s: Timed.of(runs[s]) for s in order},
        {s: runs[s].m("compile_s") for s in order},
        {s: (runs[s].m("n_iter_run"), _asked(runs[s])) for s in order},
        same,
        noise,
        min_effect,
    )


def loop_png(results: list[Loop], path: Path) -> Path:
    """Per group, each loop form's ms/iter with the interval of its timed runs."""
    fig = _figure(4.2 * len(results), 3.6)
    axes = fig.subplots(1, len(results), squeeze=False)[0]
    for ax, r in zip(axes, results):
        names = list(r.timed)
        ms = np.array([r.timed[s].ms for s in names])
        err = np.clip(
            np.array([[r.timed[s].ms - r.timed[s].lo for s in names], [r.timed[s].hi - r.timed[s].ms for s in names]]),
            0,
            None,
        )
        for i in range(len(names)):  # points, not bars: the axis shows the differences, not from zero
            ax.errorbar([i], ms[i : i + 1], yerr=err[:, i : i + 1], fmt="o", color=f"C{i}", capsize=5, ms=7)
        ax.set_xticks(range(len(names)), names)
        ax.set_xlim(-0.6, len(names) - 0.4)
        if math.isfinite(r.noise) and "scan" in r.timed:
            scan = r.timed["scan"].ms
            ax.axhspan(scan * (1 - r.noise), scan * (1 + r.noise), color="C0", alpha=0.1, label="scan ± the A/A noise")
            ax.legend(fontsize=8, loc="upper right")
        ax.set_ylabel("ms per iteration")
        band = (
            [r.timed["scan"].ms * (1 + d * r.noise) for d in (-1, 1)]
            if math.isfinite(r.noise) and "scan" in r.timed
            else []
        )
        low = float(min([r.timed[s].lo for s in names] + band))
        high = float(max([r.timed[s].hi for s in names] + band))
        pad = max(high - low, 0.02 * high)
        ax.set_ylim(max(0.0, low - pad), high + pad)
        ax.set_title("\n".join([r.label, "median, interval of the timed runs"]), fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    fig.savefig(path)
    return path


# ---------------------------------------------------------------- the report's hooks
def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


PRESETS = ("unroll", "dispatch", "loop")


def preset(report: Report) -> str | None:
    """The preset a sweep ran: its parent's ``sweep`` tag, else its experiment's name; None for others."""
    tag = report.parent.sweep or ""
    for name in (tag, report.experiment):
        if name in PRESETS:
            return name
    return None


def _dispatch_groups(report: Report) -> dict[tuple, list[Entry]]:
    """The report's entries by everything but the data set (device, precision, the other values)."""
    return _by(report.entries, lambda e: e.group[1:])


def _dispatch_label(report: Report, entries: list[Entry]) -> str:
    e = entries[0]
    return ", ".join([e.precision, e.device, *(f"{k}={v}" for k, v in zip(report.extra_keys, e.extra))])


def results(report: Report) -> tuple[str | None, list[Any]]:
    """The preset and its results, one per comparison group (a line of text where there is none)."""
    name = preset(report)
    if name is None:
        return None, []
    noise = aa_noise(report.entries)
    if name == "unroll":
        return name, [unroll(es, report.group_label(g), noise) for g, es in report.groups.items()]
    if name == "loop":
        return name, [loop(es, report.group_label(g), noise, report.min_speedup) for g, es in report.groups.items()]
    if name == "dispatch":
        out: list[Any] = []
        for es in _dispatch_groups(report).values():
            r = dispatch(es, _dispatch_label(report, es), noise)
            out += [r] if isinstance(r, str) else r
        return name, out
    return None, []


def lines(report: Report) -> list[str]:
    """The preset's headline lines ([] for a sweep that is not one of :data:`PRESETS`)."""
    name, found = results(report)
    if not found:
        return []
    out: list[str] = []
    groups = _dispatch_groups(report) if name == "dispatch" else report.groups
    caveat = "".join(dict.fromkeys(_contended(es, report.contended) for es in groups.values()))
    for r in found:
        if isinstance(r, str):
            out.append(r)
        elif isinstance(r, Unroll):
            out += r.lines()
        else:
            out.append(r.line())
    if out and caveat:
        out[-1] += caveat
    return out


def figures(report: Report, folder: Path) -> list[str]:
    """The preset's own figure in ``folder`` (``unroll.png``, ``dispatch.png``, ``loop.png``); its name,
    or [] where there is none."""
    name, found = results(report)
    drawable = [r for r in found if not isinstance(r, str)]
    if name is None or not drawable:
        return []
    draw: dict[str, Callable[[list[Any], Path], Path]] = {
        "unroll": unroll_png,
        "dispatch": dispatch_png,
        "loop": loop_png,
    }
    draw[name](drawable, Path(folder) / f"{name}.png")
    return [f"{name}.png"]
