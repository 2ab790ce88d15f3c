"""Sparse counts (issue #51): PLN-PCA on counts kept as CSR, each block of rows densified on the device
only while it is used (``plnexp.simulate_pca(..., sparse=True)``, ``plnexp.fit(..., block_rows=b)``).

``--check``: the same draw dense and sparse, one float64 fit each (scan, rprop, init="seed"), and
the largest relative difference of their ELBO curves::

    .venv/bin/python benchmarks/sparse.py --check --n 20000 --p 2000 --iterations 20

Without ``--check``: the sparse layout alone, float32, timed (one compile, one run): the draw's and
the fit's seconds, the time per iteration, the non-zeros' bytes, the process's peak resident set
(``resource.getrusage``), and what the dense layout's n x p float32 counts alone would take
(``--dense``: the same fit of the same draw in the dense layout, in a process of its own)::

    .venv/bin/python benchmarks/sparse.py --n 200000 --p 20000 --rank 10 --zero-fraction 0.95 --iterations 5
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

import plnexp
from _header import machine_header


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: kB


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--p", type=int, default=2000)
    ap.add_argument("--rank", type=int, default=10)
    ap.add_argument("--zero-fraction", type=float, default=0.95)
    ap.add_argument("--block-rows", type=int, default=1000)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--check", action="store_true", help="dense vs sparse float64 ELBO curves")
    ap.add_argument("--dense", action="store_true", help="time the dense layout instead (the same draw)")
    args = ap.parse_args(argv)
    plnexp.system.runtime.configure()  # XLA_FLAGS before JAX starts, as a fit would
    print("\n".join(machine_header("sparse counts (issue #51)", argv)))
    draw = dict(n=args.n, p=args.p, q=args.rank, zero_fraction=args.zero_fraction, seed=0)
    fit = dict(model="pca", rank=args.rank, block_rows=args.block_rows, init="seed", n_iter=args.iterations)
    if args.check:
        dense, sparse = plnexp.simulate_pca(**draw), plnexp.simulate_pca(**draw, sparse=True)
        curves = [plnexp.fit(d, **fit, precision="float64", timed=False).elbo for d in (dense, sparse)]
        worst = float(np.max(np.abs(curves[1] - curves[0]) / np.abs(curves[0])))
        print(f"n={args.n} p={args.p} rank={args.rank} zeros={args.zero_fraction} block_rows={args.block_rows}")
        print(f"float64 ELBO curves, {args.iterations} iterations: max relative difference sparse vs dense {worst:.3g}")
        print(f"final ELBO dense {curves[0][-1]:.12g}  sparse {curves[1][-1]:.12g}")
        return
    start = time.perf_counter()
    data = plnexp.simulate_pca(**draw, sparse=not args.dense)
    drawn = time.perf_counter() - start
    print(f"{data!r}")
    if data.sparse:
        Y = data.Y
        stored = Y.data.nbytes + Y.indices.nbytes + Y.indptr.nbytes
        print(
            f"draw: {drawn:.1f} s; non-zeros {Y.nnz} ({Y.nnz / (args.n * args.p):.4f} of n x p), CSR {stored / 1e9:.2f} GB"
        )
    else:
        print(f"draw: {drawn:.1f} s; dense counts {data.Y.nbytes / 1e9:.2f} GB")
    print(f"peak resident set after the draw: {_peak_gb():.2f} GB")
    start = time.perf_counter()
    res = plnexp.fit(data, **fit, precision="float32")
    print(f"{res!r}")
    print(
        f"fit: {time.perf_counter() - start:.1f} s (compile {res.timing.compile_s:.1f} s); {res.timing.ms_per_iter / 1e3:.2f} s per iteration"
    )
    print(f"ELBO curve: {' '.join(f'{v:.6g}' for v in res.elbo)}")
    print(f"peak resident set (getrusage): {_peak_gb():.2f} GB")
    print(f"the dense layout's n x p float32 counts alone: {args.n * args.p * 4 / 1e9:.1f} GB")


if __name__ == "__main__":
    main()
