"""Run one job (data -> plnexp.fit, timed) and log it; hold the state of a sweep (its parent run).

A job never raises for a failed fit: the outcome is marked FAILED with the reason, logged, and the
sweep goes on. The sweep's parent run is closed by :func:`close_sweep` (called in a ``finally``
by the command line) or, as a last resort, at interpreter exit.
"""

from __future__ import annotations

import atexit
import logging
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import numpy as np
import yaml

from .config import Config
from .data import Data

log = logging.getLogger(__name__)


@lru_cache(maxsize=4)
def load_data(dataset) -> Data:
    return dataset.load()


@dataclass
class Outcome:
    name: str
    overrides: tuple[str, ...]
    config: Config
    status: str = "FINISHED"  # or FAILED
    reason: str = ""
    result: object = None  # plnexp.FitResult when the fit returned
    started: float = field(default_factory=time.time)
    ended: float = 0.0
    data_digest: str = ""
    output_dir: str = ""
    run_id: str = ""

    @property
    def wall_s(self) -> float:
        return self.ended - self.started

    def metrics(self) -> dict[str, float]:
        out = {"wall_s": self.wall_s, "n_iter": float(self.config.n_iter)}
        r = self.result
        if r is not None:
            out.update(r.timing.as_metrics())
            out.update(n_iter_run=float(r.n_iter), final_elbo=r.extra.get("final_elbo_jit", np.nan),
                       loglik=r.loglik)
        return out

    def curve(self) -> np.ndarray:
        """The ELBO per iteration actually run, cut at the first non-finite value."""
        if self.result is None:
            return np.zeros(0)
        c = np.asarray(self.result.elbo[: self.result.n_iter], dtype=float)
        bad = np.flatnonzero(~np.isfinite(c))
        return c[: bad[0]] if len(bad) else c

    def config_yaml(self) -> str:
        return yaml.safe_dump(self.config.as_dict(), sort_keys=False)

    def note(self) -> str:
        return f"`{' '.join(self.overrides) or '(defaults)'}` -> {self.status} {self.reason}".strip()

    def summary(self) -> str:
        if self.result is None:
            return f"{self.name} {self.status}: {self.reason}"
        m = self.metrics()
        g = lambda k, f: f.format(m[k]) if np.isfinite(m.get(k, np.nan)) else "-"  # noqa: E731
        parts = [f"{self.result.n_iter} iter", f"compile {g('compile_s', '{:.2f}')} s"]
        if "compile_warm_s" in m:
            parts.append(f"cached compile {g('compile_warm_s', '{:.2f}')} s")
        if "first_call_s" in m:
            parts.append(f"first call {g('first_call_s', '{:.2f}')} s")
        parts += [f"run {g('run_s', '{:.3f}')} s ({g('ms_per_iter', '{:.2f}')} ms/iter)",
                  f"final ELBO {g('final_elbo', '{:.6g}')}"]
        text = f"{self.name} {self.status}: " + ", ".join(parts)
        return text + (f" [{self.reason}]" if self.reason else "")


def execute(config: Config, overrides=(), name: str | None = None, output_dir: str = "") -> Outcome:
    """Load the data and fit; any failure becomes a FAILED outcome with its reason."""
    from .fitting import fit

    out = Outcome(name or config.run_name, tuple(overrides), config, output_dir=output_dir)
    try:
        data = load_data(config.dataset)
        out.data_digest = data.digest()
        out.result = fit(data, **config.fit_kwargs())
        bad = np.flatnonzero(~np.isfinite(out.result.elbo[: out.result.n_iter]))
        if len(bad) or not np.isfinite(out.result.extra.get("final_elbo_jit", np.nan)):
            out.status = "FAILED"
            at = int(bad[0]) if len(bad) else out.result.n_iter
            out.reason = f"non-finite ELBO at iteration {at}"
    except Exception as e:  # noqa: BLE001 - a job reports, never raises
        out.status, out.reason = "FAILED", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        log.warning("%s failed: %s", out.name, out.reason)
    out.ended = time.time()
    return out


# ---------------------------------------------------------------- sweeps
@dataclass
class Sweep:
    uri: str
    experiment_id: str
    parent_id: str
    total: int
    outcomes: list = field(default_factory=list)
    closed: bool = False
    started: float = field(default_factory=time.perf_counter)


SWEEP: Sweep | None = None


def open_sweep(name: str, experiment: str, total: int, tracking_uri: str | None, tags: dict) -> Sweep:
    """Create the experiment and the parent run once, before any job starts."""
    global SWEEP
    from . import tracking

    uri = tracking.tracking_uri(tracking_uri)
    cl = tracking.client(uri)
    exp_id = tracking.experiment_id(cl, experiment)
    parent = tracking.start_parent(cl, exp_id, name, {"jobs": total, "git_commit": tracking.git_commit(), **tags})
    SWEEP = Sweep(uri, exp_id, parent, total)
    atexit.register(close_sweep, "KILLED")
    return SWEEP


def close_sweep(status: str = "FINISHED") -> None:
    """End the parent run (once). A sweep with failed jobs still ends FINISHED, tagged n_failed."""
    global SWEEP
    sweep = SWEEP
    if sweep is None or sweep.closed:
        return
    sweep.closed = True
    from . import tracking

    failed = sum(o.status != "FINISHED" for o in sweep.outcomes)
    if status == "FINISHED" and len(sweep.outcomes) < sweep.total:
        status = "FAILED"
    wall = time.perf_counter() - sweep.started
    tags = {"n_done": len(sweep.outcomes), "n_failed": failed, "wall_s": f"{wall:.1f}",
            "fit_s": f"{sum(o.wall_s for o in sweep.outcomes):.1f}"}
    cl = tracking.client(sweep.uri)
    if sweep.outcomes:
        cl.log_text(sweep.parent_id, summary_table(sweep.outcomes) + "\n", "summary.txt")
    tracking.end_run(cl, sweep.parent_id, status, tags)


def run_job(config: Config, overrides=(), name: str | None = None, output_dir: str = "",
            progress: Callable[[str, str], None] | None = None) -> Outcome:
    """Execute one job and log it (as a child of the open sweep, if any).

    ``progress(text, end)``, given by the command line, shows the sweep's progress (one line a job).
    """
    from . import tracking

    sweep = SWEEP
    show = progress if (sweep is not None and progress is not None) else (lambda text, end: None)
    if sweep is not None:
        show(f"[{len(sweep.outcomes) + 1}/{sweep.total}] {name or config.run_name} ...", "")
    outcome = execute(config, overrides, name, output_dir)
    uri = sweep.uri if sweep else tracking.tracking_uri(config.tracking_uri)
    cl = tracking.client(uri)
    exp_id = sweep.experiment_id if sweep else tracking.experiment_id(cl, config.experiment)
    outcome.run_id = tracking.log_job(cl, exp_id, outcome, sweep.parent_id if sweep else None)
    if sweep is not None:
        sweep.outcomes.append(outcome)
        extra = f" ({outcome.reason})" if outcome.reason else ""
        logged = time.time() - outcome.ended
        show(f" {'done' if outcome.status == 'FINISHED' else outcome.status} {outcome.wall_s:.1f} s"
             f" (+{logged:.1f} s logging){extra}", "\n")
    return outcome


def summary_table(outcomes) -> str:
    """One row per job; a value not measured (first_call off, no compile cache) or not finite is "-"."""
    head = ("job", "status", "iter", "compile_s", "cached_s", "first_s", "run_s", "ms/iter", "final ELBO",
            "wall_s")
    rows = []
    for o in outcomes:
        m = o.metrics()
        g = lambda k, f="{:.3f}": f.format(m[k]) if np.isfinite(m.get(k, np.nan)) else "-"  # noqa: E731
        rows.append((o.name, o.status, f"{int(m.get('n_iter_run', 0))}", g("compile_s"), g("compile_warm_s"),
                     g("first_call_s"), g("run_s"), g("ms_per_iter", "{:.2f}"), g("final_elbo", "{:.6g}"),
                     f"{o.wall_s:.1f}"))
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *map(fmt, rows)])
