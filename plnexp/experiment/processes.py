"""``processes=N``: one fit across N JAX processes, process 0 owning its run.

``python -m plnexp run strategy=scan_sharded processes=N`` (``model=full`` or ``pca``: the models
the registry's ``Strategy.processes`` names) does not fit in its own process, whose
JAX has started already (its checks list the devices): it starts **workers**, ``python -m
plnexp.experiment.processes SPEC OUTPUT_DIR``, each of which calls ``jax.distributed.initialize``
before any other use of JAX (CPU collectives over gloo), then runs the job. Where they come from:

- on one machine (no ``srun``): N local workers, the coordinator on ``127.0.0.1`` at a free port,
  told their place by :data:`COORDINATOR`, :data:`NUM_PROCESSES` and :data:`PROCESS_ID`;
- under ``srun -n N python -m plnexp run ... processes=N``: each of the N tasks starts one worker,
  which inherits SLURM's environment, and ``jax.distributed.initialize()`` reads its place there
  (:func:`placement`); SLURM's task 0 is JAX's process 0.

The mesh of ``scan_sharded`` then spans every process's devices, and each process puts on them
only its own rows (:func:`plnexp.core.data_rows.row_range`), which is all it reads of the data where the
source allows (:meth:`plnexp.jobs.dataset_specs.DatasetSpec.load_rows`: CSV lines, ``.h5ad`` rows in
backed mode, ``simulate_pca``'s blocks; ``simulate``'s draw is whole, then sliced); the float64 host
reference and log y! are summed across processes over each one's rows; each process's peak memory is
gathered onto process 0's run (:func:`plnexp.experiment.runner.peak_rss_by_process`).

Process 0 runs the job (:func:`plnexp.experiment.runner.run_job`: its run created RUNNING, logged,
ended; ``run``'s one-line summary); the others run the same fit and report nothing
(:func:`plnexp.experiment.runner.execute` with ``lead=False``: no store, no floor). The launcher
(:func:`launch`) waits for its workers; the first to fail (an error, a signal, SIGKILL) ends the
others, the run left RUNNING by a worker is ended FAILED with that reason, and the command exits 1
with one line. A worker ends when its launcher does (Linux: ``PR_SET_PDEATHSIG``).

**A sweep's jobs and a rerun** (:func:`run_job`): under the basic launcher, a sweep's driver runs
each job of ``processes`` > 1 by starting its N workers here and waiting for them (jobs one after
the other, as always there); process 0 logs the run as a child of the sweep's parent (the parent
travels in the pickled :class:`Job`) and hands its outcome back (:class:`Ran`, in the job's folder);
a worker that fails makes the job FAILED with the one line, and the sweep goes on. ``resume=true``
then runs it again like any job that did not finish; ``rerun`` of such a run (or of its sweep)
starts its workers the same way. Under the SLURM launcher such a job is one SLURM job of N tasks,
each of which joins the others as under ``srun`` (:func:`plnexp.experiment.sweep_dispatch.across_in_worker`:
task 0 runs the job, the others :func:`follow`). A joblib worker does not start workers: a sweep of
``processes`` > 1 under it is refused (:mod:`plnexp.experiment.plan`), and the interleaved rounds
leave such jobs out (:mod:`plnexp.experiment.groups`).
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..jobs.spec import JobSpec
from .srun import srun_tasks
from ..system import interrupts
from ..system.redact import redact_text

if TYPE_CHECKING:
    from ..jobs.config import Config
    from ..store import Parent

COORDINATOR, NUM_PROCESSES, PROCESS_ID = "PLNEXP_COORDINATOR", "PLNEXP_NUM_PROCESSES", "PLNEXP_PROCESS_ID"
GRACE_S = 5.0  # the other workers' time to end on SIGTERM once one failed, before SIGKILL
POLL_S = 0.05
REASON = "processes"  # the reason tag of a run ended by the launcher


@dataclass(frozen=True)
class Placement:
    """Where a worker joins: the coordinator's address, the number of processes and this one's id
    (all None: ``jax.distributed.initialize()`` reads them from SLURM's environment)."""

    coordinator: str | None
    num_processes: int | None
    process_id: int | None

    def initialize(self) -> None:
        import jax

        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPUs' collectives across processes
        if self.coordinator is None:
            jax.distributed.initialize()
        else:
            jax.distributed.initialize(self.coordinator, self.num_processes, self.process_id)


def placement(processes: int, environ: Mapping[str, str] = os.environ) -> Placement | None:
    """How the workers of a fit across ``processes`` processes find each other: None where this
    command starts them all here (no srun); a :class:`Placement` read from SLURM's environment under
    ``srun -n processes`` (each task starts one worker). ValueError (one line) where srun started
    another number of tasks."""
    tasks = srun_tasks(environ)
    if tasks is None or tasks == 1:
        return None
    if tasks != processes:
        raise ValueError(
            f"processes={processes}: srun started {tasks} tasks; allowed are srun -n {processes} "
            f"(each task one process) or no srun (the {processes} processes start on this machine)"
        )
    return Placement(None, None, None)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _forward(stream, out, ended: threading.Event) -> None:
    """A worker's output (``stream``) on this process's (``out``), without gloo's connection lines
    (``[Gloo] Rank 0 is connected to 1 peer ranks``, one per process and run), and nothing once the
    fit is ``ended`` (a process failed or was stopped): what the others then say is how the loss of a
    peer reached them (a collective's connection reset, JAX's coordination service ending them)."""
    for line in stream:
        if not line.startswith("[Gloo]") and not ended.is_set():
            out.write(line)
            out.flush()


def _join(threads: Sequence[threading.Thread]) -> None:
    for t in threads:
        t.join(GRACE_S)


def _end(procs: Sequence[subprocess.Popen], signum: int = signal.SIGTERM) -> None:
    """Signal the workers still running, then SIGKILL those left after :data:`GRACE_S`."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signum)
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _local(n: int) -> list[dict[str, str]]:
    """The environments of ``n`` workers started on this machine (the coordinator at a free port)."""
    address = f"127.0.0.1:{free_port()}"
    return [{**os.environ, COORDINATOR: address, NUM_PROCESSES: str(n), PROCESS_ID: str(i)} for i in range(n)]


@dataclass(frozen=True)
class Launched:
    """How the workers of one fit ended: ``failure`` "" when every one exited 0, else the first
    failure's words (``process 1 of 2 was killed by SIGKILL``); ``closed``: the runs they left
    RUNNING, ended FAILED then."""

    failure: str = ""
    closed: tuple = ()

    def line(self, n: int) -> str:
        run_note = f"; run {self.closed[0].info.run_id} ended FAILED" if self.closed else ""
        return f"the fit across {n} processes failed: {self.failure}{run_note}"


def launch(cmd: Sequence[str], envs: Sequence[Mapping[str, str]], uri: str, n: int, first: int = 0) -> Launched:
    """Start one worker ``cmd`` per environment of ``envs`` and wait for them all: the one loop of
    ``run`` (its command) and of a sweep's or a rerun's job (:func:`run_job`). The first to fail (an
    error, a signal) ends the others, and the runs they left RUNNING are ended FAILED with its words.
    On an interrupt (Ctrl-C, SIGTERM: raised in this process's main thread), the workers are sent
    it, then SIGKILL after :data:`GRACE_S`, their runs ended KILLED, and the interrupt raised again."""
    from .. import store as tracking

    procs: list[subprocess.Popen] = []
    threads: list[threading.Thread] = []
    ended = threading.Event()
    failed: tuple[int, int] | None = None
    try:
        pipe = subprocess.PIPE
        procs = [subprocess.Popen(list(cmd), env=dict(env), stdout=pipe, stderr=pipe, text=True) for env in envs]
        threads = [
            threading.Thread(target=_forward, args=(stream, out, ended), daemon=True)
            for p in procs
            for stream, out in ((p.stdout, sys.stdout), (p.stderr, sys.stderr))
        ]
        for t in threads:
            t.start()
        while True:
            codes = [p.poll() for p in procs]
            bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if bad:  # a worker killed by a signal first: the others' errors are what it left them
                ended.set()
                failed = min(bad, key=lambda b: (b[1] >= 0, b[0]))
                break
            if all(c == 0 for c in codes):
                _join(threads)
                return Launched()
            time.sleep(POLL_S)
    except KeyboardInterrupt as e:
        ended.set()
        stop = interrupts.as_interrupted(e)
        with interrupts.deferred():  # a second signal waits for the workers' end and their runs'
            _end(procs, stop.signum)
            _join(threads)
            reason = f"interrupted by {stop.name}"
            tracking.end_runs_of_processes(uri, [p.pid for p in procs], "KILLED", reason, "interrupted")
        raise
    _end(procs)
    _join(threads)
    assert failed is not None  # the loop ends on a failure, else returns
    i, code = failed
    line = f"process {first + i} of {n} {_how(code)}"
    closed = tracking.end_runs_of_processes(uri, [p.pid for p in procs], "FAILED", line, REASON)
    return Launched(line, tuple(closed))


def run(spec: JobSpec, uri: str, output_dir: str) -> int:
    """``python -m plnexp run ... processes=N``: start the workers (N here, or this srun task's one),
    wait for them; the exit code: 0, 1 when a worker failed, 128 + the signal on an interrupt."""
    n = spec.config.processes
    try:
        where = placement(n)
    except ValueError as e:
        print(f"plnexp: error: {e}", file=sys.stderr, flush=True)
        return 2
    device = spec.config.device.value
    if where is None and device != "cpu":
        print(f"plnexp: error: {device_line(n, device)}", file=sys.stderr, flush=True)
        return 2
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    spec_file = folder / "job_spec.pkl"
    spec_file.write_bytes(pickle.dumps(spec))
    cmd = [sys.executable, "-m", "plnexp.experiment.processes", str(spec_file), str(folder)]
    envs = _local(n) if where is None else [dict(os.environ)]
    first = int(os.environ.get("SLURM_PROCID", "0") or 0) if where is not None else 0
    with interrupts.handled() as guard:
        try:
            done = launch(cmd, envs, uri, n, first)
        except KeyboardInterrupt as e:
            guard.stopping()
            stop = interrupts.as_interrupted(e)
            print(f"plnexp: interrupted by {stop.name}: the fit across {n} processes was stopped", file=sys.stderr)
            return stop.exit_code
    if not done.failure:
        return 0
    print(f"plnexp: error: {done.line(n)}", file=sys.stderr, flush=True)
    return 1


def device_line(n: int, device: str) -> str:
    return (
        f"processes={n} with device={device}: the {n} processes started on this machine would "
        f"share its accelerators; allowed are device=cpu here, or srun -n {n} with one accelerator per task"
    )


@dataclass(frozen=True)
class Job:
    """A job whose workers a sweep's driver or a rerun starts (:func:`run_job`), pickled into its
    folder: what process 0 hands :func:`plnexp.experiment.runner.run_job` (``parent``: the sweep's
    parent run, whose child the job's run is; None: a run of its own, in the config's store)."""

    config: Config
    overrides: tuple
    name: str
    parent: Parent | None = None
    num: int | None = None
    tags: dict | None = None
    shown: bool = False  # python -m plnexp run's job: process 0 prints its summary, exits 1 unless FINISHED


RAN_FILE = "outcome.pkl"


@dataclass(frozen=True)
class Ran:
    """A job's outcome as process 0 hands it back to the process that started the workers (its runs
    are in the store): what a sweep's :class:`plnexp.experiment.job_task.Task` and a rerun read of a
    :class:`plnexp.experiment.runner.Outcome`."""

    name: str
    status: str
    reason: str = ""
    run_id: str = ""
    kept: str = ""
    clock: float = 0.0  # time.monotonic() when the job started (one clock for the processes of a host)
    wall_s: float = 0.0
    rows: tuple = ()  # runner.Row of each replicate's run
    text: str = ""  # the outcome's summary()

    @classmethod
    def of(cls, outcome) -> Ran:
        batch = getattr(outcome, "batch", None) or [outcome]
        return cls(
            outcome.name,
            outcome.status,
            outcome.reason,
            outcome.run_id,
            outcome.kept,
            outcome.clock,
            outcome.wall_s,
            tuple(o.row() for o in batch),
            outcome.summary(),
        )

    def row(self):
        from .runner import Row

        return self.rows[0] if len(self.rows) == 1 else Row(self.name, self.status, {}, self.wall_s)

    @property
    def batch(self) -> list:
        """Each replicate's (a job of ``replicates`` > 1); empty for one run."""
        return [Ran(r.name, r.status, rows=(r,), wall_s=r.wall_s) for r in self.rows] if len(self.rows) > 1 else []

    def summary(self) -> str:
        return self.text or f"{self.name} {self.status}: {self.reason}"


def run_job(
    config: Config,
    overrides=(),
    name: str | None = None,
    output_dir: str = "",
    *,
    parent: Parent | None = None,
    job_num: int | None = None,
    tags: dict | None = None,
) -> Ran:
    """A job of ``config.processes`` > 1 processes started here, from a sweep's driver (each job in
    turn, the basic launcher) or a rerun: its N workers on this machine, waited for; process 0 runs
    :func:`plnexp.experiment.runner.run_job` (the run a child of ``parent``) and hands back its
    outcome (:class:`Ran`). A worker that fails: a FAILED outcome whose reason is the one line, the
    run it left RUNNING ended FAILED. An interrupt: the workers stopped, their runs KILLED, raised."""
    from .. import store as tracking
    from ..jobs.config import outputs_dir

    n, name = config.processes, name or config.run_name
    clock = time.monotonic()
    if config.device.value != "cpu":
        return Ran(name, "FAILED", device_line(n, config.device.value), clock=clock)
    uri = parent.uri if parent is not None else tracking.tracking_uri(config.tracking_uri)
    if output_dir:
        folder = Path(output_dir)
        folder.mkdir(parents=True, exist_ok=True)
    else:
        root = outputs_dir() / "processes"
        root.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=time.strftime("%Y-%m-%d_%H-%M-%S-"), dir=root))
    job_file, ran_file = folder / "job.pkl", folder / RAN_FILE
    ran_file.unlink(missing_ok=True)
    job_file.write_bytes(pickle.dumps(Job(config, tuple(overrides), name, parent, job_num, tags)))
    cmd = [sys.executable, "-m", "plnexp.experiment.processes", str(job_file), str(folder)]
    done = launch(cmd, _local(n), uri, n)
    ran = pickle.loads(ran_file.read_bytes()) if ran_file.is_file() else None
    if done.failure or ran is None:
        why = done.line(n) if done.failure else f"the fit across {n} processes: process 0 handed back no outcome"
        run_id = done.closed[0].info.run_id if done.closed else (ran.run_id if ran is not None else "")
        return Ran(name, "FAILED", why, run_id, clock=clock, wall_s=time.monotonic() - clock)
    return ran


def _end_with_launcher() -> None:
    """On Linux, this worker is SIGKILLed when the process that started it ends (a sweep's driver
    SIGKILLed, which can end nothing itself): no fit goes on alone; the run it leaves RUNNING is the
    next command's to end (its owner gone: ``orphaned``)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before the call
        os._exit(1)


def worker(spec_file: str, output_dir: str, environ: Mapping[str, str] = os.environ) -> int:
    """One worker: join the others (before any other use of JAX), then run the job: process 0 as
    ``run`` does (its run logged; of a :class:`Job`, a sweep's or a rerun's, its outcome written into
    ``output_dir`` for the process that started the workers), the others without any store. The
    exit code: 0, or 1 when the job did not finish (of a :class:`Job`: when process 0 wrote no
    outcome)."""
    from ..system import credentials, runtime

    _end_with_launcher()
    credentials.install()
    runtime.configure()
    if environ.get(COORDINATOR):
        Placement(environ[COORDINATOR], int(environ[NUM_PROCESSES]), int(environ[PROCESS_ID])).initialize()
    else:
        Placement(None, None, None).initialize()
    import jax

    work: JobSpec | Job = pickle.loads(Path(spec_file).read_bytes())
    if not isinstance(work, Job):  # python -m plnexp run: process 0 says the run's summary, as run does
        work = Job(work.config, tuple(work.overrides), work.name, tags=work.run_tags or None, shown=True)
    code = _job(work, output_dir, jax.process_index() == 0)
    if code == 0:
        jax.distributed.shutdown()  # waits for the others: process 0 is logging the run
    return code


def follow(config: Config, overrides, name: str, output_dir: str) -> int:
    """A process other than process 0 (a worker, a SLURM task): the same fit, nothing reported (no
    store, no floor); 0 when it finished, else 1 with one line on stderr."""
    import jax

    from . import runner

    out = runner.execute(config, overrides, name, output_dir, lead=False)
    if out.status == "FINISHED":
        return 0
    print(f"plnexp: error: process {jax.process_index()}: {redact_text(out.reason)}", file=sys.stderr, flush=True)
    return 1


def _job(job: Job, output_dir: str, lead: bool) -> int:
    """A :class:`Job` in a worker: process 0 runs it as :func:`plnexp.experiment.runner.run_job`
    (its run logged, a child of the sweep's parent) and writes its :class:`Ran` into the folder
    (whole or not at all; ``run``'s job: prints its summary instead); the others fit with it."""
    if not lead:
        return follow(job.config, job.overrides, job.name, output_dir)
    from . import runner

    try:
        out = runner.run_job(
            job.config, job.overrides, job.name, output_dir, parent=job.parent, job_num=job.num, tags=job.tags
        )
    except Exception as e:  # noqa: BLE001 - the store failed under the job: one line, the launcher says the rest
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"plnexp: error: job {job.name}: {type(e).__name__}: {redact_text(first)}", file=sys.stderr, flush=True)
        return 1
    if job.shown:
        print(f"{out.summary()}  (run {out.run_id}, experiment {job.config.experiment!r})", flush=True)
        return 0 if out.status == "FINISHED" else 1
    path = Path(output_dir) / RAN_FILE
    tmp = path.with_name(f".{RAN_FILE}.{os.getpid()}")
    tmp.write_bytes(pickle.dumps(Ran.of(out)))
    os.replace(tmp, path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("plnexp: error: usage: python -m plnexp.experiment.processes SPEC_FILE OUTPUT_DIR", file=sys.stderr)
        return 2
    return worker(args[0], args[1])


if __name__ == "__main__":
    # the module's own classes (Job, Ran), not __main__'s copies: what the pickles of both ends name
    from plnexp.experiment import processes as module

    code = module.main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not waiting for JAX's threads, nor for a peer that is gone
