"""``sweep=loop``'s headline and figure (:mod:`plnexp.report.tradeoffs` asks): ``fori_loop - scan`` (the
loop form), ``while_loop - fori_loop`` (the stopping condition) and ``while_loop - scan``, per data size;
whether every run did all its iterations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


from ..jobs import ranking

from ..measure.plots import figure
from .differences import Diff, Timed, _noise_text, _ok, whiskers
from .entries import by, Entry


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
            (a, b, what, Diff.between(self.timed[a], self.timed[b], self.noise, self.min_effect))
            for a, b, what in LOOP_PAIRS
            if {a, b} <= have
        ]

    def lines(self) -> list[str]:
        return [self.line()]

    def line(self) -> str:
        parts = [f"{what}, {a} − {b} = {d.text()}: {d.verdict(a)}" for a, b, what, d in self.diffs()]
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


def loop(
    entries: Sequence[Entry], label: str, noise: float = math.nan, min_effect: float = ranking.MIN_SPEEDUP
) -> Loop:
    """scan, fori_loop and while_loop of one comparison group, side by side."""
    runs = {e.strategy: e for e in _ok(entries) if e.strategy in ("scan", "fori_loop", "while_loop")}
    order = [s for s in ("scan", "fori_loop", "while_loop") if s in runs]
    prints = by([runs[s] for s in order], lambda e: (e.tags.get("hlo_fingerprint", ""),))
    same = next((tuple(e.strategy for e in es) for (fp,), es in prints.items() if fp and len(es) > 1), ())
    return Loop(
        label,
        {s: Timed.of(runs[s]) for s in order},
        {s: runs[s].m("compile_s") for s in order},
        {s: (runs[s].m("n_iter_run"), runs[s].number("n_iter", runs[s].m("n_iter_run"))) for s in order},  # run, asked
        same,
        noise,
        min_effect,
    )


def loop_png(results: list[Loop], path: Path) -> Path:
    """Per group, each loop form's ms/iter with the interval of its timed runs."""
    fig = figure(4.2 * len(results), 3.6)
    axes = fig.subplots(1, len(results), squeeze=False)[0]
    for ax, r in zip(axes, results):
        names = list(r.timed)
        ms, err = whiskers([r.timed[s] for s in names])
        for i in range(len(names)):  # points, not bars: the axis shows the differences, not from zero
            ax.errorbar([i], ms[i : i + 1], yerr=err[:, i : i + 1], fmt="o", color=f"C{i}", capsize=5, ms=7)
        ax.set_xticks(range(len(names)), names)
        ax.set_xlim(-0.6, len(names) - 0.4)
        band = (
            [r.timed["scan"].ms * (1 + d * r.noise) for d in (-1, 1)]
            if math.isfinite(r.noise) and "scan" in r.timed
            else []
        )
        if band:
            ax.axhspan(*band, color="C0", alpha=0.1, label="scan ± the A/A noise")
            ax.legend(fontsize=8, loc="upper right")
        ax.set_ylabel("ms per iteration")
        low = float(min([r.timed[s].lo for s in names] + band))
        high = float(max([r.timed[s].hi for s in names] + band))
        pad = max(high - low, 0.02 * high)
        ax.set_ylim(max(0.0, low - pad), high + pad)
        ax.set_title("\n".join([r.label, "median, interval of the timed runs"]), fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    fig.savefig(path)
    return path
