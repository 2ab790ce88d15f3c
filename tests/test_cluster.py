"""On a cluster, into a team's store, for real: a single-node SLURM cluster and an MLflow server
backed by PostgreSQL 15, started by these tests (tests/daemons.py) on 127.0.0.1 and stopped by PID.

Each test skips, saying why, where the daemons cannot run (not root, Debian's slurm-wlm/munge or
PostgreSQL 15 missing, plnexp's cluster extra not installed); CI installs them and runs these.
"""

from __future__ import annotations

import os
import signal
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import daemons
from conftest import plugin_env, spawn, waiting

# one xdist worker runs them all: the module's daemons are started once, and never twice at a time
pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.xdist_group("cluster"), pytest.mark.timeout(600)]

SWEEP = (
    "hydra/launcher=slurm",
    "hydra.launcher.partition=debug",
    "hydra.launcher.cpus_per_task=1",
    "dataset.replication=1",
    "report=false",
    "report.rounds=0",  # each job a task of its own (with rounds, a group is one task: test_a_group_is_one_slurm_job)
)


def _need_extra() -> None:
    try:
        import hydra_plugins.hydra_submitit_launcher  # noqa: F401 - is the cluster extra installed?
        import psycopg  # noqa: F401 - is the cluster extra installed?
    except ImportError as e:
        pytest.skip(f"plnexp's cluster extra is not installed ({e}): pip install -e '.[cluster]'")


@pytest.fixture(scope="module")
def cluster():
    _need_extra()
    try:
        with daemons.slurm_cluster(kill_wait=10) as c:
            yield c
    except daemons.Unavailable as e:
        pytest.skip(f"no SLURM cluster here: {e}")


@pytest.fixture(scope="module")
def server(pg_server):
    """The session's PostgreSQL-backed server (conftest's ``pg_server``, test_store_outage's too): one
    worker process (each imports MLflow's server: seconds of CPU); it serves the eight concurrent
    writers below on its threads."""
    _need_extra()
    return pg_server.server


@pytest.fixture
def env(cluster, server, tmp_path, monkeypatch):
    """A shell's environment for the cluster: SLURM_CONF, MLFLOW_TRACKING_URI, outputs on a folder
    every job sees (one machine: the test's tmp_path)."""
    for k, v in {**cluster.env, "MLFLOW_TRACKING_URI": server.uri, "PLNEXP_OUTPUTS": str(tmp_path / "outputs")}.items():
        monkeypatch.setenv(k, v)
    return dict(os.environ)


def plnexp(*args, env, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "plnexp", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=Path(__file__).parents[1],
    )


def _client(uri):
    from mlflow import MlflowClient

    return MlflowClient(uri)


def _sweep(cl, experiment: str):
    """The newest parent run of ``experiment`` and its children."""
    exp = cl.get_experiment_by_name(experiment)
    runs = cl.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    parent = max(parents, key=lambda r: r.info.start_time)
    return parent, [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]


def test_slurm_sweep_into_the_postgres_backed_server(env, server, plnexp_main):
    """Two SLURM jobs (one job array, running side by side on the node's two CPUs) into the server:
    every run FINISHED under one parent, tagged with its SLURM job, array task and node; one line per job in the driver and none of submitit's sacct warnings;
    the report reads the sweep back through the server."""
    t0 = time.monotonic()
    out = plnexp(
        "sweep",
        *SWEEP,
        "strategy=scan,fori_loop",
        "n_iter=30",
        "experiment=cluster",
        env=env,
    )
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr[-3000:]
    assert "sacct" not in out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("[")]
    assert sorted(line.split()[0] for line in lines) == [f"[{i}/2]" for i in range(1, 3)], out.stdout
    assert all(" done " in line for line in lines), out.stdout

    cl = _client(server.uri)
    parent, runs = _sweep(cl, "cluster")
    assert parent.info.status == "FINISHED" and len(runs) == 2
    assert {r.info.status for r in runs} == {"FINISHED"}
    arrays = {r.data.tags["slurm_array_job_id"] for r in runs}
    assert len(arrays) == 1  # one job array
    assert sorted(r.data.tags["slurm_array_task_id"] for r in runs) == ["0", "1"]
    for r in runs:
        assert r.data.tags["slurm_job_id"].isdigit() and r.data.tags["slurm_node"]
        assert (
            r.data.tags["plnexp.slurm_job"]
            == f"{r.data.tags['slurm_array_job_id']}_{r.data.tags['slurm_array_task_id']}"
        )
        assert r.info.artifact_uri.startswith("mlflow-artifacts:")  # uploaded through the server

    folder = Path(env["PLNEXP_OUTPUTS"]) / "report"
    report = plnexp_main("report", "--run", parent.info.run_id, "--out", str(folder))  # here: no process needed
    assert report.returncode == 0, report.stderr[-2000:]
    table = (folder / "report.csv").read_text()
    for r in runs:
        assert r.info.run_id in table
    # a run a SLURM task made reruns here (this node's CPU) from its logged spec, bit for bit
    again = plnexp_main("rerun", runs[0].info.run_id)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "ELBO curves: identical, bit for bit (30 iterations)" in again.stdout
    assert "report/report.md" in {a.path for a in cl.list_artifacts(parent.info.run_id, "report")}  # via the server
    print(f"SLURM sweep of 2 jobs into the server: {took:.1f} s")


def _wait_running(cl, experiment: str, n: int, proc, limit_s: float = 180):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        exp = cl.get_experiment_by_name(experiment)
        if exp is not None:
            runs = [
                r
                for r in cl.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'")
                if "mlflow.parentRunId" in r.data.tags
            ]
            if len(runs) >= n:
                return runs
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    raise AssertionError(f"{n} running job(s) not seen in {limit_s} s")


def test_a_group_is_one_slurm_job_timed_in_rounds_on_its_node(env, server):
    """With rounds on, the jobs that differ only by strategy run as one SLURM task, one after the
    other, and are timed in interleaved rounds there (every ratio on one node, in one process); the
    driver logs the verdicts: each run's tags and the parent's verdict.json."""
    out = plnexp(
        "sweep",
        *[a for a in SWEEP if a != "report.rounds=0"],
        "strategy=scan,fori_loop",
        "n_iter=10",
        "report.rounds_budget_s=2",
        "experiment=cluster-group",
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "submitted 1 job(s) to slurm" in out.stdout, out.stdout
    lines = [line for line in out.stdout.splitlines() if line.startswith("[")]
    assert sorted(line.split()[0] for line in lines if not line.startswith("[rounds]")) == ["[1/2]", "[2/2]"]
    (rounds,) = [line for line in lines if line.startswith("[rounds]")]
    cl = _client(server.uri)
    parent, runs = _sweep(cl, "cluster-group")
    assert parent.info.status == "FINISHED" and len(runs) == 2
    assert len({r.data.tags["plnexp.slurm_job"] for r in runs}) == 1  # one SLURM task ran both
    node = runs[0].data.tags["slurm_node"]
    assert rounds.endswith(f" on {node}") and " rounds" in rounds
    for r in runs:
        assert r.data.tags["plnexp.reference"] == "scan" and r.data.tags["plnexp.verdict"]
        assert r.data.metrics["rounds_used"] >= 6
    import json

    path = cl.download_artifacts(parent.info.run_id, "verdict.json")
    groups = json.loads(Path(path).read_text())["groups"]
    assert len(groups) == 1 and {s["strategy"] for s in groups[0]["strategies"]} == {"scan", "fori_loop"}


def test_scancel_mid_fit_ends_the_runs_and_resume_completes_the_grid(env, server, tmp_path):
    """Two jobs of the test strategy ``blocking``, each waiting inside its fit (no CPU burnt): one
    cancelled (``scancel``: SIGTERM, the job records its run KILLED with the SLURM reason), one whose
    process is killed outright (SIGKILL, as the kernel's OOM killer or a crash would: nothing in the
    job can react; the run is marked FAILED with ``reason=slurm job <id> <state>`` once the scheduler
    says the job ended). The sweep ends with exit 1; ``resume=true``, the jobs released, runs those two
    jobs again and completes the grid."""
    release = tmp_path / "release"
    env = plugin_env(PLNEXP_TEST_RELEASE=str(release))  # the fixture's environment, the test plugins importable
    grid = ("strategy=scan", "strategy.name=blocking", "seed=0,1", "n_iter=20", "experiment=cancel")
    cmd = [sys.executable, "-m", "plnexp", "sweep", *SWEEP, *grid]
    proc = spawn(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1])
    cl = _client(server.uri)
    running = _wait_running(cl, "cancel", 2, proc)
    t0 = time.monotonic()
    while len(waiting(release)) < 2:  # both jobs inside their fit
        assert proc.poll() is None and time.monotonic() - t0 < 120, proc.communicate()
        time.sleep(0.2)
    jobs = {r.data.tags["plnexp.slurm_job"]: r for r in running}
    term, kill = sorted(jobs)
    subprocess.run(["scancel", term], env=env, check=True)
    os.kill(int(jobs[kill].data.tags["plnexp.pid"]), signal.SIGKILL)  # a crash: one node, the run's PID
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr[-3000:]
    ended = {j: cl.get_run(r.info.run_id) for j, r in jobs.items()}
    assert ended[term].info.status == "KILLED", ended[term].data.tags
    assert f"slurm job {term}" in ended[term].data.tags["status_reason"]
    assert ended[kill].info.status == "FAILED", ended[kill].data.tags
    assert ended[kill].data.tags["reason"].startswith(f"slurm job {kill} "), ended[kill].data.tags
    assert f"slurm job {kill}" in stdout, stdout

    release.touch()  # the jobs run through from here on
    again = plnexp("sweep", *SWEEP, *grid, "resume=true", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    parent, runs = _sweep(cl, "cancel")
    assert parent.info.status == "FINISHED"
    assert sorted(r.data.tags["mlflow.runName"] for r in runs if r.info.status == "FINISHED") == sorted(
        r.data.tags["mlflow.runName"] for r in ended.values()
    )


def _write(uri: str, exp: str, i: int, n: int) -> None:
    """One writer: a run with an n-point curve (in batches), a param and an artifact, through a
    client of its own (as each sweep job has)."""
    from mlflow.entities import Metric, Param

    from plnexp import store as tracking

    cl = tracking.client(uri)
    rid = cl.create_run(cl.get_experiment_by_name(exp).experiment_id, run_name=f"writer{i}").info.run_id
    for k in range(0, n, 250):
        cl.log_batch(rid, metrics=[Metric("elbo", float(-j), 0, j) for j in range(k, min(n, k + 250))])
    cl.log_batch(rid, params=[Param("writer", str(i))])
    cl.log_text(rid, f"writer {i}", "writer.txt")
    cl.set_terminated(rid, "FINISHED")


def test_eight_concurrent_writers_lose_nothing(server, tmp_path):
    """Eight writers into the server at once (each: a 1000-point curve, a param, an artifact): every
    run, point and artifact is there. Threads of this process, each with its own client: the server
    sees eight concurrent clients as it would eight jobs (eight interpreters importing MLflow cost
    ~20 s of CPU and checked nothing more)."""
    from concurrent.futures import ThreadPoolExecutor

    _need_extra()
    cl = _client(server.uri)
    cl.create_experiment("writers")
    n = 1000
    with ThreadPoolExecutor(8) as pool:
        for done in [pool.submit(_write, server.uri, "writers", i, n) for i in range(8)]:
            done.result(timeout=180)
    exp = cl.get_experiment_by_name("writers")
    runs = cl.search_runs([exp.experiment_id])
    assert sorted(r.data.params["writer"] for r in runs) == [str(i) for i in range(8)]
    for r in runs:
        assert r.info.status == "FINISHED"
        history = cl.get_metric_history(r.info.run_id, "elbo")
        assert sorted(m.step for m in history) == list(range(n))
        assert (
            cl.download_artifacts(r.info.run_id, "writer.txt", str(tmp_path))
            and (tmp_path / "writer.txt").read_text() == f"writer {r.data.params['writer']}"
        )


def test_doctor_checks_the_postgres_backed_server(server):
    """``doctor`` against the team's server: reachable, a run written and deleted, an artifact
    uploaded through the server and read back."""
    from plnexp.cli import doctor

    found = {c.name: c for c in doctor.store(server.uri)}
    assert [found[k].ok for k in ("store_reachable", "store_writable", "store_artifacts")] == [True] * 3, found
    assert "through the server" in found["store_artifacts"].detail


def test_doctor_sees_the_cluster(cluster, monkeypatch):
    from plnexp.cli import doctor

    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    [check] = doctor.slurm()
    assert check.ok is True and "partitions: debug" in check.detail, check


def test_two_slurm_tasks_fit_the_curve_of_one_process_and_log_one_run(env, server, plnexp_main, tmp_path):
    """Issue #51, launched as HPC users do, both ways: ``srun -n 2 python -m plnexp run
    strategy=scan_sharded processes=2`` (the full model), and a sweep of ``processes=2`` under the
    SLURM launcher, which submits the job as one SLURM job of 2 tasks (PLN-PCA). Either way both tasks
    join one JAX job (``jax.distributed.initialize()`` reading SLURM's environment) and task 0's
    process logs the one run; its float64 ELBO curve equals one process's to 1e-10 relative. (Each
    model across local processes, and each launch path's model-independence: tests/test_processes.py.)"""
    from test_processes import FIT, MODELS, _curve

    cl = _client(server.uri)
    for model in ("full", "pca"):  # PLN-PCA's default fit (Newton), its counts dense
        fit = [*FIT, *MODELS[model], "dataset.optimum=false"]
        one = plnexp_main("run", *fit, f"experiment=srun1-{model}", cwd=tmp_path)
        assert one.returncode == 0, one.stderr
        if model == "full":
            cmd = ["srun", "-n", "2", "--cpus-per-task=1", "--partition=debug", sys.executable, "-m", "plnexp"]
            cmd += ["run", *fit, "processes=2", f"experiment=srun2-{model}"]
        else:
            cmd = [sys.executable, "-m", "plnexp", "sweep", "sweep=null", *SWEEP, *fit, "processes=2"]  # run's config
            cmd.append(f"experiment=srun2-{model}")
        two = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
        assert two.returncode == 0, two.stderr[-3000:]
        (run1,) = cl.search_runs([cl.get_experiment_by_name(f"srun1-{model}").experiment_id])
        runs = cl.search_runs([cl.get_experiment_by_name(f"srun2-{model}").experiment_id])
        (run2,) = [r for r in runs if r.data.params.get("processes") == "2"]  # task 0's (a sweep's: the child)
        assert run2.info.status == "FINISHED"
        assert all(run2.data.metrics[f"peak_rss_mb_process_{i}"] > 0 for i in (0, 1))
        if model != "full":  # the sweep's job: one SLURM job of two tasks, on the node
            assert re.search(r"submitted 1 job\(s\) to slurm as job \d+ of 2 tasks", two.stdout), two.stdout
            assert run2.data.tags["plnexp.slurm_job"] and len(runs) == 2, [r.data.tags for r in runs]
        c1, c2 = _curve(cl, run1), _curve(cl, run2)
        assert len(c1) == len(c2) == 20
        np.testing.assert_allclose(c2, c1, rtol=1e-10, atol=0)


def _task_pid(job: str, task: int) -> int | None:
    """The pid of task ``task`` of SLURM job ``job`` on this (the only) node: the Python process whose
    environment says so (submitit's ``_submit``, started by the job's srun)."""
    want = {f"SLURM_JOB_ID={job}".encode(), f"SLURM_PROCID={task}".encode()}
    for entry in Path("/proc").iterdir():
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if want <= environ and b"submitit" in cmdline:
            return int(entry.name)
    return None


def test_a_task_killed_mid_fit_fails_its_job_in_one_line_and_resume_finishes_it(env, server):
    """Issue #51: one of the two tasks of a job of ``processes=2`` (one SLURM job of two tasks)
    killed with SIGKILL mid-fit, as the OOM killer or a crash would: the sweep ends with exit 1 and
    one line naming the job, nothing is left RUNNING, and ``resume=true`` runs the job again."""
    from test_processes import SMALL

    grid = ["strategy=scan_sharded", "precision=float64", "n_iter=600", *SMALL, "processes=2"]
    grid += ["dataset.optimum=false", "experiment=killed-task"]
    cmd = [sys.executable, "-m", "plnexp", "sweep", *SWEEP, *grid]
    proc = spawn(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1])
    cl = _client(server.uri)
    (run,) = _wait_running(cl, "killed-task", 1, proc)  # task 0's run: both tasks have joined
    job = run.data.tags["plnexp.slurm_job"]
    t0 = time.monotonic()
    while (victim := _task_pid(job, 1)) is None:
        assert proc.poll() is None and time.monotonic() - t0 < 60, proc.communicate()
        time.sleep(0.1)
    os.kill(victim, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 1, (stdout[-3000:], stderr[-3000:])
    (line,) = [line for line in stdout.splitlines() if line.startswith("[1/1] ")]
    assert re.search(rf": slurm job {job} FAILED: no result \(task 1 of 2 on \S+: Killed\)$", line), stdout
    ended = cl.get_run(run.info.run_id)  # task 0, ended by SLURM (--kill-on-bad-exit) or by its failed collective
    assert ended.info.status in ("KILLED", "FAILED"), ended.data.tags
    everything = cl.search_runs([e.experiment_id for e in cl.search_experiments()])
    assert not [r for r in everything if r.info.status == "RUNNING"]

    again = plnexp("sweep", *SWEEP, *grid, "resume=true", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    parent, runs = _sweep(cl, "killed-task")  # the resumed sweep's
    assert parent.info.status == "FINISHED"
    (done,) = runs
    assert done.data.metrics["n_iter_run"] == 600 and done.data.params["processes"] == "2"
