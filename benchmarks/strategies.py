"""Benchmark every JIT strategy of plnexp on one fit, all measured in the same process.

Default: oaks x100 (n=11600, p=114), float32, full model, radam_clip, 1000 iterations, every
strategy in ``plnexp.STRATEGIES``. Each fit goes through ``plnexp.fit(..., timed=True)``, i.e.
``plnexp.timing.measure``: cold first call, cold AOT compile, then ``--repeats`` steady runs after
``--warmup`` (median reported). Printed per strategy:

- compile_s      AOT lower+compile (summed over functions for jit_per_function; 0 for eager)
- first_call_s   cold plain call: trace + compile + run, what a naive user times
- run_s          steady-state wall time of the whole fit (median of repeats)
- ms_per_iter    run_s / iterations run
- x_scan         ms_per_iter / scan's ms_per_iter

eager dispatches op by op and is slow, so it runs ``--eager-n-iter`` iterations (default 20) and
its run_s is also shown scaled to the full iteration count (marked ``*``): per-iteration cost is
flat for eager, so the scaling is linear. while_loop runs with ``tol=0`` by default (never stops
early) so that it does the same work as the others; pass ``--while-tol`` to change that.

    .venv/bin/python benchmarks/strategies.py                     # the full run (minutes)
    .venv/bin/python benchmarks/strategies.py --n-iter 100        # a quick check
    .venv/bin/python benchmarks/strategies.py --strategies scan,fori_loop --repeats 5 --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import plnexp  # first: sets the XLA_FLAGS fix before JAX starts its backend

import jax  # noqa: E402
import jaxlib  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-iter", type=int, default=1000, help="iterations per fit (default 1000)")
    ap.add_argument("--eager-n-iter", type=int, default=20,
                    help="iterations for eager, capped at --n-iter (default 20); run_s is also scaled")
    ap.add_argument("--repeats", type=int, default=3, help="steady-state runs per strategy, median kept")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs before the repeats")
    ap.add_argument("--strategies", default=",".join(plnexp.STRATEGIES),
                    help="comma-separated subset of: " + ", ".join(plnexp.STRATEGIES))
    ap.add_argument("--replication", type=int, default=100, help="oaks row replication (default 100)")
    ap.add_argument("--model", default="full", choices=["full", "profiled"])
    ap.add_argument("--optimizer", default="radam_clip")
    ap.add_argument("--precision", default="float32", choices=["float32", "float64"])
    ap.add_argument("--unroll", type=int, default=8, help="scan_unrolled's unroll factor")
    ap.add_argument("--while-tol", type=float, default=0.0, help="while_loop tol (0: run all iterations)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in args.strategies if s not in plnexp.STRATEGIES]
    if unknown:
        ap.error(f"--strategies: unknown {', '.join(unknown)}; allowed: {', '.join(plnexp.STRATEGIES)}")
    if args.n_iter < 1 or args.eager_n_iter < 1 or args.repeats < 1 or args.warmup < 0:
        ap.error("--n-iter, --eager-n-iter and --repeats must be >= 1, --warmup >= 0")
    return args


def header(args, data) -> list[str]:
    return [
        f"# plnexp strategy benchmark  {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"# machine: {platform.platform()}  {platform.processor() or platform.machine()}  "
        f"cpu_count={os.cpu_count()}  python {platform.python_version()}",
        f"# jax {jax.__version__}  jaxlib {jaxlib.__version__}  backend={jax.default_backend()}  "
        f"devices={[str(d) for d in jax.devices()]}",
        f"# XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}",
        f"# data: {data.name} n={data.n} p={data.p} d={data.d}  model={args.model}  "
        f"optimizer={args.optimizer}  precision={args.precision}",
        f"# n_iter={args.n_iter} (eager: {min(args.eager_n_iter, args.n_iter)}, run_s* scaled to {args.n_iter})  "
        f"repeats={args.repeats} warmup={args.warmup}  unroll={args.unroll}  while tol={args.while_tol:g}",
    ]


def main(argv=None) -> int:
    args = parse_args(argv)
    data = plnexp.load_oaks(replication=args.replication)
    for line in header(args, data):
        print(line, flush=True)

    rows = []
    for name in args.strategies:
        n_iter = min(args.eager_n_iter, args.n_iter) if name == "eager" else args.n_iter
        t0 = time.perf_counter()
        res = plnexp.fit(data, model=args.model, optimizer=args.optimizer, n_iter=n_iter,
                         precision=args.precision, strategy=name, unroll=args.unroll, tol=args.while_tol,
                         repeats=args.repeats, warmup=args.warmup, timed=True)
        t = res.timing
        rows.append({"strategy": name, "n_iter": n_iter, "n_run": res.n_iter,
                     "compile_s": t.compile_s, "first_call_s": t.first_call_s, "run_s": t.run_s,
                     "ms_per_iter": t.ms_per_iter, "runs_s": list(t.runs_s),
                     "run_s_scaled": t.run_s * args.n_iter / res.n_iter,
                     "final_elbo": float(res.loglik), "wall_s": time.perf_counter() - t0})
        print(f"#   done {name:<17} in {rows[-1]['wall_s']:.1f} s", flush=True)

    scan = next((r["ms_per_iter"] for r in rows if r["strategy"] == "scan"), None)
    print()
    cols = f"{'strategy':<17} {'iters':>6} {'compile_s':>10} {'first_call_s':>13} {'run_s':>10} " \
           f"{'ms_per_iter':>12} {'x_scan':>8} {'final ELBO':>16}"
    print(cols)
    print("-" * len(cols))
    for r in rows:
        ratio = f"{r['ms_per_iter'] / scan:8.2f}" if scan else f"{'n/a':>8}"
        run = f"{r['run_s']:10.3f}"
        if r["n_run"] != args.n_iter:
            run = f"{r['run_s_scaled']:9.2f}*"
        r["x_scan"] = r["ms_per_iter"] / scan if scan else None
        print(f"{r['strategy']:<17} {r['n_run']:>6} {r['compile_s']:10.3f} {r['first_call_s']:13.3f} {run} "
              f"{r['ms_per_iter']:12.3f} {ratio} {r['final_elbo']:16.2f}")
    if any(r["n_run"] != args.n_iter for r in rows):
        print(f"* run_s scaled linearly to {args.n_iter} iterations from the iterations actually run "
              f"(column 'iters'); ms_per_iter is measured, not scaled. The final ELBO of a shorter run "
              f"is not comparable.")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"header": header(args, data), "rows": rows}, fh, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
