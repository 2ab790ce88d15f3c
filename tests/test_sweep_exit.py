"""A sweep whose job never logged a run (its process ended first: killed, or failed before the run
started) is not a success: the footer counts it, the parent ends FAILED and the command exits 1."""

from __future__ import annotations

import pytest
from conftest import store_client

from plnexp.experiment import sweep


def all_runs(outputs):
    cl = store_client(outputs)
    return cl.search_runs([e.experiment_id for e in cl.search_experiments()])


TINY = ("dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3", "warmup=0", "report.rounds=1")


@pytest.mark.slow
def test_a_job_that_never_logged_a_run_fails_the_sweep(outputs, tmp_path, plnexp_main, monkeypatch):
    ran = sweep.Task._job

    def job_one_dies_first(self, spec, record, output_dir, here):  # as a process killed before its run
        return None if spec.num == 1 else ran(self, spec, record, output_dir, here)

    monkeypatch.setattr(sweep.Task, "_job", job_one_dies_first)
    proc = plnexp_main("sweep", *TINY, "strategy=scan,fori_loop", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1/2 jobs, 0 failed, 1 without a run; " in proc.stdout, proc.stdout
    runs = all_runs(outputs)
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert parent.info.status == "FAILED" and [r.info.status for r in children] == ["FINISHED"]
