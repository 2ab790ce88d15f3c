"""Which strategy is faster, said only beyond the noise: the report's headlines.

Within one comparison group (same data size, device, precision and every other value the sweep
varies, see :attr:`plnexp.report.summary.Entry.group`):

- strategies whose compiled programs are identical (same ``hlo_fingerprint``, see
  :mod:`plnexp.measure.fingerprint`) are one **contender**: their timings differ by noise only, so no member
  is ranked above another. The sweep's **control job** (:data:`CONTROL_TAG`, see
  :mod:`plnexp.experiment.sweep`) is never a contender;
- the group's **between-job noise** (:func:`noise`) is measured by its A/A pairs: jobs of one
  program (a program of k jobs gives k - 1 pairs) and the control job with its original (the same
  config run again at the sweep's end). It is the **largest relative difference of two A/A jobs'
  median ms/iter** (max/min - 1 over each program's jobs, and over each control pair): how far two
  jobs can differ for no reason (a shared machine drifts between jobs more than within one). It is
  known only from at least :data:`MIN_PAIRS` pairs, or from the control pair (the same job twice,
  the whole sweep apart): never from one pair of two different strategies alone;
- a contender is "fastest" only when the interval of its timed runs (interquartile range, or the
  range below 5 runs: :class:`plnexp.measure.timing.Spread`) lies wholly below the next one's, each with at
  least :data:`MIN_RUNS` runs, **and** its lead over the next (ratio of medians) is at least the
  minimum effect ``min_speedup`` (``report.min_speedup``, default :data:`MIN_SPEEDUP`), **and**
  exceeds 1 + the noise. A group without a noise estimate names no winner and says so. Otherwise
  the contenders within that reach of the best are "tied within noise";
- a group with a **contended** run is not ranked at all (:func:`contention`): timed runs that
  overlapped with another job's on the same host, a calibration that moved during the timed runs,
  or runs timed on different hosts or CPU models.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import NamedTuple

from .config import ReportSpec
from .provenance import HASH_TAG, batch_key, replicate
from .verdicts import program_label
from .tags import CONTROL_OF_TAG as CONTROL_OF_TAG, CONTROL_TAG, JOB_TAG, MIN_SPEEDUP_TAG as MIN_SPEEDUP_TAG
from ..measure.timing import CALIBRATION_LEVEL_TOLERANCE, CALIBRATION_TOLERANCE

MIN_RUNS = 3  # timed runs a contender needs before it is ranked
MIN_SPEEDUP = ReportSpec.min_speedup  # the default minimum effect (report.min_speedup): as asv's default factor
MIN_PAIRS = 2  # A/A pairs a noise estimate needs, unless one of them is the control pair
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
        return program_label(self.names)

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


def is_control(e) -> bool:
    """Whether the run is a sweep's control job (its reference job run again: :mod:`plnexp.experiment.sweep`)."""
    return e.tags.get(CONTROL_TAG) == "true"


def programs(entries) -> list[list]:
    """The finished entries that are not the control job, by program: one group per non-empty
    fingerprint, one per entry without a fingerprint (eager, torch)."""
    by_program: dict[str, list] = {}
    for e in entries:
        if e.ok and not is_control(e):
            by_program.setdefault(e.tags.get("hlo_fingerprint", "") or f"-{e.run_id}", []).append(e)
    return list(by_program.values())


def contenders(entries) -> list[Contender]:
    """The finished entries as contenders, fastest first: one per program (:func:`programs`); the
    control job is none."""
    out = []
    for members in programs(entries):
        spans = [interval_ms(e) for e in members]
        ms = statistics.median(e.m("ms_per_iter") for e in members)
        out.append(
            Contender(
                tuple(dict.fromkeys(e.strategy for e in members)),  # a strategy twice (a rerun's): one name
                ms,
                min(s[0] for s in spans),
                max(s[1] for s in spans),
                min(s[2] for s in spans),
            )
        )
    return sorted(out, key=lambda c: c.ms)


@dataclass(frozen=True)
class Noise:
    """A group's between-job noise (:func:`noise`)."""

    value: float  # the largest relative difference of two A/A jobs' medians; NaN without a pair
    pairs: int  # A/A pairs: a program's k jobs give k - 1, a control job and its original 1
    control: bool  # the control pair is among them

    @property
    def known(self) -> bool:
        """Whether the estimate rests on more than one sample: :data:`MIN_PAIRS` pairs, or the
        control pair (the same job twice, the whole sweep apart)."""
        return math.isfinite(self.value) and (self.control or self.pairs >= MIN_PAIRS)

    def text(self, why: bool = False) -> str:
        """``A/A noise up to 3% over 2 pairs``, or ``no noise estimate: 1 A/A pair`` (``why``: and
        what an estimate needs)."""
        if not self.known:
            what = f"{self.pairs} A/A pair" if self.pairs else "no A/A pair"
            needs = f" (needs {MIN_PAIRS} pairs of jobs of one program, or the sweep's control job)" if why else ""
            return f"no noise estimate: {what}{needs}"
        if self.pairs == 1:
            return f"A/A noise {100 * self.value:.0f}% (the control pair)"
        whose = ", the control's included" if self.control else ""
        return f"A/A noise up to {100 * self.value:.0f}% over {self.pairs} pairs{whose}"


def original(control, entries):
    """The run a control job repeats: of the finished runs that are not controls, the one of the same
    strategy and config hash, the one of the job it names (:data:`CONTROL_OF_TAG`) first; None."""
    same = [
        e
        for e in entries
        if e.ok
        and not is_control(e)
        and e.strategy == control.strategy
        and e.tags.get(HASH_TAG) == control.tags.get(HASH_TAG)
        and e.tags.get("hlo_fingerprint", "") == control.tags.get("hlo_fingerprint", "")
    ]
    job = control.tags.get(CONTROL_OF_TAG)
    return next((e for e in same if e.tags.get(JOB_TAG) == job), same[0] if same else None)


def noise(entries) -> Noise:
    """The group's between-job noise: the largest relative difference (max/min - 1) of the median
    ms/iter of A/A jobs, over the group's programs with several jobs (the control excluded) and over
    each finished control job with its original (:func:`original`); see :class:`Noise`."""
    same = [[e.m("ms_per_iter") for e in members] for members in programs(entries)]  # k jobs: k - 1 pairs
    found = [(c, original(c, entries)) for c in entries if c.ok and is_control(c)]
    same += [[c.m("ms_per_iter"), o.m("ms_per_iter")] for c, o in found if o is not None]  # one pair each
    spreads = [max(ms) / min(ms) - 1 for ms in same if len(ms) > 1]
    control = any(o is not None for _, o in found)
    return Noise(max(spreads, default=math.nan), sum(len(ms) - 1 for ms in same), control)


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
    more than :data:`~plnexp.measure.timing.CALIBRATION_TOLERANCE` between before and after its timed runs
    (a competing load that started or stopped); a calibration slower by more than
    :data:`~plnexp.measure.timing.CALIBRATION_LEVEL_TOLERANCE` than the fastest of the sweep's runs on the
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
    winner: str  # the fastest contender's label, "" when none is (tied, contended, too few runs, no noise estimate)
    tied: tuple = ()  # the contenders tied within noise with the best (when the line says so)
    noise: Noise | None = None  # the group's noise estimate, when it was ranked


def rank(
    label: str, entries, contended: dict[str, list[str]], baseline: str = "eager", min_speedup: float = MIN_SPEEDUP
) -> Ranked:
    """The summary line of one comparison group (see the module docstring) and its winner; a clear
    winner's speed-up over the next contender and over ``baseline``'s run, when the group has one.
    ``min_speedup``: the minimum effect, a factor >= 1 (``report.min_speedup``)."""
    unfinished = [f"{e.strategy}{' (control)' if is_control(e) else ''} ({e.status})" for e in entries if not e.ok]
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
    aa = noise(entries)
    lead = nxt.ms / best.ms
    if best.hi < nxt.lo and lead >= min_speedup:
        ups = [f"{lead:.2f}× next: {nxt.label}"]
        if not aa.known:  # a lead that nothing tells from the noise: said, not named
            return Ranked(
                f"no winner named on {label}: {aa.text(why=True)}; {best.text()} leads ({ups[0]}){tail}", "", noise=aa
            )
        if lead > 1 + aa.value:
            base = next((e for e in entries if e.ok and not is_control(e) and e.strategy == baseline), None)
            if base is not None and baseline not in best.names:
                ups.append(f"{base.m('ms_per_iter') / best.ms:.1f}× {baseline}")
            return Ranked(
                f"fastest on {label}: {best.text()} ({', '.join(ups)}; {aa.text()}, minimum effect "
                f"{min_speedup:.2f}×){tail}",
                best.label,
                noise=aa,
            )
    reach = best.ms * max(min_speedup, 1 + aa.value if aa.known else 1.0)
    tied = [c for c in ranked if c.lo <= best.hi or c.ms < reach]
    rest = len(ranked) - len(tied)
    return Ranked(
        f"tied within noise ({aa.text()}; minimum effect {min_speedup:.2f}×) on {label}: "
        f"{'; '.join(c.text() for c in tied)}{f'; {rest} slower' if rest else ''}{tail}",
        "",
        tuple(c.label for c in tied),
        aa,
    )
