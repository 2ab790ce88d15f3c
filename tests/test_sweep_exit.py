"""A sweep whose job never logged a run (its process ended first: killed, or failed before the run
started) is not a success: the footer counts it, the parent ends FAILED and the command exits 1."""

from __future__ import annotations

import pytest
from conftest import store_client

from plnexp.experiment import job_task, sweep_summary


def all_runs(outputs):
    cl = store_client(outputs)
    return cl.search_runs([e.experiment_id for e in cl.search_experiments()])


TINY = ("dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3", "warmup=0", "report.rounds=1")


@pytest.mark.slow
def test_a_job_that_never_logged_a_run_fails_the_sweep(outputs, tmp_path, plnexp_main, monkeypatch):
    ran = job_task.Task._job

    def job_one_dies_first(self, spec, record, output_dir):  # as a process killed before its run
        return None if spec.num == 1 else ran(self, spec, record, output_dir)

    monkeypatch.setattr(job_task.Task, "_job", job_one_dies_first)
    proc = plnexp_main("sweep", *TINY, "strategy=scan,fori_loop", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1/2 jobs, 0 failed, 1 without a run; " in proc.stdout, proc.stdout
    runs = all_runs(outputs)
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert parent.info.status == "FAILED" and [r.info.status for r in children] == ["FINISHED"]


@pytest.mark.slow  # two sweeps of two tiny jobs and their rounds (~15 s)
def test_a_sweep_interrupted_in_its_rounds_runs_them_on_resume(outputs, tmp_path, plnexp_main, monkeypatch):
    """#62: Ctrl-C during ``[rounds]`` (every job FINISHED, no verdict yet): ``resume=true`` opens a new
    parent that reuses both jobs and runs the rounds, its verdict.json on it; a second resume has
    nothing left to run."""
    from plnexp.experiment import groups
    from plnexp.jobs import verdicts as V

    grid = (*TINY[:-1], "report.rounds=3", "report.rounds_budget_s=5", "strategy=scan,fori_loop", "experiment=rounds")
    grid = (*grid, "report=false")  # the sweeps' own lines: no report read back
    timed = groups._time_group

    def interrupted(members, held=None):
        raise KeyboardInterrupt  # as Ctrl-C inside the rounds

    monkeypatch.setattr(groups, "_time_group", interrupted)
    first = plnexp_main("sweep", "sweep=null", *grid, cwd=tmp_path)
    assert first.returncode == 130, first.stdout + first.stderr
    assert "\n[rounds] 2 programs of synthetic_n30_p5_d2_s0 ... interrupted\n" in first.stdout  # its line ended
    monkeypatch.setattr(groups, "_time_group", timed)
    cl = store_client(outputs)
    (parent,) = [r for r in all_runs(outputs) if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status == "KILLED" and V.ARTIFACT not in [a.path for a in cl.list_artifacts(parent.info.run_id)]
    resumed = plnexp_main("sweep", "sweep=null", *grid, "resume=true", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.startswith(
        "resume: all 2 jobs already FINISHED in experiment 'rounds'; their rounds did not finish (no verdict): "
    ), resumed.stdout
    assert "[rounds] 2 programs of " in resumed.stdout
    new = next(
        r for r in all_runs(outputs) if "mlflow.parentRunId" not in r.data.tags and r.info.run_id != parent.info.run_id
    )
    assert new.data.tags["resumes"] == parent.info.run_id and new.info.status == "FINISHED"
    path = cl.download_artifacts(new.info.run_id, V.ARTIFACT, str(tmp_path))
    (group,) = V.loads(open(path).read())
    assert {s.strategy for s in group.strategies} == {"scan", "fori_loop"}
    children = [r for r in all_runs(outputs) if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.data.tags["plnexp.verdict"] != "" for r in children) == [True, True]  # the reused runs timed
    again = plnexp_main("sweep", "sweep=null", *grid, "resume=true", cwd=tmp_path)
    assert again.returncode == 0 and "all 2 jobs already FINISHED" in again.stdout, again.stdout + again.stderr


def test_a_job_skipped_because_the_store_failed_is_counted_as_skipped_not_failed():
    """#62: after a store failure the later jobs are SKIPPED (resume=true runs them): the footer says
    so, they are not counted among the failed runs, and the sweep is still no success."""
    from plnexp.experiment.runner import Row

    rows = [Row("a", "FINISHED", {}, 1.0), Row("b", "FAILED", {}, 1.0), Row("c", sweep_summary.SKIPPED, {}, 0.0)]
    summary = sweep_summary.Summary("FAILED", rows, 3, 3.0, "p1")
    assert (summary.n_failed, summary.n_skipped, summary.n_missing) == (1, 1, 0)
    assert summary.footer().startswith("3/3 jobs, 1 failed, 1 skipped; ")
