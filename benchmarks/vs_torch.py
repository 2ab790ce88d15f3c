"""JAX's strategies against the PyTorch baselines (issue #10), measured side by side in one run.

Default workload W1 (the tutorial's): oaks x100 (n=11600, p=114), float32, full model, radam_clip,
1000 iterations. Each row is one ``plnexp.fit(..., timed=True)`` (the same data, initial state,
optimizer formulas and ELBO): compile apart from run, then the median of ``--repeats`` steady runs
after ``--warmup`` untimed ones (``block_until_ready``; torch on CUDA: ``torch.cuda.synchronize``).

Rows, for each gradient of ``--gradients`` (analytic: the hand-written gradient, plnexp's default;
autodiff: ``jax.value_and_grad`` / ``torch.func.grad_and_value``, what the tutorial and its PyTorch
companion use):

- the JAX strategies of ``--jax`` (default scan, scan_unrolled, fori_loop, while_loop with tol=0;
  the other scans compile to scan's program), the fastest of them marked ``*``;
- ``torch_eager`` and ``torch_compile`` for each ``--modes`` (torch.compile of the whole step;
  its compile_s = first call of the step minus a steady one, cold: TorchDynamo reset, Inductor's
  on-disk caches off, after a once-per-process warm-up that is printed apart);
- with ``--tutorial``, the tutorial's own level-2 JAX scan (``tutorial.py``, defects included) in a
  plain process, the figure behind the issue's JAX time (``REFERENCE``).

Ratios: ``x_scan`` = scan's ms/iter (same gradient) over the row's, ``x_best`` = the fastest JAX
strategy's over the row's (above 1: the row is faster); ``compile_x`` = the row's compile_s over
scan's; ``curve_rdiff`` = max |ELBO_row - ELBO_scan| / |ELBO_scan| (in float32 with radam_clip this
grows with the iterations for any two differently fused programs: see tests/test_strategies.py).

    .venv/bin/python benchmarks/vs_torch.py                                   # W1 (many minutes: docs/results.md)
    .venv/bin/python benchmarks/vs_torch.py --n-iter 20 --replication 1 --repeats 1 --warmup 0  # smoke test
    .venv/bin/python benchmarks/vs_torch.py --gradients analytic --modes default,max-autotune-no-cudagraphs
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import plnexp

import numpy as np
from _header import machine_header  # benchmarks/, on sys.path as the script's folder

import plnexp.fitting.engine  # (plnexp.fitting.engine.resolve_device below: `import plnexp` imports it lazily)
from plnexp.strategies import TORCH_STRATEGIES, torch_loops

JAX_STRATEGIES = [s for s in plnexp.STRATEGIES if s not in TORCH_STRATEGIES]
REFERENCE = (
    "issue #10's reproductions on a 2-core CPU, 1000 iterations of W1: torch eager 34.5 s, "
    "torch.compile 17.8 s, the tutorial's JAX scan 17.7 s"
)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n-iter", type=int, default=1000, help="iterations per fit (default 1000)")
    ap.add_argument("--replication", type=int, default=100, help="oaks row replication (default 100)")
    ap.add_argument("--repeats", type=int, default=2, help="steady runs per row, median kept (default 2)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs before the repeats (default 1)")
    ap.add_argument(
        "--jax",
        default="scan,scan_unrolled,fori_loop,while_loop",
        help="comma-separated JAX strategies (scan always included); allowed: " + ", ".join(JAX_STRATEGIES),
    )
    ap.add_argument(
        "--modes",
        default="default",
        help="torch.compile modes, one torch_compile row each; allowed: " + ", ".join(torch_loops.COMPILE_MODES),
    )
    ap.add_argument("--gradients", default="analytic,autodiff", help="analytic, autodiff or both (default both)")
    ap.add_argument("--no-torch-eager", action="store_true", help="skip the torch_eager rows")
    ap.add_argument("--tutorial", action="store_true", help="add the tutorial's level-2 scan in a plain process")
    ap.add_argument("--model", default="full", choices=["full", "profiled"])
    ap.add_argument("--optimizer", default="radam_clip")
    ap.add_argument("--precision", default="float32", choices=["float32", "float64"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu", "auto"])
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    split = lambda text: [s.strip() for s in text.split(",") if s.strip()]
    args.jax = list(dict.fromkeys(["scan", *split(args.jax)]))
    args.modes, args.gradients = split(args.modes), split(args.gradients)
    for flag, values, allowed in (
        ("--jax", args.jax, JAX_STRATEGIES),
        ("--modes", args.modes, torch_loops.COMPILE_MODES),
        ("--gradients", args.gradients, ("analytic", "autodiff")),
    ):
        unknown = [v for v in values if v not in allowed]
        if unknown:
            ap.error(f"{flag}: unknown {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    if args.n_iter < 1 or args.repeats < 1 or args.warmup < 0 or not args.gradients:
        ap.error("--n-iter and --repeats must be >= 1, --warmup >= 0, --gradients not empty")
    if not torch_loops.torch_available():
        ap.error('PyTorch is not installed; install the optional extra: pip install -e ".[torch]" (torch==2.13.0)')
    return args


def header(args, data) -> list[str]:
    import torch

    return machine_header("plnexp: JAX strategies vs PyTorch baselines") + [
        f"# torch {torch.__version__}  intra-op threads during a fit: the CPUs this process may use "
        f"(here {torch.get_num_threads()} by default)  cuda={torch.cuda.is_available()}",
        f"# data: {data.name} n={data.n} p={data.p} d={data.d}  model={args.model}  optimizer={args.optimizer}  "
        f"precision={args.precision}  device={args.device}",
        f"# n_iter={args.n_iter}  repeats={args.repeats}  warmup={args.warmup}  gradients={','.join(args.gradients)}",
        f"# reference: {REFERENCE}",
    ]


def fit_row(data, args, strategy: str, gradient: str, mode: str = "default") -> dict:
    t0 = time.perf_counter()
    res = plnexp.fit(
        data,
        model=args.model,
        optimizer=args.optimizer,
        n_iter=args.n_iter,
        init="seed",  # W1, the tutorial's workload (plnexp.fit's default start is the data's since #63)
        precision=args.precision,
        device=args.device,
        strategy=strategy,
        gradient=gradient,
        mode=mode,
        tol=0.0,
        repeats=args.repeats,
        warmup=args.warmup,
        timed=True,
    )
    t = res.timing
    label = strategy if strategy != "torch_compile" or mode == "default" else f"torch_compile ({mode})"
    print(f"#   done {label:<40} {gradient:<9} in {time.perf_counter() - t0:.1f} s", flush=True)
    return {
        "row": label,
        "strategy": strategy,
        "mode": mode,
        "gradient": gradient,
        "n_run": res.n_iter,
        "compile_s": t.compile_s,
        "run_s": t.run_s,
        "ms_per_iter": t.ms_per_iter,
        "runs_s": list(t.runs_s),
        "final_elbo": float(res.loglik),
        "curve": res.elbo[: res.n_iter],
    }


def tutorial_row(args) -> dict:
    from strategies import tutorial_plain_process  # benchmarks/strategies.py

    out = tutorial_plain_process(args)
    run_s = statistics.median(out["runs_s"])
    print("#   done the tutorial's scan in a plain process", flush=True)
    return {
        "row": "tutorial scan (plain process)",
        "strategy": "tutorial",
        "mode": "",
        "gradient": "autodiff",
        "n_run": args.n_iter,
        "compile_s": out["compile_s"],
        "run_s": run_s,
        "ms_per_iter": 1e3 * run_s / args.n_iter,
        "runs_s": out["runs_s"],
    }


def main(argv=None) -> int:
    plnexp.system.runtime.configure()  # first: XLA_FLAGS and SciPy's OpenBLAS threads, before JAX starts its backend
    args = parse_args(argv)
    data = plnexp.load_oaks(replication=args.replication)
    lines = header(args, data)
    for line in lines:
        print(line, flush=True)
    from plnexp.strategies.torch_pln.program import warm_up

    device_type = (
        "cuda"
        if args.device != "cpu" and plnexp.fitting.engine.resolve_device(args.device).platform == "gpu"
        else "cpu"
    )
    print(
        f"# torch.compile process warm-up (Inductor's imports and workers, one trivial kernel; not in any "
        f"compile_s): {warm_up(device_type):.1f} s",
        flush=True,
    )

    rows = []
    for gradient in args.gradients:
        for name in args.jax:
            rows.append(fit_row(data, args, name, gradient))
        if not args.no_torch_eager:
            rows.append(fit_row(data, args, "torch_eager", gradient))
        for mode in args.modes:
            rows.append(fit_row(data, args, "torch_compile", gradient, mode))
    if args.tutorial:
        rows.append(tutorial_row(args))

    cols = (
        f"{'row':<42} {'gradient':<9} {'iters':>6} {'compile_s':>10} {'run_s':>9} {'ms/iter':>9} {'x_scan':>7} "
        f"{'x_best':>7} {'compile_x':>10} {'curve_rdiff':>12}"
    )
    print()
    print(cols)
    print("-" * len(cols))
    best = {}
    for gradient in args.gradients:
        jax_rows = [r for r in rows if r["gradient"] == gradient and r["strategy"] in args.jax]
        best[gradient] = min(jax_rows, key=lambda r: r["ms_per_iter"])
    for r in rows:
        g = r["gradient"]
        scan = next((s for s in rows if s["strategy"] == "scan" and s["gradient"] == g), None)
        if scan is None:  # the tutorial's row: compared with the analytic scan
            scan = next(s for s in rows if s["strategy"] == "scan")
        fastest = best.get(g) or best[args.gradients[0]]
        r["x_scan"] = scan["ms_per_iter"] / r["ms_per_iter"]
        r["x_best"] = fastest["ms_per_iter"] / r["ms_per_iter"]
        r["compile_x"] = r["compile_s"] / scan["compile_s"] if r["compile_s"] > 0 and scan["compile_s"] > 0 else None
        if "curve" in r:
            ref = scan["curve"][: len(r["curve"])]
            r["curve_rdiff"] = float(np.max(np.abs(r["curve"][: len(ref)] - ref) / np.abs(ref)))
        f = lambda v, spec: format(v, spec) if v is not None else format("-", spec.split(".")[0])
        label = r["row"] + (" *" if r is fastest else "")
        print(
            f"{label:<42} {g:<9} {r['n_run']:>6} {r['compile_s']:>10.3f} {r['run_s']:>9.3f} {r['ms_per_iter']:>9.3f} "
            f"{r['x_scan']:>7.2f} {r['x_best']:>7.2f} {f(r['compile_x'], '>10.2f')} {f(r.get('curve_rdiff'), '>12.2e')}"
        )
    print(
        "x_scan, x_best: scan's / the fastest JAX strategy's (*) ms/iter over the row's, same gradient (above 1: "
        "the row is faster); compile_x: the row's compile_s over scan's."
    )
    print()
    for gradient in args.gradients:
        scan = next(r for r in rows if r["strategy"] == "scan" and r["gradient"] == gradient)
        for r in rows:
            if r["gradient"] == gradient and r["strategy"] in TORCH_STRATEGIES:
                compile_part = (
                    f", compile {r['compile_s']:.2f} s = {r['compile_s'] / scan['compile_s']:.1f}x scan's "
                    f"{scan['compile_s']:.2f} s"
                    if r["compile_s"] > 0
                    else ""
                )
                print(
                    f"{gradient:<9} {r['row']:<40} steady {r['run_s']:.2f} s = {r['run_s'] / scan['run_s']:.2f}x scan's "
                    f"{scan['run_s']:.2f} s, {r['run_s'] / best[gradient]['run_s']:.2f}x the fastest JAX "
                    f"({best[gradient]['row']}){compile_part}"
                )
    if args.json:
        for r in rows:
            r.pop("curve", None)
        with open(args.json, "w") as fh:
            json.dump({"header": lines, "rows": rows}, fh, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
