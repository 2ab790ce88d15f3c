"""End to end: ``python -m plnexp`` in a subprocess, on tiny data, into a temporary store."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import plnexp_cli, store_client

TINY = ["dataset=synthetic", "dataset.n=30", "dataset.p=5", "repeats=1", "warmup=0"]
METRICS = ("compile_s", "run_s", "ms_per_iter", "n_iter_run", "final_elbo", "loglik")
NOT_MEASURED = ("first_call_s", "compile_warm_s")  # by default: first_call=false, compile_cache=false


def all_runs(outputs):
    cl = store_client(outputs)
    exps = [e.experiment_id for e in cl.search_experiments()]
    return cl.search_runs(exps) if exps else []


def test_run_logs_one_finished_run(outputs, tmp_path):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    proc = plnexp_cli("run", *TINY, "n_iter=6", "strategy=fori_loop", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("fori_loop-synthetic_n30_p5_d2_s0-f32-cpu") and "FINISHED" in line
    assert list(cwd.iterdir()) == [], "nothing may be written into the working directory"
    (run,) = all_runs(outputs)
    assert run.info.status == "FINISHED"
    for key in METRICS:
        assert np.isfinite(run.data.metrics[key]), key
    for key in NOT_MEASURED:
        assert key not in run.data.metrics, key
    history = store_client(outputs).get_metric_history(run.info.run_id, "elbo")
    assert sorted(h.step for h in history) == list(range(6))
    assert (outputs / "runs").is_dir()


def test_sweep_one_parent_children_and_equal_curves(outputs, tmp_path):
    proc = plnexp_cli("sweep", "strategy=scan,fori_loop", "dataset.replication=1", "n_iter=5", "repeats=1",
                      "warmup=0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[2/2] fori_loop-oaks-f32-cpu" in proc.stdout and "0 failed" in proc.stdout
    cl = store_client(outputs)
    exp = cl.get_experiment_by_name("default")
    runs = cl.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 2 and {r.info.status for r in children} == {"FINISHED"}
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    by = {r.data.params["strategy.name"]: r for r in children}
    assert by["scan"].info.run_name == "scan-oaks-f32-cpu-n_iter5"
    curves = {s: [m.value for m in sorted(cl.get_metric_history(r.info.run_id, "elbo"), key=lambda m: m.step)]
              for s, r in by.items()}
    assert len(curves["scan"]) == 5
    np.testing.assert_allclose(curves["scan"], curves["fori_loop"], rtol=1e-5)
    assert by["scan"].data.params["dataset.replication"] == "1"


def test_plain_hydra_multirun_goes_on_after_a_failed_job(outputs, tmp_path):
    # sgd at lr=1e6 diverges: that job is FAILED with its reason, the other one still runs.
    proc = plnexp_cli("run", "--multirun", *TINY, "n_iter=3", "optimizer=sgd,radam_clip", "optimizer.lr=1e6",
                      cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # a job failed
    assert "[2/2]" in proc.stdout and "1 failed" in proc.stdout
    runs = all_runs(outputs)
    assert len(runs) == 3 and not any(r.info.status == "RUNNING" for r in runs)
    children = {r.data.params["optimizer.name"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert children["sgd"].info.status == "FAILED"
    assert "non-finite ELBO" in children["sgd"].data.tags["status_reason"]
    assert children["radam_clip"].info.status == "FINISHED"


BAD = [
    (["run", "precision=float16"], ["precision", "float32, float64"]),
    (["run", "strategy=scna"], ["strategy=scna", "scan_unrolled"]),
    (["run", "n_iter=-5"], ["n_iter=-5", ">= 1"]),
    (["run", "dataset.replication=0"], ["dataset.replication=0", ">= 1"]),
    (["run", "nonsense=1"], ["nonsense", "unknown key", "n_iter"]),
    (["run", "device=gpu"], ["device", "cpu"]),
    (["sweep", "strategy=scan,scna"], ["strategy=scna", "allowed values"]),
]


@pytest.mark.parametrize("args,words", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_value_is_one_line_and_leaves_no_run(outputs, tmp_path, args, words):
    if args[1] == "device=gpu":
        import jax

        if any(d.platform == "gpu" for d in jax.devices()):
            pytest.skip("this machine has a GPU")
    proc = plnexp_cli(*args, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in err
    assert all_runs(outputs) == []
    assert not (outputs / "runs").exists() and not (outputs / "multirun").exists()


def test_help_lists_config_groups(tmp_path):
    proc = plnexp_cli("--help", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0
    for group in ("dataset:", "optimizer:", "strategy:", "device:", "precision:", "model:", "sweep:"):
        assert group in proc.stdout
