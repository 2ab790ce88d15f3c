"""How much plnexp's calibration workload moves on this machine: idle, then with a competing process.

A timed job runs the calibration (plnexp.measure.timing.calibrate) just before and just after its timed
runs and is flagged contended when after/before - 1 leaves ±CALIBRATION_TOLERANCE. This prints the
distribution of that ratio over ``--pairs`` before/after pairs separated by ``--gap`` seconds of a
compiled scan fit (what a job does in between), first alone, then while a second process keeps the
cores busy (what a joblib sweep or a second SLURM job on the node does), and the share of pairs the
tolerance flags in each case (drift; and level: the calibration over the best idle one, what the
report compares across the jobs of one host).

    .venv/bin/python benchmarks/calibration.py                 # a minute or so (docs/results.md)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np

from _header import machine_header


def _burn(stop, period: float) -> None:
    """Keep the cores busy for ``period`` seconds, idle for as long, and so on: a competing job that
    starts and stops (a steady one is seen by the level check, not by the drift)."""
    a = np.random.default_rng(1).standard_normal((400, 400))
    while not stop.is_set():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < period:
            a = np.tanh(a @ a)
        stop.wait(period)


def pairs(n: int, gap: float) -> tuple[np.ndarray, np.ndarray]:
    import plnexp
    from plnexp.measure.timing import calibrate

    data = plnexp.load_oaks(10)
    out = []
    for _ in range(n):
        before = calibrate()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < gap:
            plnexp.fit(data, n_iter=20, strategy="scan", model="full", optimizer="radam_clip", init="seed", timed=False)
        out.append((before, calibrate()))
    a = np.asarray(out)
    return a[:, 0], a[:, 1]


def describe(name: str, before: np.ndarray, after: np.ndarray, best: float, tol: float) -> str:
    """The drift (after/before - 1) and the level (the better of the two over the idle best - 1),
    and how often each leaves the tolerance."""
    drift = after / before - 1
    level = np.minimum(before, after) / best - 1
    q = np.percentile(drift, [0, 50, 100])
    return (
        f"{name:>9}: drift min {q[0]:+.1%} median {q[1]:+.1%} max {q[2]:+.1%}, beyond ±{tol:.0%} in "
        f"{np.mean(np.abs(drift) > tol):.0%} of {len(drift)} pairs; level median {np.median(level):+.1%} of the "
        f"idle best, beyond +{tol:.0%} in {np.mean(level > tol):.0%}; flagged (either) in "
        f"{np.mean((np.abs(drift) > tol) | (level > tol)):.0%}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--gap", type=float, default=0.5, help="seconds of fits between before and after")
    args = ap.parse_args()
    from plnexp.measure.timing import CALIBRATION_TOLERANCE, calibrate

    print("\n".join(machine_header("calibration workload: idle vs contended")))
    one = [calibrate() for _ in range(10)]
    print(f"# one calibration: median {1e3 * np.median(one):.1f} ms (best of 3 timings)")
    idle = pairs(args.pairs, args.gap)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    burner = ctx.Process(target=_burn, args=(stop, 0.7))
    burner.start()
    try:
        time.sleep(1.0)
        busy_start = pairs(args.pairs, args.gap)
    finally:
        stop.set()
        burner.join()
    best = float(min(idle[0].min(), idle[1].min()))
    print(describe("idle", *idle, best, CALIBRATION_TOLERANCE))
    print(describe("contended", *busy_start, best, CALIBRATION_TOLERANCE))


if __name__ == "__main__":
    main()
