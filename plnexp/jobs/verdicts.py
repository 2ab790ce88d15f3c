"""A sweep's verdicts: per timed group, each strategy's paired ratio to the reference, its interval
and what it supports; ``verdict.json`` on the sweep's parent run, the same figures as each run's
metrics and tags, and the headline the report, the summary and the dashboard print.

The figures come from interleaved rounds (:mod:`plnexp.fitting.rounds`) and their statistics from
:mod:`plnexp.measure.paired`. Strategies whose compiled programs are identical (one
``hlo_fingerprint``) are **one program**: the headline names them together, their verdict is that
of their ratios pooled; each keeps its own ratio in ``strategies`` (an A/A check: two names of one
program should be ``tied``).

``verdict.json`` (``schema`` :data:`SCHEMA`)::

    {"schema": 1,
     "groups": [{"label": "oaks_x100 (11600×114), float32, cpu", "reference": "scan",
                 "rounds": 8, "dropped": 1, "dropped_why": ["calibration moved +41% ..."],
                 "min_effect": 1.1, "confidence": 0.95, "seconds": 61.2, "note": "",
                 "budget_s": 30.0, "max_rounds": 30,
                 "strategies": [{"strategy": "eager", "runs": ["<run id>"], "fingerprint": "",
                                 "ms_per_iter": 70.1, "cpu_ms_per_iter": 71.0, "ratio": 5.6, "low": 5.2, "high": 6.0,
                                 "verdict": "slower", "rounds": 8, "dropped": 1}, ...],
                 "programs": [{"names": ["scan", "scan_namedtuple"], "fingerprint": "…",
                               "ratio": 1.0, "low": 1.0, "high": 1.0, "verdict": "reference"}, ...]}]}

``ratio`` is the median over the kept rounds of (the strategy's ms/iter / the reference's ms/iter,
in the same round); ``low``/``high`` its interval (null where the rounds are too few for one);
``verdict`` one of ``faster``, ``tied``, ``slower``, ``unresolved``, or ``reference``.
"""

from __future__ import annotations

import json
import math
import typing
from dataclasses import dataclass, field, fields, is_dataclass

from .tags import GROUP_TAG, REFERENCE_TAG, VERDICT_TAG

SCHEMA = 1
ARTIFACT = "verdict.json"
REFERENCE = "reference"
# a run's paired ratio as a person reads it (the dashboard shows a tag as written, a metric unrounded)
RATIO_TAG = "plnexp.ratio"


def _json(value):
    """``value`` as verdict.json holds it: a result's fields (not ``extra``), a number that is not
    finite as null, a tuple as a list."""
    if is_dataclass(value):
        return {f.name: _json(getattr(value, f.name)) for f in fields(value) if f.compare}
    if isinstance(value, (tuple, list)):
        return [_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _from_json(cls, d: dict):
    """The result of type ``cls`` that :func:`_json` wrote as ``d``: a null number is NaN, but an
    interval's null end unbounded (``low`` -inf, ``high`` inf: too few rounds for an interval); a
    field ``d`` lacks (a file older than it) takes its default."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in fields(cls):
        if f.name not in d or not f.compare:
            continue
        v, kind = d[f.name], hints[f.name]
        if kind is float:
            v = {"low": -math.inf, "high": math.inf}.get(f.name, math.nan) if v is None else float(v)
        elif kind is int:
            v = int(v or 0)
        elif typing.get_origin(kind) is tuple:
            (item, _) = typing.get_args(kind)
            v = tuple(_from_json(item, x) if is_dataclass(item) else x for x in v)
        values[f.name] = v
    return cls(**values)


@dataclass(frozen=True)
class StrategyResult:
    strategy: str
    runs: tuple[str, ...]
    fingerprint: str
    ms_per_iter: float  # the median over the kept rounds of its own ms/iter
    ratio: float
    low: float
    high: float
    verdict: str
    rounds: int  # the kept rounds its ratio rests on (fewer than the group's once it sat out: settled)
    dropped: int
    cpu_ms_per_iter: float = math.nan  # the median over the kept rounds of its process CPU time per iteration

    def metrics(self) -> dict[str, float]:
        return {
            "round_ms_per_iter": self.ms_per_iter,
            "round_cpu_ms_per_iter": self.cpu_ms_per_iter,
            "paired_ratio": self.ratio,
            "paired_ratio_lo": self.low,
            "paired_ratio_hi": self.high,
            "rounds_used": float(self.rounds),
            "rounds_dropped": float(self.dropped),
            # the study view's order (plnexp.store.writes.sweep_view): the reference first, then by ratio
            "study_order": 0.0 if self.verdict == REFERENCE else self.ratio,
        }


@dataclass(frozen=True)
class ProgramResult:
    names: tuple[str, ...]
    fingerprint: str
    ratio: float
    low: float
    high: float
    verdict: str

    @property
    def label(self) -> str:
        return program_label(self.names)

    def ratio_text(self) -> str:
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            return f"{self.ratio:.2f}× [too few rounds for an interval]"
        return f"{self.ratio:.2f}× [{self.low:.2f}–{self.high:.2f}]"


@dataclass(frozen=True)
class GroupVerdict:
    label: str
    reference: str
    rounds: int  # kept
    dropped: int
    min_effect: float
    confidence: float
    seconds: float
    strategies: tuple[StrategyResult, ...]
    programs: tuple[ProgramResult, ...]
    dropped_why: tuple[str, ...] = ()
    note: str = ""  # e.g. too few clean rounds
    extra: dict = field(default_factory=dict, compare=False)
    budget_s: float = math.nan  # report.rounds_budget_s the rounds ran under (NaN: a file older than it)
    max_rounds: int = 0  # the rounds' cap (report.rounds, at least paired.robust_rounds); 0: not known

    def run_tags(self, s: StrategyResult) -> dict[str, str]:
        return {VERDICT_TAG: s.verdict, REFERENCE_TAG: self.reference, GROUP_TAG: self.label, RATIO_TAG: ratio_text(s)}

    def of(self, verdict: str) -> list[ProgramResult]:
        return [p for p in self.programs if p.verdict == verdict]

    def fastest(self) -> str:
        """The program named fastest (its label), or "": the one whose interval lies below every other
        program's by the minimum effect at least (the reference's interval is its ratio, 1); none
        where two are tied or an interval is unbounded (too few rounds)."""
        ranked = sorted(self.programs, key=lambda p: p.ratio)
        if len(ranked) < 2 or not all(math.isfinite(p.low) and math.isfinite(p.high) for p in ranked):
            return ""
        best, nxt = ranked[0], ranked[1]
        return best.label if nxt.low >= best.high * self.min_effect else ""

    def headline(self) -> str:
        """One line in plain words: the programs tied with the reference's (and how closely), then
        those faster, slower and unresolved with their paired ratio and interval; then what it rests
        on (``oaks_x100 (11600×114), float32, cpu: scan = scan_namedtuple (one program), fori_loop
        tied within ±4%; slower: jit_per_function 1.90× [1.81–2.04], eager 5.60× [5.21–6.02]
        (paired with scan over 8 rounds, 1 dropped; minimum effect 1.10×)``)."""
        ref = [p for p in self.programs if p.verdict == REFERENCE]
        tied = self.of("tied")
        parts = []
        if tied:
            worst = max(max(p.high - 1, 1 - p.low) for p in tied)
            parts.append(f"{', '.join(p.label for p in ref + tied)} tied within ±{100 * worst:.0f}%")
        else:
            parts.append(f"{', '.join(p.label for p in ref)}: the reference")
        for word in ("faster", "slower", "unresolved"):
            progs = sorted(self.of(word), key=lambda p: p.ratio)
            if progs:
                parts.append(f"{word}: " + ", ".join(f"{' = '.join(p.names)} {p.ratio_text()}" for p in progs))
        basis = f"paired with {self.reference} over {self.rounds} rounds"
        basis += f", {self.dropped} dropped" if self.dropped else ""
        basis += f"; minimum effect {self.min_effect:.2f}×"
        note = f"; {self.note}" if self.note else ""
        return f"{self.label}: {'; '.join(parts)} ({basis}){note}"


def program_label(names: tuple[str, ...]) -> str:
    """``scan``, or ``scan = scan_namedtuple (one program)``: strategies whose compiled programs are one."""
    return " = ".join(names) + (" (one program)" if len(names) > 1 else "")


def ratio_text(s: StrategyResult) -> str:
    """``0.918× [0.81–1.70]`` (time ÷ the reference's, its interval), ``1 (the reference)``, or
    ``0.918× [unbounded]`` (too few rounds); "-" without a ratio."""
    if s.verdict == REFERENCE:
        return "1 (the reference)"
    if not math.isfinite(s.ratio):
        return "-"
    if not (math.isfinite(s.low) and math.isfinite(s.high)):
        return f"{s.ratio:.3f}× [unbounded]"
    return f"{s.ratio:.3f}× [{s.low:.2f}–{s.high:.2f}]"


def dumps(groups: list[GroupVerdict]) -> str:
    out = [{**_json(g), "seconds": round(g.seconds, 3)} for g in groups]
    return json.dumps({"schema": SCHEMA, "groups": out}, indent=1, ensure_ascii=False)


def loads(text: str) -> list[GroupVerdict]:
    """``verdict.json``'s groups; a ValueError naming the schema for a file of another schema."""
    d = json.loads(text)
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        got = d.get("schema") if isinstance(d, dict) else None
        raise ValueError(f"verdict.json: schema {got!r}: allowed is {SCHEMA}")
    return [_from_json(GroupVerdict, g) for g in d["groups"]]
