"""Host memory of a PLN-PCA fit, end to end: the process's peak resident set (VmHWM) after the data
are drawn and after the fit, and where in between the resident set grew (sampled every 20 ms).

Data: ``plnexp.simulate_pca(n, p, q, zero_fraction)`` (``--n``, ``--p``, ``--q``, ``--zero-fraction``).
Fit: ``plnexp.fit(data, model="pca", rank=q, block_rows=b, n_iter=k)`` (float32, scan, rprop,
init="seed", timed: one compile and one run), what docs/concepts/memory.md measures:

    .venv/bin/python benchmarks/pca_host_memory.py --n 60000 --p 2000
    /usr/bin/time -v .venv/bin/python benchmarks/pca_host_memory.py --n 60000 --p 20000   # 1.2e9 entries

Each stage's line: its name, seconds, the resident set at its end and the largest one seen during it
(GB: 10**9 bytes), and that peak in bytes per count (n x p entries).
"""

from __future__ import annotations

import argparse
import resource
import threading
import time

import plnexp


def _kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class Sampler:
    """The largest resident set seen since the last :meth:`stage` (a thread reading /proc)."""

    def __init__(self) -> None:
        self.peak = 0
        self.done = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done:
            self.peak = max(self.peak, _kib("VmRSS"))
            time.sleep(0.02)

    def stage(self, name: str, start: float, entries: int) -> None:
        now = _kib("VmRSS")
        peak = max(self.peak, now)
        gb = lambda kib: f"{kib * 1024 / 1e9:6.2f} GB"
        print(
            f"{name:<12} {time.perf_counter() - start:8.1f} s  rss {gb(now)}  peak {gb(peak)}"
            f"  ({peak * 1024 / entries:5.1f} B/entry)  VmHWM {gb(_kib('VmHWM'))}",
            flush=True,
        )
        self.peak = 0


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=60000)
    parser.add_argument("--p", type=int, default=2000)
    parser.add_argument("--q", type=int, default=5)
    parser.add_argument("--zero-fraction", type=float, default=0.9)
    parser.add_argument("--block-rows", type=int, default=2000)
    parser.add_argument("--n-iter", type=int, default=3)
    args = parser.parse_args(argv)
    plnexp.system.runtime.configure()  # XLA_FLAGS before JAX starts, as a fit would
    entries = args.n * args.p
    sampler = Sampler()
    sampler.stage("start", time.perf_counter(), entries)
    t = time.perf_counter()
    data = plnexp.simulate_pca(args.n, args.p, q=args.q, zero_fraction=args.zero_fraction)
    sampler.stage("data", t, entries)
    t = time.perf_counter()
    res = plnexp.fit(data, model="pca", rank=args.q, block_rows=args.block_rows, n_iter=args.n_iter)
    sampler.stage("fit", t, entries)
    sampler.done = True
    hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(
        f"n={args.n} p={args.p} q={args.q} block_rows={args.block_rows} n_iter={args.n_iter}: "
        f"peak {hwm * 1024 / 1e9:.2f} GB = {hwm * 1024 / entries:.1f} bytes per entry; "
        f"ELBO {res.elbo[0]:.9g} -> {res.loglik:.9g}, {res.timing.ms_per_iter:.0f} ms/iter, "
        f"compile {res.timing.compile_s:.1f} s"
    )


if __name__ == "__main__":
    main()
