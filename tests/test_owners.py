"""plnexp.store.owners: who owns a RUNNING run (the Owner protocol, LocalProcess), and what the
orphan sweep-up and closing a sweep do with runs whose owner is alive, dead, or elsewhere."""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import end, spawn, store_client

from plnexp.experiment import runner
from plnexp.experiment import sweep
from plnexp import store as tracking
from plnexp.store import owners
from plnexp.store.owners import BOOT_TAG, HOST_TAG, PID_TAG, START_TAG, LocalProcess, Owner


@pytest.fixture
def config(tiny_config):
    return tiny_config


@pytest.fixture
def live_pid():
    """The PID of another live process of this host (``sleep 30``), ended at the end (and by
    :func:`conftest.reap` whatever happens)."""
    proc = spawn(["sleep", "30"])
    yield proc.pid
    end(proc)


def test_local_process_tags_round_trip():
    owner = LocalProcess("some-host", 1234)
    assert owner.tags() == {HOST_TAG: "some-host", PID_TAG: "1234"}
    assert LocalProcess.from_tags(owner.tags()) == owner
    assert owners.owner_of({**owner.tags(), "other": "tag"}) == owner
    assert isinstance(owner, Owner)
    assert str(owner) == "process 1234 on some-host"
    for tags in ({}, {HOST_TAG: "h"}, {PID_TAG: "1"}, {HOST_TAG: "h", PID_TAG: "not-a-pid"}):
        assert owners.owner_of(tags) is None, tags


def test_current_is_this_process_and_what_runs_are_tagged_with():
    me = owners.current()
    assert me == LocalProcess(platform.node(), os.getpid())
    assert tracking.process_tags() == {**me.tags(), "mlflow.user": tracking.writes.user()}  # and who ran it
    # the host's boot and the process's start time in it (field 22 of /proc/<pid>/stat) name it too
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    start = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19]
    assert me.tags() == {HOST_TAG: platform.node(), PID_TAG: str(os.getpid()), BOOT_TAG: boot, START_TAG: start}
    assert owners.owner_of(me.tags()) == me and LocalProcess.from_tags(me.tags()).start == start


def test_a_reused_pid_is_another_process():
    """A PID the kernel gave again (after the owner died, or in a later boot) names another process:
    host and PID agree, start time or boot id do not. Such an owner is gone and not this process."""
    me = LocalProcess.here()
    assert me.alive() is True and me.boot and me.start.isdigit()
    for stranger in (replace(me, start=str(int(me.start) - 1)), replace(me, boot="another-boot")):
        assert stranger != me and owners.owner_of(stranger.tags()) != owners.current()
        assert stranger.alive() is False, stranger
    older = LocalProcess(me.host, me.pid)  # an older run's tags: host and PID only, compared as then
    assert older == me and older.alive() is True


def test_alive_this_process_a_dead_one_and_another_host(exited_pid):
    assert LocalProcess.here().alive() is True
    assert LocalProcess(platform.node(), exited_pid).alive() is False
    assert LocalProcess("another-host", os.getpid()).alive() is None  # cannot tell from here
    assert LocalProcess(platform.node(), 0).alive() is None  # no PID: cannot tell


def test_a_zombie_is_not_alive():
    proc = spawn([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        assert LocalProcess(platform.node(), proc.pid).alive() is False  # exited, not yet reaped
    finally:
        proc.wait()


def test_cancel_of_a_local_process_does_nothing(live_pid):
    owner = LocalProcess(platform.node(), live_pid)
    assert owner.cancel() is None
    assert owner.alive() is True


def test_sweep_up_orphans_asks_the_owners(outputs, config, exited_pid, live_pid):
    uri = tracking.check_store()
    cl = tracking.client(uri)
    exp = tracking.experiment_id(cl, "orphans")
    job = runner.Outcome("x", (), config)
    here = platform.node()
    dead = tracking.start_job(cl, exp, job, tags=LocalProcess(here, exited_pid).tags())
    live = tracking.start_job(cl, exp, job, tags=LocalProcess.of(live_pid).tags())
    elsewhere = tracking.start_job(cl, exp, job, tags=LocalProcess("another-host", exited_pid).tags())
    mine = tracking.start_job(cl, exp, job)
    found = tracking.sweep_up_orphans(uri)
    assert [r.run_id for r in found] == [dead]
    st = store_client(outputs)
    run = st.get_run(dead)
    assert run.info.status == "FAILED" and run.data.tags["reason"] == "orphaned"
    assert run.data.tags["status_reason"] == f"orphaned: process {exited_pid} on {here} ended without closing this run"
    for rid in (live, elsewhere, mine):
        assert st.get_run(rid).info.status == "RUNNING"
    assert [r.run_id for r in tracking.process_runs(uri)] == [mine]
    assert [r.run_id for r in tracking.end_process_runs(uri, "KILLED", "test", "interrupted")] == [mine]
    assert st.get_run(live).info.status == "RUNNING" and st.get_run(elsewhere).info.status == "RUNNING"


def test_close_sweep_leaves_children_of_live_or_unknown_owners_running(outputs, config, tmp_path, exited_pid, live_pid):
    uri = tracking.check_store()
    record = sweep.open_sweep(tmp_path / "sw", "s", "sw", uri, 4, {})
    cl = tracking.client(uri)
    here = platform.node()
    ids = {}
    for num, (name, owner) in enumerate(
        [
            ("mine", None),
            ("dead", LocalProcess(here, exited_pid)),
            ("live", LocalProcess.of(live_pid)),
            ("elsewhere", LocalProcess("another-host", os.getpid())),
        ]
    ):
        tags = {tracking.JOB_TAG: num, **(owner.tags() if owner else {})}
        ids[name] = tracking.start_job(
            cl, record.experiment_id, runner.Outcome(name, (), config), record.parent_id, tags
        )
    summary = sweep.close_sweep(record, "KILLED", "interrupted by SIGINT")
    st = store_client(outputs)
    status = {name: st.get_run(rid).info.status for name, rid in ids.items()}
    assert status == {"mine": "KILLED", "dead": "KILLED", "live": "RUNNING", "elsewhere": "RUNNING"}
    assert st.get_run(ids["dead"]).data.tags["reason"] == "interrupted"
    assert "reason" not in st.get_run(ids["live"]).data.tags
    assert summary.n_running == 2 and summary.count("KILLED") == 2
    assert summary.interrupted_line("SIGINT").startswith(
        "plnexp: interrupted by SIGINT: 0 of 4 jobs finished, 2 killed, 0 failed, 0 not started, "
        "2 left RUNNING (owner alive elsewhere or unknown); parent run "
    )
    assert ", 2 failed, 2 left RUNNING (owner alive elsewhere or unknown); " in summary.footer()
    parent = st.get_run(record.parent_id)
    assert parent.info.status == "KILLED" and parent.data.tags["n_running"] == "2"
    assert "RUNNING" in summary.table()


def test_close_sweep_output_unchanged_when_nothing_is_left_running(outputs, config, tmp_path):
    uri = tracking.check_store()
    record = sweep.open_sweep(tmp_path / "sw", "s", "sw", uri, 2, {})
    cl = tracking.client(uri)
    tracking.start_job(cl, record.experiment_id, runner.Outcome("lost", (), config), record.parent_id)
    summary = sweep.close_sweep(record, "KILLED", "interrupted by SIGTERM")
    assert summary.n_running == 0
    assert "left RUNNING" not in summary.footer() + summary.interrupted_line("SIGTERM")
    assert "0 of 2 jobs finished, 1 killed, 0 failed, 1 not started; parent run" in summary.interrupted_line("SIGTERM")
    assert "1/2 jobs, 1 failed; " in summary.footer()
    assert "n_running" not in store_client(outputs).get_run(record.parent_id).data.tags


def test_runs_of_a_reused_pid_are_orphans_and_older_runs_are_judged_as_before(outputs, config, exited_pid, live_pid):
    """A run tagged with this process's PID but another start time (its owner died, this process got
    its PID) is swept up as orphaned and is not this process's; runs of older versions (host and PID
    only) are judged by their PID as they were."""
    uri = tracking.check_store()
    cl = tracking.client(uri)
    exp = tracking.experiment_id(cl, "reused")
    me = LocalProcess.here()
    stranger = replace(me, start=str(int(me.start) - 1))
    job = runner.Outcome("x", (), config)
    theirs = tracking.start_job(cl, exp, job, tags=stranger.tags())
    mine = tracking.start_job(cl, exp, job)
    here = platform.node()
    older = {
        name: cl.create_run(exp, tags={HOST_TAG: here, PID_TAG: str(pid)}).info.run_id
        for name, pid in (("older_dead", exited_pid), ("older_live", live_pid))
    }
    found = {r.run_id for r in tracking.sweep_up_orphans(uri)}
    assert found == {theirs, older["older_dead"]}
    st = store_client(outputs)
    run = st.get_run(theirs)
    assert run.info.status == "FAILED" and run.data.tags["reason"] == "orphaned"
    assert st.get_run(mine).info.status == "RUNNING" and st.get_run(older["older_live"]).info.status == "RUNNING"
    assert [r.run_id for r in tracking.process_runs(uri)] == [mine]  # not the stranger's run
