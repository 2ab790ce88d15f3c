"""One fit across processes (issue #51): ms/iteration and each process's peak memory, N = 1 and 2.

Each fit is ``python -m plnexp run strategy=scan_sharded processes=N ...`` in a process of its own
(N = 2: its launcher starts the two JAX processes on this machine, gloo between them; each reads only
its rows), logged into a store of this benchmark's own (a temporary folder): the time per iteration is
the run's ``ms_per_iter`` (plnexp's timed runs, compile timed apart as ``compile_s``); the peak
resident memory is ``ru_maxrss`` of the process that fits: for N = 1 the run's process
(``os.wait4``), for N = 2 each process's own, which process 0 logs on the run
(``peak_rss_mb_process_<i>``). Both include reading the data and compiling, as a user's process does.

The cases:

- ``full``: the full model on oaks replicated to ``--rows`` rows (default 1,724 x 116 = 199,984 rows
  x 114);
- ``pca``: PLN-PCA rank ``--rank`` on synthetic counts ``--pca-rows`` x ``--pca-p`` with
  ``--zero-fraction`` zeros (``dataset=synthetic_pca``), dense counts (Newton, every row at once),
  or with ``--sparse`` kept sparse (``dataset.sparse=true``: each device its rows' CSR; the blocked
  fit, ``model.block_rows=--block-rows``, rprop, ``strategy.via=shard_map``); each
  process draws only the blocks of rows it holds (per-block seeds: the same data for N = 1 and 2).

One device per process (``JAX_NUM_CPU_DEVICES=--devices``), float32, ``init`` the model's default,
``dataset.optimum=false`` (no best known ELBO computed: not the point). The ratios are N = 2's over
N = 1's (time: < 1 is faster; memory: each process's share of the one-process fit's)::

    .venv/bin/python benchmarks/processes.py                       # the sizes of issue #51
    .venv/bin/python benchmarks/processes.py --rows 2000 --pca-rows 2000 --pca-p 200 --iterations 5
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _header import machine_header

REPO = Path(__file__).resolve().parent.parent
OAKS_ROWS = 116


def cases(args) -> dict[str, list[str]]:
    replication = max(1, math.ceil(args.rows / OAKS_ROWS))
    return {
        "full": ["dataset=oaks", f"dataset.replication={replication}", "model=full"],
        "pca": [
            "dataset=synthetic_pca",
            f"dataset.n={args.pca_rows}",
            f"dataset.p={args.pca_p}",
            f"dataset.q={args.rank}",
            f"dataset.zero_fraction={args.zero_fraction}",
            "model=pca",
            f"model.rank={args.rank}",
            *(
                # counts kept sparse: each device its rows' CSR, densified a block at a time (rprop)
                ["dataset.sparse=true", f"model.block_rows={args.block_rows}", "strategy.via=shard_map"]
                if args.sparse
                else []
            ),
        ],
    }


def fit(case: list[str], processes: int, args, folder: Path) -> dict[str, float]:
    """One run in a process of its own: its metrics, and ``peak_rss_mb_process_0`` measured here for N = 1."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    experiment = f"processes_{len(list(folder.glob('*.log')))}"
    cmd = [
        sys.executable,
        "-m",
        "plnexp",
        "run",
        "strategy=scan_sharded",
        f"processes={processes}",
        f"n_iter={args.iterations}",
        f"repeats={args.repeats}",
        "warmup=1",
        "time_budget_s=0",
        "compile_cache=false",
        "dataset.optimum=false",
        f"precision={args.precision}",
        f"tracking_uri={uri}",
        f"experiment={experiment}",
        *case,
    ]
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(args.devices), "PYTHONPATH": str(REPO)}
    log = folder / f"{experiment}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak: the fitting process for N = 1
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"processes={processes} failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    cl = MlflowClient(tracking_uri=uri)
    (run,) = cl.search_runs([cl.get_experiment_by_name(experiment).experiment_id])
    metrics = dict(run.data.metrics)
    if processes == 1:
        metrics["peak_rss_mb_process_0"] = usage.ru_maxrss / 1024  # KiB on Linux
    return metrics


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=["full", "pca", "both"], default="both")
    ap.add_argument("--rows", type=int, default=1724 * OAKS_ROWS, help="full: oaks replicated to this many rows")
    ap.add_argument("--pca-rows", type=int, default=100_000)
    ap.add_argument("--pca-p", type=int, default=5_000)
    ap.add_argument("--rank", type=int, default=10)
    ap.add_argument("--zero-fraction", type=float, default=0.95)
    ap.add_argument("--sparse", action="store_true", help="pca: counts kept sparse (blocked fit, via=shard_map)")
    ap.add_argument("--block-rows", type=int, default=1000, help="pca --sparse: model.block_rows")
    ap.add_argument("--iterations", type=int, default=20, help="n_iter of each fit")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each compiled fit")
    ap.add_argument("--devices", type=int, default=1, help="JAX CPU devices per process")
    ap.add_argument("--precision", choices=["float32", "float64"], default="float32")
    args = ap.parse_args(argv)
    print("\n".join(machine_header("one fit across processes (issue #51)", argv)))
    chosen = cases(args) if args.case == "both" else {args.case: cases(args)[args.case]}
    print(
        f"{'case':<5} {'N':>2} {'ms/iter':>10} {'compile s':>10} {'peak MB per process':>24} {'x time':>7} {'x memory':>16}"
    )
    with tempfile.TemporaryDirectory(prefix="plnexp-processes-") as tmp:
        for name, case in chosen.items():
            print(f"# {name}: {' '.join(case)}")
            one = None
            for n in (1, 2):
                m = fit(case, n, args, Path(tmp))
                peaks = [m[f"peak_rss_mb_process_{i}"] for i in range(n)]
                ms, compile_s = m.get("ms_per_iter", math.nan), m.get("compile_s", math.nan)
                if one is None:
                    one = (ms, peaks[0])
                ratios = f"{ms / one[0]:>7.2f} {' '.join(f'{p / one[1]:.2f}' for p in peaks):>16}"
                shown = " ".join(f"{p:.0f}" for p in peaks)
                print(f"{name:<5} {n:>2} {ms:>10.3f} {compile_s:>10.2f} {shown:>24} {ratios}", flush=True)


if __name__ == "__main__":
    main()
