"""A SLURM job as the owner of its runs (plnexp.store.owners.SlurmJob), without a cluster: fake
``squeue``, ``sacct``, ``scancel`` and ``scontrol`` first on PATH, answering from files the tests write.
What the orphan sweep-up and the closing of a sweep do with the runs of jobs that run, ended, or
cannot be asked about; and the ``slurm_*`` provenance tags of a run logged inside a job."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import store_client

from plnexp.jobs import provenance
from plnexp.experiment import runner
from plnexp.experiment import sweep
from plnexp import store as tracking
from plnexp.store import owners
from plnexp.store.owners import HOST_TAG, PID_TAG, SLURM_CLUSTER_TAG, SLURM_JOB_TAG, LocalProcess, SlurmJob

# Each fake logs its command line to $FAKE_LOG.
# squeue -h -r --states=all -o %i|%T -j <ids>: the lines "id|STATE" of $FAKE_QUEUE whose id is one of
# <ids> or one of their array tasks; a job id the queue does not hold: "Invalid job id", exit 1.
FAKE_SQUEUE = r"""#!/bin/sh
echo "squeue $*" >> "$FAKE_LOG"
[ -n "$FAKE_SLURM_DOWN" ] && { echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1; }
prev=""; for a in "$@"; do [ "$prev" = "-j" ] && ids="$a"; prev="$a"; done
found=$(grep -E "^($(echo "$ids" | tr ',' '|'))(_|\|)" "$FAKE_QUEUE")
[ -z "$found" ] && { echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }
echo "$found"
"""
# sacct -n -X -P -j <job> -o State: the rest of the line "<job>|..." of $FAKE_ACCOUNTING (nothing for a
# job it does not hold); without $FAKE_ACCOUNTING, a cluster without accounting.
FAKE_SACCT = r"""#!/bin/sh
echo "sacct $*" >> "$FAKE_LOG"
[ -z "$FAKE_ACCOUNTING" ] && { echo "sacct: error: Slurm accounting storage is disabled" >&2; exit 1; }
prev=""; for a in "$@"; do [ "$prev" = "-j" ] && job="$a"; prev="$a"; done
grep "^$job|" "$FAKE_ACCOUNTING" | cut -d'|' -f2-
exit 0
"""
FAKE_SCANCEL = r"""#!/bin/sh
echo "scancel $*" >> "$FAKE_LOG"
[ -n "$FAKE_SCANCEL_FAILS" ] && { echo "scancel: error: Kill job error on job id $1" >&2; exit 1; }
exit 0
"""
FAKE_SCONTROL = r"""#!/bin/sh
echo "scontrol $*" >> "$FAKE_LOG"
[ -n "$FAKE_SLURM_DOWN" ] && { echo "slurm_load_ctl_conf error: Unable to contact slurm controller" >&2; exit 1; }
echo "Configuration data as of 2026-01-01T00:00:00"
echo "AccountingStorageType   = (null)"
echo "ClusterName             = ${FAKE_CLUSTER:-alpha}"
"""
SLURM_ENV = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_CLUSTER_NAME",
    "SLURMD_NODENAME",
    "SLURM_JOB_PARTITION",
    "SLURM_CONF",
)


@pytest.fixture(autouse=True)
def outside_slurm(monkeypatch):
    """No SLURM variable of the machine running the tests leaks in; the cluster name asked afresh."""
    for var in SLURM_ENV:
        monkeypatch.delenv(var, raising=False)
    owners._configured_cluster.cache_clear()
    yield
    owners._configured_cluster.cache_clear()


@pytest.fixture
def scheduler(tmp_path, monkeypatch):
    """The fake SLURM commands first on PATH: job array 7 has task 7_1 RUNNING (7_2 forgotten by the
    controller, CANCELLED in the accounting), job 8 is forgotten with no accounting record."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (
        ("squeue", FAKE_SQUEUE),
        ("sacct", FAKE_SACCT),
        ("scancel", FAKE_SCANCEL),
        ("scontrol", FAKE_SCONTROL),
    ):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    s = SimpleNamespace(
        bin=bin_dir, queue=tmp_path / "queue", accounting=tmp_path / "accounting", log=tmp_path / "calls"
    )
    s.queue.write_text("7_1|RUNNING\n")
    s.accounting.write_text("7_2|CANCELLED by 0\n")
    s.log.write_text("")
    s.calls = lambda cmd: [c for c in s.log.read_text().splitlines() if c.split()[0] == cmd]
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    for var, value in (("FAKE_QUEUE", s.queue), ("FAKE_ACCOUNTING", s.accounting), ("FAKE_LOG", s.log)):
        monkeypatch.setenv(var, str(value))
    for var in ("FAKE_SLURM_DOWN", "FAKE_SCANCEL_FAILS", "FAKE_CLUSTER"):
        monkeypatch.delenv(var, raising=False)
    return s


@pytest.fixture
def config(tiny_config):
    return tiny_config


def test_here_is_the_job_of_an_array_task_or_of_a_plain_job():
    task = SlurmJob.here(
        {"SLURM_JOB_ID": "21", "SLURM_ARRAY_JOB_ID": "20", "SLURM_ARRAY_TASK_ID": "1", "SLURM_CLUSTER_NAME": "alpha"}
    )
    assert task == SlurmJob("20_1", "alpha", platform.node(), os.getpid())
    plain = SlurmJob.here({"SLURM_JOB_ID": "33"})
    assert (plain.job, plain.cluster, plain.host, plain.pid) == ("33", "", platform.node(), os.getpid())
    assert SlurmJob.here({}) is None and SlurmJob.here({"SLURMD_NODENAME": "n1"}) is None
    assert str(task) == "slurm job 20_1"


def test_tags_round_trip_through_owner_of_and_keep_host_and_pid():
    job = SlurmJob("20_1", "alpha", "node3", 4242)
    tags = job.tags()
    assert tags == {SLURM_JOB_TAG: "20_1", SLURM_CLUSTER_TAG: "alpha", HOST_TAG: "node3", PID_TAG: "4242"}
    assert owners.owner_of({**tags, "other": "tag"}) == job and isinstance(job, owners.Owner)
    assert LocalProcess.from_tags(tags) == LocalProcess("node3", 4242)  # older code still reads host and PID
    assert SlurmJob.from_tags(LocalProcess("h", 3).tags()) is None
    assert owners.owner_of(LocalProcess("h", 3).tags()) == LocalProcess("h", 3)
    assert owners.owner_of({SLURM_JOB_TAG: "9"}) == SlurmJob("9")  # host and PID missing: still the job
    assert owners.KINDS.index(SlurmJob) < owners.KINDS.index(LocalProcess)
    asked = SlurmJob("20_1", "alpha", "node3", 4242)
    object.__setattr__(asked, "state", "RUNNING")
    assert asked == job and hash(asked) == hash(job)  # the state asked is not part of the owner's identity


def test_current_is_the_job_inside_slurm_and_this_process_outside(monkeypatch):
    assert owners.current() == LocalProcess(platform.node(), os.getpid())
    for var, value in (
        ("SLURM_JOB_ID", "52"),
        ("SLURM_ARRAY_JOB_ID", "50"),
        ("SLURM_ARRAY_TASK_ID", "2"),
        ("SLURM_CLUSTER_NAME", "alpha"),
    ):
        monkeypatch.setenv(var, value)
    assert owners.current() == SlurmJob("50_2", "alpha", platform.node(), os.getpid())
    assert tracking.process_tags()[SLURM_JOB_TAG] == "50_2"


def test_alive_asks_squeue_then_sacct(scheduler, monkeypatch):
    running = SlurmJob("7_1")
    assert running.alive() is True and running.state == "RUNNING"
    assert scheduler.calls("squeue") == ["squeue -h -r --states=all -o %i|%T -j 7"] and not scheduler.calls("sacct")
    cancelled = SlurmJob("7_2")  # array 7 still queued, this task forgotten: its final state from sacct
    assert cancelled.alive() is False and cancelled.state == "CANCELLED"
    assert scheduler.calls("sacct") == ["sacct -n -X -P -j 7_2 -o State"]
    forgotten = SlurmJob("8")  # squeue: "Invalid job id specified"; sacct knows nothing of it
    assert forgotten.alive() is False and forgotten.state == "ENDED"
    monkeypatch.delenv("FAKE_ACCOUNTING")  # "Slurm accounting storage is disabled"
    no_accounting = SlurmJob("7_2")
    assert no_accounting.alive() is False and no_accounting.state == "ENDED"
    assert owners.slurm_state("7_2") == "ENDED" and owners.slurm_state("7_1") == "RUNNING"


@pytest.mark.parametrize(
    "state, alive",
    [
        ("PENDING", True),
        ("CONFIGURING", True),
        ("COMPLETING", True),
        ("SUSPENDED", True),
        ("REQUEUED", True),
        ("STAGE_OUT", True),
        ("RESV_DEL_HOLD", True),
        ("COMPLETED", False),
        ("TIMEOUT", False),
        ("FAILED", False),
        ("NODE_FAIL", False),
        ("PREEMPTED", False),
        ("OUT_OF_MEMORY", False),
        ("BOOT_FAIL", False),
        ("DEADLINE", False),
    ],
)
def test_alive_by_the_queues_state(scheduler, state, alive):
    scheduler.queue.write_text(f"7_1|{state}\n")
    job = SlurmJob("7_1")
    assert job.alive() is alive
    if not alive:
        assert job.end_reason()[0] == f"slurm job 7_1 {state}"


def test_alive_cannot_tell_without_squeue_or_controller(scheduler, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_SLURM_DOWN", "1")  # squeue fails for another reason than an unknown job
    assert SlurmJob("7_2").alive() is None and not scheduler.calls("sacct")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no squeue on PATH at all
    job = SlurmJob("7_2")
    assert job.alive() is None and job.state is None


def test_a_job_of_another_cluster_is_not_asked(scheduler, monkeypatch):
    # outside a job: this machine's cluster from scontrol show config (alpha), asked once
    assert SlurmJob("7_1", "alpha").alive() is True
    assert SlurmJob("7_2", "beta").alive() is None
    assert SlurmJob("7_2", "alpha").alive() is False
    assert len(scheduler.calls("scontrol")) == 1 and len(scheduler.calls("squeue")) == 2
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "beta")  # inside a job of cluster beta
    assert SlurmJob("7_2", "alpha").alive() is None and SlurmJob("7_2", "beta").alive() is False
    assert SlurmJob("7_2").alive() is False  # no cluster recorded: asked here
    monkeypatch.delenv("SLURM_CLUSTER_NAME")
    monkeypatch.setenv("FAKE_SLURM_DOWN", "1")
    owners._configured_cluster.cache_clear()
    assert SlurmJob("7_2", "alpha").alive() is None  # which cluster this is cannot be told


def test_end_reasons():
    assert LocalProcess("h", 3).end_reason() == ("orphaned", "orphaned: process 3 on h ended without closing this run")
    job = SlurmJob("12_3", host="n1", pid=5)
    object.__setattr__(job, "state", "CANCELLED")
    code, text = job.end_reason()
    assert code == "slurm job 12_3 CANCELLED"
    assert text.startswith("slurm job 12_3 ended CANCELLED without closing this run (scancel, time limit, preemption")
    assert text.endswith("or a crash)")
    assert SlurmJob("12_4").end_reason()[0] == "slurm job 12_4 ENDED"  # never asked: final state unknown


def test_cancel_scancels_the_job_and_ignores_a_failure(scheduler, monkeypatch, tmp_path):
    assert SlurmJob("7_1").cancel() is None
    monkeypatch.setenv("FAKE_SCANCEL_FAILS", "1")
    assert SlurmJob("8").cancel() is None
    assert scheduler.calls("scancel") == ["scancel 7_1", "scancel 8"]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert SlurmJob("8").cancel() is None  # no scancel here: a warning, no error


def _start(cl, exp, config, owner, parent=None, num=0):
    tags = {tracking.JOB_TAG: num, **owner.tags()}
    return tracking.start_job(cl, exp, runner.Outcome(f"job{num}", (), config), parent, tags)


def test_sweep_up_fails_the_runs_of_ended_jobs_only(scheduler, outputs, config, exited_pid, capsys, monkeypatch):
    from plnexp.cli.sync import sweep_up as _sweep_up

    uri = tracking.check_store()
    cl = tracking.client(uri)
    exp = tracking.experiment_id(cl, "slurm-owners")
    owned = [
        ("running", SlurmJob("7_1", "", "n1", 11)),
        ("cancelled", SlurmJob("7_2", "", "n1", 12)),
        ("cancelled_too", SlurmJob("7_2", "", "n1", 12)),
        ("forgotten", SlurmJob("8", "", "n2", 13)),
        ("elsewhere", LocalProcess("another-host", 14)),
        ("dead", LocalProcess(platform.node(), exited_pid)),
    ]
    runs = {name: _start(cl, exp, config, owner, num=i) for i, (name, owner) in enumerate(owned)}
    _sweep_up(uri)
    err = capsys.readouterr().err
    assert (
        "plnexp: 3 run(s) left RUNNING by slurm job(s) 7_2, 8, which ended (CANCELLED, ENDED), marked FAILED "
        "(reason=slurm job <id> <state>)"
    ) in err
    assert f"plnexp: 1 run(s) left RUNNING by process(es) {exited_pid} on this host, which no longer exist" in err
    assert len(scheduler.calls("squeue")) == 3  # once per distinct job (7_2's two runs: one question)
    st = store_client(outputs)
    got = {name: st.get_run(rid) for name, rid in runs.items()}
    assert {n: r.info.status for n, r in got.items()} == {
        "running": "RUNNING",
        "cancelled": "FAILED",
        "cancelled_too": "FAILED",
        "forgotten": "FAILED",
        "elsewhere": "RUNNING",
        "dead": "FAILED",
    }
    assert got["cancelled"].data.tags["reason"] == "slurm job 7_2 CANCELLED"
    assert (
        got["cancelled"]
        .data.tags["status_reason"]
        .startswith("slurm job 7_2 ended CANCELLED without closing this run (scancel, time limit, preemption")
    )
    assert got["forgotten"].data.tags["reason"] == "slurm job 8 ENDED"
    assert got["dead"].data.tags["reason"] == "orphaned"  # a local process's reason, as before
    assert "reason" not in got["running"].data.tags and "reason" not in got["elsewhere"].data.tags

    scheduler.queue.write_text("7_1|COMPLETED\n")
    with_fakes = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(Path(scheduler.bin).parent / "empty"))  # no squeue: nothing can be told
    assert tracking.sweep_up_orphans(uri) == []
    assert st.get_run(runs["running"]).info.status == "RUNNING"
    monkeypatch.setenv("PATH", with_fakes)
    monkeypatch.setenv("FAKE_SLURM_DOWN", "1")  # the controller does not answer: nothing either
    assert tracking.sweep_up_orphans(uri) == []
    monkeypatch.delenv("FAKE_SLURM_DOWN")
    (done,) = tracking.sweep_up_orphans(uri)  # now the scheduler says it completed
    assert done.run_id == runs["running"] and done.tags["reason"] == "slurm job 7_1 COMPLETED"


@pytest.mark.parametrize("status, reason", [("FINISHED", ""), ("KILLED", "interrupted by SIGINT")])
def test_closing_a_sweep_fails_the_children_of_ended_jobs_with_their_reason(
    scheduler, outputs, config, tmp_path, status, reason
):
    uri = tracking.check_store()
    record = sweep.open_sweep(tmp_path / "sw", "s", "sw", uri, 3, {})
    cl = tracking.client(uri)
    owned = [
        ("running", SlurmJob("7_1", "", "n1", 11)),
        ("cancelled", SlurmJob("7_2", "", "n1", 12)),
        ("elsewhere", LocalProcess("another-host", 13)),
    ]
    ids = {
        name: _start(cl, record.experiment_id, config, owner, record.parent_id, i)
        for i, (name, owner) in enumerate(owned)
    }
    summary = sweep.close_sweep(record, status, reason)
    st = store_client(outputs)
    assert {n: st.get_run(rid).info.status for n, rid in ids.items()} == {
        "running": "RUNNING",
        "cancelled": "FAILED",
        "elsewhere": "RUNNING",
    }
    assert st.get_run(ids["cancelled"]).data.tags["reason"] == "slurm job 7_2 CANCELLED"
    assert summary.n_running == 2
    assert len(scheduler.calls("squeue")) == 2


def test_slurm_tags_of_a_job_and_of_no_job(config, monkeypatch):
    env = {
        "SLURM_JOB_ID": "21",
        "SLURM_ARRAY_JOB_ID": "20",
        "SLURM_ARRAY_TASK_ID": "1",
        "SLURMD_NODENAME": "n7",
        "SLURM_JOB_PARTITION": "debug",
        "SLURM_CLUSTER_NAME": "alpha",
    }
    assert provenance.slurm_tags(env) == {
        "slurm_job_id": "21",
        "slurm_array_job_id": "20",
        "slurm_array_task_id": "1",
        "slurm_node": "n7",
        "slurm_partition": "debug",
        "slurm_cluster": "alpha",
    }
    assert provenance.slurm_tags({"SLURM_JOB_ID": "33", "SLURMD_NODENAME": "n2"}) == {
        "slurm_job_id": "33",
        "slurm_node": "n2",
    }
    assert provenance.slurm_tags({"SLURMD_NODENAME": "n7", "SLURM_CLUSTER_NAME": "alpha"}) == {}
    assert not any(k.startswith("slurm_") for k in provenance.environment_tags(config))
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert provenance.environment_tags(config).items() >= provenance.slurm_tags(env).items()
