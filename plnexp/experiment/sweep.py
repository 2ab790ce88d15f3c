"""A sweep's life in MLflow, owned here, whatever executor runs its jobs.

::

    python -m plnexp sweep [overrides]              (plnexp.__main__, one process: the driver)
      -> plan.plan, check_data, tracking.check_store  every job composed once and validated once into
                                                      a JobSpec, each data set loaded once, the store
                                                      reached: still no run
      -> open_sweep(sweep_dir, ...)                   the experiment and the parent run, created once,
                                                      and the record <sweep_dir>/plnexp-sweep.json
      -> run_jobs(task, record, sweep_dir, specs, executor)
           the executor (plnexp.experiment.executors: in this process, joblib's workers, a SLURM job
           array) runs each spec as one Task call, given the record: the job runs as a child of
           the parent (plnexp.experiment.runner.run_job), its folder <sweep_dir>/<job number>
      -> close_sweep(record, status)                  after the last job, or on an interrupt
                                                      (KILLED) or a crash (FAILED): children still
                                                      RUNNING are ended (unless their owner is alive
                                                      elsewhere), the summary is read back from
                                                      MLflow, the parent closed.

A job in another process gets the record with its spec (pickled), never through this process's
memory; a worker tells itself from the driver by what its executor called (:func:`job_of`). A job of
``processes`` > 1 (one fit across N JAX processes) runs through its N workers, which :func:`run_job`
starts from the process running the job (the basic launcher's driver) and waits for
(:mod:`plnexp.experiment.processes`: process 0 logs the child run and hands the outcome back); under
SLURM it is one SLURM job of N tasks, each joining the others (:func:`across_in_worker`).

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

import json
import os
import platform
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..system import credentials, interrupts
from ..jobs import provenance
from ..jobs.spec import JobSpec
from . import executors, groups, resume
from . import runner
from .. import store as tracking
from ..jobs import config as C
from ..system.redact import redact, redact_text, unredacted

RECORD_NAME = "plnexp-sweep.json"
SKIPPED = "SKIPPED"  # the status of a job not run because the store had failed (resume=true runs it)


@dataclass(frozen=True)
class SweepRecord:
    """What every job of a sweep reads: where its parent run is, how many jobs, who drives it."""

    uri: str
    experiment_id: str
    parent_id: str
    name: str
    total: int
    host: str
    pid: int
    started: float  # time.time() when the sweep opened
    clock: float = 0.0  # time.monotonic() then (one clock for the processes of a host)
    reused: tuple = ()  # resume=true: plnexp.experiment.resume.Reused of the jobs that earlier runs answer

    def __post_init__(self):  # read back from JSON: lists and dicts
        object.__setattr__(
            self, "reused", tuple(resume.Reused(*r[:4], tuple(r[4]) if len(r) > 4 else ()) for r in self.reused)
        )

    @property
    def parent(self) -> tracking.Parent:
        return tracking.Parent(self.uri, self.experiment_id, self.parent_id)


def new_sweep_dir() -> Path:
    """A fresh folder under ``<outputs>/multirun``, unique even for sweeps started in the same instant."""
    root = C.outputs_dir() / "multirun"
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=time.strftime("%Y-%m-%d_%H-%M-%S-"), dir=root))


# The real URIs of the stores of the sweeps this process wrote records of, by their redacted form:
# the record, a file, holds the URI redacted, and a job in this process (the basic launcher)
# finds the password here (see store_of)
_OWN_STORES: dict[str, str] = {}


def write_record(sweep_dir: Path, record: SweepRecord) -> Path:
    """Write the record whole or not at all; a folder that already holds one is refused. Its
    credentials are masked (:mod:`plnexp.system.redact`): the file outlives the process, and others read it."""
    path = Path(sweep_dir) / RECORD_NAME
    fd, tmp = tempfile.mkstemp(prefix=".plnexp-sweep-", dir=sweep_dir)
    _OWN_STORES[redact_text(record.uri)] = record.uri
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(redact(asdict(record)), f, indent=1)
        os.link(tmp, path)  # atomic, and fails if a record is there already
    finally:
        os.unlink(tmp)
    return path


def read_record(sweep_dir) -> SweepRecord | None:
    """The record as written: its ``uri`` redacted where it had a password (:func:`store_of`)."""
    path = Path(str(sweep_dir)) / RECORD_NAME
    if not path.is_file():
        return None
    return SweepRecord(**json.loads(path.read_text()))


def store_of(record: SweepRecord, configured: str | None) -> str:
    """The URI of the sweep's store as a job reaches it. The record holds it redacted when it has a
    password; the real one is the first that redacts to it of: the one this process wrote the record
    with (the driver), the job's own ``tracking_uri`` (the sweep's overrides), ``$MLFLOW_TRACKING_URI``.
    None of them: one :class:`~plnexp.jobs.config.ConfigError` line."""
    uri = unredacted(record.uri, (_OWN_STORES.get(record.uri), configured, os.environ.get("MLFLOW_TRACKING_URI")))
    if uri is None:
        raise C.ConfigError(
            f"the sweep's store {record.uri}: its password is not in this job's tracking_uri nor in "
            "MLFLOW_TRACKING_URI; allowed values are the store's full URI, given with tracking_uri= or MLFLOW_TRACKING_URI"
        )
    return uri


def open_sweep(
    sweep_dir: Path,
    name: str,
    experiment: str,
    uri: str,
    total: int,
    tags: dict,
    reused: tuple = (),
) -> SweepRecord:
    """Create the experiment (once, before any job) and the parent run, and write the record
    (``reused``: the jobs a resumed sweep does not run again, see :mod:`plnexp.experiment.resume`)."""
    sweep_dir = Path(sweep_dir)
    if (sweep_dir / RECORD_NAME).exists():
        raise C.ConfigError(
            f"hydra.sweep.dir={sweep_dir}: already holds a sweep ({RECORD_NAME}); "
            "allowed values are new or empty folders"
        )
    sweep_dir.mkdir(parents=True, exist_ok=True)
    tags = {"jobs": total, "git_commit": provenance.git_commit(), "sweep": name, "sweep_dir": str(sweep_dir), **tags}
    parent = tracking.open_parent(uri, experiment, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}", tags)
    record = SweepRecord(
        uri,
        parent.experiment_id,
        parent.run_id,
        name,
        total,
        platform.node(),
        os.getpid(),
        time.time(),
        time.monotonic(),
        tuple(reused),
    )
    try:
        write_record(sweep_dir, record)
    except FileExistsError:
        tracking.close_parent(parent, "FAILED", {"status_reason": "sweep folder taken by another sweep"})
        raise C.ConfigError(
            f"hydra.sweep.dir={sweep_dir}: already holds a sweep ({RECORD_NAME}); "
            "allowed values are new or empty folders"
        ) from None
    return record


@dataclass
class Summary:
    status: str
    rows: list  # runner.Row, in job order: one per run (a job of ``replicates=K`` has K runs)
    total: int  # jobs in the grid
    wall_s: float
    parent_id: str
    reused: tuple = ()  # names of the rows a resumed sweep took from earlier runs (not fitted here)
    jobs: tuple = ()  # the job number of each row (empty: one row per job)
    store_error: str = ""  # the line saying the store failed at the close (the rows: what this process saw)

    def _job_of(self) -> list:
        return list(self.jobs) if len(self.jobs) == len(self.rows) else list(range(len(self.rows)))

    @property
    def n_jobs(self) -> int:
        """The jobs of the grid that ran (a job's replicates are one job; the control job is not one
        of the grid: its job number is ``total``, see :meth:`Task.control`)."""
        return len({j for j in self._job_of() if j < self.total})

    @property
    def n_missing(self) -> int:
        """The jobs of the grid with no run in the store: a job whose process ended before it logged
        one (killed, or failed before its run started). Not one of :attr:`n_failed`'s runs, but a
        sweep with any is not a success: its parent ends FAILED and the command exits 1."""
        return self.total - self.n_jobs

    @property
    def n_control(self) -> int:
        """The control job's runs: none, or one per replicate (``replicates``)."""
        return sum(j == self.total for j in self._job_of())

    @property
    def n_peers(self) -> int:
        """The peers' runs (job numbers past the control's: :meth:`Task.peers`)."""
        return sum(j > self.total for j in self._job_of())

    def _peer_rows(self) -> list:
        return [r for j, r in zip(self._job_of(), self.rows) if j > self.total]

    @property
    def fit_s(self) -> float:
        """Seconds in fits: a job's replicates share one program, so a job counts once (its longest run)."""
        longest: dict = {}
        for job, r in zip(self._job_of(), self.rows):
            if r.name not in self.reused:
                longest[job] = max(longest.get(job, 0.0), r.wall_s)
        return sum(longest.values())

    def count(self, status: str) -> int:
        """Runs with this status."""
        return sum(r.status == status for r in self.rows)

    @property
    def n_failed(self) -> int:
        """The runs that did not finish (including those left RUNNING, see :attr:`n_running`), the
        peers' left out: a peer that fails changes neither the sweep's status nor its exit code."""
        return sum(r.status not in ("FINISHED", SKIPPED) for j, r in zip(self._job_of(), self.rows) if j <= self.total)

    @property
    def n_skipped(self) -> int:
        """The jobs not run because the store had failed (resume=true runs them): not failed, not a success."""
        return self.count(SKIPPED)

    @property
    def n_running(self) -> int:
        """Children left RUNNING when the sweep closed: their owner is alive elsewhere or cannot be
        checked from here (:func:`plnexp.store.end_children`)."""
        return self.count("RUNNING")

    @property
    def parent_status(self) -> str:
        """The parent run's status as the close left it: RUNNING where the store failed then."""
        return "RUNNING" if self.store_error else self.status

    def _running_note(self) -> str:
        n = self.n_running
        return f"{n} left RUNNING (owner alive elsewhere or unknown)" if n else ""

    def runs_note(self) -> str:
        """`` (8 runs)`` when jobs have several runs (replicates), else nothing."""
        return f" ({len(self.rows)} runs)" if len(self.rows) != self.n_jobs + self.n_control + self.n_peers else ""

    def table(self) -> str:
        """One line per job; a sweep with rounds shows the verdict's figures (:mod:`.sweep_table`)."""
        from . import sweep_table

        return sweep_table.table(self.rows) if self.rows else "(no job ran)"

    def footer(self) -> str:
        fit_s = self.fit_s
        outside = f" ({100 * (1 - fit_s / self.wall_s):.0f}% outside)" if 0 < fit_s <= self.wall_s else ""
        earlier = {j for j, r in zip(self._job_of(), self.rows) if r.name in self.reused}
        reused = f" ({len(earlier)} FINISHED earlier)" if earlier else ""
        unit = " runs" if self.runs_note() else ""
        control = " + the control job" if self.n_control else ""
        peers = self._peer_rows()
        if peers:
            bad = [r for r in peers if r.status != "FINISHED"]
            control += f" + {len(peers)} peer run{'s' if len(peers) > 1 else ''}"
            control += f" ({len(bad)} {'/'.join(sorted({r.status for r in bad}))})" if bad else ""
        failed = (
            f"{self.n_failed - self.n_running}{unit} failed, {self._running_note()}"
            if self.n_running
            else f"{self.n_failed}{unit} failed"
        )
        failed += f", {self.n_skipped} skipped" if self.n_skipped else ""
        if self.n_missing and self.status != "KILLED":  # (interrupted: the line says how many not started)
            failed += f", {self.n_missing} without a run"
        return (
            f"{self.n_jobs}/{self.total} jobs{control}{self.runs_note()}{reused}, {failed}; {self.wall_s:.1f} s in the "
            f"sweep, {fit_s:.1f} s in fits{outside}; parent run {self.parent_id} {self.parent_status}"
        )

    def show(self, signame: str | None = None) -> None:
        """Print the table, then the footer (stdout) or, after an interrupt, one line on stderr."""
        print(self.table(), flush=True)
        if signame is not None:
            print(self.interrupted_line(signame), file=sys.stderr, flush=True)
        else:
            print(self.footer(), flush=True)
        if self.store_error:
            print(self.store_error, file=sys.stderr, flush=True)

    def interrupted_line(self, signame: str) -> str:
        left = self.total - self.n_jobs
        running = f", {self._running_note()}" if self.n_running else ""
        done = (
            f"{self.count('FINISHED')} of {len(self.rows)} runs of {self.n_jobs} jobs finished"
            if self.runs_note()
            else f"{self.count('FINISHED')} of {self.total} jobs finished"
        )
        return (
            f"plnexp: interrupted by {signame}: {done}, "
            f"{self.count('KILLED')} killed, {self.count('FAILED')} failed, {left} not started{running}; "
            f"parent run {self.parent_id} {'left' if self.store_error else 'closed'} {self.parent_status}"
        )


def close_sweep(record: SweepRecord, status: str = "FINISHED", reason: str = "") -> Summary:
    """End the sweep: children still RUNNING are ended (KILLED on an interrupt, FAILED otherwise) when
    their owner is this process or is gone (a dead local process); a child whose owner is alive
    elsewhere, or cannot be checked from here, is left RUNNING and counted so. The summary table is
    read back from MLflow and logged, and the parent closed with ``status`` (FAILED instead of
    FINISHED when jobs are missing). Safe to call again: it re-reads the store. First, unless
    interrupted, the results kept locally while the store failed (:mod:`plnexp.store.pending`)
    are sent if it is back (else they stay kept, their runs ended FAILED here until sent)."""
    if status != "KILLED":
        try:
            for line in tracking.pending.send_all(record.uri):
                print(line, file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - the store still fails: the results stay kept (the job's line said so)
            pass
    end_status = "KILLED" if status == "KILLED" else "FAILED"
    why = reason or "the sweep ended while this job was running"
    store_error = ""
    try:
        found = tracking.end_children(record.parent, end_status, why, "interrupted" if status == "KILLED" else "lost")
        found = sorted(
            found + resume.rows(record.uri, record.reused), key=lambda r: (r["job"], r.get("replicate", 0))
        )  # the grid
        rows = [runner.Row(r["name"], r["status"], r["metrics"], r["metrics"].get("wall_s", 0.0)) for r in found]
        jobs = tuple(r["job"] for r in found)
    except Exception as e:  # noqa: BLE001 - the store failed: the summary is what this process saw
        store_error = _store_error_line(record, e)
        seen = sorted(_SEEN.get(record.parent_id, {}).items())
        found, rows, jobs = [], [row for _, row in seen], tuple(job for (job, _), _ in seen)
    if status == "FINISHED" and len({j for j in jobs if j < record.total}) < record.total:  # (the control: not counted)
        status = "FAILED"
    here = record.host == platform.node() and record.clock
    wall = time.monotonic() - record.clock if here else time.time() - record.started
    summary = Summary(
        status,
        rows,
        record.total,
        wall,
        record.parent_id,
        tuple(r["name"] for r in found if r.get("reason") == "reused"),
        jobs,
        store_error,
    )
    if store_error:  # the store is down: the parent is not closed (sync or the next command ends it)
        return summary
    tags = {
        "n_done": summary.n_jobs,
        "n_failed": summary.n_failed,
        "wall_s": f"{summary.wall_s:.1f}",
        "fit_s": f"{summary.fit_s:.1f}",
    }
    if summary.n_running:
        tags["n_running"] = summary.n_running
    if reason:
        tags["status_reason"] = reason
    tags["mlflow.note.content"] = (
        f"**Sweep `{record.name}`** ({status}): {summary.n_jobs} of {record.total} jobs ran{summary.runs_note()}, "
        f"{summary.n_failed} failed; each job is a child run (expand this run's + to see them). `python -m plnexp report --run "
        f"{record.parent_id}` writes its table and plots and attaches them here (a sweep does it at its end)."
    )
    if status == "KILLED":
        tags["reason"] = "interrupted"
    try:
        tracking.close_parent(record.parent, status, tags, summary.table() + "\n" if rows else None)
    except Exception as e:  # noqa: BLE001 - the store failed at the last step: one line, the summary still shown
        summary.store_error = _store_error_line(record, e)
    return summary


# What this process saw of each sweep's jobs (by parent run, then (job number, replicate)): the
# summary's rows when the store cannot be read back at the sweep's close (:func:`close_sweep`)
_SEEN: dict[str, dict[tuple[int, int], runner.Row]] = {}


def _saw(record: SweepRecord | None, num: int | None, rows) -> None:
    if record is not None and num is not None:
        for k, row in enumerate(rows):
            _SEEN.setdefault(record.parent_id, {})[(num, k)] = row


def _row(outcome, name: str) -> runner.Row:
    row = getattr(outcome, "row", None)
    return row() if callable(row) else runner.Row(name, outcome.status, {}, 0.0)


def _store_error_line(record: SweepRecord, e: BaseException) -> str:
    """The one line a store that failed at the sweep's close gives (no traceback)."""
    first = redact_text(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
    return (
        f"plnexp: store error: {redact_text(record.uri)}: the sweep's close failed ({type(e).__name__}: {first}); "
        f"the parent run {record.parent_id} stays RUNNING until python -m plnexp sync (or the next plnexp "
        "command on this store) ends it, the results kept in pending/ are sent then"
    )


# ---------------------------------------------------------------- a worker whose driver is gone
_WATCHED: set[int] = set()  # the processes (by pid: a fork is another) whose driver watchdog runs


def watch_driver(record: SweepRecord, poll_s: float = 0.5, grace_s: float = 3.0) -> None:
    """In a sweep's worker process (joblib's loky workers: the record's driver is another process of
    this host), start once a daemon thread that ends this process when the driver is gone: a SIGKILL
    of the driver runs no handler and loky cannot shut its pool down, so the workers would run on
    (issue #48). Gone: the driver's PID exists no more, or belongs to a process started since (its
    start time, read when the watch starts), or this process's parent changed (reparented). Then it
    ends this process's RUNNING runs FAILED ``orphaned`` (what the next command's sweep-up would
    say), waiting at most ``grace_s`` for the store, and exits (``os._exit(1)``). Never in the driver,
    nor in a SLURM job (the cluster's own machinery ends those); a compiled fit releases the GIL, so
    the thread runs during a fit."""
    import threading

    from ..system import slurm

    me = os.getpid()
    if record.pid == me or record.host != platform.node() or slurm.in_job() or me in _WATCHED:
        return
    _WATCHED.add(me)
    driver, parent = tracking.LocalProcess.of(record.pid), os.getppid()

    def gone() -> bool:
        return driver.alive() is False or os.getppid() != parent

    def watch() -> None:
        while not gone():
            time.sleep(poll_s)
        reason = f"orphaned: the sweep's driver ({driver}) ended without closing this run"
        ender = threading.Thread(
            target=tracking.end_process_runs, args=(record.uri, "FAILED", reason, "orphaned"), daemon=True
        )
        ender.start()
        ender.join(grace_s)
        os._exit(1)

    threading.Thread(target=watch, name="plnexp-driver-watch", daemon=True).start()


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


def job_dir(sweep_dir: Path, num: int | None) -> str:
    """A sweep job's folder: ``<sweep dir>/<job number>`` (as Hydra's ``hydra.sweep.subdir``)."""
    return str(Path(sweep_dir) / str(num or 0))


def write_job_dir(output_dir: str, config: C.Config, overrides=()) -> None:
    """The job's folder, with the config it runs (``config.yaml``, loadable: ``python -m plnexp run``
    of its values) and the overrides that named it (``overrides.yaml``), for people: nothing of
    plnexp reads them back (``rerun`` reads the run's logged config)."""
    if not output_dir:
        return
    import yaml

    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(redact(C.loadable(config)), sort_keys=False))
    (folder / "overrides.yaml").write_text(yaml.safe_dump([redact_text(o) for o in overrides]))


def job_of(task: Task, record: SweepRecord, sweep_dir: str, here: bool, spec: JobSpec) -> str | None:
    """A sweep's job in its folder, in the driver (``here``) or a worker process (a joblib worker, a
    SLURM task): what executors run, ``partial``-ed with all but the spec."""
    return task(spec, record, job_dir(Path(sweep_dir), spec.num), here=here)


@dataclass(frozen=True)
class Unit:
    """Jobs a SLURM task runs one after the other: a job alone, or a group (the jobs that differ only
    by strategy, :func:`plnexp.experiment.groups.group_key`) followed by its rounds, so that every
    ratio of the group is measured on one node, in one process."""

    specs: tuple[JobSpec, ...]
    rounds: bool = False

    @property
    def tasks(self) -> int:
        """The SLURM tasks the unit's job is one of: ``processes`` of a job of one fit across
        processes (each task one process), else 1."""
        return self.specs[0].config.processes if len(self.specs) == 1 else 1

    @property
    def num(self) -> int | None:
        """The job number of a unit of one job (None for a group)."""
        return self.specs[0].num if len(self.specs) == 1 else None

    @property
    def name(self) -> str:
        more = len(self.specs) - 1
        return f"{self.specs[0].name}{f' and {more} more (a group: rounds on its node)' if more else ''}"


@dataclass
class Finished:
    """What a SLURM task hands back: its jobs' lines and its group's verdicts (logged by the driver)."""

    lines: list[str]
    verdicts: list


def units_of(specs, rounds: bool) -> list[Unit]:
    """The SLURM tasks of a sweep: with rounds, each group of two strategies or more is one task
    (its jobs in job order, then its rounds); every other job is a task of its own."""
    if not rounds:
        return [Unit((s,)) for s in specs]
    across = [s for s in specs if s.config.processes > 1]  # never in a group (plnexp.experiment.groups)
    compared, alone = groups.partition([s for s in specs if s.config.processes == 1])
    alone += across
    units = [Unit(tuple(members), rounds=True) for members in compared] + [Unit((s,)) for s in alone]
    return sorted(units, key=lambda u: u.specs[0].num or 0)


def unit_in_worker(task: Task, record: SweepRecord, sweep_dir: str, unit: Unit) -> Finished:
    """A SLURM task: its unit's jobs here, one after the other (their programs kept), then the
    group's rounds on this node; the verdicts go back to the driver, which logs them. One of the
    tasks of a job of ``processes`` > 1: :func:`across_in_worker`."""
    if unit.tasks > 1:
        return across_in_worker(task, record, sweep_dir, unit.specs[0])
    task = replace(task, held=groups.Held() if unit.rounds else None, grid={})
    lines = [job_of(task, record, sweep_dir, False, spec) for spec in unit.specs]
    verdicts = []
    if unit.rounds:
        configs = {s.num: s.config.as_study() for s in unit.specs if s.num is not None}
        uri = store_of(record, unit.specs[0].config.tracking_uri)
        verdicts = groups.judge_groups(replace(record, uri=uri), configs, task.held)
        node = platform.node()
        for v in verdicts:
            dropped = f", {v.dropped} dropped" if v.dropped else ""
            lines.append(f"[rounds] {v.label}: {v.rounds} rounds{dropped} in {v.seconds:.1f} s on {node}")
    return Finished([line for line in lines if line], verdicts)


def across_in_worker(task: Task, record: SweepRecord, sweep_dir: str, spec: JobSpec) -> Finished:
    """One of the N tasks of the SLURM job of a job of ``processes=N`` (:class:`plnexp.experiment.executors.Slurm`
    submits it with N tasks): join the others first (``jax.distributed.initialize()`` reads SLURM's
    environment, as under ``srun -n N python -m plnexp run``); then task 0 runs the job as any SLURM
    task does (its run logged, a child of the sweep's parent; its line back to the driver, which
    reads task 0's result) and the others fit with it, reporting nothing. A task that fails ends
    non-zero with one line (the driver's wait reports the job)."""
    from ..system import runtime
    from . import processes

    n = spec.config.processes
    runtime.configure()  # this process's settings before JAX starts (as a worker: processes.worker)
    processes.placement(n)  # srun started another number of tasks: one line (ValueError)
    processes.Placement(None, None, None).initialize()
    import jax

    if jax.process_index() == 0:
        line = job_of(replace(task, held=None, grid={}), record, sweep_dir, False, spec)
        finished = Finished([line] if line else [], [])
    else:
        config, output_dir = spec.config.as_study(), job_dir(Path(sweep_dir), spec.num)
        if processes.follow(config, spec.overrides, spec.name, output_dir) != 0:
            raise RuntimeError(f"job {spec.name}: process {jax.process_index()} of {n} did not finish")
        finished = Finished([], [])
    jax.distributed.shutdown()  # waits for the others: process 0 is logging the run
    return finished


def run_jobs(task: Task, record: SweepRecord, sweep_dir: Path, specs, executor: executors.Executor) -> list:
    """The sweep's jobs through ``executor`` (each one :class:`Task` call where the executor runs
    it), then, where this process ran the whole grid, its control job and its peers. Under SLURM
    with rounds on (``report.rounds``), each group is one SLURM task (:class:`Unit`) and the groups'
    verdicts come back (the driver logs them: :func:`plnexp.experiment.groups.log_verdicts`)."""
    from functools import partial

    if isinstance(executor, executors.Slurm):
        specs = list(specs)
        units = units_of(specs, rounds=bool(specs) and specs[0].config.report.rounds > 0)
        results = executor.run(partial(unit_in_worker, task, record, str(sweep_dir)), units, record.total)
        return [v for r in results if r is not None for v in r.verdicts]
    if not isinstance(executor, executors.InProcess):  # side by side in workers: no control job, no peers
        executor.run(partial(job_of, task, record, str(sweep_dir), False), list(specs), record.total)
        return []
    executor.run(partial(job_of, task, record, str(sweep_dir), True), list(specs), record.total)
    task.control()  # after the grid: the sweep's control job, when this process ran the grid (Task.control)
    task.peers()  # then the peers' fits (report.peers), on the same condition (Task.peers)
    return []


def force_stop(record: SweepRecord | None, uri: str, signame: str) -> None:
    """From the interrupt helper thread, when the main thread is stuck in a compiled fit: end this
    process's RUNNING runs KILLED and close the sweep (the process exits right after)."""
    reason = f"interrupted by {signame} (twice: stopped inside a compiled fit)"
    tracking.end_process_runs(uri, "KILLED", reason, "interrupted")
    if record is not None:
        close_sweep(record, "KILLED", reason).show(signame)
    else:
        print(f"plnexp: interrupted by {signame}: {killed_line(uri)}", file=sys.stderr, flush=True)


def killed_line(uri: str) -> str:
    """What an interrupted single ``run`` says: its run id (the runs this process created)."""
    ids = ", ".join(r.info.run_id for r in tracking.process_runs(uri))
    return f"the run {ids} was recorded KILLED" if ids else "no run had been created"


@dataclass
class Ended:
    """How a sweep session ended: its record and summary, and the interrupt or error that ended it."""

    record: SweepRecord
    summary: Summary
    stop: interrupts.Interrupted | None = None
    error: BaseException | None = None


def session(
    sweep_dir: Path,
    name: str,
    experiment: str,
    uri: str,
    total: int,
    tags: dict,
    jobs,
    *,
    header,
    reused: tuple = (),
) -> Ended:
    """A sweep's whole life, the one path of ``sweep``, ``sweep ... resume=true`` and ``rerun`` of a
    sweep: open the parent (:func:`open_sweep`; a :class:`~plnexp.jobs.config.ConfigError` before anything
    exists), print ``header(record)``, run ``jobs(record)`` (:func:`run_jobs` through an executor),
    then close it whatever happened (FINISHED; KILLED on Ctrl-C or SIGTERM; FAILED on an error of the
    machinery) and show the summary. A second signal while a fit is stuck in compiled code ends the
    process's runs and the sweep from the interrupt helper thread (:func:`force_stop`)."""
    held: dict = {}
    force = lambda signum: force_stop(held.get("record"), uri, signal.Signals(signum).name)
    with interrupts.handled(force) as guard:
        record = held["record"] = open_sweep(sweep_dir, name, experiment, uri, total, tags, reused=reused)
        print(header(record), flush=True)
        status, reason, stop, error = "FAILED", "the sweep stopped on an error", None, None
        try:
            jobs(record)
            status, reason = "FINISHED", ""
        except BaseException as e:  # noqa: BLE001 - an interrupt, or an error of the machinery
            stop = interrupts.stopped_by(e, guard)
            if stop is None:
                error = e
                reason = f"the sweep stopped on an error: {type(e).__name__}"
            else:
                status, reason = "KILLED", f"interrupted by {stop.name}"
        guard.stopping()
        with interrupts.deferred():  # the parent never stays RUNNING
            summary = close_sweep(record, status, reason)
        summary.show(stop.name if stop is not None else None)
    return Ended(record, summary, stop, error)
