"""A sweep's ``report.csv`` (:mod:`plnexp.report.summary` writes it): every figure of every run, one row
per run, each group's runs fastest first as its verdict ranks them (:mod:`plnexp.report.speed`). Its
columns (:func:`columns`: csv name, value function) with full-precision numbers (:func:`csv_text`),
then what XLA said of each run's program.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable

import numpy as np

from ..jobs import ranking
from ..jobs.tags import VERDICT_TAG
from ..measure.metrics import REPORT
from . import speed
from .entries import COMPILER, num, Entry, Report


def _iqr_ms(e: Entry) -> float:
    """The width of a finished run's interval, in ms/iter (:func:`ranking.interval_ms`)."""
    if not e.ok:
        return np.nan
    lo, hi, _ = ranking.interval_ms(e)
    return hi - lo


def _span(lo: float, hi: float, fmt: str) -> str:
    """``lo–hi`` in ``fmt``; "-" where either bound is not finite."""
    return f"{fmt.format(lo)}–{fmt.format(hi)}" if np.isfinite(lo) and np.isfinite(hi) else "-"


def columns(report: Report) -> list[tuple[str, Callable[[Entry], object]]]:
    """(csv name, value function) per column: a number in full precision, or the cell's text."""
    metric = lambda key: lambda e: e.m(key)
    logged = {m.key: (m.key, metric(m.key)) for m in REPORT}
    interval = lambda e: ranking.interval_ms(e) if e.ok else (np.nan, np.nan, 0)
    cols: list[tuple[str, Callable[[Entry], object]]] = [
        ("strategy", lambda e: e.label),
        ("data", lambda e: e.data),
        ("shape", lambda e: f"{e.n}x{e.p}" if e.n else ""),
        ("precision", lambda e: e.precision),
        ("device", lambda e: e.device),
    ]
    cols += [(k, lambda e, i=i: e.extra[i]) for i, k in enumerate(report.extra_keys)]  # type: ignore[misc]  # mypy cannot infer a lambda with a default argument against Callable[[Entry], object]
    cols += [("status", lambda e: e.status)]
    cols += [logged[k] for k in ("n_iter_run", "compile_s", "run_s", "ms_per_iter")]
    cols += [
        ("ms_per_iter_interval", lambda e: _span(*interval(e)[:2], "{:.2f}")),
        logged["n_runs"],
        ("program", lambda e: report.program(e)),
        ("ms_per_iter_iqr", _iqr_ms),
        ("timing", lambda e: "contended" if e.run_id in report.contended else "ok" if e.ok else "-"),
    ]
    if report.verdicts:  # the verdict's figures, as the tables rank by them (plnexp.report.speed)
        cols += [
            ("round_ms_per_iter", lambda e: speed.of(report, e).ms_per_iter),
            ("paired_ratio", lambda e: speed.of(report, e).ratio),
            ("paired_ratio_interval", lambda e: _span(e.m("paired_ratio_lo"), e.m("paired_ratio_hi"), "{:.3f}")),
            ("verdict", lambda e: e.tags.get(VERDICT_TAG, "-")),
            ("rounds_used", lambda e: num(e.m("rounds_used"), "{:.0f}")),
        ]
    cols += [
        ("speedup_vs_eager", lambda e: e.speedup_eager),
        ("speedup_vs_scan", lambda e: e.speedup_scan),
        ("x_floor", lambda e: e.x_floor),
        logged["final_elbo"],
    ]
    if report.common:
        cols.append(("elbo_at_common_length", lambda e: e.elbo_common))
    cols.append(("max_rel_diff_to_scan", lambda e: e.vs_scan))
    # then what XLA said of the run's program (the compiler table's, per run; empty where not logged)
    cols += [(k, metric(k)) for k in COMPILER if k != "compile_s"]
    return cols + [("bytes_x_floor", lambda e: e.bytes_x_floor)]


def csv_text(report: Report) -> str:
    """The table with full-precision numbers (empty cells where a value was not measured)."""
    cols = columns(report)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["run_id", *(name for name, _ in cols)])
    for e in speed.ordered(report):  # each group fastest first, as its verdict ranks it
        values = [get(e) for _, get in cols]
        w.writerow(
            [e.run_id]
            + [
                "" if isinstance(v, float) and not np.isfinite(v) else repr(v) if isinstance(v, float) else v
                for v in values
            ]
        )
    return out.getvalue()
