"""One job's fit and its outcome: data -> plnexp.fit (timed), the measurements (floor, best known
ELBO, convergence), the summary line. Its run's life (created RUNNING in MLflow, ended with the job's
status) is :func:`plnexp.experiment.job_task.run_job`'s, the one way a job runs.

A job never raises for a failed fit: the outcome is marked FAILED with the reason, logged, and the
sweep goes on. An interrupt (Ctrl-C, SIGTERM) is the one exception that gets through: the run is
first ended KILLED (with the fit's result if the fit had returned). The sweep around the jobs (its
parent run) is :mod:`plnexp.experiment.sweep`'s business.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from functools import lru_cache
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import yaml

from ..system import interrupts, jax_compat
from ..jobs.config import Config
from ..core.data import Data
from ..core.data_rows import digest_by_rows
from ..system.commandline import first_line
from ..system.redact import redact

if TYPE_CHECKING:
    from ..fitting.engine import FitResult
    from ..fitting.optimum import Optimum

log = logging.getLogger(__name__)


@lru_cache(maxsize=4)
def load_data(dataset) -> Data:
    return dataset.load()


# What a replicate's run reports as its share of its batch's run (the batch's divided by the number
# of fits in it); ``batch_run_s`` keeps the batch's own. compile_s is the batch's.
# how long the processes of a fit across processes wait for each other at its start (process 0's
# digest of the data, its best known ELBO and the floor come first); a process that died meanwhile
# ends the others sooner (the launcher, or JAX's heartbeats)
BARRIER_S = 3600.0
SHARED_TIMES = ("run_s", "run_s_iqr", "run_s_lo", "run_s_hi", "ms_per_iter")


@dataclass
class Outcome:
    name: str
    overrides: tuple[str, ...]
    config: Config
    status: str = "FINISHED"  # or FAILED, KILLED
    reason: str = ""
    result: FitResult | None = None  # when the fit returned
    started: float = field(default_factory=time.time)  # epoch seconds, for MLflow
    ended: float = 0.0
    clock: float = field(default_factory=time.monotonic)  # durations: immune to wall-clock jumps
    elapsed: float | None = None
    data_digest: str = ""
    data_shape: tuple[int, int] | None = None  # (n, p) of the data fitted
    output_dir: str = ""
    run_id: str = ""
    replicate: int = 0  # its place in the job's batch of ``config.replicates`` fits
    batch: list = field(default_factory=list, repr=False)  # run_job's result: every replicate's outcome
    floor: dict = field(default_factory=dict)  # this machine's floor for the fit (plnexp.measure.floor.run_metrics)
    kept: str = ""  # the file holding the result when the store did not take it (plnexp.store.pending)
    optimum: Optimum | None = None  # the data's best known ELBO (plnexp.fitting.optimum): the convergence metrics
    # given the job's compiled program to run again (a sweep's rounds, plnexp.experiment.groups); None: not kept
    hold: Callable | None = field(default=None, repr=False, compare=False)

    @property
    def wall_s(self) -> float:
        return self.elapsed if self.elapsed is not None else self.ended - self.started

    def stop(self) -> None:
        self.ended, self.elapsed = time.time(), time.monotonic() - self.clock

    def metrics(self) -> dict[str, float]:
        out = {"wall_s": self.wall_s, "n_iter": float(self.config.n_iter), **self.floor}
        r = self.result
        if r is not None:
            out.update(r.timing.as_metrics())
            out.update(n_iter_run=float(r.n_iter), final_elbo=r.extra.get("final_elbo_jit", np.nan), loglik=r.loglik)
            if r.converged is not None:  # how it ended (plnexp.measure.convergence.ending)
                out.update(converged=float(r.converged), gap_to_best=r.gap_to_best, at_best=float(bool(r.at_best)))
            if "B" in r.params and "S" in r.params:  # the result's own criteria (PLNmodels' conventions)
                out.update(n_params=float(r.n_params), bic=r.bic, icl=r.icl)
            k = self.config.replicates
            if k > 1 and "run_s" in out:  # one fit of a batch: its share of the batch's run time
                out.update(batch_run_s=out["run_s"], replicates=float(k))
                for key in SHARED_TIMES:
                    if key in out:
                        out[key] /= k
            if self.optimum is not None:
                out.update(self.optimum.metrics())
                out.update(self._convergence(out.get("run_s", np.nan)))
        return out

    def _resolution(self) -> float:
        from ..measure import convergence

        r, opt = self.result, self.optimum
        assert r is not None and opt is not None
        n, p = self.data_shape or r.params["S"].shape
        return convergence.resolution(
            self.config.precision.eps, n * p, opt.elbo, r.extra.get("final_elbo_jit", np.nan), r.loglik
        )

    def _convergence(self, run_s: float) -> dict[str, float]:
        """The run's gap to its data's best known ELBO (:func:`plnexp.measure.convergence.run_metrics`)."""
        from ..measure import convergence

        r, opt = self.result, self.optimum
        assert r is not None and opt is not None
        n, p = self.data_shape or r.params["S"].shape
        return convergence.run_metrics(
            self.curve(),
            opt.elbo,
            r.loglik,
            r.extra.get("final_elbo_jit", np.nan),
            self.config.precision.eps,
            n * p,
            run_s,
            r.n_iter,
        )

    def curve(self) -> np.ndarray:
        """The ELBO per iteration actually run, cut at the first non-finite value."""
        if self.result is None:
            return np.zeros(0)
        c = np.asarray(self.result.elbo[: self.result.n_iter], dtype=float)
        bad = np.flatnonzero(~np.isfinite(c))
        return c[: bad[0]] if len(bad) else c

    def gap_curve(self) -> np.ndarray:
        """``gap_rel_log10``: log10 of each ELBO's relative gap to the data's best known ELBO
        (:func:`plnexp.measure.convergence.gap_curve`), no lower than the run's resolution; to the run's own
        best where no optimum is known (``dataset.optimum=false``), no lower than the precision's
        epsilon. A curve that MLflow's linear chart can show (the ELBO itself falls from ~-1e9 to
        ~-1e5, flattening every curve), and on which a stalled run stays above the others."""
        from ..measure import convergence

        c = self.curve()
        if not len(c):
            return c
        if self.optimum is not None and self.result is not None:
            return convergence.gap_curve(c, self.optimum.elbo, self._resolution())
        return convergence.gap_curve(c, float(c.max()), self.config.precision.eps)

    def config_yaml(self) -> str:
        """The resolved config as the run's ``config.yaml`` artifact holds it: credentials masked
        (:mod:`plnexp.system.redact`; ``rerun`` takes the store from its own command, never from here)."""
        return yaml.safe_dump(redact(self.config.as_dict()), sort_keys=False)

    def note(self) -> str:
        return f"`{' '.join(self.overrides) or '(defaults)'}` -> {self.status} {self.reason}".strip()

    def shown_status(self) -> str:
        """The status, ``pending`` added while the result is kept locally (not yet in the store)."""
        return f"{self.status} (pending: kept locally)" if self.kept else self.status

    def summary(self) -> str:
        if self.result is None:
            return f"{self.name} {self.shown_status()}: {self.reason}"
        m = self.metrics()
        g = lambda k, f: f.format(m[k]) if np.isfinite(m.get(k, np.nan)) else "-"
        parts = [f"{self.result.n_iter} iter", f"compile {g('compile_s', '{:.2f}')} s"]
        if "compile_warm_s" in m:
            parts.append(f"cached compile {g('compile_warm_s', '{:.2f}')} s")
        if "first_call_s" in m:
            parts.append(f"first call {g('first_call_s', '{:.2f}')} s")
        runs = int(m.get("n_runs", 1))
        spread = f", {runs} runs, spread {g('run_s_iqr', '{:.3f}')} s" if runs > 1 else ""
        parts += [
            f"run {g('run_s', '{:.3f}')} s ({g('ms_per_iter', '{:.2f}')} ms/iter{spread})",
            f"final ELBO {g('final_elbo', '{:.6g}')}",
        ]
        if self.result.converged is not None:
            parts.append("converged" if self.result.converged else "not converged")
            if not self.result.at_best:  # more than its precision's rounding below the best it reached
                parts.append(f"ended {self.result.gap_to_best:.4g} nats below its best ELBO")
        text = f"{self.name} {self.shown_status()}: " + ", ".join(parts)
        return text + (f" [{self.reason}]" if self.reason else "")

    def row(self) -> Row:
        return Row(self.name, self.status, self.metrics(), self.wall_s)


class Row(NamedTuple):
    """One line of the summary table (from an Outcome, or from a run read back from MLflow)."""

    name: str
    status: str
    metrics: dict
    wall_s: float


def execute(config: Config, outcomes: list[Outcome], *, lead: bool = True) -> list[Outcome]:
    """Load the data and fit the job's ``config.replicates`` fits in one program, filling one outcome
    per replicate; any failure but an interrupt becomes FAILED outcomes with the reason.
    ``lead`` False: a process of a fit across processes other than process 0, which runs the fit
    with the others and reports nothing (no floor, no best known ELBO: process 0's run has them).

    A replicate whose ELBO is not finite is FAILED alone; an error of the program fails them all.
    Before the fit (never while it is timed), this machine's floor for one iteration of the model on
    the data (:func:`plnexp.measure.floor.iteration`: its shape, the model's declared work, offsets one per
    row or not; :func:`plnexp.measure.floor.run_metrics`: cached per machine; its measured parts NaN, never
    an error, when not measured)."""
    from ..measure import floor
    from ..fitting.engine import run_all

    try:
        specs = config.replicate_datasets()
        check_processes(config)
        datas = [load_data(ds) if config.processes == 1 else load_rows(ds, config) for ds in specs]
        for k, out in enumerate(outcomes):
            data, ds = datas[k] if len(datas) > 1 else datas[0], specs[k] if len(specs) > 1 else specs[0]
            out.data_shape = (data.n if data.part is None else data.part.n, data.p)
            if lead:  # this process's rows of a fit across processes: the whole data's digest, read again by rows
                out.data_digest = data.digest() if data.part is None else digest_by_rows(ds.load_rows, *out.data_shape)
            out.optimum = best_known(ds, config.model.value) if lead else None
        spec = config.fit_spec()
        iteration = floor.iteration(spec.model, datas[0])
        if datas[0].part is not None:  # the whole fit's iteration, not this process's rows'
            iteration = replace(iteration, n=datas[0].part.n)
        measured = floor.run_metrics(iteration, config.precision.dtype, config.device.value) if lead else {}
        stop = interrupts.pending()
        if stop is not None:  # a Ctrl-C while measuring, which the floor's guard took for a failure
            raise stop
        for out in outcomes:
            out.floor = measured
        if config.processes > 1:  # every process at the fit's start: its first collective waits for them
            jax_compat.barrier("plnexp-fit", BARRIER_S)
        results = run_all(datas, spec, owns_process=True, hold=outcomes[0].hold)  # a job: plnexp owns the process
        if config.processes > 1:  # every process's peak memory, on process 0's run
            peaks = peak_rss_by_process()
            for out in outcomes:
                out.floor = {**out.floor, **{f"peak_rss_mb_process_{i}": mb for i, mb in enumerate(peaks)}}
        for out, result in zip(outcomes, results):
            out.result = result
            bad = np.flatnonzero(~np.isfinite(result.elbo[: result.n_iter]))
            if len(bad) or not np.isfinite(result.extra.get("final_elbo_jit", np.nan)):
                out.status = "FAILED"
                at = int(bad[0]) if len(bad) else result.n_iter
                out.reason = f"non-finite ELBO at iteration {at}"
    except Exception as e:  # a job reports, never raises
        stop = interrupts.pending()
        if stop is not None:  # a Ctrl-C that a library turned into another error
            raise stop from e
        reason = first_line(e)
        for out in outcomes:
            out.status, out.reason = "FAILED", reason
        log.warning("%s failed: %s", outcomes[0].name, reason)
    for out in outcomes:
        out.stop()
    return outcomes


def load_rows(dataset, config: Config) -> Data:
    """This JAX process's rows of ``dataset`` in a fit across ``config.processes`` processes (those
    its devices hold in ``scan_sharded``'s mesh), read alone where the source allows
    (:meth:`plnexp.jobs.dataset_specs.DatasetSpec.load_rows`)."""
    from ..strategies.sharded import rows_of_this_process
    from ..core.device import resolve_device

    n = dataset.rows()
    start, stop = rows_of_this_process(n, resolve_device(config.device.value).platform)
    return dataset.load_rows(start, stop)


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB (2**20 bytes): ``ru_maxrss`` (KiB on Linux)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


def peak_rss_by_process() -> list[float]:
    """Every JAX process's :func:`peak_rss_mb`, in process order (each process calls this at the
    same point; in one process, its own)."""
    import jax

    from ..strategies.sharded import across_processes_sum

    mine = np.zeros(jax.process_count())
    mine[jax.process_index()] = peak_rss_mb()
    return [float(v) for v in np.atleast_1d(across_processes_sum(mine))]


def check_processes(config: Config) -> None:
    """One-line ValueError where the job spans ``processes`` > 1 JAX processes but this process is
    not one of them (a job run in this process: ``run``, a sweep's driver and ``rerun`` start them,
    :mod:`plnexp.experiment.processes`)."""
    if config.processes == 1:
        return
    import jax

    if jax.process_count() != config.processes:
        raise ValueError(
            f"processes={config.processes}: this process is one of {jax.process_count()} JAX process(es); "
            "a fit across processes runs from python -m plnexp run, sweep (hydra/launcher=basic) or rerun "
            f"(which start them), or under srun -n {config.processes}"
        )


def best_known(dataset, model: str) -> Optimum | None:
    """The data set's best known ELBO (:func:`plnexp.fitting.optimum.for_dataset`; computed once where none
    is known, before the fit, never timed); None, with a warning, where it cannot be had: the job
    runs on without its convergence metrics."""
    from ..fitting import optimum

    try:
        return optimum.for_dataset(dataset, model, load=load_data)
    except Exception as e:
        if interrupts.pending() is not None:
            raise
        log.warning(
            "plnexp: no best known ELBO for %s (%s: %s): no convergence metrics", dataset.label, type(e).__name__, e
        )
        return None


def replicate_name(name: str, k: int, replicates: int) -> str:
    """The run name of replicate ``k`` of a job (the job's own name when it is one fit)."""
    return name if replicates == 1 else f"{name}-rep{k}"


def combined(outcomes: list[Outcome]) -> Outcome:
    """One outcome standing for a job's replicates (what the job's line and exit code report): the
    first replicate's, FAILED with a count when some failed."""
    first = outcomes[0]
    if len(outcomes) == 1:
        return first
    failed = [o for o in outcomes if o.status != "FINISHED"]
    if not failed:
        return first
    status = "KILLED" if any(o.status == "KILLED" for o in failed) else "FAILED"
    reasons = sorted({o.reason for o in failed})
    return replace(
        first,
        status=status,
        reason=f"{len(failed)} of {len(outcomes)} replicates {status}: {'; '.join(reasons)}",
        hold=None,
    )


def summary_table(rows) -> str:
    """One line per job (:class:`Row`, or anything with ``.row()``); a value not measured
    (first_call off, no compile cache) or not finite is "-"."""
    from ..measure.metrics import TERMINAL, cell

    head = ("job", "status", *(m.short for m in TERMINAL), "wall_s")
    lines = []
    for r in rows:
        r = r.row() if hasattr(r, "row") else r
        values = {**r.metrics, "n_iter_run": r.metrics.get("n_iter_run", 0.0)}
        lines.append((r.name, r.status, *(cell(m, values.get(m.key)) for m in TERMINAL), f"{r.wall_s:.1f}"))
    widths = [max(len(str(r[i])) for r in [head, *lines]) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *map(fmt, lines)])
