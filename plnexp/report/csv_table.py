"""A sweep's ``report.csv`` (:mod:`plnexp.report.summary` writes it): every figure of every run, one row
per run, each group's runs fastest first as its verdict ranks them (:mod:`plnexp.report.speed`). Its
columns (:func:`columns`: header, csv name, cell function) and the table with full-precision numbers
(:func:`csv_text`), then what XLA said of each run's program.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..jobs import ranking
from ..jobs.tags import VERDICT_TAG
from ..measure.metrics import REPORT, cell
from . import speed
from .entries import COMPILER, SHORT

if TYPE_CHECKING:
    from .entries import Entry, Report


# ---------------------------------------------------------------- the table
def _iqr_ms(e: Entry) -> float:
    """The width of a finished run's interval, in ms/iter (:func:`ranking.interval_ms`)."""
    if not e.ok:
        return np.nan
    lo, hi, _ = ranking.interval_ms(e)
    return hi - lo


def _iqr_cell(e: Entry) -> str:
    """The interval's width, said to be the range where fewer than 5 runs had no quartiles
    (:class:`plnexp.measure.timing.Spread`)."""
    width, runs = _iqr_ms(e), e.m("n_runs")
    if not np.isfinite(width):
        return "-"
    if np.isfinite(runs) and runs < 5:
        return f"{width:.2f} (range of {int(runs)})"
    return f"{width:.2f}"


def columns(report: Report) -> list[tuple[str, str, Callable[[Entry], object]]]:
    """(header, csv name, cell function) per column; every number of a column in one format."""
    f = lambda fmt, get: lambda e: "-" if not np.isfinite(get(e)) else fmt.format(get(e))
    cols: list[tuple[str, str, Callable[[Entry], object]]] = [
        ("strategy", "strategy", lambda e: e.label),
        ("data", "data", lambda e: e.data),
        ("n×p", "shape", lambda e: e.shape),
        ("precision", "precision", lambda e: e.precision),
        ("device", "device", lambda e: e.device),
    ]
    cols += [(SHORT.get(k, k), k, lambda e, i=i: e.extra[i]) for i, k in enumerate(report.extra_keys)]  # type: ignore[misc]  # mypy cannot infer a lambda with a default argument against Callable[[Entry], object]
    cols += [("status", "status", lambda e: e.status)]
    logged = {m.key: (m.header, m.key, lambda e, m=m: cell(m, e.m(m.key))) for m in REPORT}
    cols += [logged[k] for k in ("n_iter_run", "compile_s", "run_s", "ms_per_iter")]
    span = lambda e: ranking.interval_ms(e) if e.ok else (np.nan, np.nan, 0)
    cols += [
        (
            "ms/iter interval",
            "ms_per_iter_interval",
            lambda e: "-" if not np.isfinite(span(e)[0]) else f"{span(e)[0]:.2f}–{span(e)[1]:.2f}",
        ),
        logged["n_runs"],
        ("program", "program", lambda e: report.program(e)),
        ("ms/iter IQR", "ms_per_iter_iqr", _iqr_cell),
        ("timing", "timing", lambda e: "contended" if e.run_id in report.contended else "ok" if e.ok else "-"),
    ]
    if report.verdicts:  # the interleaved rounds: each run's paired ratio to its group's reference
        cols += [
            ("ms/iter (rounds)", "round_ms_per_iter", f("{:.2f}", lambda e: e.m("round_ms_per_iter"))),
            ("× reference", "paired_ratio", f("{:.3f}", lambda e: e.m("paired_ratio"))),
            (
                "interval",
                "paired_ratio_interval",
                lambda e: (
                    "-"
                    if not (np.isfinite(e.m("paired_ratio_lo")) and np.isfinite(e.m("paired_ratio_hi")))
                    else f"{e.m('paired_ratio_lo'):.3f}–{e.m('paired_ratio_hi'):.3f}"
                ),
            ),
            ("verdict", "verdict", lambda e: e.tags.get(VERDICT_TAG, "-")),
            ("rounds", "rounds_used", f("{:.0f}", lambda e: e.m("rounds_used"))),
        ]
    cols += [
        ("× eager", "speedup_vs_eager", f("{:.2f}", lambda e: e.speedup_eager)),
        ("× scan", "speedup_vs_scan", f("{:.2f}", lambda e: e.speedup_scan)),
        ("× floor", "x_floor", f("{:.2f}", lambda e: e.x_floor)),
        logged["final_elbo"],
    ]
    if report.common:
        cols.append(("ELBO at common length", "elbo_at_common_length", f("{:.1f}", lambda e: e.elbo_common)))
    cols.append(("max rel. diff to scan", "max_rel_diff_to_scan", f("{:.1e}", lambda e: e.vs_scan)))
    return cols


def csv_text(report: Report) -> str:
    """The table with full-precision numbers (empty cells where a value was not measured)."""
    raw: dict[str, Callable[[Entry], object]] = {
        **{m.key: (lambda e, k=m.key: e.m(k)) for m in REPORT},  # type: ignore[misc]  # mypy cannot infer a lambda with a default argument against Callable[[Entry], object]
        "speedup_vs_eager": lambda e: e.speedup_eager,
        "speedup_vs_scan": lambda e: e.speedup_scan,
        "x_floor": lambda e: e.x_floor,
        "elbo_at_common_length": lambda e: e.elbo_common,
        "max_rel_diff_to_scan": lambda e: e.vs_scan,
        "ms_per_iter_iqr": _iqr_ms,
        "shape": lambda e: f"{e.n}x{e.p}" if e.n else "",
        # the verdict's figures, as the tables rank by them (plnexp.report.speed)
        "round_ms_per_iter": lambda e: speed.of(report, e).ms_per_iter if report.verdicts else np.nan,
        "paired_ratio": lambda e: speed.of(report, e).ratio if report.verdicts else np.nan,
    }
    cols = columns(report)
    # then what XLA said of the run's program (the compiler table's, per run; empty where not logged)
    compiler: dict[str, Callable[[Entry], object]] = {
        **{k: (lambda e, k=k: e.m(k)) for k in COMPILER if k != "compile_s"},  # type: ignore[misc]  # as above
        "bytes_x_floor": lambda e: e.bytes_x_floor,
    }
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["run_id", *(name for _, name, _ in cols), *compiler])
    for e in speed.ordered(report):  # each group fastest first, as its verdict ranks it
        row: list[object] = [e.run_id]
        values = [raw[name](e) if name in raw else get(e) for _, name, get in cols] + [g(e) for g in compiler.values()]
        for v in values:
            row.append("" if isinstance(v, float) and not np.isfinite(v) else repr(v) if isinstance(v, float) else v)
        w.writerow(row)
    return out.getvalue()
