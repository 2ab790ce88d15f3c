"""Log-likelihood reached on oaks (n=116, intercept, log offsets) and the time it took.

Reference optimum: -32026.02 (float64 L-BFGS on the same ELBO, exact log-factorial).
Each fit is one plain ``plnexp.fit(..., timed=False)`` call (compile + run, blocked), strategy scan.

    .venv/bin/python benchmarks/convergence.py
    .venv/bin/python benchmarks/convergence.py --n-iter 3000
"""

from __future__ import annotations

import argparse
import time

import plnexp

OPTIMUM = -32026.02
GRID = [  # (model, optimizer, precision)
    ("profiled", "rprop", "float64"),
    ("profiled", "rprop", "float32"),
    ("full", "rprop", "float64"),
    ("profiled", "adam", "float64"),
    ("full", "radam_clip", "float32"),
]


def main(argv=None) -> None:
    plnexp.system.runtime.configure()  # first: XLA_FLAGS and SciPy's OpenBLAS threads, before JAX starts its backend
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-iter", type=int, default=1000)
    args = ap.parse_args(argv)
    data = plnexp.load_oaks()
    print(f"# oaks n={data.n} p={data.p}, {args.n_iter} iterations, strategy scan; optimum {OPTIMUM}")
    print(f"{'model':<9} {'optimizer':<10} {'precision':<9} {'loglik':>12} {'gap':>9} {'wall_s':>7}  iters to gap<0.05")
    for model, optimizer, precision in GRID:
        t0 = time.perf_counter()
        res = plnexp.fit(
            data, model=model, optimizer=optimizer, precision=precision, n_iter=args.n_iter, init="seed", timed=False
        )
        wall = time.perf_counter() - t0
        close = (OPTIMUM - res.elbo[: res.n_iter]) < 0.05
        first = int(close.argmax()) + 1 if close.any() else "-"
        print(
            f"{model:<9} {optimizer:<10} {precision:<9} {res.loglik:12.3f} {OPTIMUM - res.loglik:9.3f} "
            f"{wall:7.2f}  {first}",
            flush=True,
        )


if __name__ == "__main__":
    main()
