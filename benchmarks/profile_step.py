"""Where one iteration of the compiled fit spends its time: a JAX profiler trace of the ``scan``
program, summed per XLA operation (fusion, dot, LAPACK call) and per iteration.

XLA:CPU runs independent operations of one program concurrently on its thread pool and splits
large fusions across threads, so the per-operation times overlap and add up to more than the
wall time; the table says which operations dominate, and the first line gives the wall time.
Each row also shows how many n x p arrays the operation writes (from the optimized HLO), the
memory traffic that a fused kernel would avoid.

    .venv/bin/python benchmarks/profile_step.py                      # W1: oaks x100, float32, full
    .venv/bin/python benchmarks/profile_step.py --gradient autodiff --top 30
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

# XLA reads XLA_FLAGS once, at its first computation: ask for per-operation trace events first.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true").strip()

import plnexp  # main() adds plnexp's own flags (plnexp.system.runtime.configure)

import jax

from plnexp.fitting import engine as fitting
from plnexp import strategies
from plnexp.core.initial_state import init_state
from plnexp.core.model import MODELS
from plnexp.core.optim import OptimizerSpec
from plnexp.core.precision import PRECISIONS


def big_outputs(hlo_text: str, n: int, p: int) -> dict[str, int]:
    """Operation name -> number of n x p arrays it writes, from the optimized HLO."""
    shape = f"[{n},{p}]"
    out = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) (fusion|dot|copy|custom-call)\(", hlo_text, re.M):
        out[m.group(1)] = m.group(2).count(shape)
    return out


def main(argv=None) -> int:
    plnexp.system.runtime.configure()  # first: XLA_FLAGS and SciPy's OpenBLAS threads, before JAX starts its backend
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-iter", type=int, default=50)
    ap.add_argument("--replication", type=int, default=100)
    ap.add_argument("--model", default="full", choices=list(MODELS))
    ap.add_argument("--optimizer", default="radam_clip")
    ap.add_argument("--gradient", default="analytic", choices=["analytic", "autodiff"])
    ap.add_argument("--precision", default="float32", choices=["float32", "float64"])
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args(argv)

    data = plnexp.load_oaks(replication=args.replication)
    precision = PRECISIONS[args.precision]
    dtype = precision.dtype
    with jax.enable_x64(precision.x64):
        problem = fitting.make_problem(MODELS[args.model], OptimizerSpec(args.optimizer), args.gradient)
        arrays = data.to_device(dtype, jax.devices("cpu")[0])
        state = problem.init(init_state(problem.model, arrays, "seed"))
        program = strategies.build(problem, args.n_iter, strategies.StrategySpec("scan"))
        compiled = program.compile(state, arrays)
        (executable,) = compiled.executables.values()  # the scan's one program, compiled once
        writes = big_outputs(executable.as_text(), data.n, data.p)
        jax.block_until_ready(compiled.run(state, arrays))  # warm
        with tempfile.TemporaryDirectory() as trace_dir:
            with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
                t0 = time.perf_counter()
                jax.block_until_ready(compiled.run(state, arrays))
                wall = time.perf_counter() - t0
            path = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)[0]
            with gzip.open(path) as fh:
                trace = json.load(fh)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    total, count = collections.defaultdict(float), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and not e["name"].startswith(("$", "ThunkExecutor", "PjitFunction")):
            total[e["name"]] += e["dur"] / 1e3  # microseconds -> ms
            count[e["name"]] += 1
    ops = {k: v for k, v in total.items() if k in writes or "fusion" in k or "dot" in k}
    print(
        f"# {data.name} n={data.n} p={data.p} {args.precision} model={args.model} optimizer={args.optimizer} "
        f"gradient={args.gradient}, {args.n_iter} iterations profiled"
    )
    print(f"# XLA_FLAGS={os.environ['XLA_FLAGS']!r}")
    print(
        f"wall time: {1e3 * wall / args.n_iter:.2f} ms/iter; sum over operations: "
        f"{sum(ops.values()) / args.n_iter:.2f} ms/iter (operations overlap on {os.cpu_count()} cores)"
    )
    print(f"{'ms/iter':>8} {'calls/iter':>10} {'n x p written':>13}  operation")
    for name, ms in sorted(ops.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{ms / args.n_iter:8.3f} {count[name] / args.n_iter:10.1f} {writes.get(name, 0):>13}  {name}")
    n_arrays = sum(writes.values())
    print(f"n x p arrays written per iteration (all operations of the loop body and the final ELBO): {n_arrays}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
