"""``python -m plnexp compare RUN_A RUN_B [tracking_uri=STORE]``: how two runs' compiled programs differ.

Read from what each run logged, nothing compiled again: its optimized HLO (the ``program.hlo.txt``
artifact, or ``program.hlo.txt.gz``), its metrics and its ``hlo_fingerprint`` tag. One short table,
A beside B and their ratio B/A:

- the instructions of the HLO and its fusions (counted as :mod:`plnexp.measure.xla_stats` says), the
  functions (``jit_per_function`` has three) and the loops (trip count, instructions of the body);
- XLA's flops and bytes of one iteration, the peak bytes, the compile time and its three parts;
- the opcodes whose counts differ (fusions are opcode ``fusion``); the totals above;
- whether the two are one program (same fingerprint).

The store is ``tracking_uri=STORE``, else ``$MLFLOW_TRACKING_URI``, else the local one under the
outputs folder. A malformed or unknown run id, or a run without the HLO artifact (``eager``, the
PyTorch strategies, a failed run, a run logged before plnexp logged programs), is one line naming it;
exit 2.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .. import store
from ..jobs.tags import GROUP_TAG, REFERENCE_TAG, VERDICT_TAG
from ..measure import xla_stats
from ..jobs.config import ConfigError
from ..measure.metrics import PROGRAM, Metric
from ..store.records import RunRecord
from ..system.commandline import Parser, UsageError, fail
from .entries import num
from .table import aligned

USAGE = "usage: python -m plnexp compare RUN_A RUN_B [tracking_uri=STORE]"
RUN_ID = re.compile(r"^[0-9a-f]{32}$")
HLO = store.writes.HLO_ARTIFACT
HELP = f"""{USAGE}

How the compiled programs of two logged runs differ, from their logged optimized HLO ({HLO}) and
metrics (nothing is compiled again): instructions and fusions, functions and loops, flops and bytes
per iteration, peak bytes, compile time in parts (trace, lower, XLA), the opcodes whose counts
differ, and whether they are one program (hlo_fingerprint). The store: tracking_uri=STORE, else
MLFLOW_TRACKING_URI, else the local one. Exit 0; 2 for a bad or unknown run id, or a run without
{HLO} (eager, torch, a failed or older run)."""


@dataclass(frozen=True)
class Side:
    """One run as compare reads it: its record and its program's stats, per function."""

    run: RunRecord
    functions: dict[str, xla_stats.Stats]

    @property
    def total(self) -> xla_stats.Stats:
        first, *rest = self.functions.values()
        return sum(rest, first)

    @property
    def strategy(self) -> str:
        name = self.run.params.get("strategy.name", "?")
        options = [f"{k.split('.', 1)[1]}={v}" for k, v in sorted(self.run.params.items()) if k.startswith("strategy.")]
        options = [o for o in options if not o.startswith("name=")]
        return f"{name} ({', '.join(options)})" if options else name


def parse(args: list[str]) -> tuple[str, str, str | None] | None:
    """(RUN_A, RUN_B, the ``tracking_uri=`` given or None); None once ``--help`` is printed;
    UsageError or ConfigError (one line) otherwise."""
    p = Parser(USAGE.removeprefix("usage: "), HELP.split("\n\n", 1)[1], unknown="unknown option {arg}")
    p.add_argument("runs", nargs="*", metavar="RUN_A RUN_B", help="the two runs (then tracking_uri=STORE)")
    ns = p.parse(args)
    if ns is None:
        return None
    rest = [a for a in ns.runs if not a.startswith("tracking_uri=")]
    if len(rest) != 2:
        p.error(f"{len(rest)} run id(s) given, 2 needed")
    for rid in rest:
        if not RUN_ID.match(rid):
            raise ConfigError(
                f"run id {rid!r}: malformed; allowed values are MLflow run ids (32 hexadecimal characters)"
            )
    return rest[0], rest[1], store_of(ns.runs)


def store_of(args: list[str]) -> str | None:
    """The ``tracking_uri=`` of a compare command line, if any (the last one)."""
    given = [a.split("=", 1)[1] for a in args if a.startswith("tracking_uri=")]
    return given[-1] if given else None


def side(uri: str, run_id: str) -> Side:
    """Run ``run_id`` of the store, read back; ConfigError (one line) if it is missing or has no HLO."""
    db = store.open(uri)
    run = db.run(run_id)
    if run is None or run.deleted:
        raise ConfigError(
            f"run {run_id}: not found in the store {uri}; allowed values are ids of runs in this store "
            "(tracking_uri=, MLFLOW_TRACKING_URI or PLNEXP_OUTPUTS selects another)"
        )
    name = run.name
    text = db.artifact(run_id, HLO)  # program.hlo.txt, or its .gz; None without one
    if not text:
        raise ConfigError(
            f"run {run_id} ({name}): has no {HLO} artifact, so no compiled XLA program to compare "
            "(eager and the PyTorch strategies have none, nor a failed run or one logged by an older plnexp); "
            "allowed values are runs of a compiled JAX strategy"
        )
    try:
        functions = {fn: xla_stats.stats(t) for fn, t in xla_stats.split_functions(text).items()}
    except ValueError as e:
        raise ConfigError(f"run {run_id} ({name}): its {HLO} does not read as HLO ({e})") from None
    return Side(run, functions)


# ---------------------------------------------------------------- the table
def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or a == 0:
        return ""
    return f"{b / a:.2f}"


def _loops(s: xla_stats.Stats) -> list[str]:
    cells = []
    for loop in s.loops:
        trips = f"{loop.trip_count} trips" if loop.trip_count is not None else "? trips (a condition)"
        nested = f", depth {loop.depth}" if loop.depth else ""
        cells.append(f"{trips}, body {loop.body_instructions}{nested}")
    return cells or ["none"]


def rows(a: Side, b: Side) -> list[tuple[str, str, str, str]]:
    """The table's rows: (what, A, B, B/A)."""
    ta, tb = a.total, b.total
    out: list[tuple[str, str, str, str]] = [("strategy", a.strategy, b.strategy, "")]
    names_a, names_b = [n or "1" for n in a.functions], [n or "1" for n in b.functions]
    if len(names_a) > 1 or len(names_b) > 1:
        out.append(("functions", ", ".join(names_a), ", ".join(names_b), ""))
    out.append(
        ("HLO instructions", str(ta.instructions), str(tb.instructions), _ratio(ta.instructions, tb.instructions))
    )
    out.append(("fusions", str(ta.fusions), str(tb.fusions), _ratio(ta.fusions, tb.fusions)))
    la, lb = _loops(ta), _loops(tb)
    for i in range(max(len(la), len(lb))):
        label = "loops" if i == 0 else ""
        out.append((label, la[i] if i < len(la) else "", lb[i] if i < len(lb) else "", ""))
    by_key: dict[str, Metric] = {m.key: m for m in PROGRAM}
    for key in ("xla_flops_per_iter", "xla_bytes_per_iter", "peak_bytes"):
        m = by_key[key]
        va, vb = a.run.metrics.get(key), b.run.metrics.get(key)
        out.append((m.header, num(va, m.fmt), num(vb, m.fmt), _ratio(va, vb)))
    for key in ("compile_s", "trace_s", "lower_s", "xla_compile_s"):  # compile_s, then its parts
        label = f"  {by_key[key].header}" if key in by_key else "compile s"
        va, vb = a.run.metrics.get(key), b.run.metrics.get(key)
        out.append((label, num(va, "{:.3f}"), num(vb, "{:.3f}"), _ratio(va, vb)))
    # their sweep's verdict (plnexp.jobs.verdicts), where both were timed in one group's rounds
    ref_a, ref_b = a.run.tags.get(REFERENCE_TAG), b.run.tags.get(REFERENCE_TAG)
    if ref_a and ref_a == ref_b and a.run.tags.get(GROUP_TAG) == b.run.tags.get(GROUP_TAG):
        va, vb = a.run.metrics.get("paired_ratio"), b.run.metrics.get("paired_ratio")
        out.append((f"× {ref_a} (rounds)", num(va, "{:.3f}"), num(vb, "{:.3f}"), _ratio(va, vb)))
        out.append(("verdict", a.run.tags.get(VERDICT_TAG, "-"), b.run.tags.get(VERDICT_TAG, "-"), ""))
    return out


def opcode_rows(a: Side, b: Side) -> list[tuple[str, str, str, str]]:
    """The opcodes whose counts differ, largest difference first."""
    oa, ob = a.total.opcodes, b.total.opcodes
    differ = [op for op in set(oa) | set(ob) if oa.get(op, 0) != ob.get(op, 0)]
    differ.sort(key=lambda op: (-abs(ob.get(op, 0) - oa.get(op, 0)), op))
    return [(f"  {op}", str(oa.get(op, 0)), str(ob.get(op, 0)), _ratio(oa.get(op, 0), ob.get(op, 0))) for op in differ]


def render(a: Side, b: Side) -> str:
    """The comparison as text (see the module's doc)."""
    head = [
        f"A: run {a.run.run_id} ({a.run.name})",
        f"B: run {b.run.run_id} ({b.run.name})",
        "",
    ]
    ops = opcode_rows(a, b)
    table: list[tuple[str, str, str, str] | str] = [("", "A", "B", "B/A"), *rows(a, b)]
    if ops:
        table += [f"opcodes whose counts differ ({len(ops)} of {len(set(a.total.opcodes) | set(b.total.opcodes))}):"]
        table += ops
    else:
        table += [f"opcodes: the same counts ({len(a.total.opcodes)} opcodes)"]
    body = aligned(table)
    if a.run.fingerprint and a.run.fingerprint == b.run.fingerprint:
        verdict = f"one program: the same optimized HLO (hlo_fingerprint {a.run.fingerprint}); their timings differ by noise only"
    elif a.run.fingerprint and b.run.fingerprint:
        verdict = f"two programs: hlo_fingerprint {a.run.fingerprint} vs {b.run.fingerprint}"
    else:
        verdict = "hlo_fingerprint: not logged on both runs"
    return "\n".join([*head, *body, "", verdict])


def main(args: list[str]) -> int:
    try:
        parsed = parse(args)
        if parsed is None:  # --help: printed
            return 0
        run_a, run_b, given = parsed
        uri = store.check_existing_store(
            given, "no runs to compare (tracking_uri=, MLFLOW_TRACKING_URI or PLNEXP_OUTPUTS selects another)"
        )
        a, b = side(uri, run_a), side(uri, run_b)
    except (UsageError, ConfigError, store.StoreError) as e:
        return fail(e)
    print(render(a, b), flush=True)
    return 0
