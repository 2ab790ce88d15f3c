"""Which strategy is faster, said only beyond the noise: the report's headlines.

Within one comparison group (same data size, device, precision and every other value the sweep
varies, see :attr:`plnexp.report.Entry.group`):

- strategies whose compiled programs are identical (same ``hlo_fingerprint``, see
  :mod:`plnexp.fingerprint`) are one **contender**: their timings differ by noise only, so no member
  is ranked above another;
- a contender is "fastest" only when the interval of its timed runs (interquartile range, or the
  range below 5 runs: :class:`plnexp.timing.Spread`) lies wholly below the next one's, each with at
  least :data:`MIN_RUNS` runs, and when its lead exceeds the **between-job noise** the group
  measures itself: jobs of one program are an A/A test, and how far their medians lie apart
  (:func:`same_program_noise`) is how far two jobs can differ for no reason (a shared machine
  drifts between jobs more than within one). Otherwise the contenders within that reach of the
  best are "tied within noise";
- a group with a **contended** run is not ranked at all (:func:`contention`): timed runs that
  overlapped with another job's on the same host, a calibration that moved during the timed runs,
  or runs timed on different hosts or CPU models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from .provenance import batch_key, replicate
from .timing import CALIBRATION_LEVEL_TOLERANCE, CALIBRATION_TOLERANCE

MIN_RUNS = 3  # timed runs a contender needs before it is ranked
CLEAN = "for clean timings run the sweep alone on its machine with hydra/launcher=basic (one job at a time)"


@dataclass(frozen=True)
class Contender:
    """One strategy, or several whose programs are identical (one fingerprint)."""

    names: tuple[str, ...]
    ms: float  # median ms/iter (the median of the members' medians)
    lo: float  # the members' intervals joined, in ms/iter
    hi: float
    n_runs: int  # the fewest timed runs of a member

    @property
    def label(self) -> str:
        if len(self.names) == 1:
            return self.names[0]
        return " = ".join(self.names) + " (one program)"

    def text(self) -> str:
        return f"{self.label} {self.ms:.2f} ms/iter [{self.lo:.2f}–{self.hi:.2f}, {self.n_runs} runs]"


def interval_ms(e) -> tuple[float, float, int]:
    """A run's interval of its timed runs in ms/iter, and their number (1 for runs logged before
    spreads were: their interval is their one value)."""
    ms, n_iter = e.m("ms_per_iter"), e.m("n_iter_run")
    lo, hi, n = e.m("run_s_lo"), e.m("run_s_hi"), e.m("n_runs")
    if not (math.isfinite(lo) and math.isfinite(hi) and n_iter > 0):
        return ms, ms, 1
    return 1e3 * lo / n_iter, 1e3 * hi / n_iter, int(n) if math.isfinite(n) else 1


def contenders(entries) -> list[Contender]:
    """The finished entries as contenders, fastest first: one per program (same non-empty
    fingerprint), one per entry without a fingerprint (eager, torch)."""
    by_program: dict[str, list] = {}
    for e in entries:
        if e.ok:
            fp = e.tags.get("hlo_fingerprint", "")
            by_program.setdefault(fp or f"-{e.run_id}", []).append(e)
    out = []
    for members in by_program.values():
        spans = [interval_ms(e) for e in members]
        medians = sorted(e.m("ms_per_iter") for e in members)
        mid = len(medians) // 2
        ms = medians[mid] if len(medians) % 2 else (medians[mid - 1] + medians[mid]) / 2
        out.append(
            Contender(
                tuple(e.strategy for e in members),
                ms,
                min(s[0] for s in spans),
                max(s[1] for s in spans),
                min(s[2] for s in spans),
            )
        )
    return sorted(out, key=lambda c: c.ms)


def same_program_noise(ranked: list[Contender], entries) -> float:
    """How far apart (max/min - 1 of their median ms/iter) the jobs of one program landed, the
    largest over the group's programs with several jobs; NaN when no program has two."""
    worst = math.nan
    for c in ranked:
        if len(c.names) > 1:
            ms = [e.m("ms_per_iter") for e in entries if e.ok and e.strategy in c.names]
            worst = max(worst if math.isfinite(worst) else 0.0, max(ms) / min(ms) - 1)
    return worst


def same_batch(a, b) -> bool:
    """Two replicates of one job (``replicates=K``): one program, timed once, so their timed runs are
    the same ones, not two loads on the machine."""
    return (
        replicate(a.tags) != replicate(b.tags)
        and batch_key(a.tags)[0] is not None
        and batch_key(a.tags) == batch_key(b.tags)
        and a.m("timed_start") == b.m("timed_start")
    )


def contention(entries) -> dict[str, list[str]]:
    """Why each contended run's timings cannot be trusted, by run id (runs not named are clean):
    timed runs that overlapped with another run's on the same host; a calibration that moved by
    more than :data:`~plnexp.timing.CALIBRATION_TOLERANCE` between before and after its timed runs
    (a competing load that started or stopped); a calibration slower by more than
    :data:`~plnexp.timing.CALIBRATION_LEVEL_TOLERANCE` than the fastest of the sweep's runs on the
    same host (a load all through the run). A load that lasts
    the whole sweep is not seen: nothing measured it idle.
    ``entries``: every run of the sweep (an overlap may cross comparison groups)."""
    why: dict[str, list[str]] = {}
    timed = [e for e in entries if math.isfinite(e.m("timed_start")) and math.isfinite(e.m("timed_end"))]
    for i, a in enumerate(timed):
        for b in timed[i + 1 :]:
            same_host = a.tags.get("host") and a.tags.get("host") == b.tags.get("host")
            overlap = a.m("timed_start") < b.m("timed_end") and b.m("timed_start") < a.m("timed_end")
            if same_host and overlap and not same_batch(a, b):
                why.setdefault(a.run_id, []).append(f"timed runs overlapped with {b.name}'s on {a.tags['host']}")
                why.setdefault(b.run_id, []).append(f"timed runs overlapped with {a.name}'s on {b.tags['host']}")
    best: dict[str, float] = {}  # per host, the fastest calibration of the sweep
    calibrated = [e for e in entries if e.m("calib_before_s") > 0 and e.m("calib_after_s") > 0]
    for e in calibrated:
        host = e.tags.get("host", "?")
        best[host] = min(best.get(host, math.inf), e.m("calib_before_s"), e.m("calib_after_s"))
    tol = f"idle: within ±{100 * CALIBRATION_TOLERANCE:.0f}%"
    for e in calibrated:
        before, after = e.m("calib_before_s"), e.m("calib_after_s")
        if abs(after / before - 1) > CALIBRATION_TOLERANCE:
            why.setdefault(e.run_id, []).append(
                f"calibration moved {100 * (after / before - 1):+.0f}% during its timed runs ({tol})"
            )
        level = min(before, after) / best[e.tags.get("host", "?")] - 1
        if level > CALIBRATION_LEVEL_TOLERANCE:
            why.setdefault(e.run_id, []).append(
                f"calibration {100 * level:+.0f}% over its host's fastest in the sweep (idle: within "
                f"+{100 * CALIBRATION_LEVEL_TOLERANCE:.0f}%)"
            )
    return why


def machines(entries) -> str:
    """ "" when every finished run of the group ran on one host and CPU model, else what differs."""
    ok = [e for e in entries if e.ok]
    hosts = sorted({e.tags.get("host", "?") for e in ok})
    cpus = sorted({e.tags.get("cpu_model", "?") for e in ok})
    if len(cpus) > 1:
        return f"timed on different CPU models ({'; '.join(cpus)})"
    if len(hosts) > 1:
        return f"timed on different hosts ({', '.join(hosts)})"
    return ""


class Ranked(NamedTuple):
    line: str  # the group's summary line
    winner: str  # the fastest contender's label, "" when none is (tied, contended, too few runs)


def headline(label: str, entries, contended: dict[str, list[str]], baseline: str = "eager") -> str:
    return rank(label, entries, contended, baseline).line


def rank(label: str, entries, contended: dict[str, list[str]], baseline: str = "eager") -> Ranked:
    """The summary line of one comparison group (see the module docstring) and its winner; a clear
    winner's speed-up over the next contender and over ``baseline``'s run, when the group has one."""
    unfinished = [f"{e.strategy} ({e.status})" for e in entries if not e.ok]
    tail = f"; not finished: {', '.join(unfinished)}" if unfinished else ""
    ranked = contenders(entries)
    if not ranked:
        return Ranked(f"{label}: no run finished{tail}", "")
    bad = [e for e in entries if e.run_id in contended]
    where = machines(entries)
    if bad or where:
        reason = where or "; ".join(f"{e.strategy}: {contended[e.run_id][0]}" for e in bad[:2])
        more = f" (+{len(bad) - 2} more)" if len(bad) > 2 else ""
        return Ranked(f"timings contended on {label}: do not compare ({reason}{more}){tail}", "")
    best = ranked[0]
    if len(ranked) == 1:
        return Ranked(f"{label}: only {best.text()} finished{tail}", best.label)
    few = [c.label for c in ranked if c.n_runs < MIN_RUNS]
    if few:
        return Ranked(
            f"not ranked on {label}: fewer than {MIN_RUNS} timed runs for {', '.join(few)} "
            f"(repeats={MIN_RUNS} or more ranks them){tail}",
            "",
        )
    nxt = ranked[1]
    noise = same_program_noise(ranked, entries)
    aa = f" (jobs of one program differ by up to {100 * noise:.0f}% here)" if math.isfinite(noise) else ""
    reach = best.ms * (1 + noise) if math.isfinite(noise) else -math.inf
    if best.hi < nxt.lo and nxt.ms > reach:
        ups = [f"{nxt.ms / best.ms:.2f}× next: {nxt.label}"]
        base = next((e for e in entries if e.ok and e.strategy == baseline), None)
        if base is not None and baseline not in best.names:
            ups.append(f"{base.m('ms_per_iter') / best.ms:.1f}× {baseline}")
        return Ranked(f"fastest on {label}: {best.text()} ({', '.join(ups)}){tail}", best.label)
    tied = [c for c in ranked if c.lo <= best.hi or c.ms <= reach]
    rest = len(ranked) - len(tied)
    return Ranked(
        f"tied within noise{aa} on {label}: {'; '.join(c.text() for c in tied)}"
        f"{f'; {rest} slower' if rest else ''}{tail}",
        "",
    )
