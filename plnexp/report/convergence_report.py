"""Convergence in a sweep's report (#33): what reaches ε of the optimum first, the gaps, and
``while_loop``'s stopping rule judged on scan's curves.

A report (:mod:`plnexp.report.summary`) asks :func:`lines` (the headline, ``sweep=convergence`` only),
:func:`markdown` (its tables) and :func:`plnexp.report.convergence_figures.figures` (``convergence.png``:
the relative gap to the optimum against seconds, for ``sweep=convergence`` and any sweep that varies the
precision).
Everything is read from the runs' metrics (:mod:`plnexp.measure.convergence` names them): ``optimum_elbo``,
``gap_final_rel``, ``gap_resolution_rel``, ``iters_to_<ε>`` and ``s_to_<ε>`` (absent where the run
never came within ε, or where ε is at or below the resolution of its precision), ``run_s_lo`` and
``run_s_hi``; nothing is measured here.

- **Time to ε**: the steady seconds a run took to come within ε (relative) of the optimum,
  ``run_s × iters / n_iter_run``, with its spread (the interval of the timed runs, ``run_s_lo`` to
  ``run_s_hi``, scaled alike). Per ε and data set, a run is named first only when its interval lies
  wholly below the next one's, it leads by at least the minimum effect (``report.min_speedup``)
  and by more than the A/A noise between jobs where the sweep measured it (its control job,
  :func:`plnexp.report.differences.aa_noise`); else the runs within that reach are tied. The control job and
  the peer (a run tagged :data:`plnexp.jobs.tags.PEER_TAG`, pyPLNmodels' own fit) are shown, never ranked.
- **while_loop's rule**: on each scan run's curve (the same iterations as a while_loop run's),
  where the rule "relative ELBO change below ``tol`` for ``patience`` iterations in a row" would
  stop (:func:`plnexp.measure.convergence.while_stop`), for each of :data:`TOLS`, and the gap there; checked
  against the sweep's while_loop runs at their own ``tol``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from ..measure import convergence
from ..jobs import ranking
from .differences import aa_noise
from .entries import DASH, md_table, num, varying, Entry, Report


PRESET = "convergence"  # the sweep file whose report has the headline (conf/sweep/convergence.yaml)
TOLS = (1e-4, 1e-6, 1e-8, 1e-10)  # the while_loop tolerances judged on scan's curves
PATIENCE = 10  # while_loop's default patience (plnexp.strategies.EarlyStop), for a sweep without while_loop runs
NOT_LOGGED = "not logged"  # runs from before the convergence metrics


# ---------------------------------------------------------------- time to ε
@dataclass(frozen=True)
class Reach:
    """One run's time to ε: the iterations and steady seconds (median, interval of the timed runs),
    or why there are none (``why``: "" when reached)."""

    iters: int | None
    s: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    why: str = ""  # why not reached, in full (the headline)
    short: str = ""  # the same in a table's cell

    @property
    def reached(self) -> bool:
        return self.iters is not None and math.isfinite(self.s)

    def text(self) -> str:
        """``0.0123 s [0.0120–0.0126], 76 iterations`` or why not."""
        if not self.reached:
            return self.why
        return f"{num(self.s, '{:.3g}')} s [{num(self.lo, '{:.3g}')}–{num(self.hi, '{:.3g}')}], {self.iters} iterations"


def reach(e: Entry, eps: float) -> Reach:
    """How long the run took to come within ``eps`` of the optimum, from its metrics."""
    if not math.isfinite(e.m("optimum_elbo")):
        return Reach(None, why=NOT_LOGGED, short=NOT_LOGGED)
    resolution = e.m("gap_resolution_rel")
    if math.isfinite(resolution) and eps <= resolution:
        return Reach(None, why=f"below {e.precision}'s resolution ({resolution:.1e})", short="below resolution")
    key = convergence.eps_key(eps)
    iters, n = e.m(f"iters_to_{key}"), e.m("n_iter_run")
    if not math.isfinite(iters):
        why = f"not reached in {n:.0f} iterations" if math.isfinite(n) else "not reached"
        return Reach(None, why=why, short="not reached")
    share = iters / n if n > 0 else math.nan
    s = e.m(f"s_to_{key}")
    s = s if math.isfinite(s) else e.m("run_s") * share
    lo, hi = e.m("run_s_lo") * share, e.m("run_s_hi") * share
    if not (math.isfinite(lo) and math.isfinite(hi)):  # runs logged before spreads were: their one value
        lo = hi = s
    return Reach(int(iters), s, lo, hi)


@dataclass(frozen=True)
class Race:
    """Which run of one data set reaches ε first (:func:`race`)."""

    label: str  # the data set, as the report names its groups
    eps: float
    reached: tuple[tuple[str, Reach], ...]  # the ranked runs that reached ε, fastest first
    missed: tuple[tuple[str, str], ...]  # the ranked runs that did not: (name, why)
    shown: tuple[tuple[str, Reach], ...] = ()  # the peer's, shown beside, never ranked
    min_effect: float = ranking.MIN_SPEEDUP
    noise: float = math.nan  # the A/A noise between jobs, a share (NaN: not measured)
    contended: tuple[str, ...] = ()  # the ranked runs whose timings are contended (plnexp.jobs.ranking.contention)

    @property
    def winner(self) -> str:
        """The first run beyond the spread, the minimum effect and the noise; "" when there is none
        (and where two runs reached ε and one's timings are contended: their seconds cannot be compared)."""
        if len(self.reached) == 1:
            return self.reached[0][0]
        if self.contended or len(self.reached) < 2:
            return ""
        (_, best), (_, nxt) = self.reached[:2]
        beyond_noise = not math.isfinite(self.noise) or self.lead > 1 + self.noise
        return self.reached[0][0] if best.hi < nxt.lo and self.lead >= self.min_effect and beyond_noise else ""

    @property
    def lead(self) -> float:
        """How many times the first run's seconds to ε the second's are (two runs reached ε)."""
        (_, best), (_, nxt) = self.reached[:2]
        return nxt.s / best.s if best.s > 0 else math.inf

    def line(self) -> str:
        head = f"convergence on {self.label}, ε={convergence.eps_key(self.eps)}"
        missed = self._missed()
        peer = "".join(f"; {name} (peer, not ranked): {r.text()}" for name, r in self.shown)
        if not self.reached:
            whys = sorted({why for _, why in self.missed})
            return f"{head}: none reached ε ({'; '.join(whys) or 'no run finished'}){peer}"
        name, best = self.reached[0]
        if self.contended and len(self.reached) > 1:
            return (
                f"{head}: no winner named, timings contended in {'; '.join(self.contended)} (see the notes; "
                f"measure again alone): lowest median {name} {best.text()}{missed}{peer}"
            )
        if len(self.reached) == 1:
            return f"{head}: first {name}, the only run to reach ε: {best.text()}{missed}{peer}"
        nxt_name, nxt = self.reached[1]
        noise = f", A/A noise {100 * self.noise:.1f}%" if math.isfinite(self.noise) else ""
        if self.winner:
            return (
                f"{head}: first {name} in {best.text()} (steady seconds: run time × iterations to ε / "
                f"iterations run), {self.lead:.2f}× next: {nxt_name} {nxt.text()}{noise}{missed}{peer}"
            )
        reach_s = best.s * max(self.min_effect, 1 + self.noise if math.isfinite(self.noise) else 1.0)
        tied = [(n, r) for n, r in self.reached if r.lo <= best.hi or r.s < reach_s]
        rest = len(self.reached) - len(tied)
        return (
            f"{head}: no winner: tied within the spread or the minimum effect {self.min_effect:.2f}×{noise}: "
            + "; ".join(f"{n} {r.text()}" for n, r in tied)
            + (f"; {rest} more reached ε later" if rest else "")
            + missed
            + peer
        )

    def _missed(self) -> str:
        if not self.missed:
            return ""
        whys = sorted({why for _, why in self.missed})
        return f"; {len(self.missed)} of {len(self.missed) + len(self.reached)} runs did not ({'; '.join(whys)})"


def race(
    named: Sequence[tuple[str, Entry]],
    label: str,
    eps: float,
    min_effect: float = ranking.MIN_SPEEDUP,
    noise: float = math.nan,
    contended: Collection[str] = (),
) -> Race:
    """The race to ``eps`` of the finished runs ``named`` ((name, entry) pairs of one data set); the
    control job left out, the peer shown beside; ``contended``: the run ids whose timings are."""
    ranked = [(n, e) for n, e in named if e.ok and not e.control and not e.peer]
    reaches = [(n, reach(e, eps)) for n, e in ranked]
    reached = sorted(((n, r) for n, r in reaches if r.reached), key=lambda nr: nr[1].s)
    ids = {n: e.run_id for n, e in ranked}
    return Race(
        label,
        eps,
        tuple(reached),
        tuple((n, r.why) for n, r in reaches if not r.reached),
        tuple((n, reach(e, eps)) for n, e in named if e.ok and e.peer),
        min_effect,
        noise,
        tuple(n for n, _ in reached if ids[n] in contended),  # a run that did not reach ε compares no time
    )


# ---------------------------------------------------------------- while_loop's stopping rule
@dataclass(frozen=True)
class Stop:
    """Where while_loop's rule would stop on a curve at ``tol``: the iterations, the gap there, the
    steady seconds to it."""

    tol: float
    iters: int
    gap: float  # relative to the optimum; NaN without one
    s: float
    stopped: bool = True  # False: the rule never fired, the curve ran to its end
    resolution: float = 0.0  # the run's gap_resolution_rel: a smaller gap is rounding, not a result

    def text(self) -> str:
        if math.isfinite(self.gap) and self.gap <= self.resolution:
            gap = f"gap ≤ {self.resolution:.1e} (resolution)"
        else:
            gap = f"gap {self.gap:.1e}" if math.isfinite(self.gap) else "gap -"
        if not self.stopped:
            return f"no stop in {self.iters} it ({gap} at the end)"
        return f"{self.iters} it, {gap}, {num(self.s, '{:.3g}')} s"


def stops(
    curve: np.ndarray,
    optimum: float,
    s_per_iter: float,
    tols: Sequence[float] = TOLS,
    patience: int = PATIENCE,
    resolution: float = 0.0,
) -> list[Stop]:
    """Per ``tol``, where :func:`plnexp.measure.convergence.while_stop` stops on ``curve`` (k updates) and the
    relative gap to ``optimum`` there (``curve[k]``: the ELBO after k updates; the curve's last where it
    ends first; NaN without an optimum)."""
    gaps = convergence.gap_rel(curve, optimum) if math.isfinite(optimum) else np.full(len(curve), np.nan)
    out = []
    for tol in tols:
        k = convergence.while_stop(curve, tol, patience)
        gap = float(gaps[min(k, len(curve) - 1)]) if len(curve) else math.nan
        out.append(Stop(tol, k, gap, k * s_per_iter, k < len(curve), resolution))
    return out


@dataclass(frozen=True)
class Check:
    """A while_loop run against what scan's curve of the same config predicts at its ``tol``."""

    name: str
    tol: float
    patience: int
    ran: int  # the iterations it ran
    predicted: int

    def line(self) -> str:
        what = f"{self.name} (tol {self.tol:g}, patience {self.patience}): ran {self.ran} iterations"
        if self.ran == self.predicted:
            return f"{what}, as scan's curve predicts"
        return (
            f"{what}, scan's curve predicts {self.predicted} ({self.ran - self.predicted:+d}): the two programs' "
            "ELBO curves round differently, and the rule reads the ELBO in the run's own precision"
        )


def checks(report: Report, names: dict[str, str]) -> list[Check]:
    """Each finished while_loop run against scan's run of its group (same data, precision and other
    values): where :func:`plnexp.measure.convergence.while_stop` stops on scan's curve at its tol and patience."""
    out = []
    for entries in report.groups.values():
        scan = next((e for e in entries if e.ok and not e.control and e.strategy == "scan" and len(e.curve)), None)
        for e in entries:
            if scan is None or not e.ok or e.control or e.base != "while_loop":
                continue
            tol, patience = e.number("strategy.tol", 1e-6), int(e.number("strategy.patience", PATIENCE))
            predicted = convergence.while_stop(scan.curve, tol, patience)
            out.append(Check(names.get(e.run_id, e.strategy), tol, patience, int(e.m("n_iter_run")), predicted))
    return out


def patience(report: Report) -> int:
    """The patience of the sweep's while_loop runs (the first one's), else :data:`PATIENCE`."""
    runs = [e for e in report.entries if e.base == "while_loop"]
    return int(runs[0].number("strategy.patience", PATIENCE)) if runs else PATIENCE


# ---------------------------------------------------------------- naming and the optimum
def _fields(e: Entry) -> tuple[str, ...]:
    """What tells the run apart: its strategy, data set, precision and other grouping values."""
    return (e.strategy, e.data, e.precision, *map(str, e.extra))


def names(entries: Sequence[Entry], skip: Sequence[int] = ()) -> dict[str, str]:
    """Each run's short name (by run id): the fields that vary among ``entries`` (peers named by
    their tag), those at indices ``skip`` of :func:`_fields` left out."""
    mine = [e for e in entries if not e.peer]
    differ = varying([_fields(e) for e in mine])
    out = {}
    for e in entries:
        if e.peer:
            out[e.run_id] = f"{e.peer} (peer)"
            continue
        parts = [_fields(e)[i] for i in differ if i not in skip] or [e.strategy]
        out[e.run_id] = ", ".join(parts) + (" (control)" if e.control else "")
    return out


def optimum(report: Report, data: str) -> tuple[float, str]:
    """The data set's optimum ELBO and where it comes from: the runs' ``optimum_elbo`` (source: their
    ``plnexp.optimum_source`` tag), else the best float64 ELBO at a run's final parameters
    (``loglik``) of the sweep, said so; (NaN, "") without either."""
    runs = [e for e in report.entries if e.data == data and e.ok]
    logged = [e for e in runs if math.isfinite(e.m("optimum_elbo"))]
    if logged:
        return logged[0].m("optimum_elbo"), logged[0].tags.get("plnexp.optimum_source", "logged")
    best = max((e.m("loglik") for e in runs if math.isfinite(e.m("loglik"))), default=math.nan)
    return best, "the sweep's best final ELBO (no optimum_elbo logged)" if math.isfinite(best) else ""


# ---------------------------------------------------------------- the report's hooks
def drawn(report: Report) -> bool:
    """Whether the report has ``convergence.png``: sweep=convergence, or a sweep that varies the precision."""
    return report.ran(PRESET) or len({e.precision for e in report.grid}) > 1


def _datasets(report: Report) -> list[str]:
    return list(dict.fromkeys(e.data for e in report.entries))


def _data_label(report: Report, data: str) -> str:
    e = next(e for e in report.entries if e.data == data)
    return f"{data} ({e.shape}, {e.device})"


def races(report: Report) -> list[Race]:
    """Per data set and ε of :data:`plnexp.measure.convergence.EPSILONS`, its race (:func:`race`)."""
    noise = aa_noise(report.entries)
    out = []
    for data in _datasets(report):
        entries = [e for e in report.entries if e.data == data]
        named = [(names(entries)[e.run_id], e) for e in entries]
        label = _data_label(report, data)
        out += [race(named, label, eps, report.min_speedup, noise, report.contended) for eps in convergence.EPSILONS]
    return out


def lines(report: Report) -> list[str]:
    """The headline of ``sweep=convergence``: per data set and ε, what reaches it first; then whether
    the while_loop runs stopped where scan's curves predict. [] for any other sweep."""
    if not report.ran(PRESET):
        return []
    out = [r.line() for r in races(report)]
    found = checks(report, names(report.entries))
    if found:
        same = sum(c.ran == c.predicted for c in found)
        differ = [c.line() for c in found if c.ran != c.predicted]
        out.append(
            f"while_loop's stopping rule: {same} of {len(found)} while_loop runs stopped where scan's curve "
            "predicts" + (": " + "; ".join(differ) if differ else "")
        )
    return out


def _cell(r: Reach) -> tuple[str, str]:
    if not r.reached:
        return "–", r.short
    return str(r.iters), f"{num(r.s, '{:.3g}')} [{num(r.lo, '{:.3g}')}–{num(r.hi, '{:.3g}')}]"


def time_table(report: Report) -> list[str]:
    """Per run: its final gap, the resolution of its precision, and for each ε the iterations and steady
    seconds to it (interval of the timed runs)."""
    runs = [e for e in report.entries if e.ok]
    if not runs:
        return []
    named = names(runs)
    keys = [convergence.eps_key(eps) for eps in convergence.EPSILONS]
    head = ["run", "compile s", "ms/iter", "iterations", "final gap (rel.)", "resolution (rel.)"]
    head += [f"{h} {k}" for k in keys for h in ("iters to", "s to")]
    rows = []
    for e in sorted(runs, key=lambda e: named[e.run_id]):
        cells = [named[e.run_id], f"{e.m('compile_s'):.3f}", f"{e.m('ms_per_iter'):.3f}", f"{e.m('n_iter_run'):.0f}"]
        cells += [num(e.m("gap_final_rel"), "{:.1e}", DASH), num(e.m("gap_resolution_rel"), "{:.1e}", DASH)]
        for eps in convergence.EPSILONS:
            cells += _cell(reach(e, eps))
        rows.append(cells)
    return md_table(head, rows)


def stop_table(report: Report) -> list[str]:
    """Per scan run, where while_loop's rule would stop at each tol of :data:`TOLS` and the gap there."""
    scans = [e for e in report.grid if e.ok and e.strategy == "scan" and len(e.curve)]
    if not scans:
        return []
    named = names(scans, skip=(0,))
    k = patience(report)
    head = ["scan run", *(f"tol {tol:g}" for tol in TOLS)]
    rows = []
    for e in sorted(scans, key=lambda e: named[e.run_id]):
        n = e.m("n_iter_run")
        per = e.m("run_s") / n if n > 0 else math.nan
        res = e.m("gap_resolution_rel")
        found = stops(e.curve, optimum(report, e.data)[0], per, TOLS, k, res if math.isfinite(res) else 0.0)
        rows.append([named[e.run_id], *(s.text() for s in found)])
    return md_table(head, rows)


def markdown(report: Report) -> list[str]:
    """The report's convergence section (Markdown lines): the optimum, time to ε per run, and (where
    the sweep has scan runs) while_loop's rule judged; [] where the sweep is not drawn (:func:`drawn`)."""
    if not drawn(report):
        return []
    out = ["## Convergence", ""]
    for data in _datasets(report):
        value, source = optimum(report, data)
        if math.isfinite(value):
            out.append(f"- optimum ELBO of {data}: {value:,.3f} ({source})")
    out += [
        "",
        "Per run, the relative gap to the optimum after its last step (the float64 ELBO at its final "
        "parameters), the gap below which its precision cannot tell (resolution), and per ε the iterations and "
        "steady seconds until its ELBO curve first came within ε of the optimum (run time × iterations to ε ÷ "
        "iterations run; in brackets, the interval of its timed runs scaled alike). '–': not reached, below the "
        "resolution, or not logged (runs from before these metrics).",
        "",
        *time_table(report),
        "",
    ]
    stop = stop_table(report)
    if stop:
        out += [
            f"while_loop's stopping rule on each scan curve (relative ELBO change below tol for {patience(report)} "
            "iterations in a row): where it would stop, the relative gap to the optimum there, and the steady "
            "seconds to it. A tol whose gap is above the ε you need stops too early.",
            "",
            *stop,
            "",
        ]
    found = checks(report, names(report.entries))
    if found:
        out += ["while_loop runs against the prediction:", "", *(f"- {c.line()}" for c in found), ""]
    return out
