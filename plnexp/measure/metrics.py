"""The metrics a job's run logs, declared once: key, headers, number format, what they mean.

The terminal's summary table (:func:`plnexp.experiment.runner.summary_table`), the report's table and CSV
(:mod:`plnexp.report.summary`) take their timing and result columns from :data:`COLUMNS`, in this order. A
leaf module.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    key: str  # the MLflow metric
    short: str  # the terminal's column header
    header: str  # the report's column header
    fmt: str  # one format for every number of a column
    doc: str
    in_terminal: bool = True
    in_report: bool = True


# a metric every job logs that neither table shows (the report's own views and ``compare`` read them)
_logged = functools.partial(Metric, in_terminal=False, in_report=False)


COLUMNS: tuple[Metric, ...] = (
    Metric("n_iter_run", "iter", "iters", "{:.0f}", "iterations run (while_loop may stop early)"),
    Metric("compile_s", "compile_s", "compile s", "{:.3f}", "ahead-of-time compile: trace + lower + XLA"),
    Metric(
        "compile_warm_s",
        "cached_s",
        "cached compile s",
        "{:.3f}",
        "a second compile served by JAX's persistent cache (compile_cache=true)",
        in_report=False,
    ),
    Metric(
        "first_call_s",
        "first_s",
        "first call s",
        "{:.3f}",
        "a cold plain call: trace + compile + run (first_call=true)",
        in_report=False,
    ),
    Metric("run_s", "run_s", "run s", "{:.3f}", "steady run of the compiled program (median of the timed runs)"),
    Metric(
        "run_cpu_s",
        "cpu_s",
        "run CPU s",
        "{:.3f}",
        "the process's CPU time over a timed run, every thread's (median): how much of the machine it kept busy",
        in_terminal=False,
    ),
    Metric(
        "run_s_iqr",
        "spread_s",
        "run s spread",
        "{:.3f}",
        "interquartile range of the timed runs (their range below 5 runs)",
        in_report=False,
    ),
    Metric("n_runs", "runs", "runs", "{:.0f}", "timed runs: at least repeats, more within time_budget_s"),
    Metric("ms_per_iter", "ms/iter", "ms/iter", "{:.2f}", "run_s per iteration run, in ms"),
    Metric("final_elbo", "final ELBO", "final ELBO", "{:.1f}", "the compiled ELBO at the final state (with log y!)"),
)
# This machine's floor for the fit (plnexp.measure.floor), logged by every job from the process that ran it,
# measured before the fit; the report divides ms_per_iter by the first (its "× floor" column).
FLOOR: tuple[Metric, ...] = (
    _logged(
        "floor_ms_per_iter",
        "floor",
        "floor ms/iter",
        "{:.3f}",
        "the machine's floor for one iteration: floor_bytes_per_iter at floor_copy_GBps + the model's "
        "n x p x q products of floor_dot_ms + its p x p factorizations of floor_factor_ms (full, profiled: "
        "14 n x p arrays, 2 products, q = p, 1 factorization; pca: 2 n x p + 12 n x q arrays, 6 products; "
        "offsets one per row: one n x p array fewer)",
    ),
    _logged(
        "floor_copy_GBps",
        "copy_GBps",
        "copy GB/s",
        "{:.1f}",
        "in-place copy bandwidth over a buffer the size of the fit's working set (bytes read + written)",
    ),
    _logged(
        "floor_dot_ms",
        "dot_ms",
        "dot ms",
        "{:.3f}",
        "one n x p times p x q product (q: the model's latent width, p for full and profiled)",
    ),
    _logged(
        "floor_factor_ms",
        "factor_ms",
        "factor ms",
        "{:.3f}",
        "one p x p Cholesky factor and the inverse it gives (Sigma's, for Omega); 0 for pca, which does none",
    ),
    _logged(
        "floor_bytes_per_iter",
        "floor_bytes",
        "floor bytes/iter",
        "{:.0f}",
        "the bytes one iteration must read or write at least (the floor's streamed arrays)",
    ),
)
# compile_s in parts, and what XLA made of the program (plnexp.strategies.base.xla_metrics, counted
# as plnexp.measure.xla_stats says): logged by every job with a compiled XLA program (none for eager and the
# PyTorch strategies), shown side by side by ``python -m plnexp compare``.
PROGRAM: tuple[Metric, ...] = (
    _logged("trace_s", "trace_s", "trace s", "{:.3f}", "compile_s's tracing: jitted.trace(*args)"),
    _logged("lower_s", "lower_s", "lower s", "{:.3f}", "compile_s's lowering to StableHLO: traced.lower()"),
    _logged("xla_compile_s", "xla_s", "XLA compile s", "{:.3f}", "compile_s's XLA compilation: lowered.compile()"),
    _logged(
        "xla_instructions",
        "instr",
        "HLO instructions",
        "{:.0f}",
        "instructions of the optimized HLO's non-fusion computations, each computation once",
    ),
    _logged("xla_fusions", "fusions", "fusions", "{:.0f}", "fusion instructions among xla_instructions"),
    _logged("xla_flops_per_iter", "flops/iter", "flops/iter", "{:.4g}", "XLA's cost analysis of one iteration: flops"),
    _logged(
        "xla_bytes_per_iter",
        "bytes/iter",
        "bytes/iter",
        "{:.4g}",
        "XLA's cost analysis of one iteration: bytes accessed",
    ),
    _logged(
        "peak_bytes",
        "peak",
        "peak bytes",
        "{:.4g}",
        "argument + output + temp - alias bytes of XLA's memory analysis (the largest function's)",
    ),
)
TERMINAL = tuple(m for m in COLUMNS if m.in_terminal)
REPORT = tuple(m for m in COLUMNS if m.in_report)


def cell(metric: Metric, value: float | None) -> str:
    """The value in its column's format; "-" where not measured (NaN, missing, infinite)."""
    import math

    return metric.fmt.format(value) if value is not None and math.isfinite(value) else "-"
