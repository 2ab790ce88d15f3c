"""Run one job: its run is created RUNNING in MLflow, then data -> plnexp.fit (timed), then the
results are logged and the run ended with the job's status.

A job never raises for a failed fit: the outcome is marked FAILED with the reason, logged, and the
sweep goes on. An interrupt (Ctrl-C, SIGTERM) is the one exception that gets through: the run is
first ended KILLED (with the fit's result if the fit had returned). The sweep around the jobs (its
parent run) is :mod:`plnexp.sweep`'s business.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import yaml

from . import interrupts
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
    status: str = "FINISHED"  # or FAILED, KILLED
    reason: str = ""
    result: object = None  # plnexp.FitResult when the fit returned
    started: float = field(default_factory=time.time)  # epoch seconds, for MLflow
    ended: float = 0.0
    clock: float = field(default_factory=time.monotonic)  # durations: immune to wall-clock jumps
    elapsed: float | None = None
    data_digest: str = ""
    data_shape: tuple[int, int] | None = None  # (n, p) of the data fitted
    output_dir: str = ""
    run_id: str = ""

    @property
    def wall_s(self) -> float:
        return self.elapsed if self.elapsed is not None else self.ended - self.started

    def stop(self) -> None:
        self.ended, self.elapsed = time.time(), time.monotonic() - self.clock

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

    def gap_curve(self) -> np.ndarray:
        """log10 of each ELBO's gap to the best one of the run: a curve that MLflow's linear chart can
        show (the ELBO itself falls from ~-1e9 to ~-1e5, flattening every curve). A gap below the
        precision's resolution of the best value is shown at that resolution (float32: ~1e-7 of it)."""
        c = self.curve()
        if not len(c):
            return c
        best = c.max()
        floor = max(abs(best), 1.0) * self.config.precision.eps
        return np.log10(np.maximum(best - c, floor))

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
        runs = int(m.get("n_runs", 1))
        spread = f", {runs} runs, spread {g('run_s_iqr', '{:.3f}')} s" if runs > 1 else ""
        parts += [f"run {g('run_s', '{:.3f}')} s ({g('ms_per_iter', '{:.2f}')} ms/iter{spread})",
                  f"final ELBO {g('final_elbo', '{:.6g}')}"]
        text = f"{self.name} {self.status}: " + ", ".join(parts)
        return text + (f" [{self.reason}]" if self.reason else "")


    def row(self) -> "Row":
        return Row(self.name, self.status, self.metrics(), self.wall_s)


class Row(NamedTuple):
    """One line of the summary table (from an Outcome, or from a run read back from MLflow)."""

    name: str
    status: str
    metrics: dict
    wall_s: float


def execute(config: Config, overrides=(), name: str | None = None, output_dir: str = "",
            outcome: Outcome | None = None) -> Outcome:
    """Load the data and fit, filling ``outcome`` (a new one if None) as it goes; any failure but an
    interrupt becomes a FAILED outcome with its reason."""
    from .fitting import run

    out = outcome if outcome is not None else Outcome(name or config.run_name, tuple(overrides), config,
                                                      output_dir=output_dir)
    try:
        data = load_data(config.dataset)
        out.data_digest = data.digest()
        out.data_shape = (data.n, data.p)
        out.result = run(data, config.fit_spec())
        bad = np.flatnonzero(~np.isfinite(out.result.elbo[: out.result.n_iter]))
        if len(bad) or not np.isfinite(out.result.extra.get("final_elbo_jit", np.nan)):
            out.status = "FAILED"
            at = int(bad[0]) if len(bad) else out.result.n_iter
            out.reason = f"non-finite ELBO at iteration {at}"
    except Exception as e:  # noqa: BLE001 - a job reports, never raises
        stop = interrupts.pending()
        if stop is not None:  # a Ctrl-C that a library turned into another error
            raise stop from e
        out.status, out.reason = "FAILED", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        log.warning("%s failed: %s", out.name, out.reason)
    out.stop()
    return out


def run_job(config: Config, overrides=(), name: str | None = None, output_dir: str = "", *,
            parent=None, job_num: int | None = None, tags: dict | None = None) -> Outcome:
    """Execute one job with its MLflow run: created RUNNING now, ended with the job's status.

    ``parent`` (a :class:`plnexp.tracking.Parent`) makes the run a child of a sweep, in the sweep's
    store and experiment; otherwise the run goes to the config's store and experiment. On an
    interrupt the run is ended KILLED and :class:`plnexp.interrupts.Interrupted` re-raised. The run
    is created with the provenance tags (:func:`plnexp.provenance.run_tags`) and ``tags``.
    """
    from . import provenance, slurm, tracking

    uri = parent.uri if parent else tracking.tracking_uri(config.tracking_uri)
    cl = tracking.client(uri)
    outcome = Outcome(name or config.run_name, tuple(overrides), config, output_dir=output_dir)
    tags = {**provenance.run_tags(config), **({tracking.JOB_TAG: job_num} if job_num is not None else {}),
            **(tags or {})}
    try:
        with interrupts.deferred():
            exp_id = parent.experiment_id if parent else tracking.experiment_id(cl, config.experiment)
            outcome.run_id = tracking.start_job(cl, exp_id, outcome, parent.run_id if parent else None, tags)
        done = execute(config, overrides, name, output_dir, outcome)
        if done is not outcome:  # a stand-in execute (tests) may return its own
            done.run_id, outcome = outcome.run_id, done
    except KeyboardInterrupt as e:
        stop = interrupts.as_interrupted(e)
        outcome.status, outcome.reason = "KILLED", f"interrupted by {stop.name}{slurm.why(stop.signum)}"
        outcome.stop()
        if outcome.run_id:
            with interrupts.deferred():
                tracking.finish_job(cl, outcome.run_id, outcome)
        raise stop from None
    with interrupts.deferred():
        tracking.finish_job(cl, outcome.run_id, outcome)
    return outcome


def summary_table(rows) -> str:
    """One line per job (:class:`Row`, or anything with ``.row()``); a value not measured
    (first_call off, no compile cache) or not finite is "-"."""
    from .metrics import TERMINAL, cell

    head = ("job", "status", *(m.short for m in TERMINAL), "wall_s")
    lines = []
    for r in rows:
        r = r.row() if hasattr(r, "row") else r
        values = {**r.metrics, "n_iter_run": r.metrics.get("n_iter_run", 0.0)}
        lines.append((r.name, r.status, *(cell(m, values.get(m.key)) for m in TERMINAL), f"{r.wall_s:.1f}"))
    widths = [max(len(str(r[i])) for r in [head, *lines]) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *map(fmt, lines)])
