"""The plan is the sweep (issue #65): ``plan`` emits every job a sweep runs (the grid, its control
job, its peers); the dry run lists them and writes nothing; a sweep runs exactly that list (its
runs' ``config_hash`` tags are the plan's); resume dispatches the plan minus what is finished."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import store_client
from test_peers import fake_fit  # a peer's FitResult without pyPLNmodels

from plnexp.experiment import dry_run, executors
from plnexp.jobs import peers

DATA = ["dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=5", "warmup=0", "report.rounds=0"]
# two strategies timed 3 times: a control job (scan's again); replicates=2: each job two runs
GRID = ["sweep=null", *DATA, "strategy=scan,fori_loop", "repeats=3", "replicates=2", "report.peers=[pyplnmodels]"]


def tree(root) -> dict:
    """Every path under ``root`` with its size and modification time (a link's own: the outputs'
    ``jax_cache`` links to the session's compile cache, which other tests write)."""
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.fixture
def fake_peer(monkeypatch):
    """pyPLNmodels' peer in this process's registry, fitted by :func:`fake_fit` (no torch)."""
    fake = replace(
        peers.PEERS["pyplnmodels"],
        available=lambda: None,
        fit=fake_fit,
        versions=lambda: {"pyplnmodels_version": "0.0-test"},
        uses_gpu=lambda: False,
    )
    monkeypatch.setitem(peers.PEERS, "pyplnmodels", fake)
    return fake


@pytest.mark.slow  # the grid composed twice (~3 s)
def test_the_dry_run_lists_grid_control_and_peer_jobs_and_writes_nothing(outputs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    from plnexp.__main__ import main

    assert main(["sweep", *GRID, "--dry-run", "--json"]) == 0  # as a user types it
    jobs = json.loads(capsys.readouterr().out)
    assert [(j["kind"], j["num"]) for j in jobs] == [("job", 0), ("job", 1), ("control", 2), ("peer", 3)]
    assert jobs[2]["name"] == f"control-{jobs[0]['name']}" and jobs[2]["hash"] == jobs[0]["hash"]  # scan's again
    assert jobs[0]["hash"] != jobs[1]["hash"] and all(len(j["hash"]) == 64 for j in jobs)
    assert jobs[0]["replicates"] == 2 and jobs[3]["replicates"] == 1 and jobs[3]["peer"] == "pyplnmodels"
    assert dry_run.main(GRID, as_json=False) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "dry run: 2 jobs, 1 control, 1 peer; nothing run, nothing written"
    assert lines[2].split()[:3] == ["2", "control", jobs[2]["hash"][:12]]
    assert tree(tmp_path) == before  # no store, no outputs, no Hydra folder


def test_a_bad_override_in_a_dry_run_is_one_line_exit_2(outputs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert dry_run.main([*DATA, "strategy=nope"], as_json=True) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("plnexp: error: strategy=nope: allowed values are ") and err.count("\n") == 1


def _children(outputs, experiment):
    cl = store_client(outputs)
    exp = cl.get_experiment_by_name(experiment)
    return [r for r in cl.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]


@pytest.mark.slow  # two sweeps: 4 runs of two jobs' replicates, a control, a peer; a job across 2 processes
def test_a_sweep_runs_exactly_its_plan(outputs, tmp_path, plnexp_main, fake_peer, capsys):
    """The runs' config_hash tags (and job numbers) are the plan's, for a grid with replicates, its
    control job and a peer; and for a job of processes=2."""
    across = ["sweep=null", *DATA, "strategy=scan_sharded", "model=full", "processes=2", "repeats=1"]
    for experiment, grid in (("planned", GRID), ("planned-across", across)):
        dry_run.main([*grid, f"experiment={experiment}"], as_json=True)
        planned = json.loads(capsys.readouterr().out)
        ran = plnexp_main("sweep", *grid, f"experiment={experiment}", "report=false", cwd=tmp_path)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        runs = _children(outputs, experiment)
        assert all(r.info.status == "FINISHED" for r in runs)
        hashed = sorted(
            (r.data.tags["plnexp.job"], r.data.tags["config_hash"]) for r in runs if "plnexp.peer" not in r.data.tags
        )
        want = sorted(
            (str(j["num"]), j["hash"]) for j in planned if j["kind"] != "peer" for _ in range(j["replicates"])
        )
        assert hashed == want
        peer_runs = sorted((r.data.tags["plnexp.job"], r.info.run_name) for r in runs if "plnexp.peer" in r.data.tags)
        assert peer_runs == [(str(j["num"]), j["name"]) for j in planned if j["kind"] == "peer"]
    assert [j["processes"] for j in planned] == [2]


def _counting(monkeypatch) -> list:
    """Every spec the sweep's driver hands its executor (the in-process one), in order."""
    dispatched: list = []
    run = executors.InProcess.run

    def counted(self, work, specs, total):
        dispatched.extend(specs)
        return run(self, work, specs, total)

    monkeypatch.setattr(executors.InProcess, "run", counted)
    return dispatched


@pytest.mark.slow  # three sweeps of four tiny jobs
def test_resume_dispatches_the_plan_minus_the_finished_jobs(outputs, tmp_path, plnexp_main, monkeypatch):
    """A finished sweep resumed dispatches nothing; with half its runs no longer FINISHED, exactly the
    other half (by job number), and it says how many it runs and reuses."""
    grid = ["sweep=null", *DATA, "seed=0,1,2,3", "experiment=halves", "report=false"]
    dispatched = _counting(monkeypatch)
    first = plnexp_main("sweep", *grid, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert [s.num for s in dispatched] == [0, 1, 2, 3]

    dispatched.clear()
    again = plnexp_main("sweep", *grid, "resume=true", cwd=tmp_path)
    assert again.returncode == 0 and dispatched == [], again.stdout
    assert "resume: all 4 jobs already FINISHED" in again.stdout

    cl = store_client(outputs)
    for r in _children(outputs, "halves"):
        if r.data.tags["plnexp.job"] in ("1", "3"):
            cl.set_terminated(r.info.run_id, "FAILED")
    half = plnexp_main("sweep", *grid, "resume=true", cwd=tmp_path)
    assert half.returncode == 0, half.stdout + half.stderr
    assert [s.num for s in dispatched] == [1, 3]
    assert "resume: runs 2 jobs; reuses 2 job(s)" in half.stdout
    assert "4/4 jobs (2 FINISHED earlier), 0 failed" in half.stdout
