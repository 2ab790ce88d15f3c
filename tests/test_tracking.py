"""plnexp.tracking and the runner's sweep bookkeeping against a real (copied) sqlite store; the
fit is faked so that these tests run no JAX program."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import store_client

from plnexp import cli, runner, tracking
from plnexp.fitting import FitResult
from plnexp.timing import Timing

N_ITER = 7


@pytest.fixture
def config(outputs):
    (job,) = cli.plan(["dataset=synthetic", "dataset.n=30", "dataset.p=5", f"n_iter={N_ITER}"], multirun=False)
    return job.config


def fake_result(config, elbo) -> FitResult:
    timing = Timing(1.5, 2.5, 0.07, 10.0, (0.07,), {"step": {"flops": 123.0}}, {"step": {"temp_size_in_bytes": 64}})
    return FitResult(np.asarray(elbo, dtype=float), -99.0, {}, int(np.sum(np.isfinite(elbo))), timing, "full",
                     config.strategy.name, config.optimizer.name, "float32", "TFRT_CPU_0",
                     {"final_elbo_jit": float(elbo[-1])})


def outcome(config, elbo, status="FINISHED", reason=""):
    o = runner.Outcome("scan-test", ("strategy=scan",), config, status, reason, fake_result(config, elbo),
                       data_digest="abc123")
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


def test_log_job_finished(outputs, config):
    elbo = -100.0 + np.arange(N_ITER, dtype=float)
    cl = tracking.client(tracking.tracking_uri())
    exp = tracking.experiment_id(cl, "t")
    run_id = tracking.log_job(cl, exp, outcome(config, elbo))
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
    for key in ("jax_version", "jaxlib_version", "optax_version", "platform", "device_kind", "x64", "XLA_FLAGS",
                "git_commit"):
        assert key in t, key
    assert t["data_digest"] == "abc123" and t["x64"] == "False"
    arts = {a.path for a in store_client(outputs).list_artifacts(run_id)}
    assert arts == {"config.yaml", "elbo.png", "analysis.json"}


def test_log_job_failed_keeps_partial_curve(outputs, config):
    elbo = np.array([-10.0, -9.0, -8.5, np.nan, np.nan, np.nan, np.nan])
    cl = tracking.client(tracking.tracking_uri())
    exp = tracking.experiment_id(cl, "t")
    run_id = tracking.log_job(cl, exp, outcome(config, elbo, "FAILED", "non-finite ELBO at iteration 3"))
    run = store_client(outputs).get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["status_reason"] == "non-finite ELBO at iteration 3"
    assert len(store_client(outputs).get_metric_history(run_id, "elbo")) == 3


def test_failed_fit_without_result(outputs, config):
    o = runner.Outcome("x", (), config, "FAILED", "NumericsError: boom")
    o.ended = o.started
    cl = tracking.client(tracking.tracking_uri())
    run_id = tracking.log_job(cl, tracking.experiment_id(cl, "t"), o)
    run = store_client(outputs).get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["status_reason"] == "NumericsError: boom"
    assert {a.path for a in store_client(outputs).list_artifacts(run_id)} == {"config.yaml"}


def test_execute_reports_failure_instead_of_raising(config, monkeypatch):
    import plnexp.fitting

    def boom(*a, **k):
        raise plnexp.fitting.NumericsError("compiled ELBO disagrees")

    monkeypatch.setattr(plnexp.fitting, "fit", boom)
    out = runner.execute(config)
    assert out.status == "FAILED" and out.reason == "NumericsError: compiled ELBO disagrees"


def test_sweep_parent_and_children(outputs, config, monkeypatch):
    monkeypatch.setattr(runner, "SWEEP", None)
    calls = iter([np.linspace(-10, -5, N_ITER), np.full(N_ITER, np.nan)])

    def fake_execute(cfg, overrides=(), name=None, output_dir=""):
        elbo = next(calls)
        ok = np.isfinite(elbo).all()
        return outcome(cfg, elbo, "FINISHED" if ok else "FAILED", "" if ok else "non-finite ELBO at iteration 0")

    monkeypatch.setattr(runner, "execute", fake_execute)
    sweep = runner.open_sweep("s1", "sw", 3, None, {"sweep": "test"})
    runner.run_job(config, ("strategy=scan",), "a")
    runner.run_job(config, ("strategy=fori_loop",), "b")
    runner.close_sweep("FINISHED")  # only 2 of 3 jobs ran: the parent ends FAILED
    runner.close_sweep("FINISHED")  # idempotent
    cl = store_client(outputs)
    parent = cl.get_run(sweep.parent_id)
    assert parent.info.status == "FAILED" and parent.data.tags["n_failed"] == "1"
    exp = cl.get_experiment_by_name("sw")
    children = cl.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{sweep.parent_id}'")
    assert sorted(r.info.status for r in children) == ["FAILED", "FINISHED"]
    assert "elbo" in runner.summary_table(sweep.outcomes).splitlines()[0].lower()
    assert [a.path for a in cl.list_artifacts(sweep.parent_id)] == ["summary.txt"]


def test_elbo_png(tmp_path):
    from plnexp.plots import elbo_png

    path = elbo_png(np.linspace(-10, -1, 50), "t", tmp_path / "c.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_unmeasured_timings_are_not_logged_and_shown_as_dash(outputs, config):
    """The default protocol (no first call, no compile cache): first_call_s and compile_warm_s are NaN,
    absent from the metrics, and "-" in the summary table."""
    elbo = -100.0 + np.arange(N_ITER, dtype=float)
    o = outcome(config, elbo)
    o.result = dataclasses.replace(o.result, timing=Timing(1.5, float("nan"), 0.07, 10.0, (0.07,)))
    assert "first_call_s" not in o.metrics() and "compile_warm_s" not in o.metrics()
    assert "first call" not in o.summary() and "run 0.070 s" in o.summary()
    cl = tracking.client(tracking.tracking_uri())
    run_id = tracking.log_job(cl, tracking.experiment_id(cl, "t"), o)
    m = store_client(outputs).get_run(run_id).data.metrics
    assert "first_call_s" not in m and "compile_warm_s" not in m and m["compile_s"] == 1.5
    head, _, row = runner.summary_table([o]).splitlines()
    cells = dict(zip(head.split(), row.split()))
    assert cells["first_s"] == "-" and cells["cached_s"] == "-" and cells["compile_s"] == "1.500"
