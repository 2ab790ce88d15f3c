"""Many devices, one fit; many fits, one program: ``scan_sharded`` and ``replicates=K``, measured
side by side in one run.

1. **Rows split across devices**: ``scan`` (one device) against ``scan_sharded`` with
   ``via=jit`` (NamedSharding, XLA partitions) and ``via=shard_map`` (explicit psum), on every CPU
   device this process sees (2 simulated ones unless ``JAX_NUM_CPU_DEVICES`` says otherwise; set
   here before JAX starts), for oaks x100 (n=11600, p=114) and synthetic n=1e6, p=114
   (``--big-n``; 0 skips it). Full model, radam_clip, float32. Columns: compile_s, ms/iter (median
   of the steady runs, each ended by ``block_until_ready``), ``x_scan`` (scan's ms/iter over the
   row's), ``mem/dev_MB`` (XLA's memory analysis of the compiled fit: arguments + outputs + temporaries
   − aliased, per device: what one device must hold), ``curve_rdiff`` (max relative difference of
   the ELBO curve to scan's).
2. **K fits in one program** (``jax.vmap`` of scan's fit) against the same K fits one after the
   other (the single fit compiled once, run K times from the K initial states), on oaks x1, where
   one fit is too small to fill the machine; ``init=random`` from seeds 0..K-1. Columns: the batch's
   compile_s and steady run_s, the K sequential fits' summed steady run_s, fits per second each
   way and their ratio ``x_seq`` (the goal: >= 3 at K=16).

Both parts use ``plnexp.fit`` / ``plnexp.fit_replicates`` with ``timed=True``: AOT compile timed
apart, ``--warmup`` untimed runs, then the median of ``--repeats`` steady runs.

    .venv/bin/python benchmarks/devices.py                       # both parts (minutes; n=1e6 needs many GB: docs/results.md)
    .venv/bin/python benchmarks/devices.py --big-n 0 --ks 1,4    # a smoke test
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "2")  # before JAX starts its CPU client

import plnexp

import jax
import numpy as np
from _header import machine_header  # benchmarks/, on sys.path as the script's folder


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n-iter", type=int, default=100, help="iterations of the oaks x100 fits (default 100)")
    ap.add_argument("--big-n", type=int, default=1_000_000, help="rows of the synthetic data set (0: skip it)")
    ap.add_argument("--big-n-iter", type=int, default=5, help="iterations of the big fits (default 5)")
    ap.add_argument("--ks", default="1,4,16", help="replicate counts (default 1,4,16)")
    ap.add_argument("--rep-n-iter", type=int, default=500, help="iterations of each replicate (default 500)")
    ap.add_argument("--repeats", type=int, default=3, help="steady runs, median kept (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    return ap.parse_args(argv)


def per_device_mb(timing) -> float:
    """What one device holds during the compiled fit, by XLA's memory analysis (NaN if none)."""
    (mem,) = timing.memory_analysis.values() or [{}]
    if not mem:
        return float("nan")
    used = (
        mem.get("argument_size_in_bytes", 0)
        + mem.get("output_size_in_bytes", 0)
        + mem.get("temp_size_in_bytes", 0)
        - mem.get("alias_size_in_bytes", 0)
    )
    return used / 2**20


def rdiff(a, b) -> float:
    n = min(len(a), len(b))
    return float(np.max(np.abs(a[:n] - b[:n])) / np.max(np.abs(b[:n])))


def sharding(label: str, data, n_iter: int, args) -> None:
    kw = dict(
        model="full",
        optimizer="radam_clip",
        n_iter=n_iter,
        init="seed",  # W1's start (plnexp.fit's default is the data's since #63)
        precision="float32",
        repeats=args.repeats,
        warmup=args.warmup,
        compile_cache=False,
    )  # compile_s cold, as in a sweep
    rows = [
        ("scan", {}),
        ("scan_sharded via=jit", {"via": "jit"}),
        ("scan_sharded via=shard_map", {"via": "shard_map"}),
    ]
    print(
        f"\n## rows split across {len(jax.devices('cpu'))} CPU devices: {label} (n={data.n}, p={data.p}), "
        f"{n_iter} iterations, float32, full, radam_clip"
    )
    print(
        f"{'strategy':<28} {'compile_s':>9} {'ms/iter':>9} {'spread_ms':>9} {'x_scan':>7} {'mem/dev_MB':>11} "
        f"{'curve_rdiff':>11}"
    )
    scan = None
    for name, options in rows:
        res = plnexp.fit(data, strategy=name.split()[0], **kw, **options)
        t = res.timing
        scan = scan or res
        iqr = t.spread.width / n_iter * 1e3 if len(t.runs_s) > 1 else float("nan")
        print(
            f"{name:<28} {t.compile_s:>9.2f} {t.ms_per_iter:>9.2f} {iqr:>9.2f} "
            f"{scan.timing.ms_per_iter / t.ms_per_iter:>7.2f} {per_device_mb(t):>11.1f} "
            f"{rdiff(res.elbo, scan.elbo):>11.1e}",
            flush=True,
        )


def replicates(args) -> None:
    oaks = plnexp.load_oaks()
    ks = [int(k) for k in args.ks.split(",")]
    kw = dict(
        model="full",
        optimizer="radam_clip",
        n_iter=args.rep_n_iter,
        precision="float32",
        strategy="scan",
        init="random",
        repeats=args.repeats,
        warmup=args.warmup,
        compile_cache=False,
    )
    print(
        f"\n## K fits in one program (vmap of scan) vs K fits one after the other: oaks x1 (n={oaks.n}, "
        f"p={oaks.p}), {args.rep_n_iter} iterations each, float32, full, radam_clip, init=random"
    )
    print(
        f"{'K':>3} {'batch_compile_s':>15} {'batch_run_s':>11} {'seq_run_s':>9} {'fits/s batch':>12} "
        f"{'fits/s seq':>10} {'x_seq':>6}"
    )
    single = {}  # seed -> steady run_s of the single fit (compiled once: build() caches the program)
    for k in ks:
        for seed in range(k):
            if seed not in single:
                single[seed] = plnexp.fit(oaks, seed=seed, **kw).timing.run_s
        seq = sum(single[s] for s in range(k))
        batch = plnexp.fit_replicates(oaks, k, **kw)[0].timing if k > 1 else None
        run = batch.run_s if batch else single[0]
        compile_s = batch.compile_s if batch else float("nan")
        print(
            f"{k:>3} {compile_s:>15.2f} {run:>11.3f} {seq:>9.3f} {k / run:>12.1f} {k / seq:>10.1f} {seq / run:>6.2f}",
            flush=True,
        )


def main(argv=None) -> int:
    plnexp.system.runtime.configure()  # first: XLA_FLAGS and SciPy's OpenBLAS threads, before JAX starts its backend
    args = parse_args(argv)
    print("\n".join(machine_header("devices: scan_sharded and replicates", argv)))
    if len(jax.devices("cpu")) < 2:
        print("only one CPU device: set JAX_NUM_CPU_DEVICES=2 (or more) before the process starts", file=sys.stderr)
        return 2
    sharding("oaks x100", plnexp.load_oaks(replication=100), args.n_iter, args)
    if args.big_n:
        sharding(
            f"synthetic n={args.big_n:.0e}", plnexp.simulate(n=args.big_n, p=114, d=1, seed=0), args.big_n_iter, args
        )
    replicates(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
