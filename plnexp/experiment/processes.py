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
only its own rows (:func:`plnexp.core.data.row_range`), which is all it reads of the data where the
source allows (:meth:`plnexp.jobs.config.DatasetSpec.load_rows`: CSV lines, ``.h5ad`` rows in
backed mode, ``simulate_pca``'s blocks; ``simulate``'s draw is whole, then sliced); the float64 host
reference and log y! are summed across processes over each one's rows; each process's peak memory is
gathered onto process 0's run (:func:`plnexp.experiment.runner.peak_rss_by_process`).

Process 0 runs the job as ``run`` does (:class:`plnexp.experiment.sweep.Task`: its run created
RUNNING, logged, ended; its one-line summary); the others run the same fit and report nothing
(:func:`plnexp.experiment.runner.execute` with ``lead=False``: no store, no floor). The launcher
waits for its workers; the first to fail (an error, a signal, SIGKILL) ends the others, the run
left RUNNING by a worker is ended FAILED with that reason, and the command exits 1 with one line.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..jobs.spec import JobSpec
from ..system import interrupts
from ..system.redact import redact_text

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


def srun_tasks(environ: Mapping[str, str] = os.environ) -> int | None:
    """The number of tasks of the ``srun`` step this process is one of (None: not started by srun)."""
    tasks = environ.get("SLURM_STEP_NUM_TASKS") if environ.get("SLURM_JOB_ID") else None
    try:
        return int(tasks) if tasks else None
    except ValueError:
        return None


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


def run(spec: JobSpec, uri: str, output_dir: str) -> int:
    """``python -m plnexp run ... processes=N``: start the workers (N here, or this srun task's one),
    wait for them; the exit code: 0, 1 when a worker failed, 128 + the signal on an interrupt."""
    from .. import store as tracking

    n = spec.config.processes
    try:
        where = placement(n)
    except ValueError as e:
        print(f"plnexp: error: {e}", file=sys.stderr, flush=True)
        return 2
    device = spec.config.device.value
    if where is None and device != "cpu":
        print(
            f"plnexp: error: processes={n} with device={device}: the {n} processes started on this machine would "
            f"share its accelerators; allowed are device=cpu here, or srun -n {n} with one accelerator per task",
            file=sys.stderr,
            flush=True,
        )
        return 2
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    spec_file = folder / "job_spec.pkl"
    spec_file.write_bytes(pickle.dumps(spec))
    cmd = [sys.executable, "-m", "plnexp.experiment.processes", str(spec_file), str(folder)]
    if where is None:
        address = f"127.0.0.1:{free_port()}"
        envs = [{**os.environ, COORDINATOR: address, NUM_PROCESSES: str(n), PROCESS_ID: str(i)} for i in range(n)]
    else:
        envs = [dict(os.environ)]
    first = int(os.environ.get("SLURM_PROCID", "0") or 0) if where is not None else 0
    procs: list[subprocess.Popen] = []
    threads: list[threading.Thread] = []
    ended = threading.Event()
    failed: tuple[int, int] | None = None
    with interrupts.handled() as guard:
        try:
            pipe = subprocess.PIPE
            procs = [subprocess.Popen(cmd, env=env, stdout=pipe, stderr=pipe, text=True) for env in envs]
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
                    return 0
                time.sleep(POLL_S)
        except KeyboardInterrupt as e:
            guard.stopping()
            ended.set()
            stop = interrupts.as_interrupted(e)
            _end(procs, stop.signum)
            _join(threads)
            reason = f"interrupted by {stop.name}"
            tracking.end_runs_of_processes(uri, [p.pid for p in procs], "KILLED", reason, "interrupted")
            print(f"plnexp: interrupted by {stop.name}: the fit across {n} processes was stopped", file=sys.stderr)
            return stop.exit_code
    _end(procs)
    _join(threads)
    assert failed is not None  # the loop ends on a failure, else returns
    i, code = failed
    line = f"process {first + i} of {n} {_how(code)}"
    closed = tracking.end_runs_of_processes(uri, [p.pid for p in procs], "FAILED", line, REASON)
    run_note = f"; run {closed[0].info.run_id} ended FAILED" if closed else ""
    print(f"plnexp: error: the fit across {n} processes failed: {line}{run_note}", file=sys.stderr, flush=True)
    return 1


def worker(spec_file: str, output_dir: str, environ: Mapping[str, str] = os.environ) -> int:
    """One worker: join the others (before any other use of JAX), then run the job: process 0 as
    ``run`` does (its run logged), the others without any store. The exit code: 0, or 1 when the
    job did not finish."""
    from ..system import credentials, runtime

    credentials.install()
    runtime.configure()
    if environ.get(COORDINATOR):
        Placement(environ[COORDINATOR], int(environ[NUM_PROCESSES]), int(environ[PROCESS_ID])).initialize()
    else:
        Placement(None, None, None).initialize()
    import jax

    spec: JobSpec = pickle.loads(Path(spec_file).read_bytes())
    if jax.process_index() == 0:
        from .sweep import Task

        task = Task()
        task(spec, None, output_dir)
        code = 1 if task.failed else 0
    else:
        from . import runner

        out = runner.execute(spec.config, spec.overrides, spec.name, output_dir, lead=False)
        code = 0
        if out.status != "FINISHED":
            print(
                f"plnexp: error: process {jax.process_index()}: {redact_text(out.reason)}", file=sys.stderr, flush=True
            )
            code = 1
    if code == 0:
        jax.distributed.shutdown()  # waits for the others: process 0 is logging the run
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("plnexp: error: usage: python -m plnexp.experiment.processes SPEC_FILE OUTPUT_DIR", file=sys.stderr)
        return 2
    return worker(args[0], args[1])


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not waiting for JAX's threads, nor for a peer that is gone
