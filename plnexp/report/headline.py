"""The plain headline of a group's verdict: what a person reads first, in the terminal, the report
and the dashboard's description.

From the group's interleaved rounds (:class:`plnexp.jobs.verdicts.GroupVerdict`), in this order:

1. the fastest strategy and by how much, with its interval (``fastest: scan_fused, 0.35× scan's
   time [0.33–0.37], 2.9× as fast``), or ``no compiled loop is measurably faster than scan (12
   rounds, minimum effect 1.10×)``;
2. the strategies tied with the reference, then those slower (each with its ratio and interval);
3. when any is unresolved, why (the round budget spent, the rounds' cap reached, too many rounds
   dropped: noise) and the exact ``key=value`` that would decide it (:func:`decide`).

Every ratio is **time ÷ the reference's time** (:mod:`plnexp.report.speed`). Pure functions of a
verdict: no store, no JAX.
"""

from __future__ import annotations

import math

from ..jobs import verdicts as V

BUDGET_KEY = "report.rounds_budget_s"
ROUNDS_KEY = "report.rounds"
MAX_BUDGET_S = 3600.0  # report.rounds_budget_s's largest allowed value
SPENT = 0.9  # rounds that took this share of the budget or more: the budget ended them


def ratio_text(p: V.ProgramResult) -> str:
    """``0.98× [0.85–1.12]``; ``0.98× [unbounded: too few rounds]``."""
    if not (math.isfinite(p.low) and math.isfinite(p.high)):
        return f"{p.ratio:.2f}× [unbounded: too few rounds]"
    return f"{p.ratio:.2f}× [{p.low:.2f}–{p.high:.2f}]"


def _names(p: V.ProgramResult) -> str:
    return " = ".join(p.names)


def _nice(seconds: float) -> float:
    """Seconds rounded up to a value a person types: a multiple of 10 below 300, of 60 above."""
    step = 10 if seconds < 300 else 60
    return float(min(MAX_BUDGET_S, step * math.ceil(seconds / step)))


def rounds_needed(v: V.GroupVerdict, p: V.ProgramResult) -> float:
    """The kept rounds that would narrow ``p``'s interval enough to leave out the bound of the
    minimum effect that it straddles now, at its present median (an interval's width shrinks as one
    over the square root of the rounds); inf where its median sits on the bound (no number of
    rounds decides it) or nothing is known (too few rounds)."""
    if not (math.isfinite(p.low) and math.isfinite(p.high)) or v.rounds < 1 or not p.ratio > 0:
        return math.inf
    bounds = [b for b in (1 / v.min_effect, v.min_effect) if p.low < b < p.high] or [v.min_effect]
    bound = min(bounds, key=lambda b: abs(math.log(p.ratio / b)))
    gap = abs(math.log(p.ratio / bound))
    width = max(math.log(p.high / p.ratio), math.log(p.ratio / p.low))
    if gap < 0.005:
        return math.inf
    return v.rounds * (width / gap) ** 2


def why_unresolved(v: V.GroupVerdict) -> str:
    """Why the rounds ended with verdicts open: too many rounds dropped (noise), the cap of rounds, or
    the budget spent; "" when it is not known (a verdict.json older than its budget)."""
    if v.note:
        return f"noise: {v.note}"
    ran = v.rounds + v.dropped
    if v.max_rounds and ran >= v.max_rounds:
        return f"the cap of {v.max_rounds} rounds ({ROUNDS_KEY}={v.max_rounds}) was reached"
    if math.isfinite(v.budget_s) and v.seconds >= SPENT * v.budget_s:
        noisy = f", {v.dropped} dropped as noise" if v.dropped else ""
        return (
            f"the {v.budget_s:g} s budget ({BUDGET_KEY}={v.budget_s:g}) was spent after {ran} rounds{noisy}"
            " (a busy machine makes rounds slower and intervals wider)"
        )
    return ""


def decide(v: V.GroupVerdict) -> str:
    """The ``key=value`` that would decide the group's unresolved verdicts: the budget (and cap) that
    give the rounds :func:`rounds_needed` asks for at the rounds' pace so far, for those that the
    largest budget (:data:`MAX_BUDGET_S`) can decide; the others named apart: their median lies so
    near a bound of the minimum effect that no budget would (``report.min_speedup`` sets the
    bound); "" when none is open."""
    open_ = [p for p in v.programs if p.verdict == "unresolved"]
    if not open_:
        return ""
    per_round = v.seconds / max(v.rounds + v.dropped, 1)
    need = {p: rounds_needed(v, p) for p in open_}
    can = {p: n for p, n in need.items() if math.isfinite(n) and n * per_round * 1.25 <= MAX_BUDGET_S}
    said = []
    if can:
        most = math.ceil(max(can.values()))
        keys = []
        if not math.isfinite(v.budget_s) or most * per_round > SPENT * v.budget_s:
            keys.append(f"{BUDGET_KEY}={_nice(1.25 * most * per_round):g}")
        if v.max_rounds and most > v.max_rounds:
            keys.append(f"{ROUNDS_KEY}={most}")
        if keys:
            who = "" if len(can) == len(open_) else f" for {', '.join(_names(p) for p in can)}"
            said.append(f"{' '.join(keys)} would decide it{who} (about {most} rounds at this pace)")
    stuck = [p for p in open_ if p not in can]
    if stuck:
        said.append(
            f"{', '.join(_names(p) for p in stuck)}: its median too near the minimum effect's bound "
            f"({1 / v.min_effect:.2f}× or {v.min_effect:.2f}×): no budget up to {MAX_BUDGET_S:g} s decides it at this "
            "pace (a quieter machine narrows the interval; report.min_speedup sets the bound)"
        )
    return "; ".join(said)


def lines(v: V.GroupVerdict, label: str) -> list[str]:
    """The group's headline (see the module docstring): its first line names the group by ``label``
    (every value that tells the groups apart), the others follow it."""
    ref = v.reference
    basis = f"{v.rounds} rounds{f', {v.dropped} dropped' if v.dropped else ''}, minimum effect {v.min_effect:.2f}×"
    faster = sorted(v.of("faster"), key=lambda p: p.ratio)
    best = v.fastest()
    if best and faster:
        p = faster[0]
        head = (
            f"{label}: fastest: {_names(p)}, {p.ratio:.2f}× {ref}'s time [{p.low:.2f}–{p.high:.2f}], "
            f"{1 / p.ratio:.1f}× as fast ({basis})"
        )
    elif faster:
        head = (
            f"{label}: faster than {ref}, none of them measurably ahead of the others: "
            + ", ".join(f"{_names(p)} {ratio_text(p)}" for p in faster)
            + f" ({basis})"
        )
    else:
        head = f"{label}: no compiled loop is measurably faster than {ref} ({basis})"
    out = [head]
    refs = [p for p in v.programs if p.verdict == V.REFERENCE]
    tied = sorted(v.of("tied"), key=lambda p: p.ratio)
    if tied:
        within = max(max(p.high - 1, 1 - p.low) for p in tied)
        out.append(
            f"tied with {' = '.join(n for p in refs for n in p.names) or ref} (within ±{100 * within:.0f}%): "
            + ", ".join(_names(p) for p in tied)
        )
    slower = sorted(v.of("slower"), key=lambda p: p.ratio)
    if slower:
        out.append("slower: " + ", ".join(f"{_names(p)} {ratio_text(p)}" for p in slower))
    if faster and best:
        rest = faster[1:]
        if rest:
            out.append(f"also faster than {ref}: " + ", ".join(f"{_names(p)} {ratio_text(p)}" for p in rest))
    unresolved = sorted(v.of("unresolved"), key=lambda p: p.ratio)
    if unresolved:
        why = why_unresolved(v)
        text = "unresolved: " + ", ".join(f"{_names(p)} {ratio_text(p)}" for p in unresolved)
        text += f": {why}" if why else ""
        fix = decide(v)
        out.append(text + (f"; {fix}" if fix else ""))
    elif v.note:
        out.append(f"note: {v.note}")
    return out


# ---------------------------------------------------------------- a report's groups
OP_BY_OP = ("eager", "jit_per_function")  # strategies whose optimizer step is not one compiled program


def agreement(report, group: tuple) -> str:
    """Whether the group's ELBO curves agree with the reference's, and, for those beyond their
    precision's ``curve_rtol`` (:mod:`plnexp.core.precision`), why: a strategy that runs its step op
    by op rounds the optimizer's arithmetic otherwise than the fused program (radam_clip's
    rectification term most of all); "" where no curve was compared."""
    from ..core.precision import PRECISIONS

    runs = [e for e in report.groups[group] if e.ok and not e.control and math.isfinite(e.vs_scan)]
    if not runs:
        return ""
    worst = max(e.vs_scan for e in runs)
    precision = runs[0].precision
    tol = PRECISIONS[precision].curve_rtol if precision in PRECISIONS else math.nan
    text = f"ELBO curves within {worst:.1e} (relative) of scan's"
    beyond = sorted({e.strategy for e in runs if math.isfinite(tol) and e.vs_scan > tol})
    if not beyond:
        return text + (f", within {precision}'s curve tolerance {tol:.0e}" if math.isfinite(tol) else "")
    optimizer = runs[0].params.get("optimizer.name", "")
    they = "it runs" if len(beyond) == 1 else "they run"
    why = (
        f"{they} the step op by op, where XLA rounds the optimizer's arithmetic otherwise than in one fused "
        "program (radam_clip's rectification term most: the same maths, not the same float32 rounding; "
        "with adam the curves agree within the tolerance)"
        if set(beyond) <= set(OP_BY_OP)
        else "their programs round the step's arithmetic otherwise than scan's"
    )
    with_ = f" with {optimizer}" if optimizer else ""
    return f"{text}; {', '.join(beyond)} beyond {precision}'s curve tolerance {tol:.0e}{with_}: {why}"


def of_group(report, group: tuple) -> list[str]:
    """The group's headline lines (:func:`lines`, named by every value that tells the groups apart:
    :meth:`plnexp.report.entries.Report.group_label`) and its curves' agreement; [] for a group without
    rounds (the caller ranks the jobs' own timings)."""
    v = report.verdict_of(group)
    if v is None:
        return []
    out = lines(v, report.group_label(group))
    agree = agreement(report, group)
    return out + ([agree] if agree else [])
