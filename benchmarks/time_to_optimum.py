"""Time to get within ``--gap`` nats of the oaks optimum, and a real time-to-stop with while_loop.

Default: oaks (replication 1: n=116, p=114), model ``profiled``, optimizer ``rprop``, strategy
``scan``, 1000 iterations, float64 and float32. The optimum (-32026.016, exact log-factorial) is
that of an independent float64 L-BFGS fit of the same ELBO. Everything is measured in this one
process, every fit through ``plnexp.fit`` (``block_until_ready``, compile timed apart from run).

Per precision, scan (``--n-iter`` iterations, ``timed=True``: median of ``--repeats`` steady runs):

- k            iterations (updates) after which the ELBO is first >= optimum - gap. Found on
               the ELBO curve, then checked with the float64 host ELBO of fits of k and k-1
               iterations; where the curve is too coarse (float32: the jitted ELBO is a float32
               sum of size ~1.25e6, so it carries ~0.1-0.3 nats of rounding, more than the gap)
               k is found by bisection over the host ELBO of fits of k iterations instead.
- t_gap_s      run_s * k / n_iter: ESTIMATED from the steady per-iteration time of the full fit
               (a fit is a fixed-length scan, so a k-iteration fit costs k steady iterations).
- run_s        steady wall time of the whole n_iter fit; compile_s: AOT lower+compile.
- loglik, gap  final ELBO (float64 host, exact log y!) and optimum - loglik.

With ``--while-loop`` (default on), strategy ``while_loop`` also runs (at most
``--while-max-iter`` iterations) and stops inside the compiled program once the relative ELBO
change |e_i - e_(i-1)| / |e_(i-1)| stays below ``--tol`` for ``--patience`` iterations in a row:
its run_s is a measured time-to-stop, not an estimate.

The pyPLNmodels figure printed at the end (1.79 s, 0.24 nats short) is quoted from the issue, not
measured by this script.

    .venv/bin/python benchmarks/time_to_optimum.py                       # the full run (~1 min)
    .venv/bin/python benchmarks/time_to_optimum.py --n-iter 50 --gap 50  # a quick check
    .venv/bin/python benchmarks/time_to_optimum.py --precisions float64 --tol 1e-10 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import plnexp  # first: sets the XLA_FLAGS fix before JAX starts its backend

import jax  # noqa: E402
from _header import machine_header  # noqa: E402 (benchmarks/, on sys.path as the script's folder)
import numpy as np  # noqa: E402

OPTIMUM = -32026.016  # oaks, exact log-factorial, independent float64 L-BFGS fit
PYPLN_S = 1.79  # pyPLNmodels' default fit on this machine, as quoted in the issue (not measured here)
PYPLN_SHORT = 0.24  # ... and how far short of the optimum it stopped (nats)
PRECISIONS = ("float64", "float32")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-iter", type=int, default=1000, help="scan iterations per fit (default 1000)")
    ap.add_argument("--precisions", default="float64,float32", help="comma-separated (default float64,float32)")
    ap.add_argument("--gap", type=float, default=0.01, help="target: ELBO >= optimum - gap (nats, default 0.01)")
    ap.add_argument("--optimum", type=float, default=OPTIMUM, help=f"reference optimum (default {OPTIMUM})")
    ap.add_argument("--replication", type=int, default=1, help="oaks row replication (default 1: n=116)")
    ap.add_argument("--model", default="profiled", choices=["full", "profiled"])
    ap.add_argument("--optimizer", default="rprop")
    ap.add_argument("--repeats", type=int, default=3, help="steady runs per timed fit, median kept (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs before the repeats (default 1)")
    ap.add_argument("--host-check", action=argparse.BooleanOptionalAction, default=True,
                    help="check/find k with the float64 host ELBO of k-iteration fits (default on)")
    ap.add_argument("--while-loop", action=argparse.BooleanOptionalAction, default=True,
                    help="also run strategy while_loop with early stopping (default on)")
    ap.add_argument("--tol", type=float, default=1e-9,
                    help="while_loop: stop when the relative ELBO change stays below tol (default 1e-9)")
    ap.add_argument("--patience", type=int, default=10,
                    help="while_loop: ... for this many consecutive iterations (default 10)")
    ap.add_argument("--while-max-iter", type=int, default=5000, help="while_loop iteration cap (default 5000)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    args.precisions = [s.strip() for s in args.precisions.split(",") if s.strip()]
    bad = [s for s in args.precisions if s not in PRECISIONS]
    if bad or not args.precisions:
        ap.error(f"--precisions: unknown {', '.join(bad) or '(empty)'}; allowed: {', '.join(PRECISIONS)}")
    if args.n_iter < 1 or args.while_max_iter < 1 or args.repeats < 1 or args.warmup < 0 or args.patience < 1:
        ap.error("--n-iter, --while-max-iter, --repeats, --patience must be >= 1, --warmup >= 0")
    if args.gap < 0 or args.tol < 0:
        ap.error("--gap and --tol must be >= 0")
    return args


def header(args, data, argv) -> list[str]:
    return machine_header('plnexp time-to-optimum benchmark', argv) + [
        f"# data: {data.name} n={data.n} p={data.p} d={data.d}  model={args.model}  optimizer={args.optimizer}  "
        f"precisions={','.join(args.precisions)}",
        f"# optimum={args.optimum} gap={args.gap:g} (target ELBO >= {args.optimum - args.gap:.4f})  "
        f"scan n_iter={args.n_iter}  repeats={args.repeats} warmup={args.warmup}  host_check={args.host_check}",
        f"# while_loop: {'on' if args.while_loop else 'off'}  tol={args.tol:g} patience={args.patience} "
        f"max_iter={args.while_max_iter}",
    ]


class HostElbo:
    """ELBO (float64 host, exact log y!) of the state after k updates: ``fit(n_iter=k).loglik``."""

    def __init__(self, data, args, precision, known: dict[int, float]):
        self.data, self.args, self.precision, self.values = data, args, precision, dict(known)
        self.fits = 0

    def __call__(self, k: int) -> float:
        if k not in self.values:
            res = plnexp.fit(self.data, model=self.args.model, optimizer=self.args.optimizer, n_iter=k,
                             precision=self.precision, strategy="scan", timed=False)
            self.values[k] = float(res.loglik)
            self.fits += 1
        return self.values[k]


def bisect(host: HostElbo, lo: int, hi: int, threshold: float) -> int:
    """Smallest k in (lo, hi] with host(k) >= threshold, given host(lo) < threshold <= host(hi),
    assuming one crossing in between."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if host(mid) >= threshold:
            hi = mid
        else:
            lo = mid
    return hi


def iterations_to_gap(res, data, args, precision) -> dict:
    """k (updates) to reach the threshold, from the curve and, if asked, the host ELBO."""
    threshold = args.optimum - args.gap
    curve = res.elbo[: res.n_iter]  # curve[i]: ELBO after i updates
    above = np.flatnonzero(curve >= threshold)
    k_curve = int(above[0]) if above.size else None
    out = {"k_curve": k_curve, "k": k_curve, "method": "curve", "host_fits": 0}
    if not args.host_check:
        if k_curve is None and res.loglik >= threshold:  # only the final state (n_iter updates) is there
            out["k"] = res.n_iter
        return out
    # curve[0] (initial state) is far below any sensible threshold; n_iter updates: res.loglik
    host = HostElbo(data, args, precision, {res.n_iter: float(res.loglik)})
    initial = float(curve[0])
    if initial >= threshold:
        return out | {"k": 0, "method": "curve (initial state already there)"}
    if k_curve is not None and 0 < k_curve <= res.n_iter:
        reached = host(k_curve) >= threshold
        before = initial if k_curve == 1 else host(k_curve - 1)
        if reached and before < threshold:
            return out | {"k": k_curve, "method": "curve, host-checked", "host_fits": host.fits}
        lo, hi = (k_curve, res.n_iter) if not reached else (0, k_curve - 1)
    else:
        lo, hi = 0, res.n_iter
    if host(hi) < threshold:
        return out | {"k": None, "method": "host", "host_fits": host.fits}
    k = bisect(host, lo, hi, threshold)
    return out | {"k": k, "method": "host bisection", "host_fits": host.fits}


def timed_fit(data, args, precision, strategy, n_iter):
    t0 = time.perf_counter()
    res = plnexp.fit(data, model=args.model, optimizer=args.optimizer, n_iter=n_iter, precision=precision,
                     strategy=strategy, tol=args.tol, patience=args.patience, repeats=args.repeats,
                     warmup=args.warmup, first_call=True, timed=True)  # first_call_s is reported
    return res, time.perf_counter() - t0


def fmt(x, spec, none="-"):
    return none if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    data = plnexp.load_oaks(replication=args.replication)
    for line in header(args, data, argv):
        print(line, flush=True)

    rows = []
    for precision in args.precisions:
        res, wall = timed_fit(data, args, precision, "scan", args.n_iter)
        t = res.timing
        gap_info = iterations_to_gap(res, data, args, precision)
        k = gap_info["k"]
        rows.append({
            "precision": precision, "strategy": "scan", "n_iter": args.n_iter, "n_run": res.n_iter,
            "compile_s": t.compile_s, "first_call_s": t.first_call_s, "run_s": t.run_s, "runs_s": list(t.runs_s),
            "ms_per_iter": t.ms_per_iter, "loglik": float(res.loglik), "final_gap": args.optimum - res.loglik,
            # |jitted - host| ELBO of the final state: the resolution of the curve in this precision
            "curve_err": abs(res.extra["final_elbo_jit"] - res.loglik),
            "k": k, "k_curve": gap_info["k_curve"], "k_method": gap_info["method"],
            "host_fits": gap_info["host_fits"],
            "t_gap_s_est": t.run_s * k / res.n_iter if k is not None else None,
        })
        print(f"#   done {precision} scan ({wall:.1f} s, +{gap_info['host_fits']} host-check fits)", flush=True)
        if args.while_loop:
            res, wall = timed_fit(data, args, precision, "while_loop", args.while_max_iter)
            t = res.timing
            rows.append({
                "precision": precision, "strategy": "while_loop", "n_iter": args.while_max_iter,
                "n_run": res.n_iter, "compile_s": t.compile_s, "first_call_s": t.first_call_s, "run_s": t.run_s,
                "runs_s": list(t.runs_s), "ms_per_iter": t.ms_per_iter, "loglik": float(res.loglik),
                "final_gap": args.optimum - res.loglik,
                "curve_err": abs(res.extra["final_elbo_jit"] - res.loglik),
                "stopped_early": res.n_iter < args.while_max_iter,
                # smallest non-zero relative change the jitted ELBO can show: one ulp of the partial
                # ELBO (what the loop carries) over |full ELBO|; a tol below it needs exact repeats
                "relative_ulp": float(np.spacing(np.dtype(precision).type(res.loglik + res.extra["log_factorial"]))
                                      / abs(res.loglik)),
            })
            print(f"#   done {precision} while_loop ({wall:.1f} s)", flush=True)

    print()
    print(f"scan, {args.n_iter} iterations: iterations k to reach ELBO >= optimum - {args.gap:g}; "
          f"t_gap_s = run_s * k / n_iter (ESTIMATED from the steady per-iteration time)")
    cols = (f"{'precision':<9} {'k':>11} {'k(curve)':>8} {'t_gap_s':>9} {'run_s':>8} {'ms/iter':>8} "
            f"{'compile_s':>9} {'first_call_s':>12} {'final loglik':>14} {'final gap':>10} {'curve err':>9}  k found by")
    print(cols)
    print("-" * len(cols))
    for r in (r for r in rows if r["strategy"] == "scan"):
        k = str(r["k"]) if r["k"] is not None else "not reached"
        print(f"{r['precision']:<9} {k:>11} {fmt(r['k_curve'], 'd'):>8} {fmt(r['t_gap_s_est'], '9.4f'):>9} "
              f"{r['run_s']:8.4f} {r['ms_per_iter']:8.4f} {r['compile_s']:9.3f} {r['first_call_s']:12.3f} "
              f"{r['loglik']:14.4f} {r['final_gap']:10.4f} {r['curve_err']:9.2e}  {r['k_method']}")
    print("k: updates applied (the ELBO curve's index; fit(n_iter=k) returns that state). k(curve): first "
          "crossing on the jitted ELBO curve. curve err: |jitted - float64 host| ELBO at the final state, "
          "the curve's resolution in that precision.")
    if args.host_check and any(r.get("k_method") == "host bisection" for r in rows):
        print("host bisection: the first k whose k-iteration fit has a float64 host ELBO >= the target, "
              "assuming the ELBO crosses it once.")

    loops = [r for r in rows if r["strategy"] == "while_loop"]
    if loops:
        print()
        print(f"while_loop (cap {args.while_max_iter}, tol={args.tol:g}, patience={args.patience}): "
              f"run_s is a MEASURED time-to-stop (steady, compile excluded)")
        cols = (f"{'precision':<9} {'stopped at':>10} {'run_s':>8} {'ms/iter':>8} {'compile_s':>9} "
                f"{'first_call_s':>12} {'final loglik':>14} {'final gap':>10} {'within gap':>10}")
        print(cols)
        print("-" * len(cols))
        for r in loops:
            stop = str(r["n_run"]) + ("" if r["stopped_early"] else " (cap)")
            print(f"{r['precision']:<9} {stop:>10} {r['run_s']:8.4f} {r['ms_per_iter']:8.4f} {r['compile_s']:9.3f} "
                  f"{r['first_call_s']:12.3f} {r['loglik']:14.4f} {r['final_gap']:10.4f} "
                  f"{'yes' if r['final_gap'] <= args.gap else 'no':>10}")
        for r in loops:
            if not r["stopped_early"] and args.tol < r["relative_ulp"]:
                print(f"note: {r['precision']} hit the cap: its ELBO's relative resolution is ~{r['relative_ulp']:.1e} "
                      f"(one ulp), above tol={args.tol:g}, so it stops only if the ELBO repeats exactly "
                      f"{args.patience} times in a row")

    print()
    print(f"Reference (NOT measured by this script; figure quoted from the issue): pyPLNmodels' default fit "
          f"took {PYPLN_S} s on this machine and stopped {PYPLN_SHORT} nats short of the optimum.")
    for r in rows:
        if r["strategy"] == "scan":
            if r["k"] is None:
                print(f"  {r['precision']} scan: not within {args.gap:g} nats in {r['n_run']} iterations "
                      f"(final gap {r['final_gap']:.4f}); no ratio")
                continue
            t, what = r["t_gap_s_est"], f"to within {args.gap:g} nats, estimated"
        else:
            t, what = r["run_s"], (f"measured time-to-stop, gap {r['final_gap']:.4f}" if r["stopped_early"] else
                                   f"measured, did NOT stop: hit the {r['n_run']}-iteration cap, gap {r['final_gap']:.4f}")
        r["ratio_vs_pypln"] = t / PYPLN_S
        r["ratio_vs_pypln_with_compile"] = (t + r["compile_s"]) / PYPLN_S
        faster = f" ({PYPLN_S / t:.0f}x faster)" if r["strategy"] == "scan" or r["stopped_early"] else ""
        print(f"  {r['precision']} {r['strategy']:<10}: {t:.4f} s ({what}) / {PYPLN_S} s = {t / PYPLN_S:.4f}"
              f"{faster}; adding compile_s: {t + r['compile_s']:.3f} s / {PYPLN_S} s = "
              f"{(t + r['compile_s']) / PYPLN_S:.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"header": header(args, data, argv), "optimum": args.optimum, "gap": args.gap,
                       "pyplnmodels_reference": {"seconds": PYPLN_S, "nats_short": PYPLN_SHORT,
                                                 "source": "quoted from the issue, not measured here"},
                       "rows": rows}, fh, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
