"""PLN-PCA with its rows in blocks (``block_rows``) against every row at once: time per iteration and
XLA's temp memory, side by side in one process.

Data: ``plnexp.simulate_pca(n, p, q, seed=0)`` (``--n``, ``--p``, ``--q``). Fit: ``model="pca"``,
rank q, float32, ``--optimizer`` (rprop), strategy ``scan``, ``--n-iter`` iterations (20), through
``plnexp.fit(..., timed=True)``: AOT compile timed apart, then ``--repeats`` steady runs, each ended by
``block_until_ready`` (median). The block sizes (``--blocks``, 0 = none) go round ``--rounds`` times
in turn, so that a change in the machine's load hits each alike; per block size: the median of its
rounds' ms/iter, the fastest, compile_s, XLA's temp bytes (in n x p float32 arrays, from the timed
fit's memory analysis) and the largest relative difference of its ELBO curve to the unblocked one.

    .venv/bin/python benchmarks/pca_blocks.py                                  # 20,000 x 1,000, q=5
    .venv/bin/python benchmarks/pca_blocks.py --n 4000 --p 500 --blocks 0,1000 --rounds 1   # a smoke test
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

import plnexp
from _header import machine_header  # benchmarks/, on sys.path as the script's folder


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--p", type=int, default=1000)
    parser.add_argument("--q", type=int, default=5)
    parser.add_argument("--blocks", default="0,500,2000,5000", help="block_rows values, 0: no blocks")
    parser.add_argument("--optimizer", default="rprop")
    parser.add_argument("--n-iter", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    plnexp.system.runtime.configure()  # first: XLA_FLAGS and SciPy's OpenBLAS threads, before JAX starts its backend
    print("\n".join(machine_header("PLN-PCA row blocks", argv)))
    data = plnexp.simulate_pca(n=args.n, p=args.p, q=args.q, seed=0)
    blocks = [int(b) for b in args.blocks.split(",") if b.strip()]
    unit = args.n * args.p * 4
    kw = dict(
        model="pca",
        rank=args.q,
        optimizer=args.optimizer,
        n_iter=args.n_iter,
        precision="float32",
        strategy="scan",
        repeats=args.repeats,
        compile_cache=False,
    )
    ms: dict[int, list[float]] = {b: [] for b in blocks}
    compile_s: dict[int, float] = {}
    temp: dict[int, float] = {}
    curves: dict[int, np.ndarray] = {}
    for _ in range(args.rounds):
        for b in blocks:
            res = plnexp.fit(data, block_rows=b or None, **kw)
            ms[b].append(res.timing.ms_per_iter)
            compile_s[b] = res.timing.compile_s
            temp[b] = max(m.get("temp_size_in_bytes", np.nan) for m in res.timing.memory_analysis.values()) / unit
            curves[b] = res.elbo
    base = curves[blocks[0]]
    print(f"# n={args.n} p={args.p} q={args.q} {args.optimizer} float32 scan, {args.n_iter} iterations")
    print(f"{'block_rows':>10} {'ms/iter':>9} {'fastest':>9} {'compile_s':>9} {'temp n x p':>10} {'curve_rdiff':>11}")
    for b in blocks:
        rdiff = float(np.max(np.abs(curves[b] - base)) / np.max(np.abs(base)))
        print(
            f"{b or 'none':>10} {statistics.median(ms[b]):9.2f} {min(ms[b]):9.2f} {compile_s[b]:9.2f} "
            f"{temp[b]:10.3f} {rdiff:11.1e}"
        )


if __name__ == "__main__":
    main()
