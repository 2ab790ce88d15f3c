"""The full model against its floor from oaks x1 to 10^6 rows: the cost of one more iteration apart
from what every run pays once.

A sweep's ms/iter is a run's time over its iterations, so whatever a run costs once (the new output
buffers and their page faults, the copy of the initial state into the loop, the final ELBO) is
spread over ``n_iter``. This benchmark separates the two: for each size it compiles each strategy at
two lengths, a and b = 3a iterations, and times them alternately (``--repeats`` each, fastest kept,
every run ended by ``block_until_ready``, compile apart):

- marginal ms/iter = (t_b - t_a) / (b - a): what one more iteration costs, against the floor
  (:mod:`plnexp.measure.floor`, measured in the same process) as ``x floor``;
- fixed s per run = t_a - a x marginal;
- ms/iter at a: what a sweep of a iterations would report (fixed cost included), against the floor;
- minor page faults per timed run (``getrusage``), and the process's resident peak per row.

Data: oaks replicated (``plnexp.load_oaks(replication=r)``, p = 114, d = 1), float32, model ``full``,
optimizer ``radam_clip``. a = the iterations that take ~1.5 s at the floor, within [10, 5000]. Each
size runs in a fresh process (``--one R``) so that sizes share no memory high-water mark.

    .venv/bin/python benchmarks/rows.py                                 # oaks x1 .. 10^6 rows (minutes, many GB: docs/results.md)
    .venv/bin/python benchmarks/rows.py --replications 1,100 --strategies scan_fused   # a smoke test
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

import plnexp

import jax
from _header import machine_header, proc_status_kb  # benchmarks/, on sys.path as the script's folder
import numpy as np

from plnexp.measure import floor
from plnexp.fitting import engine as fitting
from plnexp import strategies
from plnexp.core.initial_state import init_state
from plnexp.core.model import MODELS
from plnexp.core.optim import OptimizerSpec

# oaks x1, x100 (W1), x400, then ~2e5, ~5e5 and ~1e6 rows (116 rows each)
REPLICATIONS = (1, 100, 400, 1724, 4310, 8621)
TARGET_S = 1.5  # the shorter run's length at the floor
MIN_ITER, MAX_ITER = 10, 5000


def _minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _timed(compiled, state, arrays) -> tuple[float, int]:
    f0, t0 = _minflt(), time.perf_counter()
    jax.block_until_ready(compiled.run(state, arrays))
    return time.perf_counter() - t0, _minflt() - f0


def run_one(replication: int, names: list[str], repeats: int) -> dict:
    data = plnexp.load_oaks(replication=replication)
    model = MODELS["full"]
    fl = floor.measure(floor.iteration(model, data), np.float32)
    a = int(min(max(math.ceil(1e3 * TARGET_S / fl.ms_per_iter), MIN_ITER), MAX_ITER))
    b = 3 * a
    problem = fitting.make_problem(model, OptimizerSpec("radam_clip"))
    arrays = data.to_device(np.float32, jax.devices("cpu")[0])
    state = problem.init(init_state(model, arrays, "seed"))
    row: dict = {"replication": replication, "n": data.n, "p": data.p, "a": a, "b": b, **fl.metrics()}
    for name in names:
        programs = {
            k: strategies.build(problem, k, strategies.StrategySpec(name)).compile(state, arrays) for k in (a, b)
        }
        for compiled in programs.values():
            _timed(compiled, state, arrays)  # warm: the first run's allocations
        runs: dict[int, list[tuple[float, int]]] = {a: [], b: []}
        for _ in range(repeats):
            for k in (a, b):
                runs[k].append(_timed(programs[k], state, arrays))
        t_a, t_b = (min(s for s, _ in runs[k]) for k in (a, b))
        marginal = 1e3 * (t_b - t_a) / (b - a)
        mem = next(iter(programs[b].memory_analysis.values()), {})
        row[name] = {
            "t_a": t_a,
            "t_b": t_b,
            "marginal_ms": marginal,
            "x_floor": marginal / fl.ms_per_iter,
            "fixed_s": t_a - a * marginal / 1e3,
            "ms_at_a": 1e3 * t_a / a,
            "x_floor_at_a": 1e3 * t_a / a / fl.ms_per_iter,
            "minflt_per_run": float(np.median([f for k in (a, b) for _, f in runs[k]])),
            "xla_bytes": sum(
                int(mem.get(k, 0)) for k in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
            ),
        }
        del programs
    peak = proc_status_kb("VmHWM") or 0
    row["peak_GB"] = peak / 2**20
    row["peak_bytes_per_row"] = 1024 * peak / data.n
    return row


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replications", default=",".join(map(str, REPLICATIONS)), help="oaks replication factors")
    ap.add_argument("--strategies", default="scan_fused,scan", help="comma-separated (default scan_fused,scan)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each length, fastest kept (default 3)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed per size (default 1800)")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child mode: one replication factor
    args = ap.parse_args(argv)
    try:
        args.replications = [int(r) for r in args.replications.split(",") if r.strip()]
    except ValueError:
        ap.error(f"--replications={args.replications!r}: allowed values are comma-separated integers >= 1")
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in args.strategies if s not in plnexp.STRATEGIES]
    if unknown or not args.strategies:
        ap.error(f"--strategies: {unknown or 'none'}: allowed values are {', '.join(plnexp.STRATEGIES)}")
    if any(r < 1 for r in args.replications) or args.repeats < 1:
        ap.error("--replications must be integers >= 1 and --repeats >= 1")
    return args


def main(argv=None) -> int:
    plnexp.system.runtime.configure()  # XLA_FLAGS and SciPy's threads, before JAX starts its backend
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.one is not None:
        print(json.dumps(run_one(args.one, args.strategies, args.repeats)), flush=True)
        return 0
    thp = "?"
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as fh:
            thp = fh.read().strip()
    except OSError:
        pass
    for line in machine_header("plnexp rows benchmark: the full model against its floor", argv):
        print(line)
    print(f"# transparent huge pages: {thp}; GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}")
    print("# oaks x r (p=114, d=1), float32, full, radam_clip; each size in a fresh process\n", flush=True)
    rows = []
    for r in args.replications:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", str(r), "--strategies", ",".join(args.strategies)]
        cmd += ["--repeats", str(args.repeats)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"oaks x{r}: timed out after {args.timeout:g} s", flush=True)
            continue
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or [""])[-1]
            print(f"oaks x{r}: exit {proc.returncode}: {tail[:200]}", flush=True)
            continue
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(
            f"oaks x{r}: n={row['n']}  floor {row['floor_ms_per_iter']:.3f} ms (copy "
            f"{row['floor_copy_GBps']:.0f} GB/s, dot {row['floor_dot_ms']:.3f} ms, factor {row['floor_factor_ms']:.3f} ms)  a={row['a']} b={row['b']}  "
            f"peak {row['peak_GB']:.2f} GB ({row['peak_bytes_per_row']:.0f} B/row)",
            flush=True,
        )
    head = (
        f"{'strategy':<11} {'n':>9} {'floor ms':>9} {'marginal ms':>11} {'x floor':>7} {'fixed s':>8} "
        f"{'ms/iter at a':>12} {'x floor at a':>12} {'faults/run':>10} {'XLA B/row':>9} {'peak B/row':>10}"
    )
    print("\n" + head + "\n" + "-" * len(head))
    for name in args.strategies:
        for row in rows:
            s = row[name]
            print(
                f"{name:<11} {row['n']:>9} {row['floor_ms_per_iter']:>9.3f} {s['marginal_ms']:>11.3f} "
                f"{s['x_floor']:>7.2f} {s['fixed_s']:>8.3f} {s['ms_at_a']:>12.3f} {s['x_floor_at_a']:>12.2f} "
                f"{s['minflt_per_run']:>10.0f} {s['xla_bytes'] / row['n']:>9.0f} {row['peak_bytes_per_row']:>10.0f}"
            )
    print(
        "marginal: (t_b - t_a)/(b - a), one more iteration; fixed: what a run pays once; at a: a sweep's ms/iter "
        "with a iterations. XLA B/row: arguments + outputs + temporaries of the compiled fit (b iterations) per "
        "row; peak B/row: the process's resident peak per row (every program of the size, the data, JAX)."
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
