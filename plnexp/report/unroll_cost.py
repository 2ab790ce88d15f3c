"""``sweep=unroll``'s headline and figure (:mod:`plnexp.report.tradeoffs` asks): the compile seconds (and
XLA instructions) each extra unrolled step adds, from a least-squares line over the unroll factors; the
unroll with the lowest ms/iter and its gain over unroll 1; the break-even for a fit of
:data:`FIT_ITERS` iterations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from pathlib import Path

import numpy as np


from ..measure.plots import figure
from .differences import Timed, _noise_text, _ok, least_squares, whiskers
from .entries import Entry


FIT_ITERS = 1000  # the fit length the unroll break-even is stated for
NOT_LOGGED = "not logged (runs from before it was)"


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
    saved_s: tuple[float, ...]  # run time best saves on a FIT_ITERS fit: median, low, high
    break_even: tuple[float, ...]  # the unroll where the added compile equals saved_s (the same three); NaN: none
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
        vs = f"{self.timed[i].text()} against {self.timed[0].text()}"
        gain = f"{self.gain:.2f}× ({self.gain_lo:.2f}–{self.gain_hi:.2f}×)"
        if self.best == u0:
            second = f"unroll on {self.label}: no unroll runs faster than unroll {u0} ({self.timed[0].text()})"
        elif self.beyond_noise:
            second = f"unroll on {self.label}: fastest at unroll {self.best}, {vs} at unroll {u0}: {gain}"
            second += _noise_text(self.noise)
        else:
            second = (
                f"unroll on {self.label}: no unroll runs faster than unroll {u0} beyond the noise (lowest median: "
                f"unroll {self.best}, {vs}, {gain}){_noise_text(self.noise)}"
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
        if e.base == "scan_unrolled":
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
    slope, intercept, se = least_squares(us, compile_s)
    slope_instr = least_squares(us, instructions)[0] if all(math.isfinite(v) for v in instructions) else math.nan
    i = int(np.argmin([t.ms for t in timed]))
    gain = timed[0] / timed[i]
    beyond = i > 0 and timed[i].hi < timed[0].lo and not gain.ms - 1 <= noise
    saved = tuple(FIT_ITERS * d / 1e3 for d in astuple(timed[0] - timed[i]))  # median, low, high
    even = (
        tuple(us[0] + s / slope if s > 0 else float(us[0]) for s in saved) if slope > 0 and beyond else (math.nan,) * 3
    )
    totals = tuple(c + FIT_ITERS * t.ms / 1e3 for c, t in zip(compile_s, timed))
    return Unroll(
        label,
        us,
        compile_s,
        timed,
        instructions,
        slope,
        intercept,
        se,
        slope_instr,
        us[i],
        gain.ms,
        gain.lo,
        gain.hi,
        beyond,
        saved,
        even,
        totals,
        noise,
    )


def unroll_png(results: list[Unroll], path: Path) -> Path:
    """Per group, three panels against the unroll factor: compile time (and XLA instructions) with
    the least-squares line, ms/iter with the timed runs' interval, and compile + run for a fit of
    :data:`FIT_ITERS` iterations with the break-even."""
    fig = figure(13, 3.9 * len(results))
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
        ms, err = whiskers(r.timed)
        ax.errorbar(x, ms, yerr=err, fmt="o-", color="C2", capsize=3, lw=1)
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
