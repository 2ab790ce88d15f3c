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

pyPLNmodels (issue #20; the optional extra ``.[peers]``, never a dependency of plnexp's fits), when it is installed:

- its default fit on the same oaks data (counts, log offsets, intercept only; checked against
  ``plnexp.load_oaks()``): ``Pln.from_formula("endog ~ 1", data=load_oaks()).fit()``, median of
  ``--repeats`` steady fits after ``--warmup`` in this process. Its own ELBO uses Stirling's
  approximation of log y! (and float32), so its gap is that of the float64 host ELBO (exact log y!,
  ``plnexp.core.reference.elbo``) at its fitted parameters (B and Sigma in closed form from M and S,
  as pyPLNmodels computes them).
- time to within ``--gap``: the first iteration k within the gap is found with one fit of
  ``fit(maxiter=--pypln-max-iter, tol=0)`` whose steps are checked with the host ELBO, then
  ``fit(maxiter=k, tol=0)`` is timed (steady, median): a measured time for a k chosen in hindsight.
- one-off fits from fresh processes (``--oneoff-runs`` each, median; ``--no-oneoff`` skips): the
  plnexp call a user makes, ``plnexp.fit(plnexp.load_oaks(), model="profiled", optimizer="rprop",
  strategy="while_loop", tol=1e-9, precision=...)`` per precision, and pyPLNmodels' default fit;
  process_s is the wall clock of the whole ``python -c`` process (imports included), import_s and
  fit_s (imports excluded: data loading + fit) are timed inside it. Each plnexp run uses a fresh
  temporary PLNEXP_OUTPUTS twice: its first process meets a cold compile cache, its second a
  warm one if plnexp.fit uses a persistent cache by default (read from compile_s; JAX_COMPILATION_CACHE_*
  variables are removed from the children's environment). The children get this process's
  environment as it was before plnexp was imported. These run without pyPLNmodels too.

pyPLNmodels 1.0.x imports ``pkg_resources``, which setuptools >= 81 no longer ships; where it is
missing a stand-in providing ``resource_stream`` (all pyPLNmodels uses) is put in ``sys.modules``
before pyPLNmodels is imported, here and in its child processes.

Install it without pulling CUDA: the ``torch`` extra first (torch==2.13.0, a CPU wheel), then
pyPLNmodels, whose torch requirement that satisfies:

    .venv/bin/pip install -e ".[torch]" && .venv/bin/pip install pyPLNmodels

Usage:

    .venv/bin/python benchmarks/time_to_optimum.py                       # the full run (minutes: docs/results.md)
    .venv/bin/python benchmarks/time_to_optimum.py --n-iter 50 --gap 50 --no-pypln --oneoff-runs 1  # a quick check
    .venv/bin/python benchmarks/time_to_optimum.py --precisions float64 --tol 1e-10 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

# the environment of the one-off child processes: as it was before plnexp's import sets XLA_FLAGS
ENV_BEFORE_PLNEXP = dict(os.environ)

import plnexp  # noqa: E402 (first of the JAX side; main() applies its process settings)
import plnexp.jobs.peers  # noqa: E402 (its pyPLNmodels import and scoring)

from _header import machine_header  # noqa: E402 (benchmarks/, on sys.path as the script's folder)
import numpy as np  # noqa: E402 - after plnexp, as above

OPTIMUM = -32026.016  # oaks, exact log-factorial, independent float64 L-BFGS fit
PYPLN_INSTALL = '.venv/bin/pip install -e ".[torch]" && .venv/bin/pip install pyPLNmodels'
PRECISIONS = ("float64", "float32")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n-iter", type=int, default=1000, help="scan iterations per fit (default 1000)")
    ap.add_argument("--precisions", default="float64,float32", help="comma-separated (default float64,float32)")
    ap.add_argument("--gap", type=float, default=0.01, help="target: ELBO >= optimum - gap (nats, default 0.01)")
    ap.add_argument("--optimum", type=float, default=OPTIMUM, help=f"reference optimum (default {OPTIMUM})")
    ap.add_argument("--replication", type=int, default=1, help="oaks row replication (default 1: n=116)")
    ap.add_argument("--model", default="profiled", choices=["full", "profiled"])
    ap.add_argument("--optimizer", default="rprop")
    ap.add_argument("--repeats", type=int, default=3, help="steady runs per timed fit, median kept (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs before the repeats (default 1)")
    ap.add_argument(
        "--host-check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="check/find k with the float64 host ELBO of k-iteration fits (default on)",
    )
    ap.add_argument(
        "--while-loop",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run strategy while_loop with early stopping (default on)",
    )
    ap.add_argument(
        "--tol",
        type=float,
        default=1e-9,
        help="while_loop: stop when the relative ELBO change stays below tol (default 1e-9)",
    )
    ap.add_argument(
        "--patience", type=int, default=10, help="while_loop: ... for this many consecutive iterations (default 10)"
    )
    ap.add_argument("--while-max-iter", type=int, default=5000, help="while_loop iteration cap (default 5000)")
    ap.add_argument(
        "--pypln",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run pyPLNmodels when it is installed (default on)",
    )
    ap.add_argument(
        "--pypln-max-iter",
        type=int,
        default=5000,
        help="pyPLNmodels: iteration cap of the search for its first iteration within --gap (default 5000)",
    )
    ap.add_argument(
        "--oneoff",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time one-off fits from fresh processes (default on)",
    )
    ap.add_argument(
        "--oneoff-runs",
        type=int,
        default=3,
        help="fresh processes per one-off fit and cache state, median kept (default 3)",
    )
    ap.add_argument("--oneoff-timeout", type=float, default=300.0, help="seconds per one-off process (default 300)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    args.precisions = [s.strip() for s in args.precisions.split(",") if s.strip()]
    bad = [s for s in args.precisions if s not in PRECISIONS]
    if bad or not args.precisions:
        ap.error(f"--precisions: unknown {', '.join(bad) or '(empty)'}; allowed: {', '.join(PRECISIONS)}")
    if (
        args.n_iter < 1
        or args.while_max_iter < 1
        or args.repeats < 1
        or args.warmup < 0
        or args.patience < 1
        or args.pypln_max_iter < 1
        or args.oneoff_runs < 1
    ):
        ap.error(
            "--n-iter, --while-max-iter, --repeats, --patience, --pypln-max-iter, --oneoff-runs must be >= 1, "
            "--warmup >= 0"
        )
    if args.gap < 0 or args.tol < 0:
        ap.error("--gap and --tol must be >= 0")
    return args


def header(args, data, argv) -> list[str]:
    return machine_header("plnexp time-to-optimum benchmark", argv) + [
        f"# plnexp {package_version('plnexp')}  pyPLNmodels {package_version('pyPLNmodels') or 'not installed'}  "
        f"torch {package_version('torch') or 'not installed'}",
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
            res = plnexp.fit(
                self.data,
                model=self.args.model,
                optimizer=self.args.optimizer,
                n_iter=k,
                init="seed",  # the start its figures were measured from (plnexp.fit's default is the data's since #63)
                precision=self.precision,
                strategy="scan",
                timed=False,
            )
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
    res = plnexp.fit(
        data,
        model=args.model,
        optimizer=args.optimizer,
        n_iter=n_iter,
        init="seed",  # as the fits of k iterations above
        precision=precision,
        strategy=strategy,
        tol=args.tol,
        patience=args.patience,
        repeats=args.repeats,
        warmup=args.warmup,
        first_call=True,
        timed=True,  # first_call_s is reported
        compile_cache=False,
    )  # and compile_s cold (the one-off fits below use the default)
    return res, time.perf_counter() - t0


# ---------------------------------------------------------------- pyPLNmodels (benchmark only) and one-off fits

# pyPLNmodels 1.0.x's data loaders import pkg_resources (gone from setuptools >= 81) for resource_stream
# only: where it is missing, a stand-in with that one function. Source text, run in the children (this
# process imports pyPLNmodels through plnexp.jobs.peers.import_pyplnmodels, which does the same).
PKG_RESOURCES_SHIM = """\
import os as _os, sys as _sys, types as _types
try:
    import pkg_resources as _pkg_resources
except ImportError:
    _m = _types.ModuleType("pkg_resources")
    _m.resource_stream = lambda mod, name: open(_os.path.join(_os.path.dirname(_sys.modules[mod].__file__), name), "rb")
    _sys.modules["pkg_resources"] = _m
"""

# the one-off fits, each run as `python -c` in a fresh process; the child prints one line "@@<json>"
PLNEXP_ONEOFF = """\
import time
t0 = time.perf_counter()
import plnexp
t1 = time.perf_counter()
res = plnexp.fit(plnexp.load_oaks(), {call})
t2 = time.perf_counter()
import json
t = res.timing
print("@@" + json.dumps({{"import_s": t1 - t0, "fit_s": t2 - t1, "n_iter": res.n_iter, "loglik": float(res.loglik),
                         "compile_s": t.compile_s, "run_s": t.run_s,
                         "cache_hits": getattr(t, "compile_cache_hits", None)}}))
"""
PYPLN_ONEOFF = """\
import time
t0 = time.perf_counter()
{shim}import pyPLNmodels
from pyPLNmodels import Pln, load_oaks
t1 = time.perf_counter()
pln = Pln.from_formula("endog ~ 1", data=load_oaks()).fit()
t2 = time.perf_counter()
import json, numpy as np
np.savez({npz!r}, M=pln.latent_mean.double().numpy(), S=pln.latent_sqrt_variance.double().numpy())
print("@@" + json.dumps({{"import_s": t1 - t0, "fit_s": t2 - t1,
                         "n_iter": len(pln._elbo_criterion_monitor.elbo_list)}}))
"""


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" (1, 5, 15 min; {os.cpu_count()} CPUs)"
    except OSError:
        return "unavailable"


def pypln_available() -> bool:
    return importlib.util.find_spec("pyPLNmodels") is not None


def import_pypln():
    return plnexp.jobs.peers.import_pyplnmodels()  # with its pkg_resources stand-in where needed


def exact_elbo_of(M, S, data) -> float:
    """Float64 host ELBO (exact log y!) at pyPLNmodels' variational parameters M (uncentred: Z = O + M)
    and S, with B and Sigma in their closed forms, as pyPLNmodels' profiled ELBO takes them."""
    return plnexp.jobs.peers.score(data, M, S)[0]


def pypln_exact_elbo(pln, data) -> float:
    return exact_elbo_of(pln.latent_mean.double().numpy(), pln.latent_sqrt_variance.double().numpy(), data)


class _Reached(Exception):
    pass


def pypln_bench(pp, data, args) -> dict:
    """pyPLNmodels' default fit (steady, median) and its time to within the gap, in this process."""
    Pln, oaks = pp.Pln, pp.load_oaks()
    quiet = io.StringIO()  # its progress bar and messages ("Taking the offsets from the data given.", ...)

    def model():
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch: "The given NumPy array is not writable" (pandas' arrays)
            return Pln.from_formula("endog ~ 1", data=oaks)

    probe = model()  # same data as plnexp's? (float32 in pyPLNmodels)
    same = {
        name: float(np.max(np.abs(getattr(probe, attr).double().numpy() - ref)))
        for name, attr, ref in (
            ("counts", "_endog", data.Y),
            ("log offsets", "_offsets", data.O),
            ("design", "_exog", data.X),
        )
        if getattr(probe, attr, None) is not None and tuple(getattr(probe, attr).shape) == ref.shape
    }
    out = {
        "version": pp.__version__,
        "data_max_abs_diff": same,
        "data_matches": len(same) == 3 and max(same.values()) < 1e-5,
    }

    def one_fit(**kw):
        pln = model()
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            t0 = time.perf_counter()
            pln.fit(**kw)
            return pln, time.perf_counter() - t0

    def steady(**kw):
        for _ in range(args.warmup):
            one_fit(**kw)
        fits = [one_fit(**kw) for _ in range(args.repeats)]
        times = [t for _, t in fits]
        pln = fits[-1][0]
        loglik = pypln_exact_elbo(pln, data)
        return {
            "run_s": float(np.median(times)),
            "runs_s": times,
            "loglik": loglik,
            "gap": args.optimum - loglik,
            "n_iter": len(pln._elbo_criterion_monitor.elbo_list),
            "own_elbo": float(pln.elbo),
        }

    out["default"] = steady()
    # first iteration within the gap: one fit with tol=0 whose every step is checked on the host
    threshold = args.optimum - args.gap
    pln = model()
    step, done = pln._trainstep, [0]

    def checked_step():
        elbo = step()
        done[0] += 1
        if pypln_exact_elbo(pln, data) >= threshold:
            raise _Reached
        return elbo

    pln._trainstep = checked_step
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            pln.fit(maxiter=args.pypln_max_iter, tol=0.0)
        out["k"], out["search_gap"] = None, args.optimum - pypln_exact_elbo(pln, data)
    except _Reached:
        out["k"] = done[0]
    if out["k"] is not None:
        out["to_gap"] = steady(maxiter=out["k"], tol=0.0)
    return out


def child_env(outputs: str) -> dict:
    env = {
        k: v
        for k, v in ENV_BEFORE_PLNEXP.items()
        if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))
    }
    env["PLNEXP_OUTPUTS"] = outputs
    return env


def run_child(code: str, env: dict, timeout: float) -> dict:
    """One fresh `python -c code` process: its wall clock and the "@@" JSON line it prints."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=tempfile.gettempdir(),
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return {"process_s": wall, **json.loads(lines[-1][2:])}


def plnexp_call(args, precision: str) -> str:
    return (
        f'model="{args.model}", optimizer="{args.optimizer}", strategy="while_loop", tol={args.tol!r}, '
        f'precision="{precision}"'
    )


def oneoff_bench(args, data, with_pypln: bool) -> dict:
    """Fresh-process fits, interleaved: per run r and precision, a cold-cache process then a warm-cache
    one in the same fresh PLNEXP_OUTPUTS; then pyPLNmodels' default fit."""
    kinds = [(p, c) for p in args.precisions for c in ("cold", "warm")] + ([("pyPLNmodels", "-")] if with_pypln else [])
    runs: dict = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="plnexp-oneoff-") as top:
        for r in range(args.oneoff_runs):
            for precision in args.precisions:
                outputs = os.path.join(top, f"outputs-{precision}-{r}")
                os.makedirs(outputs)
                code = PLNEXP_ONEOFF.format(call=plnexp_call(args, precision))
                for cache in ("cold", "warm"):
                    res = run_child(code, child_env(outputs), args.oneoff_timeout)
                    if "loglik" in res:
                        res["gap"] = args.optimum - res["loglik"]
                    res["cache_files"] = sum(len(f) for _, _, f in os.walk(os.path.join(outputs, "jax_cache")))
                    runs[(precision, cache)].append(res)
                shutil.rmtree(outputs, ignore_errors=True)
            if with_pypln:
                npz = os.path.join(top, f"pypln-{r}.npz")
                code = PYPLN_ONEOFF.format(shim=PKG_RESOURCES_SHIM, npz=npz)
                res = run_child(code, child_env(os.path.join(top, "pypln-outputs")), args.oneoff_timeout)
                if "error" not in res:
                    with np.load(npz) as z:
                        res["loglik"] = exact_elbo_of(z["M"], z["S"], data)
                    res["gap"] = args.optimum - res["loglik"]
                runs[("pyPLNmodels", "-")].append(res)
            print(f"#   done one-off run {r + 1}/{args.oneoff_runs}", flush=True)
    summary = {}
    for (what, cache), rs in runs.items():
        ok = [x for x in rs if "error" not in x]
        med = {
            key: float(np.median([x[key] for x in ok])) if ok and all(x.get(key) is not None for x in ok) else None
            for key in ("process_s", "import_s", "fit_s", "compile_s", "run_s", "n_iter", "gap")
        }
        summary[f"{what}/{cache}"] = {
            "what": what,
            "cache": cache,
            "runs": rs,
            "ok": len(ok),
            "errors": [x["error"] for x in rs if "error" in x],
            "max_gap": max((x["gap"] for x in ok), default=None),
            **med,
        }
    return summary


def fmt(x, spec, none="-"):
    return none if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def main(argv=None) -> int:
    plnexp.system.runtime.configure()  # first: XLA_FLAGS and SciPy's OpenBLAS threads, before JAX starts its backend
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    data = plnexp.load_oaks(replication=args.replication)
    for line in header(args, data, argv):
        print(line, flush=True)
    print(f"# load average at start: {load_average()} (on a shared machine the timings move with it)", flush=True)

    rows = []
    for precision in args.precisions:
        res, wall = timed_fit(data, args, precision, "scan", args.n_iter)
        t = res.timing
        gap_info = iterations_to_gap(res, data, args, precision)
        k = gap_info["k"]
        rows.append(
            {
                "precision": precision,
                "strategy": "scan",
                "n_iter": args.n_iter,
                "n_run": res.n_iter,
                "compile_s": t.compile_s,
                "first_call_s": t.first_call_s,
                "run_s": t.run_s,
                "runs_s": list(t.runs_s),
                "ms_per_iter": t.ms_per_iter,
                "loglik": float(res.loglik),
                "final_gap": args.optimum - res.loglik,
                # |jitted - host| ELBO of the final state: the resolution of the curve in this precision
                "curve_err": abs(res.extra["final_elbo_jit"] - res.loglik),
                "k": k,
                "k_curve": gap_info["k_curve"],
                "k_method": gap_info["method"],
                "host_fits": gap_info["host_fits"],
                "t_gap_s_est": t.run_s * k / res.n_iter if k is not None else None,
            }
        )
        print(f"#   done {precision} scan ({wall:.1f} s, +{gap_info['host_fits']} host-check fits)", flush=True)
        if args.while_loop:
            res, wall = timed_fit(data, args, precision, "while_loop", args.while_max_iter)
            t = res.timing
            rows.append(
                {
                    "precision": precision,
                    "strategy": "while_loop",
                    "n_iter": args.while_max_iter,
                    "n_run": res.n_iter,
                    "compile_s": t.compile_s,
                    "first_call_s": t.first_call_s,
                    "run_s": t.run_s,
                    "runs_s": list(t.runs_s),
                    "ms_per_iter": t.ms_per_iter,
                    "loglik": float(res.loglik),
                    "final_gap": args.optimum - res.loglik,
                    "curve_err": abs(res.extra["final_elbo_jit"] - res.loglik),
                    "stopped_early": res.n_iter < args.while_max_iter,
                    # smallest non-zero relative change the jitted ELBO can show: one ulp of the partial
                    # ELBO (what the loop carries) over |full ELBO|; a tol below it needs exact repeats
                    "relative_ulp": float(
                        np.spacing(np.dtype(precision).type(res.loglik + res.extra["log_factorial"])) / abs(res.loglik)
                    ),
                }
            )
            print(f"#   done {precision} while_loop ({wall:.1f} s)", flush=True)

    print()
    print(
        f"scan, {args.n_iter} iterations: iterations k to reach ELBO >= optimum - {args.gap:g}; "
        f"t_gap_s = run_s * k / n_iter (ESTIMATED from the steady per-iteration time)"
    )
    cols = (
        f"{'precision':<9} {'k':>11} {'k(curve)':>8} {'t_gap_s':>9} {'run_s':>8} {'ms/iter':>8} "
        f"{'compile_s':>9} {'first_call_s':>12} {'final loglik':>14} {'final gap':>10} {'curve err':>9}  k found by"
    )
    print(cols)
    print("-" * len(cols))
    for r in (r for r in rows if r["strategy"] == "scan"):
        k = str(r["k"]) if r["k"] is not None else "not reached"
        print(
            f"{r['precision']:<9} {k:>11} {fmt(r['k_curve'], 'd'):>8} {fmt(r['t_gap_s_est'], '9.4f'):>9} "
            f"{r['run_s']:8.4f} {r['ms_per_iter']:8.4f} {r['compile_s']:9.3f} {r['first_call_s']:12.3f} "
            f"{r['loglik']:14.4f} {r['final_gap']:10.4f} {r['curve_err']:9.2e}  {r['k_method']}"
        )
    print(
        "k: updates applied (the ELBO curve's index; fit(n_iter=k) returns that state). k(curve): first "
        "crossing on the jitted ELBO curve. curve err: |jitted - float64 host| ELBO at the final state, "
        "the curve's resolution in that precision."
    )
    if args.host_check and any(r.get("k_method") == "host bisection" for r in rows):
        print(
            "host bisection: the first k whose k-iteration fit has a float64 host ELBO >= the target, "
            "assuming the ELBO crosses it once."
        )

    loops = [r for r in rows if r["strategy"] == "while_loop"]
    if loops:
        print()
        print(
            f"while_loop (cap {args.while_max_iter}, tol={args.tol:g}, patience={args.patience}): "
            f"run_s is a MEASURED time-to-stop (steady, compile excluded)"
        )
        cols = (
            f"{'precision':<9} {'stopped at':>10} {'run_s':>8} {'ms/iter':>8} {'compile_s':>9} "
            f"{'first_call_s':>12} {'final loglik':>14} {'final gap':>10} {'within gap':>10}"
        )
        print(cols)
        print("-" * len(cols))
        for r in loops:
            stop = str(r["n_run"]) + ("" if r["stopped_early"] else " (cap)")
            print(
                f"{r['precision']:<9} {stop:>10} {r['run_s']:8.4f} {r['ms_per_iter']:8.4f} {r['compile_s']:9.3f} "
                f"{r['first_call_s']:12.3f} {r['loglik']:14.4f} {r['final_gap']:10.4f} "
                f"{'yes' if r['final_gap'] <= args.gap else 'no':>10}"
            )
        for r in loops:
            if not r["stopped_early"] and args.tol < r["relative_ulp"]:
                print(
                    f"note: {r['precision']} hit the cap: its ELBO's relative resolution is ~{r['relative_ulp']:.1e} "
                    f"(one ulp), above tol={args.tol:g}, so it stops only if the ELBO repeats exactly "
                    f"{args.patience} times in a row"
                )

    pypln, oneoff = None, None
    have_pypln = pypln_available()
    if args.replication != 1 and (args.pypln or args.oneoff):
        print(f"# pyPLNmodels and the one-off fits run on oaks itself: skipped with --replication {args.replication}")
    elif args.pypln and have_pypln:
        t0 = time.perf_counter()
        pypln = pypln_bench(import_pypln(), data, args)
        print(f"#   done pyPLNmodels ({time.perf_counter() - t0:.1f} s)", flush=True)
    if args.replication == 1 and args.oneoff:
        t0 = time.perf_counter()
        oneoff = oneoff_bench(args, data, args.pypln and have_pypln)
        print(f"#   done one-off fits ({time.perf_counter() - t0:.1f} s)", flush=True)
    print(f"# load average at the end: {load_average()}", flush=True)

    print()
    if not have_pypln:
        print(
            f"pyPLNmodels is not installed: no side-by-side with it. It is a benchmark-only extra (never a plnexp "
            f"dependency); to install it without pulling CUDA (torch==2.13.0, a CPU wheel, first): {PYPLN_INSTALL}"
        )
    elif pypln is not None:
        diffs = ", ".join(f"{k} {v:.1e}" for k, v in pypln["data_max_abs_diff"].items())
        print(
            f'pyPLNmodels {pypln["version"]} (torch {package_version("torch")}), Pln.from_formula("endog ~ 1", '
            f"data=pyPLNmodels.load_oaks()): steady fits in this process, median of {args.repeats} after "
            f"{args.warmup} warm-up"
        )
        print(
            f"data vs plnexp.load_oaks(): max |diff| {diffs} "
            f"({'the same data' if pypln['data_matches'] else 'DIFFERENT DATA: comparisons below are not like for like'})"
        )
        cols = (
            f"{'fit':<30} {'iterations':>10} {'run_s':>8} {'ms/iter':>8} {'loglik':>14} {'gap':>10} "
            f"{'within gap':>10} {'own ELBO':>10}"
        )
        print(cols)
        print("-" * len(cols))
        fits = [("fit() (its default)", pypln["default"])]
        if pypln.get("to_gap"):
            fits.append((f"fit(maxiter={pypln['k']}, tol=0)", pypln["to_gap"]))
        for name, f in fits:
            print(
                f"{name:<30} {f['n_iter']:>10} {f['run_s']:8.4f} {1e3 * f['run_s'] / f['n_iter']:8.3f} "
                f"{f['loglik']:14.4f} {f['gap']:10.4f} {'yes' if f['gap'] <= args.gap else 'no':>10} "
                f"{f['own_elbo']:10.1f}"
            )
        print(
            "loglik, gap: float64 host ELBO with exact log y! at its fitted parameters (as plnexp's). own ELBO: "
            "pyPLNmodels' own float32 ELBO, Stirling's log y!, not comparable."
        )
        if pypln["k"] is None:
            print(
                f"pyPLNmodels did NOT get within {args.gap:g} nats in {args.pypln_max_iter} iterations with tol=0 "
                f"(gap then {pypln['search_gap']:.4f})"
            )
        else:
            print(
                f"k={pypln['k']}: its first iteration within {args.gap:g} nats (host ELBO checked at every step of a "
                f"tol=0 fit), chosen in hindsight: its default stopping rule (tol=1e-6, maxiter=400) stops at "
                f"{pypln['default']['n_iter']} iterations, {pypln['default']['gap']:.4f} nats short"
            )

    if oneoff:
        print()
        print(
            f"one-off fits from fresh processes (`python -c`), median of {args.oneoff_runs}. process_s: the whole "
            f"process (imports included); import_s, fit_s (imports excluded: data + fit) timed inside it"
        )
        for p in args.precisions:
            print(f"  plnexp {p}: plnexp.fit(plnexp.load_oaks(), {plnexp_call(args, p)})")
        if have_pypln and args.pypln:
            print('  pyPLNmodels: Pln.from_formula("endog ~ 1", data=load_oaks()).fit()')
        cols = (
            f"{'fit':<22} {'cache':<5} {'process_s':>9} {'import_s':>8} {'fit_s':>8} {'compile_s':>9} "
            f"{'iterations':>10} {'gap':>8} {'max gap':>8} {'within':>6}"
        )
        print(cols)
        print("-" * len(cols))
        for o in oneoff.values():
            name = o["what"] if o["what"] == "pyPLNmodels" else f"plnexp {o['what']}"
            if not o["ok"]:
                print(f"{name:<22} {o['cache']:<5} failed: {o['errors'][0]}")
                continue
            print(
                f"{name:<22} {o['cache']:<5} {o['process_s']:9.3f} {o['import_s']:8.3f} {o['fit_s']:8.3f} "
                f"{fmt(o['compile_s'], '9.3f'):>9} {o['n_iter']:10.0f} {o['gap']:8.4f} {o['max_gap']:8.4f} "
                f"{'yes' if o['max_gap'] <= args.gap else 'no':>6}"
                + (f"  ({len(o['errors'])} failed: {o['errors'][0]})" if o["errors"] else "")
            )
        print(
            "cold: the first process in a fresh PLNEXP_OUTPUTS; warm: a second process in the same one. "
            "within: every run's gap <= the target gap."
        )
        for p in args.precisions:
            cold, warm = oneoff.get(f"{p}/cold"), oneoff.get(f"{p}/warm")
            if cold and warm and cold["ok"] and warm["ok"]:
                files = max(x.get("cache_files", 0) for x in warm["runs"] if "error" not in x)
                used = warm["compile_s"] < 0.5 * cold["compile_s"]
                where = f"{files} file(s) in <outputs>/jax_cache"
                print(
                    f"  {p}: compile_s warm / cold = {warm['compile_s'] / cold['compile_s']:.2f}, process_s warm - "
                    f"cold = {warm['process_s'] - cold['process_s']:+.3f} s: "
                    + (
                        f"the later processes skipped XLA compilation (a persistent compile cache; {where})"
                        if used
                        else f"no persistent-cache effect, every process compiles ({where})"
                    )
                )

    summary = side_by_side(args, rows, pypln, oneoff)
    if summary:
        print()
        for line in summary:
            print(line)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "header": header(args, data, argv),
                    "optimum": args.optimum,
                    "gap": args.gap,
                    "rows": rows,
                    "pyplnmodels": pypln,
                    "oneoff": list(oneoff.values()) if oneoff else None,
                    "summary": summary,
                },
                fh,
                indent=2,
            )
        print(f"wrote {args.json}")
    return 0


def side_by_side(args, rows, pypln, oneoff) -> list[str]:
    """The closing lines: seconds and ratios, all measured in this run."""
    if not pypln and not oneoff:
        return []
    out = [
        f"Side by side, oaks, target ELBO >= {args.optimum - args.gap:.3f} (within {args.gap:g} nats of "
        f"{args.optimum}); every figure measured in this run"
    ]
    ref = pypln["default"] if pypln else None
    if pypln:
        out.append(
            f"steady (in-process, warm; plnexp compile excluded), against pyPLNmodels' default fit: "
            f"{ref['run_s']:.3f} s, {ref['n_iter']} iterations, {ref['gap']:.4f} nats short"
            f" ({'within' if ref['gap'] <= args.gap else 'NOT within'} {args.gap:g})"
        )
        if pypln.get("to_gap"):
            g = pypln["to_gap"]
            out.append(
                f"  pyPLNmodels to within {args.gap:g} (maxiter={pypln['k']} in hindsight, tol=0): "
                f"{g['run_s']:.3f} s, gap {g['gap']:.4f}"
            )
        else:
            out.append(f"  pyPLNmodels: not within {args.gap:g} nats in {args.pypln_max_iter} iterations")
        for r in rows:
            if r["strategy"] == "scan":
                if r["k"] is None:
                    out.append(f"  plnexp {r['precision']} scan: not within {args.gap:g} in {r['n_run']} iterations")
                    continue
                t, what = r["t_gap_s_est"], f"to within {args.gap:g}, k={r['k']}, ESTIMATED"
                within = True
            else:
                t, within = r["run_s"], r["final_gap"] <= args.gap
                what = (
                    f"measured time-to-stop, {r['n_run']} it"
                    + ("" if r["stopped_early"] else " (cap)")
                    + f", gap {r['final_gap']:.4f}"
                    + ("" if within else f", NOT within {args.gap:g}")
                )
            line = (
                f"  plnexp {r['precision']} {r['strategy']:<10}: {t:.4f} s ({what}): pyPLNmodels default "
                f"{ref['run_s'] / t:.1f}x as long"
            )
            if pypln.get("to_gap"):
                line += f", pyPLNmodels to within {args.gap:g} {pypln['to_gap']['run_s'] / t:.1f}x"
            out.append(line + ("" if within else " (plnexp not within the gap)"))
    if oneoff:
        py = oneoff.get("pyPLNmodels/-")
        py = py if py and py["ok"] else None
        out.append(
            "one-off, fresh process, median (imports included / excluded):"
            + (
                f" pyPLNmodels default fit {py['process_s']:.2f} s / {py['fit_s']:.2f} s, gap {py['gap']:.4f}"
                f" ({'within' if py['max_gap'] <= args.gap else 'NOT within'} {args.gap:g})"
                if py
                else ""
            )
        )
        for o in oneoff.values():
            if o["what"] == "pyPLNmodels" or not o["ok"]:
                continue
            within = o["max_gap"] <= args.gap
            line = (
                f"  plnexp {o['what']} while_loop, {'first process (cold cache)' if o['cache'] == 'cold' else 'later processes (warm cache)'}: "
                f"{o['process_s']:.2f} s / {o['fit_s']:.2f} s, gap {o['gap']:.4f}"
                + ("" if within else f" (NOT within {args.gap:g})")
            )
            if py:
                line += (
                    f": pyPLNmodels {py['process_s'] / o['process_s']:.2f}x as long "
                    f"({py['fit_s'] / o['fit_s']:.2f}x imports excluded)"
                )
            out.append(line)
        if py:
            best = [o for o in oneoff.values() if o["what"] != "pyPLNmodels" and o["ok"] and o["max_gap"] <= args.gap]
            cold = [o for o in best if o["cache"] == "cold"]
            if cold:
                o = min(cold, key=lambda o: o["process_s"])
                met = o["process_s"] < py["process_s"]
                out.append(
                    f"target (a one-off fit within {args.gap:g} nats faster, wall clock, than pyPLNmodels' "
                    f"default fit): {'MET' if met else 'NOT met'} by plnexp {o['what']} from a cold cache, "
                    f"{o['process_s']:.2f} s against {py['process_s']:.2f} s, imports included"
                )
            else:
                out.append(
                    f"target (a one-off fit within {args.gap:g} nats faster than pyPLNmodels' default fit): "
                    f"NOT met: no plnexp one-off fit got within {args.gap:g} nats"
                )
    return out


if __name__ == "__main__":
    sys.exit(main())
