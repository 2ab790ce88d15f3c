"""One job of ``run``, ``sweep`` or ``rerun`` as it runs where its executor put it (:class:`Task`: the
driver, a joblib worker, a SLURM task), given as its spec: run, log, one line; after a sweep's grid,
in the driver, its control job and its peers.

The **control job** (:meth:`Task.control`): after the grid, the sweep's reference job
(:func:`plnexp.experiment.plan.control_reference`: scan's, else the first) runs once more with the same config,
named ``control-<its name>``, tagged ``plnexp.control=true`` and ``plnexp.control_of=<its job
number>``, job number ``total`` (one past the grid). The report pairs it with its original as an A/A
test of the between-job noise (:func:`plnexp.jobs.ranking.noise`) and never ranks it. It runs only where
every job of the grid ran in the driver, one after the other (the basic launcher, the timing
study's): with a launcher of other processes (joblib, SLURM) jobs run side by side or on other
machines, their timings are contended or not comparable anyway, and the driver cannot tell when the
last job ends relative to the others. Not in a rerun (its jobs are given whole), nor after an
interrupt; in a resumed sweep it runs again (an earlier control is never reused), its original
possibly an earlier sweep's run. ``report.control=false`` turns it off.

The **peers** (:meth:`Task.peers`, ``report.peers``: other packages' fits of the same model,
:mod:`plnexp.jobs.peers`): after the control job, on the same condition, each peer's default fit on each
data set of the grid, of the model the jobs fit there (PLN-PCA: one per rank), one more child run
each (job numbers from ``total + 1``, tagged ``plnexp.peer=<name>``). A peer is a guest: not
installed, it is one line and no run; failed, its run is FAILED; neither changes the sweep's status,
its count of failed runs nor its exit code.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..system import credentials, interrupts
from ..jobs.spec import JobSpec
from . import groups, resume
from . import runner
from ..jobs import config as C
from ..jobs import config_load
from ..system.redact import redact, redact_text
from .driver_watch import watch_driver
from .sweep_record import SweepRecord, store_of
from .sweep_summary import SKIPPED, _row, _saw


# ---------------------------------------------------------------- a job
def run_job(config: C.Config, overrides=(), name: str | None = None, output_dir: str = "", *, hold=None, **where):
    """:func:`plnexp.experiment.runner.run_job` in this process, or, for a fit across
    ``config.processes`` > 1 processes, through its workers started here and waited for
    (:func:`plnexp.experiment.processes.run_job`: process 0 logs the run, a child of the sweep's
    parent; its outcome comes back, its program does not: ``hold`` is not kept)."""
    if config.processes > 1 and not _joined():
        from . import processes

        return processes.run_job(config, overrides, name, output_dir, **where)
    return runner.run_job(config, overrides, name, output_dir, hold=hold, **where)


def _joined() -> bool:
    """Whether this process has joined a fit across processes already (a SLURM task of a job of N
    tasks, :func:`across_in_worker`): it runs its share itself, starting no workers."""
    import jax

    return jax.distributed.is_initialized()


@dataclass
class Task:
    """One job of ``run``, ``sweep`` or ``rerun``, given as its spec: run, log, one line.

    Picklable, so that launchers running jobs in other processes can ship it. ``failed`` counts the
    jobs of this process that did not finish (what ``run`` exits with); a sweep counts from MLflow.
    """

    failed: int = 0
    # why the store is down, once a job of this process saw it fail: the grid's later jobs are skipped
    # (each would wait store_timeout_s on it again), said in one line each; "" while it answers
    store_down: str = ""
    # the programs of the jobs this process ran as a sweep's driver, kept for the rounds (groups.Held);
    # None: none kept (a single run, a rerun)
    held: groups.Held | None = None
    # the jobs of the sweep this process ran, by job number (what the control job needs, Task.control)
    grid: dict[int, GridJob] = field(default_factory=dict)
    record: SweepRecord | None = None
    # whether the sweep's grid is followed by its control job and peers (not a rerun's given jobs)
    extras: bool = True

    def __call__(self, spec: JobSpec, record: SweepRecord | None, output_dir: str, here: bool = True) -> str | None:
        """Run the job ``spec`` (of the sweep ``record``; None: a single run) with its outputs in
        ``output_dir``; returns its progress line when it ran in another process than the driver
        (``here`` false: a joblib worker, a SLURM task, whose executor hands the line to the driver)."""
        from ..system import runtime
        from ..system import slurm

        # plnexp owns the process a job runs in (the driver, a joblib worker, a SLURM job): its
        # settings before the job starts JAX (idempotent where the command line applied them), and
        # its one masking boundary (the driver's command line installed it already)
        runtime.configure()
        if not credentials.installed():
            credentials.install()
        if slurm.in_job() and interrupts.pending() is None and not interrupts.in_place():
            with interrupts.handled(signals=slurm.JOB_SIGNALS):  # scancel, time limit, preemption
                return self._job(spec, record, output_dir, here)
        return self._job(spec, record, output_dir, here)

    def _job(self, spec: JobSpec, record: SweepRecord | None, output_dir: str, here: bool) -> str | None:
        from ..system import slurm

        num = spec.num if record is not None else None
        config = spec.config
        try:
            if record is not None:  # the record's URI is redacted: the store as this job reaches it
                record = replace(record, uri=store_of(record, config.tracking_uri))
        except C.ConfigError as e:
            line = f"plnexp: error: {redact_text(str(e))}"
            print(line, file=sys.stderr, flush=True)
            self.failed += 1
            return line
        if record is not None:
            config = config.as_study()  # compile_cache auto: off, every job compiles cold
        overrides, name = list(spec.overrides), spec.name
        write_job_dir(output_dir, config, spec.overrides)
        if not here:  # a worker process: it ends when its driver is gone (watch_driver)
            assert record is not None
            watch_driver(record)
        if record is not None and num is not None:
            self.record, self.grid[num] = record, GridJob(config, tuple(overrides), name)
        earlier = resume.reused_run(record, config) if record is not None else None
        if earlier is not None:
            assert record is not None and num is not None  # earlier: a run the record's resume found
            self.grid[num] = replace(self.grid[num], status="FINISHED")
            line = f"[{num + 1}/{record.total}] {name} FINISHED earlier (run {earlier}): skipped"
            print(line, flush=True)
            return None if here else line
        label = f"[{num + 1}/{record.total}] {name}" if record is not None and num is not None else name
        if self.store_down and record is not None:  # each job would wait store_timeout_s on it again
            self.failed += 1
            _saw(record, num, [runner.Row(name, SKIPPED, {}, 0.0)])
            line = f"{label} skipped: the store failed ({self.store_down}); resume=true runs it later"
            print(line, flush=True)
            return None if here else line
        if record is not None and here:
            print(f"{label} ...", end="", flush=True)
        try:
            outcome = run_job(
                config,
                overrides,
                name,
                output_dir,
                parent=record.parent if record else None,
                job_num=num,
                tags=spec.run_tags or None,
                hold=self.held.keeper(num) if self.held is not None and num is not None else None,
            )
        except KeyboardInterrupt as e:
            _saw(record, num, [runner.Row(name, "KILLED", {}, 0.0)])
            if record is not None:
                print(" KILLED" if here else f"{label} KILLED", flush=True)
            if not here and slurm.in_job():  # the run is recorded: the job ends normally, its line says why
                stop = interrupts.as_interrupted(e)
                return f"{label} KILLED (interrupted by {stop.name}{slurm.why(stop.signum)})"
            raise
        except Exception as e:  # the store failed under us: say so, go on
            pending = interrupts.pending()
            if pending is not None:  # a Ctrl-C that a library turned into another error
                raise pending from e
            self.failed += 1
            _saw(record, num, [runner.Row(name, "FAILED", {}, 0.0)])
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            first = redact_text(first)  # a store's error may quote its URI
            self.store_down = f"job {name}: {type(e).__name__}"
            print(f"{' ' if record is not None and here else ''}FAILED", flush=True)
            print(f"plnexp: error: job {name}: {type(e).__name__}: {first}", file=sys.stderr, flush=True)
            return None if here else f"{label} FAILED ({type(e).__name__}: {first})"
        self.failed += outcome.status != "FINISHED"
        if getattr(outcome, "kept", ""):  # the store failed after the fit: the next jobs are skipped
            self.store_down = f"job {name}'s result kept locally"
        _saw(record, num, [_row(o, name) for o in (getattr(outcome, "batch", None) or [outcome])])
        if num in self.grid:
            self.grid[num] = replace(self.grid[num], status=outcome.status)
        if record is None:
            print(f"{outcome.summary()}  (run {outcome.run_id}, experiment {config.experiment!r})", flush=True)
            return None
        word = "done" if outcome.status == "FINISHED" else outcome.status
        word += " (pending: kept locally)" if getattr(outcome, "kept", "") else ""  # not in the store yet
        extra = f" ({outcome.reason})" if outcome.reason else ""
        logged = time.monotonic() - outcome.clock - outcome.wall_s
        text = f"{word} {outcome.wall_s:.1f} s (+{logged:.1f} s logging){extra}"
        print(f" {text}" if here else f"{label} {text}", flush=True)
        return None if here else f"{label} {text}"

    def _ran_the_grid(self) -> bool:
        """Whether this process ran every job of a sweep's grid (the basic launcher; not a
        rerun's given jobs): what the control job and the peers need (:meth:`control`, :meth:`peers`)."""
        record = self.record
        return record is not None and self.extras and sorted(self.grid) == list(range(record.total))

    def _extra(self, kind: str, name: str, run):
        """Run one job beyond the grid (the control job, a peer's fit: ``run()`` returns its outcome)
        with its line: ``KILLED`` and raised on an interrupt; a store that fails under it is one
        ``FAILED`` line on stderr and None (the sweep goes on)."""
        try:
            return run()
        except KeyboardInterrupt:
            print(" KILLED", flush=True)
            raise
        except Exception as e:  # the store failed under us: say so (the sweep closes as usual)
            pending = interrupts.pending()
            if pending is not None:
                raise pending from e
            first = redact_text(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            print(" FAILED", flush=True)
            print(f"plnexp: error: {kind} {name}: {type(e).__name__}: {first}", file=sys.stderr, flush=True)
            return None

    def control(self) -> None:
        """After the grid, the sweep's control job (see the module docstring): its reference job's
        config once more, as job number ``total``, tagged as the control. Nothing unless this process
        ran every job of a sweep's grid (the basic launcher; not a rerun's given jobs) and the
        grid has a reference (:func:`plnexp.experiment.plan.control_reference`); skipped, saying so, when the
        reference job did not finish. An interrupt is raised (the sweep closes KILLED)."""
        from .plan import control_reference
        from ..jobs.ranking import CONTROL_OF_TAG, CONTROL_TAG

        record = self.record
        if record is None or not self._ran_the_grid():
            return
        ref = control_reference([self.grid[i].config for i in range(record.total)])
        if ref is None:
            return
        job = self.grid[ref]
        name = f"control-{job.name}"
        if job.status != "FINISHED":
            print(f"[control] {name}: skipped (job {ref + 1}, {job.name}, did not finish)", flush=True)
            return
        print(f"[control] {name} (job {ref + 1} again: the report's A/A pair) ...", end="", flush=True)
        outcome = self._extra(
            "job",
            name,
            lambda: run_job(
                job.config,
                job.overrides,
                name,
                parent=record.parent,
                job_num=record.total,
                tags={CONTROL_TAG: "true", CONTROL_OF_TAG: str(ref)},
            ),
        )
        if outcome is None:
            self.failed += 1
            return
        self.failed += outcome.status != "FINISHED"
        word = "done" if outcome.status == "FINISHED" else outcome.status
        word += " (pending: kept locally)" if outcome.kept else ""
        extra = f" ({outcome.reason})" if outcome.reason else ""
        print(f" {word} {outcome.wall_s:.1f} s{extra}", flush=True)

    def peers(self) -> None:
        """After the grid and its control job, the sweep's peers (``report.peers``: other packages'
        fits of the same model, :mod:`plnexp.jobs.peers`): each peer's default fit once per data set of the
        grid and model it fits there (:func:`plnexp.jobs.peers.following`: pyPLNmodels' Pln for full and
        profiled alike, its PlnPCA once per rank), in job order (a grid over one data set and the PLN
        model has one peer run per peer; ``sweep=pca_rank`` one per rank), in this process, logged
        as one more child run (job numbers from ``total + 1``, past the control job's; tagged
        ``plnexp.peer=<name>``; scored and timed as :mod:`plnexp.jobs.peers` says). Nothing unless this
        process ran every job of the grid (as :meth:`control`: the peer is then timed in the same
        process, after the jobs, not beside them). A peer not installed: one line, its row left out;
        a peer's fit that fails: one line, its run FAILED; neither changes the sweep's status or exit
        code. An interrupt is raised (the sweep closes KILLED)."""
        from ..jobs import peers as P

        record = self.record
        if record is None or not self._ran_the_grid():
            return
        configs = [self.grid[i].config for i in range(record.total)]
        names = configs[0].report.peers
        num = record.total + 1
        for name in names:
            peer = P.PEERS[name]
            why = peer.available()
            if why is not None:
                print(f"[peer] {name}: {why}: its row is left out", flush=True)
                continue
            first: dict = {}  # (data set, what the peer fits beside the job) -> its first job
            for i, c in enumerate(configs):
                fits = P.following(peer, c.model.value, c.rank)
                first.setdefault((c.dataset, fits.cls, fits.rank), i)
            for i in first.values():
                self._peer(peer, i, num)
                num += 1

    def _peer(self, peer, ref: int, num: int) -> None:
        """One peer's run on the data of job ``ref``, as job number ``num`` (:meth:`peers`)."""
        from . import peer_runs

        assert self.record is not None
        config = self.grid[ref].config
        name = peer_runs.peer_config(peer, config).run_name
        print(f"[peer] {name} (the default fit of {peer.label} on job {ref + 1}'s data) ...", end="", flush=True)
        record = self.record
        outcome = self._extra("peer", name, lambda: peer_runs.run_peer(peer, config, record.parent, num))
        if outcome is None:
            return
        word = "done" if outcome.status == "FINISHED" else outcome.status
        word += " (pending: kept locally)" if outcome.kept else ""
        r = outcome.result
        what = f", {r.n_iter} iterations, run {r.timing.run_s:.3f} s, ELBO {r.loglik:.6g}" if r is not None else ""
        extra = f" ({redact_text(outcome.reason)})" if outcome.reason else ""
        print(f" {word} {outcome.wall_s:.1f} s{what}{extra}", flush=True)


@dataclass(frozen=True)
class GridJob:
    """A job of the sweep as :class:`Task` ran it: what its control job would repeat."""

    config: C.Config
    overrides: tuple
    name: str
    status: str = "RUNNING"  # until it ends (FINISHED earlier: a resumed sweep's reused job)


def write_job_dir(output_dir: str, config: C.Config, overrides=()) -> None:
    """The job's folder, with the config it runs (``config.yaml``, loadable: ``python -m plnexp run``
    of its values) and the overrides that named it (``overrides.yaml``), for people: nothing of
    plnexp reads them back (``rerun`` reads the run's logged config)."""
    if not output_dir:
        return
    import yaml

    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(redact(config_load.loadable(config)), sort_keys=False))
    (folder / "overrides.yaml").write_text(yaml.safe_dump([redact_text(o) for o in overrides]))
