"""PLN-PCA: plnexp against pyPLNmodels' ``PlnPCA`` on the same synthetic counts (issue #34).

For each size n x p (``--sizes``), counts are drawn once from the PLN-PCA model
(``plnexp.simulate_pca(n, p, q=--rank, zero_fraction=--zero-fraction, seed=--seed)``: intercept
only, offsets the log of a per-row total, single-cell-like zeros) and written to a temporary
``.npz``; each fit then runs in a fresh process of its own, so that its peak memory (``ru_maxrss``
of that process: imports, data and fit) is its own:

- **pyPLNmodels**: ``PlnPCA(Y, exog=X, offsets=O, rank=q, add_const=False).fit()``, its default fit
  (Rprop, lr 0.01, at most 400 iterations, its own stopping rule; its random start from the sweep
  peer's torch seed: ``plnexp.jobs.peers.seeded_pyplnmodels``), in PyTorch float32 on the CPU,
  or on the GPU where torch sees one (``--device gpu`` puts plnexp there too; the rows then add
  each fit's peak GPU memory).
  ``fit_s``: the wall clock of ``fit()`` alone. Its fitted B, C, M, S are scored on plnexp's ELBO
  (``plnexp.jobs.peers.score_plnpca``: ``plnexp.core.reference.pca_elbo``, float64, exact log y!, as a sweep's
  ``report.peers=[pyplnmodels]`` run of model=pca is scored): ``elbo``. Where its projected time (its
  initialisation plus 400 times its per-iteration time, both from two short fits of 1 and
  1 + ``--probe-iter`` iterations) exceeds ``--peer-max-s``, only those probes run and the row says so.
  With ``--no-peer``, ``--peer-elbo`` gives its final ELBO from an earlier run as the target.
- **plnexp**, one row per optimizer of ``--optimizer`` (default rprop and adam, each at its own
  default lr: 0.01 and 0.1, chosen on oaks long before this benchmark, ``plnexp.core.optim.DEFAULT_LR``):
  ``plnexp.fit(data, model="pca", rank=q, optimizer=..., lr=--lr, strategy=--strategy, precision=--precision, n_iter=--n-iter, init=--init, compile_cache=False)``
  (init "data": C and M from the top-q singular vectors of log(1 + Y) - O less its regression on
  X, B the Poisson regression of Y given them; pyPLNmodels' init is of the same kind), timed as
  every plnexp fit is (cold AOT compile apart, then a steady run, ``block_until_ready``). ``to_target_s``: the steady seconds to reach
  pyPLNmodels' final ELBO, ``run_s x k / n_iter`` with k the first iteration whose ELBO is at or
  above it (the compiled ELBO curve; the row also gives the compiled-against-float64 error at the
  end, which must be far smaller than the margin); ``+compile`` adds the compile. ``elbo``: the
  float64 ELBO at plnexp's final parameters.

Ratios, side by side in one run: ``x_peer`` = pyPLNmodels' fit_s over plnexp's to_target_s (plnexp
steady), ``x_peer_cold`` = over plnexp's compile + its initial state's first call (``init``, in
the note: pyPLNmodels' own initialisation is part of its fit_s) + to_target_s: what a user waits
for. Sizes where pyPLNmodels did not run have no target: plnexp's row then gives its time to the
ELBO it reaches with pyPLNmodels' relative standing measured at the largest size where both ran
(``target rel``, said in the row).

    .venv/bin/python benchmarks/pca.py --n-iter 1000                           # 2,000 x 1,000 and 5,000 x 2,000
    .venv/bin/python benchmarks/pca.py --n-iter 1000 --sizes 2000x1000,5000x2000,20000x14000  # the issue's sizes
    .venv/bin/python benchmarks/pca.py --sizes 300x100 --n-iter 100              # smoke test
    .venv/bin/python benchmarks/pca.py --grid    # issue #49's table: zeros 10/50/90/95%, ranks 5 and 10, both sizes

``--grid``: the default call (``plnexp.fit(Y, model="pca", rank=q)``: optimizer newton) against
pyPLNmodels at zero fractions :data:`GRID_ZEROS` and ranks :data:`GRID_RANKS`, at ``--sizes``, one
table each (the other options as given).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _header import machine_header

PEER_MAXITER = 400  # pyPLNmodels' default maxiter
GRID_ZEROS = (0.1, 0.5, 0.9, 0.95)
GRID_RANKS = (5, 10)


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


def _gpu_peak_gb_jax() -> float:
    """JAX's peak device memory in GB where the fit ran on a GPU (NaN on the CPU)."""
    import jax

    dev = jax.devices()[0]
    stats = dev.memory_stats() if dev.platform == "gpu" else None
    return stats["peak_bytes_in_use"] / 1e9 if stats and "peak_bytes_in_use" in stats else float("nan")


def _load(path: str, full_offsets: bool = False):
    """Y, O, X of the file; O is the (n,) column where the offsets are one per row (plnexp's Data
    keeps them so), or the (n, p) array pyPLNmodels takes with ``full_offsets``."""
    z = np.load(path)
    Y, O, X = z["Y"], z["O"], z["X"]
    if full_offsets and O.ndim == 1:
        O = np.ascontiguousarray(np.broadcast_to(O[:, None], Y.shape))
    return Y, O, X


def child_peer(args) -> dict:
    """pyPLNmodels' default PlnPCA fit (or a probe of ``--probe-iter`` iterations), scored on plnexp's ELBO."""
    import torch

    from plnexp.jobs import peers

    Y, O, X = _load(args.file, full_offsets=True)
    kwargs = {"maxiter": args.probe_iter, "tol": 0.0} if args.probe else {}
    cuda = torch.cuda.is_available()  # pyPLNmodels fits on the GPU wherever torch sees one
    with peers.seeded_pyplnmodels(Y, O, X, rank=args.rank) as model:  # from the sweep peer's seed
        t0 = time.perf_counter()
        with peers.quiet():
            model.fit(**kwargs)
        if cuda:
            torch.cuda.synchronize()
        fit_s = time.perf_counter() - t0
    n_iter = len(model._elbo_criterion_monitor.elbo_list)
    elbo, _ = peers.score_plnpca(Y, O, X, model)  # plnexp's exact PCA ELBO, as a sweep's pca peer run is scored
    gpu_gb = torch.cuda.max_memory_allocated() / 1e9 if cuda else float("nan")
    return {
        "fit_s": fit_s,
        "n_iter": n_iter,
        "elbo": elbo,
        "peak_gb": _peak_gb(),
        "gpu_peak_gb": gpu_gb,
        "probe": bool(args.probe),
    }


def child_plnexp(args) -> dict:
    """plnexp's PLN-PCA fit, timed; the first iteration at or above ``--target`` (if given)."""
    import jax

    import plnexp
    from plnexp.strategies import base

    init_s = []
    init_state = base.init_state

    def timed_init(*a, **k):  # the initial state's wall clock (its first call: compiles included)
        t0 = time.perf_counter()
        state = jax.block_until_ready(init_state(*a, **k))
        init_s.append(time.perf_counter() - t0)
        return state

    base.init_state = timed_init
    Y, O, X = _load(args.file)
    data = plnexp.as_data(Y, offsets=O, log_offsets=True)  # X: the intercept, which as_data adds
    assert data.X.shape == X.shape and np.array_equal(data.X, X)
    res = plnexp.fit(
        data,
        model="pca",
        rank=args.rank,
        optimizer=args.optimizer,
        lr=args.lr,
        strategy=args.strategy,
        precision=args.precision,
        n_iter=args.n_iter,
        block_rows=args.block_rows or None,
        init=args.init,
        device=args.device,
        compile_cache=False,  # a cold compile, as a first fit of this shape pays
    )
    t = res.timing
    curve = np.asarray(res.elbo[: res.n_iter], dtype=float)
    out = {
        "compile_s": t.compile_s,
        "init_s": init_s[0] if init_s else float("nan"),
        "run_s": t.run_s,
        "ms_per_iter": t.ms_per_iter,
        "n_iter": res.n_iter,
        "elbo": res.loglik,
        "jit_error": abs(res.extra.get("final_elbo_jit", np.nan) - res.loglik),
        "curve_max": float(np.nanmax(curve)),
        "peak_gb": _peak_gb(),
        "gpu_peak_gb": _gpu_peak_gb_jax(),
        "curve": curve.tolist(),
    }
    return out


def first_at(curve: list[float], target: float) -> int | None:
    """The first iteration k (updates done) whose ELBO is at or above ``target``."""
    hits = np.flatnonzero(np.asarray(curve) >= target)
    return int(hits[0]) if len(hits) else None


def _gpu_note(result: dict) -> str:
    gb = result.get("gpu_peak_gb", float("nan"))
    return "" if np.isnan(gb) else f"; GPU peak {gb:.2f} GB"


def _child(kind: str, args, file: str, extra: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--file", file, "--rank", str(args.rank), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        n, p = part.lower().split("x")
        out.append((int(n), int(p)))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2000x1000,5000x2000", help="n x p, comma-separated")
    ap.add_argument("--rank", type=int, default=5)
    ap.add_argument("--zero-fraction", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--optimizer",
        default="newton",
        help="plnexp's optimizers, comma-separated: one row each, at its default lr (newton: pca's default, no lr)",
    )
    ap.add_argument(
        "--lr", type=float, default=None, help="plnexp's learning rate (one optimizer only; default: its own)"
    )
    ap.add_argument("--strategy", default="scan")
    ap.add_argument("--precision", default="float32")
    ap.add_argument(
        "--device", default="cpu", help="plnexp's device (cpu or gpu); pyPLNmodels takes the GPU where torch sees one"
    )
    ap.add_argument("--n-iter", type=int, default=400)
    ap.add_argument(
        "--init", default="data", help="plnexp's init: seed or data (see plnexp.core.initial_state.init_state)"
    )
    ap.add_argument("--block-rows", type=int, default=0, help="plnexp's block_rows (0: every row at once)")
    ap.add_argument("--peer-max-s", type=float, default=900.0, help="pyPLNmodels' full fit only where projected below")
    ap.add_argument("--probe-iter", type=int, default=5)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument(
        "--target-rel",
        type=float,
        default=None,
        help="where pyPLNmodels does not run: its relative standing below plnexp's final ELBO from an earlier run",
    )
    ap.add_argument(
        "--peer-elbo",
        default=None,
        help="where pyPLNmodels does not run (--no-peer): its final ELBO from an earlier run, one per size, "
        "comma-separated (e.g. -631293.72,-3133033.92): the target",
    )
    ap.add_argument("--grid", action="store_true", help="every zero fraction of GRID_ZEROS and rank of GRID_RANKS")
    ap.add_argument("--child", choices=["peer", "plnexp"], help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peer_elbo and not args.no_peer:
        ap.error("--peer-elbo: only with --no-peer (where pyPLNmodels runs, its own final ELBO is the target)")

    if args.grid:
        rest = list(sys.argv[1:] if argv is None else argv)
        rest.remove("--grid")
        for rank in GRID_RANKS:
            for zeros in GRID_ZEROS:
                main([*rest, "--zero-fraction", str(zeros), "--rank", str(rank), "--optimizer", args.optimizer])
                print(flush=True)
        return
    optimizers = args.optimizer.split(",")
    if args.lr and len(optimizers) > 1:
        ap.error("--lr: with one --optimizer only (each of several runs at its own default lr)")
    if args.child:
        result = child_peer(args) if args.child == "peer" else child_plnexp(args)
        print(json.dumps(result))
        return

    import plnexp
    from plnexp.core.data import device_offsets

    print("\n".join(machine_header("PLN-PCA: plnexp against pyPLNmodels' PlnPCA", argv)))
    print(
        f"# rank {args.rank}, zero fraction {args.zero_fraction}, seed {args.seed}; plnexp: {args.strategy}, "
        f"{args.optimizer} (lr {args.lr or 'default'}), {args.precision}, init {args.init}, {args.n_iter} iterations"
        + (f", block_rows {args.block_rows}" if args.block_rows else "")
    )
    try:
        from importlib.metadata import version

        print(f"# pyPLNmodels {version('pyPLNmodels')}, torch {version('torch')}")
    except Exception:  # noqa: BLE001 - not installed: plnexp's rows only
        pass
    from plnexp.jobs import peers

    why = peers.pyplnmodels_available()
    have_peer = not args.no_peer and why is None
    if why:
        print(f"# pyPLNmodels: {why}: plnexp's rows only")
    header = (
        f"{'n x p':>13} {'who':>17} {'iters':>6} {'compile_s':>9} {'s/iter':>8} {'to_target_s':>11} "
        f"{'fit_s':>8} {'elbo (float64)':>17} {'peak_GB':>7} {'x_peer':>7} {'x_peer_cold':>11}  note"
    )
    rows = [header]
    print(header, flush=True)
    rel_standing = args.target_rel  # pyPLNmodels' final ELBO relative to plnexp's, at the largest size both ran
    sizes = _sizes(args.sizes)
    given = [float(v) for v in args.peer_elbo.split(",")] if args.peer_elbo else [None] * len(sizes)
    if len(given) != len(sizes):
        raise SystemExit(f"--peer-elbo: {len(given)} values for {len(sizes)} sizes")
    with tempfile.TemporaryDirectory() as tmp:
        for (n, p), peer_elbo in zip(sizes, given):
            data = plnexp.simulate_pca(n=n, p=p, q=args.rank, zero_fraction=args.zero_fraction, seed=args.seed)
            file = os.path.join(tmp, f"{n}x{p}.npz")
            O = device_offsets(data.O)  # per-row offsets: their (n, 1) column, as a fit's device gets them
            np.savez(file, Y=data.Y.astype(np.float32), O=O[:, 0] if O.shape[1] == 1 else O, X=data.X)
            zeros = float(np.mean(data.Y == 0))
            del data
            size = f"{n:,}x{p:,}"
            peer = None
            note_peer = ""
            if have_peer:
                # two probes, of 1 and 1 + --probe-iter iterations (each a fresh process, its own init
                # included): their difference is the iterations' time alone
                short = _child("peer", args, file, ["--probe", "--probe-iter", "1"])
                probe = _child("peer", args, file, ["--probe", "--probe-iter", str(1 + args.probe_iter)])
                per_iter = max(probe["fit_s"] - short["fit_s"], 0.0) / max(probe["n_iter"] - short["n_iter"], 1)
                setup_s = max(short["fit_s"] - per_iter * short["n_iter"], 0.0)
                projected = setup_s + per_iter * PEER_MAXITER
                if projected <= args.peer_max_s:
                    peer = _child("peer", args, file, [])
                else:
                    note_peer = (
                        f"probes of 1 and {probe['n_iter']} iterations: its init {setup_s:.0f} s, then {per_iter:.2f} "
                        f"s/iter: projected {projected / 60:.0f} min for its {PEER_MAXITER} (> --peer-max-s)"
                    )
                    line = (
                        f"{size:>13} {'pyPLNmodels':>17} {'-':>6} {'-':>9} {per_iter:8.3f} {'-':>11} {'-':>8} "
                        f"{'-':>17} {probe['peak_gb']:7.2f} {'':>7} {'':>11}  {note_peer}"
                    )
                    rows.append(line)
                    print(line, flush=True)
            if peer is not None:
                line = (
                    f"{size:>13} {'pyPLNmodels':>17} {peer['n_iter']:6d} {'-':>9} "
                    f"{peer['fit_s'] / peer['n_iter']:8.3f} {peer['fit_s']:11.2f} {peer['fit_s']:8.2f} "
                    f"{peer['elbo']:17.2f} {peer['peak_gb']:7.2f} {'':>7} {'':>11}  its default fit{_gpu_note(peer)}"
                )
                rows.append(line)
                print(line, flush=True)
            for i, optimizer in enumerate(optimizers):  # each at its own default lr, or --lr where one
                mine = _child(
                    "plnexp",
                    args,
                    file,
                    [
                        "--optimizer",
                        optimizer,
                        *(["--lr", str(args.lr)] if args.lr else []),
                        "--strategy",
                        args.strategy,
                        "--precision",
                        args.precision,
                        "--n-iter",
                        str(args.n_iter),
                        "--block-rows",
                        str(args.block_rows),
                        "--init",
                        args.init,
                        "--device",
                        args.device,
                    ],
                )
                s_iter = mine["run_s"] / mine["n_iter"]
                if peer is not None:
                    target, target_note = peer["elbo"], "target: pyPLNmodels' final ELBO"
                    if i == 0:  # the first optimizer's standing sets the larger sizes' target
                        rel_standing = (mine["elbo"] - peer["elbo"]) / abs(mine["elbo"])
                elif peer_elbo is not None:
                    target, target_note = peer_elbo, "target: pyPLNmodels' final ELBO from an earlier run (--peer-elbo)"
                elif rel_standing is not None:
                    target = mine["elbo"] - rel_standing * abs(mine["elbo"])
                    target_note = (
                        f"target rel {rel_standing:.2e} below plnexp's final (pyPLNmodels' standing at a smaller size)"
                    )
                else:
                    target, target_note = None, "no target"
                k = first_at(mine["curve"], target) if target is not None else None
                to_target = s_iter * k if k is not None else float("nan")
                margin = (mine["curve_max"] - target) if target is not None else float("nan")
                note = (
                    (f"{target_note}; reached at iteration {k}" if k is not None else f"{target_note}; not reached")
                    + (
                        f"; init {mine['init_s']:.2f} s; zeros {zeros:.0%}; compiled ELBO error {mine['jit_error']:.2g} "
                        f"(margin {margin:.3g})"
                    )
                    + _gpu_note(mine)
                )
                x = peer["fit_s"] / to_target if peer is not None and k else float("nan")
                x_cold = (
                    peer["fit_s"] / (to_target + mine["compile_s"] + mine["init_s"])
                    if peer is not None and k
                    else float("nan")
                )
                line = (
                    f"{size:>13} {'plnexp ' + optimizer:>17} {mine['n_iter']:6d} {mine['compile_s']:9.2f} {s_iter:8.3f} "
                    f"{to_target:11.2f} {mine['run_s']:8.2f} {mine['elbo']:17.2f} {mine['peak_gb']:7.2f} "
                    f"{x:7.1f} {x_cold:11.1f}  {note}"
                )
                rows.append(line)
                print(line, flush=True)
            os.unlink(file)


if __name__ == "__main__":
    main()
