"""Which XLA:CPU flags pay on the PLN step: each flag set timed in its own process, in rounds.

XLA reads ``XLA_FLAGS`` once per process, so every configuration runs in a fresh interpreter
(``--one NAME``), and the configurations alternate over ``--rounds`` rounds so that a busy
moment of a shared machine does not favour one of them; the best round is kept. Every child
fit goes through ``plnexp.fit``, whose float64 host check raises if a flag set makes the
compiled ELBO wrong (the reason plnexp sets ``--xla_cpu_experimental_ynn_fusion_type=-reduce``).

Workload: W1 (oaks x100, float32, full model, radam_clip, strategy scan), ``--n-iter``
iterations. ``plnexp.system.runtime.SPEED_FLAGS`` is what this benchmark chose; the children run with
``PLNEXP_SPEED_FLAGS=0`` so that only the safety flag and the configuration's own flags apply.

    .venv/bin/python benchmarks/flags.py                 # every configuration, 3 rounds
    .venv/bin/python benchmarks/flags.py --rounds 5 --n-iter 300 --configs none,all
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

MOF = "--xla_backend_extra_options=xla_cpu_use_multi_output_fusion"
REGION = "--xla_cpu_copy_insertion_use_region_analysis=true"
WIDTH = "--xla_cpu_prefer_vector_width=512"
EIGEN_DOTS = "--xla_cpu_experimental_ynn_fusion_type=-reduce,-individual_dot"  # replaces the safety flag

CONFIGS = {
    "none": [],
    "multi_output_fusion": [MOF],
    "region_analysis": [REGION],
    "vector_width_512": [WIDTH],
    "eigen_dots": [EIGEN_DOTS],
    "mof+region": [MOF, REGION],
    "mof+region+width": [MOF, REGION, WIDTH],
    "all": [MOF, REGION, WIDTH, EIGEN_DOTS],
}


def one(name: str, n_iter: int, repeats: int, gradient: str) -> dict:
    import plnexp  # after XLA_FLAGS was set by the parent

    data = plnexp.load_oaks(replication=100)
    res = plnexp.fit(
        data,
        model="full",
        optimizer="radam_clip",
        n_iter=n_iter,
        init="seed",  # the tutorial's workload (plnexp.fit's default start is the data's since #63)
        precision="float32",
        strategy="scan",
        gradient=gradient,
        repeats=repeats,
        warmup=1,
        timed=True,
        compile_cache=False,
    )  # compile_s cold, as in a sweep
    return {
        "config": name,
        "ms_per_iter": min(res.timing.runs_s) * 1e3 / res.n_iter,
        "compile_s": res.timing.compile_s,
        "loglik": res.loglik,
        "xla_flags": os.environ.get("XLA_FLAGS"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ", ".join(CONFIGS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-iter", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gradient", default="analytic", choices=["analytic", "autodiff"])
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.n_iter, args.repeats, args.gradient)))
        return 0
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        ap.error(f"--configs: unknown {', '.join(unknown)}; allowed: {', '.join(CONFIGS)}")
    print(
        f"# XLA flag benchmark: W1 scan, {args.n_iter} iterations, gradient={args.gradient}, "
        f"{args.rounds} rounds x {args.repeats} repeats (best kept)"
    )
    print(f"# machine: {platform.platform()} cpu_count={os.cpu_count()}  python {platform.python_version()}")
    best: dict[str, dict] = {}
    for r in range(args.rounds):
        for name in names:
            env = {**os.environ, "PLNEXP_SPEED_FLAGS": "0", "XLA_FLAGS": " ".join(CONFIGS[name])}
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    name,
                    "--n-iter",
                    str(args.n_iter),
                    "--repeats",
                    str(args.repeats),
                    "--gradient",
                    args.gradient,
                ],
                capture_output=True,
                text=True,
                env=env,
            )
            if out.returncode != 0:
                tail = (out.stderr.strip().splitlines() or ["?"])[-1]
                best[name] = {"config": name, "error": tail[:200]}
                print(f"#   round {r + 1} {name}: FAILED ({tail[:120]})", flush=True)
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            if name not in best or row["ms_per_iter"] < best[name].get("ms_per_iter", float("inf")):
                best[name] = row
            print(f"#   round {r + 1} {name:<22} {row['ms_per_iter']:.2f} ms/iter", flush=True)
    base = best.get("none", {}).get("ms_per_iter")
    print(f"\n{'config':<22} {'ms/iter':>8} {'x none':>7} {'compile_s':>9} {'loglik (host-checked)':>22}  flags")
    for name in names:
        row = best[name]
        if "error" in row:
            print(f"{name:<22} {'FAILED':>8}  {row['error']}")
            continue
        ratio = f"{base / row['ms_per_iter']:7.2f}" if base else f"{'-':>7}"
        print(
            f"{name:<22} {row['ms_per_iter']:8.2f} {ratio} {row['compile_s']:9.2f} {row['loglik']:22.2f}  "
            f"{' '.join(CONFIGS[name]) or '(safety flag only)'}"
        )
    print(
        "x none: speed-up over the safety flag alone (higher is faster). loglik differs between flag sets "
        "in float32 because fusions round differently; each was checked against the float64 host ELBO."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
