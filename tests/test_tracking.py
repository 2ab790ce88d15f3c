"""plnexp.store and the runner's sweep bookkeeping against a real (copied) sqlite store; the
fit is faked so that these tests run no JAX program."""

from __future__ import annotations

import dataclasses
import os
import platform
import signal

import numpy as np
import pytest
from conftest import store_client

from plnexp.experiment import plan as cli
from plnexp.system import interrupts
from plnexp.experiment import job_task, runner
from plnexp.jobs.spec import JobSpec
from plnexp.experiment import sweep, sweep_record
from plnexp import store as tracking
from plnexp.jobs import config as C
from plnexp.fitting.engine import FitResult
from plnexp.measure.timing import Timing

N_ITER = 7


@pytest.fixture
def config(outputs):
    (job,) = cli.plan(["dataset=synthetic", "dataset.n=30", "dataset.p=5", f"n_iter={N_ITER}"], multirun=False)
    return job.config


def fake_result(config, elbo) -> FitResult:
    timing = Timing(
        compile_s=1.5,
        first_call_s=2.5,
        run_s=0.07,
        ms_per_iter=10.0,
        runs_s=(0.07,),
        cost_analysis={"step": {"flops": 123.0}},
        memory_analysis={"step": {"temp_size_in_bytes": 64}},
    )
    return FitResult(
        np.asarray(elbo, dtype=float),
        -99.0,
        {},
        int(np.sum(np.isfinite(elbo))),
        timing,
        "full",
        config.strategy.name,
        config.optimizer.name,
        "float32",
        "TFRT_CPU_0",
        {"final_elbo_jit": float(elbo[-1])},
    )


def outcome(config, elbo, status="FINISHED", reason=""):
    o = runner.Outcome(
        "scan-test", ("strategy=scan",), config, status, reason, fake_result(config, elbo), data_digest="abc123"
    )
    o.ended = o.started + 1.0
    return o


def test_tracking_uri_precedence(outputs, monkeypatch):
    assert tracking.tracking_uri() == f"sqlite:///{outputs / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////elsewhere.db")
    assert tracking.tracking_uri() == "sqlite:////elsewhere.db"
    assert tracking.tracking_uri("sqlite:////explicit.db") == "sqlite:////explicit.db"


def test_experiment_created_once_with_artifacts_under_outputs(outputs):
    cl = tracking.client(tracking.tracking_uri())
    first = tracking.experiment_id(cl, "exp")
    assert tracking.experiment_id(cl, "exp") == first
    location = cl.get_experiment(first).artifact_location
    assert location.startswith((outputs / "artifacts").as_uri())


def log_job(cl, exp_id: str, job) -> str:
    """A run written as a job's process writes it: created when the job starts, then its record."""
    run_id = tracking.start_job(cl, exp_id, job)
    tracking.writes.write_record(cl, run_id, tracking.writes.job_record(job))
    return run_id


def test_log_job_finished(outputs, config):
    elbo = -100.0 + np.arange(N_ITER, dtype=float)
    cl = tracking.client(tracking.tracking_uri())
    exp = tracking.experiment_id(cl, "t")
    run_id = log_job(cl, exp, outcome(config, elbo))
    run = store_client(outputs).get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "scan-test"
    m = run.data.metrics
    for key in ("compile_s", "first_call_s", "run_s", "ms_per_iter", "n_iter_run", "final_elbo", "loglik"):
        assert key in m, key
    assert m["n_iter_run"] == N_ITER and m["loglik"] == -99.0 and m["final_elbo"] == elbo[-1]
    history = store_client(outputs).get_metric_history(run_id, "elbo")
    assert sorted((h.step, h.value) for h in history) == list(enumerate(elbo))
    p = run.data.params
    assert p["dataset.name"] == "synthetic" and p["n_iter"] == str(N_ITER) and p["strategy.name"] == "scan"
    t = run.data.tags
    for key in (
        "jax_version",
        "jaxlib_version",
        "optax_version",
        "platform",
        "device_kind",
        "x64",
        "XLA_FLAGS",
        "git_commit",
    ):
        assert key in t, key
    assert t["data_digest"] == "abc123" and t["x64"] == "False"
    arts = {a.path for a in store_client(outputs).list_artifacts(run_id)}
    assert arts == {"config.yaml", "elbo.png", "analysis.json", "model"}  # model/: the fit (plnexp.store.fitted)


def test_log_job_failed_keeps_partial_curve(outputs, config):
    elbo = np.array([-10.0, -9.0, -8.5, np.nan, np.nan, np.nan, np.nan])
    cl = tracking.client(tracking.tracking_uri())
    exp = tracking.experiment_id(cl, "t")
    run_id = log_job(cl, exp, outcome(config, elbo, "FAILED", "non-finite ELBO at iteration 3"))
    run = store_client(outputs).get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["status_reason"] == "non-finite ELBO at iteration 3"
    assert len(store_client(outputs).get_metric_history(run_id, "elbo")) == 3


def test_failed_fit_without_result(outputs, config):
    o = runner.Outcome("x", (), config, "FAILED", "NumericsError: boom")
    o.ended = o.started
    cl = tracking.client(tracking.tracking_uri())
    run_id = log_job(cl, tracking.experiment_id(cl, "t"), o)
    run = store_client(outputs).get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["status_reason"] == "NumericsError: boom"
    assert {a.path for a in store_client(outputs).list_artifacts(run_id)} == {"config.yaml"}


def test_execute_reports_failure_instead_of_raising(config, monkeypatch):
    import plnexp.fitting.engine

    def boom(*a, **k):
        raise plnexp.fitting.engine.NumericsError("compiled ELBO disagrees")

    monkeypatch.setattr(plnexp.fitting.engine, "run_all", boom)
    (out,) = runner.execute(config, [runner.Outcome("a", (), config)])
    assert out.status == "FAILED" and out.reason == "NumericsError: compiled ELBO disagrees"


def test_sweep_parent_and_children(outputs, config, monkeypatch, tmp_path):
    calls = iter([np.linspace(-10, -5, N_ITER), np.full(N_ITER, np.nan)])
    seen_running = []

    def fake_execute(cfg, outcomes):
        (outcome,) = outcomes
        # while the job "fits", its run already exists, RUNNING, under the parent
        seen_running.append(store_client(outputs).get_run(outcome.run_id).info.status)
        elbo = next(calls)
        ok = np.isfinite(elbo).all()
        outcome.result, outcome.data_digest = fake_result(cfg, elbo), "abc123"
        outcome.status, outcome.reason = ("FINISHED", "") if ok else ("FAILED", "non-finite ELBO at iteration 0")
        outcome.ended = outcome.started + 1.0
        return outcomes

    monkeypatch.setattr(runner, "execute", fake_execute)
    uri = tracking.check_store()
    record = sweep.open_sweep(tmp_path / "sw", "s1", "sw", uri, 3, {"command": "test"})
    assert sweep_record.read_record(tmp_path / "sw") == record  # what a job in any process reads
    job_task.run_job(JobSpec(config, "a", 0, ("strategy=scan",)), parent=record.parent)
    job_task.run_job(JobSpec(config, "b", 1, ("strategy=fori_loop",)), parent=record.parent)
    assert seen_running == ["RUNNING", "RUNNING"]
    summary = sweep.close_sweep(record, "FINISHED")  # only 2 of 3 jobs ran: the parent ends FAILED
    assert summary.status == "FAILED" and summary.n_failed == 1 and [r.name for r in summary.rows] == ["a", "b"]
    cl = store_client(outputs)
    parent = cl.get_run(record.parent_id)
    assert parent.info.status == "FAILED" and parent.data.tags["n_failed"] == "1"
    assert parent.data.tags[tracking.PID_TAG] == str(os.getpid())
    children = cl.search_runs([record.experiment_id], f"tags.mlflow.parentRunId = '{record.parent_id}'")
    assert sorted(r.info.status for r in children) == ["FAILED", "FINISHED"]
    assert {r.data.tags[tracking.HOST_TAG] for r in children} == {platform.node()}
    assert "elbo" in summary.table().splitlines()[0].lower()
    assert [a.path for a in cl.list_artifacts(record.parent_id)] == ["summary.txt"]
    assert summary.n_missing == 1 and "2/3 jobs, 1 failed, 1 without a run; " in summary.footer()
    with pytest.raises(C.ConfigError, match="already holds a sweep"):
        sweep.open_sweep(tmp_path / "sw", "s1", "sw", uri, 3, {})


def test_interrupted_job_is_killed_with_its_result_and_the_sweep_closes_killed(outputs, config, monkeypatch, tmp_path):
    def interrupted_after_the_fit(cfg, outcomes):
        (outcome,) = outcomes
        outcome.result = fake_result(cfg, np.linspace(-10, -5, N_ITER))
        raise interrupts.Interrupted(signal.SIGTERM)

    monkeypatch.setattr(runner, "execute", interrupted_after_the_fit)
    uri = tracking.check_store()
    record = sweep.open_sweep(tmp_path / "sw", "s", "sw", uri, 2, {})
    with pytest.raises(interrupts.Interrupted) as stop:
        job_task.run_job(JobSpec(config, "a", 0, ("strategy=scan",)), parent=record.parent)
    assert stop.value.exit_code == 143
    summary = sweep.close_sweep(record, "KILLED", "interrupted by SIGTERM")
    cl = store_client(outputs)
    (child,) = cl.search_runs([record.experiment_id], f"tags.mlflow.parentRunId = '{record.parent_id}'")
    assert child.info.status == "KILLED" and child.data.tags["status_reason"] == "interrupted by SIGTERM"
    assert child.data.metrics["n_iter_run"] == N_ITER  # the fit had returned: its result is kept
    assert len(cl.get_metric_history(child.info.run_id, "elbo")) == N_ITER
    assert cl.get_run(record.parent_id).info.status == "KILLED"
    assert "0 of 2 jobs finished, 1 killed, 0 failed, 1 not started" in summary.interrupted_line("SIGTERM")


def test_close_sweep_ends_children_left_running(outputs, config, tmp_path):
    """A job whose process was killed (e.g. a joblib worker) leaves its run RUNNING: closing the
    sweep ends it with the sweep's status."""
    uri = tracking.check_store()
    record = sweep.open_sweep(tmp_path / "sw", "s", "sw", uri, 1, {})
    job = runner.Outcome("lost", (), config)
    cl = tracking.client(uri)
    run_id = tracking.start_job(cl, record.experiment_id, job, record.parent_id)
    sweep.close_sweep(record, "KILLED", "interrupted by SIGINT")
    run = store_client(outputs).get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["reason"] == "interrupted"


def test_orphans_of_dead_processes_are_marked_failed(outputs, config, exited_pid):
    uri = tracking.check_store()
    cl = tracking.client(uri)
    exp = tracking.experiment_id(cl, "orphans")
    dead = str(exited_pid)  # a PID that has just ended
    job = runner.Outcome("x", (), config)
    orphan = tracking.start_job(cl, exp, job, tags={tracking.PID_TAG: dead})
    mine = tracking.start_job(cl, exp, job)  # this process: alive
    elsewhere = tracking.start_job(cl, exp, job, tags={tracking.HOST_TAG: "another-host", tracking.PID_TAG: dead})
    found = tracking.sweep_up_orphans(uri)
    assert [r.run_id for r in found] == [orphan]
    st = store_client(outputs)
    run = st.get_run(orphan)
    assert run.info.status == "FAILED" and run.data.tags["reason"] == "orphaned"
    assert f"process {dead}" in run.data.tags["status_reason"]
    assert st.get_run(mine).info.status == "RUNNING" and st.get_run(elsewhere).info.status == "RUNNING"
    assert tracking.sweep_up_orphans(uri) == []
    tracking.end_process_runs(uri, "KILLED", "test", "interrupted")
    assert st.get_run(mine).info.status == "KILLED"


def test_client_retries_a_locked_database(monkeypatch):
    calls = []

    class Flaky:
        def get_thing(self, x):
            calls.append(x)
            if len(calls) < 3:
                raise RuntimeError("(sqlite3.OperationalError) database is locked")
            return x * 2

        def broken(self):
            calls.append("broken")
            raise RuntimeError("no such table")

    monkeypatch.setattr(tracking.backend.time, "sleep", lambda s: None)  # the retrying client lives in tracking.backend
    cl = tracking.Retrying(Flaky())
    assert cl.get_thing(21) == 42 and calls == [21, 21, 21]
    with pytest.raises(RuntimeError, match="no such table"):
        cl.broken()
    assert calls.count("broken") == 1  # other errors are not retried


def test_unreachable_http_store_fails_fast(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    with pytest.raises(tracking.StoreError, match=r"^MLFLOW_TRACKING_URI=http://127.0.0.1:9: cannot reach"):
        tracking.check_store(timeout=2.0)


def test_sqlite_store_in_an_unwritable_place(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(tracking.StoreError, match=r"^tracking_uri=sqlite:///.*/file/sub/x.db: cannot write"):
        tracking.check_store(f"sqlite:///{blocker}/sub/x.db")


def test_elbo_png(tmp_path):
    from plnexp.measure.plots import elbo_png

    path = elbo_png(np.linspace(-10, -1, 50), "t", tmp_path / "c.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_unmeasured_timings_are_not_logged_and_shown_as_dash(outputs, config):
    """The default protocol (no first call, no compile cache): first_call_s and compile_warm_s are NaN,
    absent from the metrics, and "-" in the summary table."""
    elbo = -100.0 + np.arange(N_ITER, dtype=float)
    o = outcome(config, elbo)
    o.result = dataclasses.replace(
        o.result, timing=Timing(compile_s=1.5, first_call_s=float("nan"), run_s=0.07, ms_per_iter=10.0, runs_s=(0.07,))
    )
    assert "first_call_s" not in o.metrics() and "compile_warm_s" not in o.metrics()
    assert "first call" not in o.summary() and "run 0.070 s" in o.summary()
    cl = tracking.client(tracking.tracking_uri())
    run_id = log_job(cl, tracking.experiment_id(cl, "t"), o)
    m = store_client(outputs).get_run(run_id).data.metrics
    assert "first_call_s" not in m and "compile_warm_s" not in m and m["compile_s"] == 1.5
    head, _, row = runner.summary_table([o]).splitlines()
    cells = dict(zip(head.split(), row.split()))
    assert cells["first_s"] == "-" and cells["cached_s"] == "-" and cells["compile_s"] == "1.500"


def test_an_interrupted_store_creation_leaves_no_store(tmp_path, monkeypatch):
    """MLflow's migrations run on a temporary file linked into place at the end: an interrupt
    half-way leaves nothing (a half-migrated store would fail every later command)."""
    import mlflow.store.tracking.sqlalchemy_store as sas

    def interrupted(*args, **kwargs):
        raise interrupts.Interrupted(signal.SIGINT)

    monkeypatch.setattr(sas, "SqlAlchemyStore", interrupted)
    with pytest.raises(interrupts.Interrupted):
        tracking.check_store(f"sqlite:///{tmp_path}/new/mlflow.db")
    assert list((tmp_path / "new").iterdir()) == []
