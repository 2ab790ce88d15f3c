"""Every JIT strategy of plnexp against the tutorial it corrects and against this machine's floor,
all measured side by side in one run.

Default workload W1 (the tutorial's): oaks x100 (n=11600, p=114), float32, full model,
radam_clip, 1000 iterations. Printed, in this order:

1. **The floor** of this machine, measured now by ``plnexp.measure.floor`` (the one definition, which every
   sweep's job logs too): an iteration must stream about 14 n x p arrays (read Y, O, M, S and the
   optimizer's two moments of each; write M, S and the moments) and do two n x p x p products (M
   Omega for the gradient, M'M for Sigma): ``floor = 14 n p bytes / bandwidth + 2 dot``, bandwidth
   measured in place (output buffer = input buffer, as in a loop) over a buffer the size of the
   fit's working set (8 n x p arrays, rounded up to a power of two, 1 to 256 MiB). One fused ``exp``
   pass over an n x p array is printed beside it because transcendentals, not bytes, bound the
   elementwise work on some CPUs.
2. **The tutorial's level-2 scan** (``benchmarks/tutorial.py``, defects included), three ways:
   in a plain process (no plnexp import: its users' setting), and in this process with SciPy's
   OpenBLAS at its default thread count and at one thread (what ``plnexp.system.runtime.configure()`` sets).
3. **Each strategy** through ``plnexp.fit(..., timed=True)``: AOT compile apart, then the median
   of ``--repeats`` steady runs after ``--warmup``, each ended by ``block_until_ready``; the
   ``scan`` row is repeated with ``gradient=autodiff`` (the step before the analytic gradient).
   ``--fused-isa all`` (or a list of avx512, avx2, baseline) runs ``scan_fused`` once per code path
   of its kernel, forced through ``PLNEXP_FUSED_ISA`` (rows ``scan_fused [avx2]``, ...; a path this
   CPU lacks is skipped saying so), with ``scan`` beside them.

Ratios: ``x_scan`` = scan's ms/iter in this run / the row's (higher is faster); ``x_tutorial`` = the
tutorial's steady ms/iter (plain process) / the row's; ``x_tut_1t`` = the same against the tutorial
at one LAPACK thread; ``x_floor`` = the row's ms/iter / floor.
``curve_rdiff`` = max |ELBO_row - ELBO_scan| / |ELBO_scan| over the iterations both ran.

    .venv/bin/python benchmarks/strategies.py                         # W1, every strategy (minutes)
    .venv/bin/python benchmarks/strategies.py --strategies scan,while_loop --n-iter 200
    .venv/bin/python benchmarks/strategies.py --no-tutorial --json out.json
    .venv/bin/python benchmarks/strategies.py --strategies scan --fused-isa all --no-tutorial --no-autodiff
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import plnexp
import jax
from _header import machine_header  # benchmarks/, on sys.path as the script's folder
import numpy as np

from plnexp.measure import floor as machine_floor
from plnexp.system import runtime
from plnexp.core.precision import PRECISIONS
from plnexp.fitting.spec import model_named
from plnexp.strategies import fused

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import tutorial  # noqa: E402 - benchmarks/tutorial.py, on sys.path as the script's folder


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n-iter", type=int, default=1000, help="iterations per fit (default 1000)")
    ap.add_argument(
        "--eager-n-iter",
        type=int,
        default=20,
        help="iterations for eager (default 20; per-iteration cost is flat, ms/iter compares)",
    )
    ap.add_argument("--repeats", type=int, default=3, help="steady runs per row, median kept (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs before the repeats (default 1)")
    ap.add_argument(
        "--first-call",
        action="store_true",
        help="also time a cold plain call per row (trace + compile + run; one more compile and run)",
    )
    ap.add_argument(
        "--strategies",
        default=",".join(plnexp.STRATEGIES),
        help="comma-separated subset of: " + ", ".join(plnexp.STRATEGIES),
    )
    ap.add_argument("--replication", type=int, default=100, help="oaks row replication (default 100)")
    ap.add_argument("--model", default="full", choices=["full", "profiled"])
    ap.add_argument("--optimizer", default="radam_clip")
    ap.add_argument("--precision", default="float32", choices=["float32", "float64"])
    ap.add_argument("--unroll", type=int, default=8, help="scan_unrolled's unroll factor")
    ap.add_argument("--while-tol", type=float, default=0.0, help="while_loop tol (0: run all iterations)")
    ap.add_argument("--no-autodiff", action="store_true", help="skip the scan row with gradient=autodiff")
    ap.add_argument("--no-tutorial", action="store_true", help="skip the tutorial's rows")
    ap.add_argument(
        "--fused-isa",
        default="",
        metavar="PATHS",
        help="run scan_fused once per code path of its kernel: all, or a comma-separated subset of "
        + ", ".join(fused.ISAS)
        + " (adds scan and scan_fused to --strategies)",
    )
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in args.strategies if s not in plnexp.STRATEGIES]
    if unknown:
        ap.error(f"--strategies: unknown {', '.join(unknown)}; allowed: {', '.join(plnexp.STRATEGIES)}")
    paths = [s.strip() for s in args.fused_isa.split(",") if s.strip()]
    args.fused_isa = list(fused.ISAS) if paths == ["all"] else paths
    unknown = [s for s in args.fused_isa if s not in fused.ISAS]
    if unknown:
        ap.error(f"--fused-isa: unknown {', '.join(unknown)}; allowed: all, {', '.join(fused.ISAS)}")
    if args.fused_isa:  # scan_fused's rows, per path, and scan, their yardstick
        args.strategies = ["scan"] * ("scan" not in args.strategies) + args.strategies
        args.strategies += ["scan_fused"] * ("scan_fused" not in args.strategies)
    if args.n_iter < 1 or args.eager_n_iter < 1 or args.repeats < 1 or args.warmup < 0:
        ap.error("--n-iter, --eager-n-iter and --repeats must be >= 1, --warmup >= 0")
    return args


def header(args, data) -> list[str]:
    return machine_header("plnexp strategy benchmark") + [
        f"# SciPy OpenBLAS threads={runtime.lapack_threads()}",
        f"# data: {data.name} n={data.n} p={data.p} d={data.d}  model={args.model}  "
        f"optimizer={args.optimizer}  precision={args.precision}",
        f"# n_iter={args.n_iter} (eager: {min(args.eager_n_iter, args.n_iter)})  repeats={args.repeats} "
        f"warmup={args.warmup}  unroll={args.unroll}  while tol={args.while_tol:g}",
    ]


def measure_floor(data, model: str, dtype) -> dict:
    """This machine's primitives at the fit's shapes, measured now (:mod:`plnexp.measure.floor`, uncached): copy
    bandwidth, the model's product (n x p x p for full and profiled), its p x p factorization, and an exp
    pass printed beside them."""
    it = machine_floor.iteration(model_named(model), data)
    f = machine_floor.measure(it, dtype)
    n, p = data.n, data.p
    return {
        "counts": it.describe(),
        "bandwidth_GBps": f.copy_GBps,
        "copy_MiB": f.copy_bytes / 2**20,
        "exp_pass_ms": machine_floor.measure_exp(n, p, dtype),
        "dot_ms": f.dot_ms,
        "dot_GFLOPps": f.dot_GFLOPps,
        "factor_ms": f.factor_ms,
        "stream_ms": f.stream_ms,
        "floor_ms": f.ms_per_iter,
    }


def tutorial_in_process(data, n_iter: int, repeats: int, lapack_threads: int) -> dict:
    previous = runtime.lapack_threads()
    runtime.set_lapack_threads(lapack_threads)
    try:
        fit, fit_args = tutorial.make_fit(data.Y, data.O, data.X, n_iter)
        t0 = time.perf_counter()
        compiled = jax.jit(fit).lower(*fit_args).compile()
        compile_s = time.perf_counter() - t0
        jax.block_until_ready(compiled(*fit_args))  # warm-up
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(*fit_args))
            runs.append(time.perf_counter() - t0)
    finally:
        runtime.set_lapack_threads(previous[0] if previous else 1)
    return {"compile_s": compile_s, "runs_s": runs}


def tutorial_plain_process(args) -> dict:
    """The tutorial in a fresh interpreter that never imports plnexp (its users' setting)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [
            sys.executable,
            str(HERE / "tutorial.py"),
            "--n-iter",
            str(args.n_iter),
            "--replication",
            str(args.replication),
            "--repeats",
            str(args.repeats),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def fit_row(data, args, name: str, gradient: str = "analytic", label: str | None = None) -> dict:
    n_iter = min(args.eager_n_iter, args.n_iter) if name == "eager" else args.n_iter
    t0 = time.perf_counter()
    res = plnexp.fit(
        data,
        model=args.model,
        optimizer=args.optimizer,
        n_iter=n_iter,
        init="seed",  # W1, the tutorial's workload (plnexp.fit's default start is the data's since #63)
        precision=args.precision,
        strategy=name,
        unroll=args.unroll,
        tol=args.while_tol,
        gradient=gradient,
        repeats=args.repeats,
        warmup=args.warmup,
        first_call=args.first_call,
        compile_cache=False,
        timed=True,
    )  # cold compiles, as the study times them
    t = res.timing
    label = label or (name if gradient == "analytic" else f"{name} ({gradient})")
    first = f", cold first call {t.first_call_s:.2f} s" if args.first_call else ""
    print(f"#   done {label:<20} in {time.perf_counter() - t0:.1f} s{first}", flush=True)
    return {
        "row": label,
        "strategy": name,
        "gradient": gradient,
        "n_run": res.n_iter,
        "compile_s": t.compile_s,
        "run_s": t.run_s,
        "ms_per_iter": t.ms_per_iter,
        **({"first_call_s": t.first_call_s} if args.first_call else {}),
        "runs_s": list(t.runs_s),
        "final_elbo": float(res.loglik),
        "curve": res.elbo[: res.n_iter],
    }


def fused_rows(data, args) -> list[dict]:
    """scan_fused once per code path of ``--fused-isa`` that this CPU runs, forced through
    ``$PLNEXP_FUSED_ISA`` (restored after); the programs cached by plnexp are dropped around each, so
    that each row runs its own path."""
    runs = fused.cpu_isas()
    rows = []
    before = os.environ.get(fused.ISA_ENV)
    try:
        for path in args.fused_isa:
            if path not in runs:
                print(f"#   skipped scan_fused [{path}]: this CPU runs the code paths {', '.join(runs)}", flush=True)
                continue
            os.environ[fused.ISA_ENV] = path  # strategies.build keeps a program per forced path
            rows.append({**fit_row(data, args, "scan_fused", label=f"scan_fused [{path}]"), "fused_isa": path})
    finally:
        if before is None:
            os.environ.pop(fused.ISA_ENV, None)
        else:
            os.environ[fused.ISA_ENV] = before
    return rows


def main(argv=None) -> int:
    runtime.configure()  # first: XLA_FLAGS and SciPy's OpenBLAS threads, before JAX starts its backend
    args = parse_args(argv)
    data = plnexp.load_oaks(replication=args.replication)
    lines = header(args, data)
    if "scan_fused" in args.strategies:
        lines.append(f"# scan_fused: its kernel's code paths this CPU runs: {', '.join(fused.cpu_isas())}")
    for line in lines:
        print(line, flush=True)
    precision = PRECISIONS[args.precision]
    with jax.enable_x64(precision.x64):
        floor = measure_floor(data, args.model, precision.dtype)
    print(
        f"# floor: copy {floor['bandwidth_GBps']:.1f} GB/s ({floor['copy_MiB']:.0f} MiB in place) -> "
        f"arrays {floor['stream_ms']:.2f} ms; dot n x p x p {floor['dot_ms']:.2f} ms ({floor['dot_GFLOPps']:.0f} GFLOP/s); "
        f"Cholesky + inverse {floor['factor_ms']:.3f} ms; exp pass {floor['exp_pass_ms']:.2f} ms; floor ({floor['counts']}) = {floor['floor_ms']:.2f} ms/iter",
        flush=True,
    )

    rows = []
    if not args.no_tutorial:
        plain = tutorial_plain_process(args)
        rows.append({"row": "tutorial (plain process)", **plain})
        print("#   done tutorial in a plain process", flush=True)
        for threads, label in (
            (os.cpu_count() or 1, "tutorial (OpenBLAS default)"),
            (1, "tutorial (OpenBLAS 1 thread)"),
        ):
            rows.append({"row": label, **tutorial_in_process(data, args.n_iter, args.repeats, threads)})
            print(f"#   done {label}", flush=True)
        for r in rows:
            r.update(strategy="tutorial", n_run=args.n_iter, run_s=statistics.median(r["runs_s"]))
            r["ms_per_iter"] = 1e3 * r["run_s"] / args.n_iter
    for name in args.strategies:
        if name == "scan_fused" and args.fused_isa:
            rows.extend(fused_rows(data, args))
            continue
        rows.append(fit_row(data, args, name))
        if name == "scan" and not args.no_autodiff:
            rows.append(fit_row(data, args, "scan", "autodiff"))

    tut = next((r["ms_per_iter"] for r in rows if r["row"] == "tutorial (plain process)"), None)
    tut1 = next((r["ms_per_iter"] for r in rows if r["row"] == "tutorial (OpenBLAS 1 thread)"), None)
    scan = next((r for r in rows if r["row"] == "scan"), None)
    cols = (
        f"{'row':<30} {'iters':>6} {'compile_s':>10} {'run_s':>9} {'ms/iter':>9} {'x_scan':>7} {'x_tutorial':>11} "
        f"{'x_tut_1t':>9} {'x_floor':>8} {'curve_rdiff':>12}"
    )
    print()
    print(cols)
    print("-" * len(cols))
    for r in rows:
        ms = r["ms_per_iter"]
        r["x_scan"] = scan["ms_per_iter"] / ms if scan else None
        r["x_tutorial"] = tut / ms if tut else None
        r["x_tut_1t"] = tut1 / ms if tut1 else None
        r["x_floor"] = ms / floor["floor_ms"]
        if "curve" in r and scan is not None:
            k = min(len(r["curve"]), len(scan["curve"]))
            ref = scan["curve"][:k]
            r["curve_rdiff"] = float(np.max(np.abs(r["curve"][:k] - ref) / np.abs(ref)))
        # a value not measured is "-", right-aligned in its column like the numbers
        f = lambda v, spec: format(v, spec) if v is not None else format("-", spec.split(".")[0])
        print(
            f"{r['row']:<30} {r['n_run']:>6} {r['compile_s']:>10.3f} {r['run_s']:>9.3f} {ms:>9.3f} "
            f"{f(r['x_scan'], '>7.2f')} {f(r['x_tutorial'], '>11.2f')} {f(r['x_tut_1t'], '>9.2f')} {r['x_floor']:>8.2f} "
            f"{f(r.get('curve_rdiff'), '>12.2e')}"
        )
    print(
        "x_scan, x_tutorial, x_tut_1t: scan's, the tutorial's ms/iter over the row's (higher is faster); "
        "x_floor: the row's "
        "ms/iter over the floor (1 = at the floor). eager runs fewer iterations: its run_s is not comparable, "
        "its ms/iter is. In float32 with radam_clip, curve_rdiff of a different fusion grows with iterations "
        "(sign-driven clipped steps amplify rounding; see tests/test_strategies.py)."
    )
    if args.json:
        for r in rows:
            r.pop("curve", None)
        with open(args.json, "w") as fh:
            json.dump({"header": lines, "floor": floor, "rows": rows}, fh, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
