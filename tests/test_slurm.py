"""plnexp.system.slurm without a cluster: squeue's answers parsed, the driver's wait over fake submitit jobs
and a fake clock, the reasons a signal gets inside a job. (The real cluster: tests/test_cluster.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from plnexp.system import slurm


def answer(stdout="", stderr="", code=0):
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, code, stdout, stderr)

    run.calls = calls
    return run


def test_states_asks_squeue_once_for_the_arrays_and_reads_one_task_per_line():
    run = answer("12_0|COMPLETED\n12_1|RUNNING\n12_2|PENDING\n13|CANCELLED by 0\n")
    found = slurm.states(["12_0", "12_1", "12_2", "13"], run=run)
    assert found == {"12_0": "COMPLETED", "12_1": "RUNNING", "12_2": "PENDING", "13": "CANCELLED"}
    (cmd,) = run.calls
    assert cmd[:2] == ["squeue", "-h"] and "-r" in cmd and "--states=all" in cmd and cmd[-1] == "12,13"


def test_states_of_forgotten_jobs_and_of_a_scheduler_that_does_not_answer():
    assert slurm.states(["12_0"], run=answer(stderr="slurm_load_jobs error: Invalid job id specified", code=1)) == {}
    assert slurm.states(["12_0"], run=answer(stderr="Unable to contact slurm controller", code=1)) is None

    def missing(cmd, **kw):
        raise FileNotFoundError("squeue")

    assert slurm.states(["12_0"], run=missing) is None
    assert slurm.states([], run=missing) == {}


@pytest.mark.parametrize(
    "state, over",
    [
        (None, True),
        ("COMPLETED", True),
        ("CANCELLED", True),
        ("TIMEOUT", True),
        ("RUNNING", False),
        ("PENDING", False),
        ("COMPLETING", False),
    ],
)
def test_ended(state, over):
    assert slurm.ended(state) is over


class FakeJob:
    def __init__(self, folder: Path, job_id: str, result=None, error: str = ""):
        self.job_id = job_id
        self.paths = SimpleNamespace(result_pickle=folder / f"{job_id}_result.pkl")
        self._result, self._error = result, error

    def finish(self):
        self.paths.result_pickle.write_text("done")

    def result(self):
        if self._error:
            raise RuntimeError(f"Job failed\nTraceback...\n{self._error}")
        return self._result


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_wait_reads_results_and_ends_jobs_the_scheduler_says_ended(tmp_path):
    """A job with a result file is read (its error too); a CANCELLED job without one ends after 5 s;
    a COMPLETED job without one after the full grace (its file may be late); a running one waits."""
    ok, bad, cancelled, late = (
        FakeJob(tmp_path, "7_0", result="line 0"),
        FakeJob(tmp_path, "7_1", error="ValueError: x"),
        FakeJob(tmp_path, "7_2"),
        FakeJob(tmp_path, "7_3"),
    )
    ok.finish()
    bad.finish()
    clock = Clock()
    seen = []

    def query(ids):
        if clock.t >= 30:
            late.finish()  # never: it ended before (COMPLETED, no result) and is reported so
        return {"7_2": "CANCELLED", "7_3": "COMPLETED"}

    ended = slurm.wait(
        [ok, bad, cancelled, late], seen.append, poll_s=1.0, grace_s=20.0, query=query, clock=clock, sleep=clock.sleep
    )
    assert [e.index for e in seen] == [0, 1, 2, 3]
    assert ended[0].result == "line 0" and not ended[0].error
    assert ended[1].result is None and ended[1].error == "ValueError: x"
    assert (ended[2].state, ended[2].error) == ("CANCELLED", "no result")
    assert (ended[3].state, ended[3].error) == ("COMPLETED", "no result")
    assert 20 <= clock.t < 30


def test_wait_keeps_waiting_while_the_scheduler_cannot_be_asked_or_the_job_runs(tmp_path):
    job = FakeJob(tmp_path, "8_0", result="line")
    clock = Clock()

    def query(ids):
        if clock.t >= 100:
            job.finish()
        return None if clock.t < 50 else {"8_0": "RUNNING"}

    (e,) = slurm.wait([job], lambda e: None, query=query, clock=clock, sleep=clock.sleep)
    assert e.result == "line" and clock.t >= 100


def test_an_interrupt_while_waiting_cancels_the_jobs_left(tmp_path, monkeypatch):
    done, left = FakeJob(tmp_path, "9_0", result="x"), FakeJob(tmp_path, "9_1")
    done.finish()
    cancelled = []
    monkeypatch.setattr(slurm.subprocess, "run", lambda cmd, **kw: cancelled.append(cmd))

    def query(ids):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        slurm.wait([done, left], lambda e: None, query=query, clock=Clock(), sleep=lambda s: None)
    assert cancelled == [["scancel", "9_1"]]


def test_job_id_and_why_inside_a_job():
    env = {"SLURM_JOB_ID": "21", "SLURM_ARRAY_JOB_ID": "20", "SLURM_ARRAY_TASK_ID": "1"}
    assert slurm.job_id(env) == "20_1" and slurm.job_id({"SLURM_JOB_ID": "5"}) == "5" and slurm.job_id({}) is None
    assert slurm.why(signal.SIGTERM, env) == " in slurm job 20_1 (scancel, time limit or preemption)"
    assert "time limit is near" in slurm.why(signal.SIGUSR2, env)
    assert slurm.why(signal.SIGTERM, {}) == ""


def test_submitits_sacct_warnings_are_said_once_and_its_other_messages_pass(caplog):
    import logging

    slurm.quiet_sacct()
    slurm.quiet_sacct()  # once
    logger = logging.getLogger("submitit")
    assert sum(isinstance(f, slurm.QuietSacct) for f in logger.filters) == 1
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger.addHandler(handler)
    try:
        for n in range(3):
            logger.warning(
                f"Call #{n} - Bypassing sacct error Command 'sacct' returned non-zero exit status 1., "
                "status may be inaccurate."
            )
        logger.error("Submitted job triggered an exception")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in seen] == ["Submitted job triggered an exception"]
    said = [r for r in caplog.records if r.name == "plnexp.system.slurm" and "sacct is not usable" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING"


# ------------------------------------------------------------------ a SLURM job as a run's owner
FAKE_SQUEUE = """#!/bin/sh
# squeue -h -r --states=all -o %i|%T -j <ids>: the queue written in $FAKE_QUEUE (lines "id|STATE")
[ -n "$FAKE_SLURM_DOWN" ] && { echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1; }
for last; do :; done
found=$(grep -E "^($(echo "$last" | tr ',' '|'))(_|\\|)" "$FAKE_QUEUE")
[ -z "$found" ] && { echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }
echo "$found"
"""
FAKE_SACCT = """#!/bin/sh
[ -z "$FAKE_ACCOUNTING" ] && { echo "Slurm accounting storage is disabled" >&2; exit 1; }
echo "$FAKE_ACCOUNTING"
"""


@pytest.fixture
def scheduler(tmp_path, monkeypatch):
    """Fake ``squeue`` and ``sacct`` first on PATH; the queue is the file $FAKE_QUEUE."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("squeue", FAKE_SQUEUE), ("sacct", FAKE_SACCT)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    queue = tmp_path / "queue"
    queue.write_text("7_0|RUNNING\n7_1|CANCELLED\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_QUEUE", str(queue))
    monkeypatch.delenv("FAKE_ACCOUNTING", raising=False)
    monkeypatch.delenv("SLURM_CLUSTER_NAME", raising=False)
    return queue


def test_a_slurm_job_owns_the_runs_of_its_processes(monkeypatch):
    from plnexp.store import owners

    env = {"SLURM_JOB_ID": "21", "SLURM_ARRAY_JOB_ID": "20", "SLURM_ARRAY_TASK_ID": "1", "SLURM_CLUSTER_NAME": "c1"}
    job = owners.SlurmJob.here(env)
    assert (job.job, job.cluster, job.pid) == ("20_1", "c1", os.getpid())
    assert owners.SlurmJob.here({}) is None
    tags = job.tags()
    assert tags["plnexp.slurm_job"] == "20_1" and tags[owners.PID_TAG] == str(os.getpid())  # host/PID too
    assert owners.owner_of(tags) == job and owners.owner_of(
        {owners.HOST_TAG: "h", owners.PID_TAG: "3"}
    ) == owners.LocalProcess("h", 3)
    assert isinstance(owners.current(), owners.LocalProcess)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert owners.current() == job


def test_alive_asks_the_scheduler(scheduler, monkeypatch):
    from plnexp.store.owners import SlurmJob

    assert SlurmJob("7_0").alive() is True
    cancelled = SlurmJob("7_1")
    assert cancelled.alive() is False
    assert cancelled.end_reason()[0] == "slurm job 7_1 CANCELLED"
    forgotten = SlurmJob("7_2")  # gone from the queue, no accounting
    assert forgotten.alive() is False and forgotten.end_reason()[0] == "slurm job 7_2 ENDED"
    monkeypatch.setenv("FAKE_ACCOUNTING", "TIMEOUT")
    timed_out = SlurmJob("7_2")
    assert timed_out.alive() is False and timed_out.end_reason()[0] == "slurm job 7_2 TIMEOUT"
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "here")
    assert SlurmJob("7_1", cluster="elsewhere").alive() is None  # another cluster's job
    monkeypatch.setenv("FAKE_SLURM_DOWN", "1")
    assert SlurmJob("7_1").alive() is None  # the controller does not answer: cannot tell


def test_no_squeue_here_means_cannot_tell(monkeypatch, tmp_path):
    from plnexp.store.owners import SlurmJob

    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    assert SlurmJob("7_1").alive() is None


def test_sweep_up_marks_the_runs_of_ended_slurm_jobs_failed_and_leaves_the_others(scheduler, outputs, monkeypatch):
    from conftest import store_client

    from plnexp.experiment import plan as cli
    from plnexp.experiment import runner
    from plnexp import store as tracking
    from plnexp.store.owners import LocalProcess, SlurmJob

    (job,) = cli.plan(["dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3"], multirun=False)
    uri = tracking.check_store()
    cl = tracking.client(uri)
    exp = tracking.experiment_id(cl, "slurm")
    outcome = runner.Outcome("x", (), job.config)
    runs = {
        name: tracking.start_job(cl, exp, outcome, tags=owner.tags())
        for name, owner in (
            ("running", SlurmJob("7_0", "", "node1", 11)),
            ("cancelled", SlurmJob("7_1", "", "node1", 12)),
            ("cancelled_too", SlurmJob("7_1", "", "node1", 12)),
            ("elsewhere", LocalProcess("another-host", 13)),
        )
    }
    found = tracking.sweep_up_orphans(uri)
    assert sorted(r.run_id for r in found) == sorted([runs["cancelled"], runs["cancelled_too"]])
    st = store_client(outputs)
    run = st.get_run(runs["cancelled"])
    assert run.info.status == "FAILED" and run.data.tags["reason"] == "slurm job 7_1 CANCELLED"
    assert run.data.tags["status_reason"].startswith("slurm job 7_1 ended CANCELLED without closing this run")
    assert st.get_run(runs["running"]).info.status == "RUNNING"
    assert st.get_run(runs["elsewhere"]).info.status == "RUNNING"  # another host, no scheduler: never touched

    scheduler.write_text("7_0|COMPLETED\n")
    monkeypatch.setenv("PATH", "/nonexistent")  # no squeue here now: nothing can be told
    assert tracking.sweep_up_orphans(uri) == [] and st.get_run(runs["running"]).info.status == "RUNNING"


def test_slurm_tags_of_a_job():
    from plnexp.jobs import provenance

    env = {
        "SLURM_JOB_ID": "21",
        "SLURM_ARRAY_JOB_ID": "20",
        "SLURM_ARRAY_TASK_ID": "1",
        "SLURMD_NODENAME": "n7",
        "SLURM_JOB_PARTITION": "debug",
    }
    assert provenance.slurm_tags(env) == {
        "slurm_job_id": "21",
        "slurm_array_job_id": "20",
        "slurm_array_task_id": "1",
        "slurm_node": "n7",
        "slurm_partition": "debug",
    }
    assert provenance.slurm_tags({"SLURMD_NODENAME": "n7"}) == {}


@pytest.mark.parametrize(
    "signum, why", [(signal.SIGUSR2, "its time limit is near"), (signal.SIGTERM, "scancel, time limit or preemption")]
)
def test_a_job_stopped_by_slurm_records_its_run_killed_with_the_reason(outputs, monkeypatch, signum, why):
    """Inside a SLURM job, SIGUSR2 (sent ``signal_delay_s`` before the time limit) and SIGTERM end the
    run KILLED, the reason naming the job; the owner tags are the job's."""
    from conftest import store_client

    from plnexp.experiment import plan as cli
    from plnexp.system import interrupts
    from plnexp.experiment import job_task, runner
    from plnexp.jobs.spec import JobSpec

    for k, v in {"SLURM_JOB_ID": "52", "SLURM_ARRAY_JOB_ID": "50", "SLURM_ARRAY_TASK_ID": "2"}.items():
        monkeypatch.setenv(k, v)
    (job,) = cli.plan(["dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3"], multirun=False)

    def stopped(config, outcomes):
        signal.raise_signal(signum)  # as SLURM sends it, in the middle of the fit
        raise AssertionError("not reached")

    monkeypatch.setattr(runner, "execute", stopped)
    with interrupts.handled(signals=slurm.JOB_SIGNALS):
        with pytest.raises(interrupts.Interrupted):
            job_task.run_job(JobSpec(job.config, "stopped"))
    (run,) = [
        r
        for e in store_client(outputs).search_experiments()
        for r in store_client(outputs).search_runs([e.experiment_id])
    ]
    assert run.info.status == "KILLED"
    assert run.data.tags["status_reason"] == f"interrupted by {signal.Signals(signum).name} in slurm job 50_2 ({why})"
    assert run.data.tags["plnexp.slurm_job"] == "50_2" and run.data.tags["slurm_array_task_id"] == "2"


def test_first_task_failure_reads_sruns_first_word_on_a_task(tmp_path):
    """A job across processes that srun ended: the driver's line names the task that ended it, from
    srun's first ``srun: error: NODE: task K: WHY`` in the job's log; nothing where there is none."""
    log = tmp_path / "1_0_log.out"
    log.write_text(
        "submitit INFO - Starting with JobEnvironment(job_id=1)\n"
        "srun: error: node7: task 1: Killed\n"
        "srun: launch/slurm: _step_signal: Terminating StepId=1.0\n"
        "srun: error: node7: task 0: Killed\n"
    )
    assert slurm.first_task_failure(log, 2) == "task 1 of 2 on node7: Killed"
    log.write_text("srun: error: n2: tasks 2-3: Exited with exit code 1\n")
    assert slurm.first_task_failure(log, 4) == "tasks 2-3 of 4 on n2: Exited with exit code 1"
    log.write_text("submitit INFO - all good\n")
    assert slurm.first_task_failure(log, 2) == ""
    assert slurm.first_task_failure(tmp_path / "missing.out", 2) == ""
