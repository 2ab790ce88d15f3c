"""How often the interleaved rounds' verdicts come out right, over repeated sweeps.

Each "sweep" here compiles the group's programs afresh and times them in interleaved rounds exactly as a
sweep's driver does (plnexp.fitting.rounds.prepare / time_rounds, judged by
plnexp.experiment.groups.judge, with the sweep's defaults: report.rounds, report.rounds_budget_s,
report.min_speedup), on W1's data (oaks x100, full model, radam_clip, float32). From the same rounds it
reads two comparisons with a known answer:

- an A/A pair: scan_pytree against scan_namedtuple, two names of one compiled program: should be
  ``tied`` every time;
- scan_fused against scan (the hand-fused step, about 1.4x faster on this kind of machine:
  docs/results.md, W1): should be ``faster``.

A program whose verdict stands sits out the rounds that follow, as in a sweep (scan_fused, once named).

``--busy`` runs a process that keeps one core busy all along (what a laptop, a CI runner or a shared
node often has). Prints each sweep's ratios and verdicts, then the counts.

    .venv/bin/python benchmarks/verdicts.py --sweeps 10            # idle machine
    .venv/bin/python benchmarks/verdicts.py --sweeps 5 --busy      # beside a busy core
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _header import machine_header

STRATEGIES = ("scan_namedtuple", "scan_pytree", "scan", "scan_fused")


def _spin(stop) -> None:
    """Keep one core busy until ``stop`` is set."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=10)
    ap.add_argument(
        "--n-iter",
        type=int,
        default=20,
        help="iterations per run (a round runs each program once); the default sweep's",
    )
    ap.add_argument("--replication", type=int, default=100)
    ap.add_argument("--busy", action="store_true", help="a process keeps one core busy meanwhile")
    args = ap.parse_args()

    from plnexp.core.oaks import load_oaks
    from plnexp.experiment.groups import judge
    from plnexp.fitting import rounds as R
    from plnexp.fitting.spec import parse
    from plnexp.jobs.config import ReportSpec
    from plnexp.measure import paired

    print("\n".join(machine_header("interleaved rounds: verdicts over repeated sweeps")))
    rep = ReportSpec()
    data = load_oaks(replication=args.replication)
    print(
        f"# oaks x{args.replication} ({data.n}x{data.p}), full, radam_clip, float32, {args.n_iter} iterations a run; "
        f"rounds: at least {paired.robust_rounds()} kept, at most {rep.rounds}, budget {rep.rounds_budget_s:g} s; "
        f"minimum effect {rep.min_speedup:.2f}x; busy core: {'yes' if args.busy else 'no'}"
    )
    stop = mp.Event()
    burner = mp.Process(target=_spin, args=(stop,), daemon=True) if args.busy else None
    if burner is not None:
        burner.start()
    counts: Counter = Counter()
    try:
        print(
            f"{'sweep':>5}  {'rounds':>6}  {'dropped':>7}  {'pytree/namedtuple':>28}  {'scan_fused/scan':>28}  {'s':>6}"
        )
        for k in range(args.sweeps):
            t0 = time.perf_counter()
            programs = [
                R.prepare(s, data, parse("full", "radam_clip", args.n_iter, "float32", "cpu", s, init="seed"))
                for s in STRATEGIES
            ]
            per_iter = [p.n_iter for p in programs]
            fps = [p.fingerprint for p in programs]
            runs = [() for _ in programs]

            def both(r, fps=fps, runs=runs, per_iter=per_iter):
                aa = judge(STRATEGIES, fps, runs, r, per_iter, 0, "", rep.min_speedup).strategies[1]
                fused = judge(STRATEGIES, fps, runs, r, per_iter, 2, "", rep.min_speedup).strategies[3]
                return aa, fused

            rounds = R.time_rounds(
                programs,
                min_rounds=paired.robust_rounds(),
                max_rounds=rep.rounds,
                budget_s=rep.rounds_budget_s,
                decided=lambda r: all(s.verdict != "unresolved" for s in both(r)),
                # as a sweep's driver does: a program whose verdict stands sits out the next rounds
                # (scan_fused, once named; the A/A pair's two programs and scan are references)
                settled=lambda r: {3} if both(r)[1].verdict != "unresolved" else set(),
                seed=k,
            )
            aa, fused = both(rounds)
            counts[("aa", aa.verdict)] += 1
            counts[("fused", fused.verdict)] += 1
            cell = lambda s: f"{s.ratio:.3f} [{s.low:.3f}–{s.high:.3f}] {s.verdict}"
            print(
                f"{k + 1:>5}  {len(rounds.kept):>6}  {rounds.n_dropped:>7}  {cell(aa):>28}  {cell(fused):>28}  "
                f"{time.perf_counter() - t0:>6.1f}",
                flush=True,
            )
            assert fps[0] == fps[1], "scan_namedtuple and scan_pytree no longer compile to one program"
    finally:
        stop.set()
        if burner is not None:
            burner.join(5)
    n = args.sweeps
    print(
        f"A/A (one program, two names): tied {counts[('aa', 'tied')]} of {n}; "
        + ", ".join(f"{v} {c}" for (what, v), c in sorted(counts.items()) if what == "aa" and v != "tied")
    )
    print(
        f"scan_fused vs scan: faster {counts[('fused', 'faster')]} of {n}; "
        + ", ".join(f"{v} {c}" for (what, v), c in sorted(counts.items()) if what == "fused" and v != "faster")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
