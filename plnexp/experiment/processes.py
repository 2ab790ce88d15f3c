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

Process 0 runs the job (:func:`plnexp.experiment.job_task.run_job`: its run created RUNNING, logged,
ended) and hands its outcome back (:class:`Ran`: ``run``'s one-line summary); the others run the
same fit and report nothing (:func:`plnexp.experiment.runner.execute` with ``lead=False``: no store,
no floor). The launcher (:func:`launch`) waits for its workers, each one's output in a file of its
own (``process-K.log`` in the run's folder), said only once all succeeded; the first to fail (an
error, a signal, SIGKILL, stopped past JAX's heartbeat: :data:`HEARTBEAT_S`) ends the others, the
run left RUNNING by a worker is ended FAILED with that reason, and the command exits 1 with one
line naming that worker and the logs. A worker ends when its launcher does (Linux:
``PR_SET_PDEATHSIG``).

**A sweep's jobs and a rerun** (:func:`plnexp.experiment.job_task.run_job`, the one way a job runs,
through :func:`start`): under the basic launcher, a sweep's driver runs
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
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .srun import srun_tasks
from ..system import interrupts
from ..system.commandline import first_line
from ..system.redact import redact_text

if TYPE_CHECKING:
    from ..jobs.config import Config
    from ..jobs.spec import JobSpec
    from ..store import Parent

COORDINATOR, NUM_PROCESSES, PROCESS_ID = "PLNEXP_COORDINATOR", "PLNEXP_NUM_PROCESSES", "PLNEXP_PROCESS_ID"
GRACE_S = 5.0  # the other workers' time to end on SIGTERM once one failed, before SIGKILL
POLL_S = 0.05
REASON = "processes"  # the reason tag of a run ended by the launcher
# a process that sends JAX's coordination service no heartbeat for this long (stopped, hung) is gone:
# the others are aborted (JAX's default: 100 s; a busy machine still heartbeats well within this)
HEARTBEAT_S = 20
LOG = "process-{}.log"  # a worker's output (stdout and stderr), in its job's folder


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
        jax.distributed.initialize(
            self.coordinator, self.num_processes, self.process_id, heartbeat_timeout_seconds=HEARTBEAT_S
        )


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


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, SIGTSTP: state ``T`` in Linux's /proc; elsewhere
    never said)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "Tt"
    except (OSError, IndexError):
        return False


def _how(code: int | None) -> str:
    if code is None:  # still there, stopped: JAX's coordination service ended the others
        return f"was stopped (SIGSTOP or SIGTSTP) and sent no heartbeat for {HEARTBEAT_S} s"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _said(log: Path) -> str:
    """The last error line a worker said itself (``plnexp: error: WHAT``) in its ``log``: `` (WHAT)``."""
    said = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("plnexp: error: ")]
    return f" ({said[-1].removeprefix('plnexp: error: ')})" if said else ""


def _culprit(procs: Sequence[subprocess.Popen]) -> int:
    """The worker whose failure the others' is: one stopped (the others ended by the heartbeat that
    it missed), else the first killed by a signal (the others' errors are the loss of that peer), else
    the first that exited with an error."""
    codes = [p.poll() for p in procs]
    stopped = [i for i, (p, c) in enumerate(zip(procs, codes)) if c is None and _stopped(p.pid)]
    failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
    return min(stopped or failed, key=lambda i: ((codes[i] or -1) > 0, i))  # a signal first


def _end(procs: Sequence[subprocess.Popen], signum: int = signal.SIGTERM) -> None:
    """Signal the workers still running (and SIGCONT: a stopped one takes the signal then), then
    SIGKILL those left after :data:`GRACE_S`."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signum)
            p.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _local(n: int) -> list[dict[str, str]]:
    """The environments of ``n`` workers started on this machine (the coordinator at a free port)."""
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    return [{**os.environ, COORDINATOR: address, NUM_PROCESSES: str(n), PROCESS_ID: str(i)} for i in range(n)]


def _replay(logs: Sequence[Path]) -> None:
    """The workers' output, once they all exited 0, on this process's stderr as they said it, but gloo's
    connection lines (``[Gloo] Rank 0 is connected to 1 peer ranks``, one per process and run)."""
    for log in logs:
        for line in log.read_text(errors="replace").splitlines(keepends=True):
            if not line.startswith("[Gloo]"):
                sys.stderr.write(line)
    sys.stderr.flush()


def _close(uri: str, procs: Sequence[subprocess.Popen], line: str, first: int, since_ms: int) -> tuple:
    """The runs the workers ``procs`` (ended) left RUNNING ended FAILED with ``line``; process 0's
    runs (``first``: the process id of ``procs[0]``), in any status, as they are now: by their host
    and PID tags, started since ``since_ms`` (process 0 may have ended its run itself, its peer lost)."""
    from .. import store as tracking
    from ..store.queries import search_experiments

    tracking.end_runs_of_processes(uri, [p.pid for p in procs], "FAILED", line, REASON)
    if first != 0:
        return ()
    host, pid = tracking.LocalProcess.here().host, procs[0].pid
    where = f"tags.`{tracking.HOST_TAG}` = '{host}' and tags.`{tracking.PID_TAG}` = '{pid}'"
    return tuple(r for r in search_experiments(tracking.client(uri), where) if (r.info.start_time or 0) >= since_ms)


def launch(
    cmd: Sequence[str], envs: Sequence[Mapping[str, str]], uri: str, n: int, folder: Path, first: int = 0
) -> tuple[str, str]:
    """Start one worker ``cmd`` per environment of ``envs`` and wait for them all: the one loop of
    ``run``, a sweep's and a rerun's job (:func:`start`). Each worker's output (stdout and stderr) goes
    to ``folder/process-K.log``, on this process's stderr only once all exited 0 (:func:`_replay`): what
    the others say once one failed is how the loss of a peer reached them (a collective's connection
    reset, JAX's coordination service aborting them with a C++ stack). The first to fail (an error, a
    signal, stopped past JAX's heartbeat) ends the others, and the runs they left RUNNING are ended
    FAILED with its words. Returns ("", "") when all exited 0, else the failure's one line (the
    worker, what happened to it, process 0's run as it ended, the logs) and that run's id. On an
    interrupt (Ctrl-C, SIGTERM: raised in this process's main thread), the workers are sent it, then
    SIGKILL after :data:`GRACE_S`, their runs ended KILLED, and the interrupt raised again."""
    from .. import store as tracking

    procs: list[subprocess.Popen] = []
    logs = [folder / LOG.format(first + i) for i in range(len(envs))]
    since_ms = int(time.time() * 1000)
    try:
        for env, log in zip(envs, logs):
            with log.open("wb") as out:
                procs.append(subprocess.Popen(list(cmd), env=dict(env), stdout=out, stderr=subprocess.STDOUT))
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                break
            if all(c == 0 for c in codes):
                _replay(logs)
                return "", ""
            time.sleep(POLL_S)
    except KeyboardInterrupt as e:
        stop = interrupts.as_interrupted(e)
        with interrupts.deferred():  # a second signal waits for the workers' end and their runs'
            _end(procs, stop.signum)
            reason = f"interrupted by {stop.name}"
            tracking.end_runs_of_processes(uri, [p.pid for p in procs], "KILLED", reason, "interrupted")
        raise
    i = _culprit(procs)
    code = procs[i].poll()
    what = f"process {first + i} of {n} (pid {procs[i].pid}) {_how(code)}" + (
        _said(logs[i]) if code and code > 0 else ""
    )
    _end(procs)
    runs = _close(uri, procs, what, first, since_ms)
    run = f"; run {runs[0].info.run_id} ended {runs[0].info.status}" if runs else ""
    line = f"the fit across {n} processes failed: {what}{run}; the processes' output: {folder / LOG.format('*')}"
    return line, runs[0].info.run_id if runs else ""


def run(spec: JobSpec, uri: str, output_dir: str, run_job: Callable) -> int:
    """``python -m plnexp run ... processes=N``: start the workers (N here, or this srun task's one),
    process 0 running the job with ``run_job`` (:class:`Job`), wait for them; process 0's summary
    (as ``run`` says it) or the failure's one line. The exit code:
    0, 1 when the run did not finish or a worker failed, 128 + the signal on an interrupt."""
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
    envs = None if where is None else [dict(os.environ)]  # None: the N workers here
    first = int(os.environ.get("SLURM_PROCID", "0") or 0) if where is not None else 0
    with interrupts.handled() as guard:
        try:
            ran = start(Job(replace(spec, num=None), run_job), output_dir, uri, envs, first)
        except KeyboardInterrupt as e:
            guard.stopping()
            stop = interrupts.as_interrupted(e)
            print(f"plnexp: interrupted by {stop.name}: the fit across {n} processes was stopped", file=sys.stderr)
            return stop.exit_code
    if ran is None:  # another srun task's, which ended well: process 0's task says the run's summary
        return 0
    if not ran.text:  # no outcome of process 0: the one line of the failure
        print(f"plnexp: error: {ran.reason}", file=sys.stderr, flush=True)
        return 1
    print(f"{ran.summary()}  (run {ran.run_id}, experiment {spec.config.experiment!r})", flush=True)
    return 0 if ran.status == "FINISHED" else 1


def device_line(n: int, device: str) -> str:
    return (
        f"processes={n} with device={device}: the {n} processes started on this machine would "
        f"share its accelerators; allowed are device=cpu here, or srun -n {n} with one accelerator per task"
    )


@dataclass(frozen=True)
class Job:
    """A job whose workers ``run``, a sweep's driver or a rerun starts (:func:`start`), pickled into
    its folder: its spec and what process 0 runs it with (``run``: the one way a job runs,
    :func:`plnexp.experiment.job_task.run_job`, which starts this module's workers: given by its
    caller, pickled by reference; ``parent``: the sweep's parent run, whose child the job's run is;
    None: a run of its own, in the config's store)."""

    spec: JobSpec
    run: Callable
    parent: Parent | None = None


RAN_FILE = "outcome.pkl"


@dataclass(frozen=True)
class Ran:
    """A job's outcome as process 0 hands it back to the process that started the workers (its runs
    are in the store): what ``run`` says, and what a sweep's :class:`plnexp.experiment.job_task.Task`
    and a rerun read of an :class:`~plnexp.experiment.runner.Outcome` (or of a run read back)."""

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
        batch = outcome.batch or [outcome]
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


def _write(path: Path, thing) -> None:
    """``thing`` pickled into ``path``, whole or not at all (a reader never sees half of it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(pickle.dumps(thing))
    os.replace(tmp, path)


def start(
    job: Job, output_dir: str, uri: str, envs: Sequence[Mapping[str, str]] | None = None, first: int = 0
) -> Ran | None:
    """``job``'s workers started with ``job`` pickled into its folder (``output_dir``; a new one under
    the outputs' ``processes/`` where none is given) and waited for: process 0's outcome; where a
    worker failed or process 0 handed back none, a FAILED one whose reason is the one line (and no
    ``text``); None for another srun task's, which ended well. ``envs``: one per worker (this srun
    task's one); None: N workers on this machine (:func:`plnexp.experiment.job_task.run_job`'s, a
    sweep's driver's or a rerun's job), on its CPU (another device: a FAILED outcome, nothing
    started). An interrupt: the workers stopped, their runs KILLED, raised (:func:`launch`)."""
    n, clock = job.spec.config.processes, time.monotonic()
    if envs is None:
        device = job.spec.config.device.value
        if device != "cpu":
            return Ran(job.spec.name, "FAILED", device_line(n, device), clock=clock)
        envs = _local(n)
    folder = Path(output_dir) if output_dir else _scratch()
    folder.mkdir(parents=True, exist_ok=True)
    job_file, ran_file = folder / "job.pkl", folder / RAN_FILE
    ran_file.unlink(missing_ok=True)
    _write(job_file, job)
    cmd = [sys.executable, "-m", "plnexp.experiment.processes", str(job_file), str(folder)]
    why, run_id = launch(cmd, envs, uri, n, folder, first)
    ran = pickle.loads(ran_file.read_bytes()) if ran_file.is_file() else None
    if not why and (ran is not None or first != 0):
        return ran
    why = why or f"the fit across {n} processes: process 0 handed back no outcome"
    run_id = run_id or (ran.run_id if ran is not None else "")
    return Ran(job.spec.name, "FAILED", why, run_id, clock=clock, wall_s=time.monotonic() - clock)


def _scratch() -> Path:
    """A new folder for a job given none (a rerun's), under the outputs' ``processes/``."""
    from ..jobs.config import outputs_dir

    root = outputs_dir() / "processes"
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=time.strftime("%Y-%m-%d_%H-%M-%S-"), dir=root))


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


def worker(job_file: str, output_dir: str, environ: Mapping[str, str] = os.environ) -> int:
    """One worker: join the others (before any other use of JAX), then run the :class:`Job`: process 0
    as :func:`plnexp.experiment.job_task.run_job` (its run logged, its outcome written into ``output_dir``
    for the process that started the workers), the others without any store. The exit code: 0, or 1
    when the job did not finish (process 0: when it wrote no outcome)."""
    from ..system import credentials, runtime

    _end_with_launcher()
    credentials.install()
    runtime.configure()
    if environ.get(COORDINATOR):
        Placement(environ[COORDINATOR], int(environ[NUM_PROCESSES]), int(environ[PROCESS_ID])).initialize()
    else:
        Placement(None, None, None).initialize()
    import jax

    code = _job(pickle.loads(Path(job_file).read_bytes()), output_dir, jax.process_index() == 0)
    if code == 0:
        jax.distributed.shutdown()  # waits for the others: process 0 is logging the run
    return code


def follow(config: Config, overrides, name: str, output_dir: str) -> int:
    """A process other than process 0 (a worker, a SLURM task): the same fit, nothing reported (no
    store, no floor); 0 when it finished, else 1 with one line on stderr."""
    import jax

    from . import runner

    (out,) = runner.execute(config, [runner.Outcome(name, tuple(overrides), config, output_dir=output_dir)], lead=False)
    if out.status == "FINISHED":
        return 0
    print(f"plnexp: error: process {jax.process_index()}: {redact_text(out.reason)}", file=sys.stderr, flush=True)
    return 1


def _job(job: Job, output_dir: str, lead: bool) -> int:
    """A :class:`Job` in a worker: process 0 runs it as :func:`plnexp.experiment.job_task.run_job`
    (its run logged, a child of the sweep's parent) and writes its :class:`Ran` into the folder
    (whole or not at all); the others fit with it."""
    spec = job.spec
    if not lead:
        return follow(spec.config, spec.overrides, spec.name, output_dir)
    try:
        out = job.run(spec, output_dir, parent=job.parent)  # joined: in this process
    except Exception as e:  # noqa: BLE001 - the store failed under the job: one line, the launcher says the rest
        print(f"plnexp: error: job {spec.name}: {first_line(e)}", file=sys.stderr, flush=True)
        return 1
    _write(Path(output_dir) / RAN_FILE, Ran.of(out))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from ..system.commandline import Parser, UsageError, fail

    parser = Parser(
        "python -m plnexp.experiment.processes JOB_FILE OUTPUT_DIR", prog="python -m plnexp.experiment.processes"
    )
    parser.add_argument("job_file", help="the pickled Job (processes.start writes it)")
    parser.add_argument("output_dir", help="the job's folder: its outcome goes there")
    try:
        args = parser.parse(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        return fail(e)
    return 0 if args is None else worker(args.job_file, args.output_dir)


if __name__ == "__main__":
    # the module's own classes (Job, Ran), not __main__'s copies: what the pickles of both ends name
    from plnexp.experiment import processes as module

    code = module.main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not waiting for JAX's threads, nor for a peer that is gone
