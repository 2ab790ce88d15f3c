"""Sweeps that survive: real ``python -m plnexp`` subprocesses with a parallel launcher, interrupted
(SIGINT, SIGTERM), killed (SIGKILL, then the orphan sweep-up), and two at once into one store.

A job that must be inside its fit when the signal comes runs the test strategy ``blocking``
(tests/plugins/plnexp_test_strategies.py): it waits inside its fit, without burning CPU, until the test
releases it, and says so (``waiting(release)``), so the test signals it exactly then. Processes are
started through :func:`conftest.spawn` (ended at teardown, pass or fail); a command that only follows
the process under test runs in this one (``plnexp_main``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import plnexp_cli, plugin_env, spawn, store_client, waiting

DATA = ["dataset=synthetic", "dataset.n=30", "dataset.p=5"]
TINY = [*DATA, "strategy=scan"]
BLOCKING = "blocking"  # the test strategy's name: its runs are named blocking-...


def runs_of(outputs, experiment):
    cl = store_client(outputs)
    exp = cl.get_experiment_by_name(experiment)
    return [] if exp is None else cl.search_runs([exp.experiment_id])


def split(runs):
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children


def start(*args, cwd, new_session: bool = True) -> subprocess.Popen:
    """``python -m plnexp ARGS`` started through :func:`conftest.spawn` (ended when the test ends), in a
    session of its own (``os.killpg(proc.pid, ...)`` reaches it and its workers), with the test plugins
    importable (the ``blocking`` strategy) and the test's environment (``$PLNEXP_TEST_RELEASE``)."""
    return spawn(
        [sys.executable, "-m", "plnexp", *args],
        cwd=cwd,
        env=plugin_env(),
        new_session=new_session,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(predicate, proc: subprocess.Popen, what: str, limit_s: float = 240, poll_s: float = 0.05):
    """Poll until ``predicate()`` is true (the subprocess must still be running); returns its value."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            out, err = proc.communicate(timeout=30)
            pytest.fail(f"the command ended (rc {proc.returncode}) before {what}:\n{out}\n{err}")
        time.sleep(poll_s)
    pytest.fail(f"no {what} within {limit_s} s")


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has: it only waits to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def cpu_s(pid: int) -> float:
    """CPU time (user + system, all threads) ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
def test_joblib_four_jobs_in_two_workers_lose_nothing_and_are_judged_in_rounds_in_the_driver(outputs, tmp_path):
    """Four jobs in two joblib worker processes (each reused), all writing to one store at once, with
    the sweep's report. The two workers time their jobs at the same time on this host, so the jobs' own
    timings are contended (the report's notes say so); the verdicts do not rest on them: after the
    grid, the driver times each group (a seed's two strategies) in interleaved rounds, in one process.
    Each job times thirty runs of 100 iterations of 1000 x 10 (``repeats=30``, no time budget): its timed
    window is a number of runs, so it stretches with the machine's load as the workers' start-up does,
    and the jobs that run side by side overlap; the runs are short, so the driver's rounds (each
    program once per round) stay short. (One sweep for both checks: each joblib sweep starts three
    interpreters.)"""
    proc = plnexp_cli(
        "sweep",
        "sweep=null",
        "dataset=synthetic",
        "dataset.n=1000",
        "dataset.p=10",
        "strategy=scan,fori_loop",
        "seed=0,1",
        "n_iter=100",
        "repeats=30",
        "time_budget_s=0",
        "dataset.optimum=false",  # no convergence metrics: each worker would fit its seed's optimum first
        "experiment=par",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "report.rounds_budget_s=1",  # the fewest rounds a verdict rests on: the rounds are not the point
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "4 of 4 jobs finished" in proc.stdout, proc.stdout
    # seed=K is also the synthetic data's seed: a comparison group per seed, each timed in rounds
    for k in (0, 1):
        assert f"[rounds] 2 programs of synthetic_n1000_p10_d2_s{k} ... ready in" in proc.stdout, proc.stdout
        # the plain headline, its group named by what tells the groups apart (the seed)
        assert f"synthetic_n1000_p10_d2_s{k} (1000×10), float32, cpu, seed={k}: " in proc.stdout
    # one headline per group, whatever its verdict (on a busy machine some rounds may be dropped as noise)
    assert len(re.findall(r" rounds(?:, \d+ dropped)?, minimum effect 1\.10×\)", proc.stdout)) == 2, proc.stdout
    assert "do not compare" not in proc.stdout
    (parent,), children = split(runs_of(outputs, "par"))
    md = next((outputs / "reports" / "par").iterdir()) / "report.md"
    assert "timed runs overlapped with" in md.read_text()  # the jobs' own timings: contended, noted
    assert parent.info.status == "FINISHED"
    assert len(children) == 4 and {r.info.status for r in children} == {"FINISHED"}
    assert all(
        r.data.tags["plnexp.verdict"] in ("reference", "faster", "tied", "slower", "unresolved") for r in children
    )
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert sorted((r.data.params["strategy.name"], r.data.params["seed"]) for r in children) == [
        ("fori_loop", "0"),
        ("fori_loop", "1"),
        ("scan", "0"),
        ("scan", "1"),
    ]
    worker_pids = {r.data.tags["plnexp.pid"] for r in children}
    assert parent.data.tags["plnexp.pid"] not in worker_pids, "the jobs ran in worker processes"
    assert len(worker_pids) <= 2, "two worker processes, each reused"
    cl = store_client(outputs)
    for r in children:  # no lost metric
        for key in ("final_elbo", "n_iter_run", "compile_s", "run_s", "wall_s"):
            assert key in r.data.metrics, (r.info.run_name, key)
        assert sorted(m.step for m in cl.get_metric_history(r.info.run_id, "elbo")) == list(range(100))
    assert parent.data.tags["n_done"] == "4" and parent.data.tags["n_failed"] == "0"
    windows = sorted((r.data.metrics["timed_start"], r.data.metrics["timed_end"]) for r in children)
    assert any(b[0] < a[1] for a, b in zip(windows, windows[1:])), "two jobs' timed runs overlapped"
    assert len({r.data.tags["host"] for r in children}) == 1


def check_interrupted(proc: subprocess.Popen, signum: int, counts: str, outputs: Path, experiment: str) -> None:
    """What a sweep under the basic launcher interrupted by ``signum`` while a ``blocking`` job was inside
    its fit says and leaves (in ``outputs``' store, under ``experiment``): its exit code, one line of
    counts (``counts``), the summary table of what finished; its parent and the blocked job's run KILLED
    (interrupted), the fit's result not logged."""
    out, err = proc.communicate(timeout=120)
    code = {signal.SIGINT: 130, signal.SIGTERM: 143}[signum]
    assert proc.returncode == code, err
    assert "Traceback" not in out + err
    name = signal.Signals(signum).name
    # one line says it (beside the info lines of a data set's best known ELBO, computed once per session)
    (line,) = [line for line in err.strip().splitlines() if not line.startswith("plnexp: info: ")]
    assert line.startswith(f"plnexp: interrupted by {name}: {counts}"), err
    (parent,), children = split(runs_of(outputs, experiment))
    assert parent.info.status == "KILLED" and parent.data.tags["reason"] == "interrupted"
    killed = [r for r in children if r.info.status == "KILLED"]
    assert len(killed) == 1
    assert BLOCKING in killed[0].info.run_name and killed[0].data.tags["status_reason"] == f"interrupted by {name}"
    assert "final_elbo" not in killed[0].data.metrics  # the fit had not returned: no result
    assert "scan" in out and "KILLED" in out  # the summary table of what finished


@pytest.mark.slow
def test_interrupt_mid_sweep(outputs, tmp_path, release):
    """SIGTERM (``kill``'s default) of a sweep of three jobs in a row: scan finishes, blocking is inside its
    fit when the signal lands, fori_loop never starts. (SIGINT, in the same state: the interrupted sweep
    of test_rerun.py::test_resume_an_interrupted_sweep_subprocess.)"""
    grid = f"strategy.name=scan,{BLOCKING},fori_loop"
    proc = start("run", "--multirun", *DATA, grid, "n_iter=20", "experiment=intr", cwd=tmp_path)
    (pid,) = wait_for(lambda: waiting(release), proc, "the blocking job inside its fit")
    assert pid == proc.pid  # the basic launcher: the jobs run in the sweep's process
    proc.send_signal(signal.SIGTERM)
    check_interrupted(proc, signal.SIGTERM, "1 of 3 jobs finished, 1 killed, 0 failed, 1 not started", outputs, "intr")
    _, children = split(runs_of(outputs, "intr"))
    status = {r.info.run_name.split("-")[0]: r.info.status for r in children}
    assert status == {"scan": "FINISHED", BLOCKING: "KILLED"}, status


@pytest.mark.slow
def test_ctrl_c_reaches_joblib_workers_and_nothing_stays_running(outputs, tmp_path, release):
    proc = start(
        "run",
        "--multirun",
        *DATA,
        f"strategy.name={BLOCKING}",
        "n_iter=20",
        "seed=0,1,2,3",
        "experiment=pintr",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        cwd=tmp_path,
        new_session=True,
    )
    workers = wait_for(lambda: len(waiting(release)) == 2 and waiting(release), proc, "two jobs inside their fits")
    assert proc.pid not in workers  # the jobs run in joblib's worker processes
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in out + err
    assert err.strip().splitlines() == [err.strip().splitlines()[-1]], err  # one line: the summary's
    assert "plnexp: interrupted by SIGINT: 0 of 4 jobs finished, 2 killed" in err
    (parent,), children = split(runs_of(outputs, "pintr"))
    assert parent.info.status == "KILLED"
    assert len(children) == 2 and {r.info.status for r in children} == {"KILLED"}
    assert {r.data.tags["plnexp.pid"] for r in children} == {str(w) for w in workers}
    deadline = time.monotonic() + 60  # the workers end with the command (loky shuts them down)
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [w for w in workers if alive(w)], "joblib workers left running after the command ended"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigkill_of_a_joblib_sweep_leaves_no_worker_running(outputs, tmp_path, release):
    """Issue #48: SIGKILL of the driver (no handler runs, loky cannot shut its pool down) while both
    workers are inside their fits; each worker sees its driver gone and exits within 30 s."""
    proc = start(
        "run",
        "--multirun",
        *DATA,
        f"strategy.name={BLOCKING}",
        "n_iter=20",
        "seed=0,1,2,3",
        "experiment=pkill",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        cwd=tmp_path,
    )
    workers: list[int] = []
    try:
        workers = wait_for(lambda: len(waiting(release)) == 2 and waiting(release), proc, "two jobs inside their fits")
        assert proc.pid not in workers  # the jobs run in joblib's worker processes
        proc.kill()
        proc.wait()
        killed = time.monotonic()
        while any(alive(w) for w in workers) and time.monotonic() - killed < 30:
            time.sleep(0.05)
        assert not [w for w in workers if alive(w)], "joblib workers still running 30 s after their driver's SIGKILL"
        print(f"last worker gone {time.monotonic() - killed:.2f} s after the driver's SIGKILL")
        # each worker closed its own run on its way out (the parent, the driver's: the next command's sweep-up)
        _, children = split(runs_of(outputs, "pkill"))
        assert len(children) == 2 and {r.info.status for r in children} == {"FAILED"}
        assert {r.data.tags["reason"] for r in children} == {"orphaned"}
    finally:
        for w in workers:
            if alive(w):
                try:
                    os.kill(w, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.mark.slow
def test_sigkill_then_the_next_command_marks_orphans_failed(outputs, tmp_path, release, plnexp_main):
    proc = start(
        "run", "--multirun", *DATA, f"strategy.name=scan,{BLOCKING}", "n_iter=20", "experiment=orph", cwd=tmp_path
    )
    wait_for(lambda: waiting(release), proc, "the blocking job inside its fit")
    proc.kill()
    proc.wait()
    (parent,), children = split(runs_of(outputs, "orph"))
    assert parent.info.status == "RUNNING" and "RUNNING" in {r.info.status for r in children}
    assert parent.data.tags["plnexp.pid"] == str(proc.pid)
    # the next command, whichever it is (here one in this process), sweeps the orphans up first
    nxt = plnexp_main("run", *TINY, "n_iter=3", "experiment=next", cwd=tmp_path)
    assert nxt.returncode == 0, nxt.stderr
    assert f"2 run(s) left RUNNING by process(es) {proc.pid} on this host" in nxt.stderr
    assert "marked FAILED (reason=orphaned)" in nxt.stderr
    (parent,), children = split(runs_of(outputs, "orph"))
    assert parent.info.status == "FAILED" and parent.data.tags["reason"] == "orphaned"
    by = {r.info.run_name.split("-")[0]: r for r in children}
    assert by["scan"].info.status == "FINISHED"
    assert by[BLOCKING].info.status == "FAILED" and by[BLOCKING].data.tags["reason"] == "orphaned"
    assert [r.info.status for r in runs_of(outputs, "next")] == ["FINISHED"]


@pytest.mark.slow
def test_two_sweeps_at_once_into_one_new_store(tmp_path, monkeypatch):
    out = tmp_path / "fresh"  # no store yet: both processes want to create it
    monkeypatch.setenv("PLNEXP_OUTPUTS", str(out))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    procs = [
        start(
            "run",
            "--multirun",
            *DATA,
            "strategy=scan,fori_loop",
            "n_iter=5",
            "experiment=both",
            "report.rounds_budget_s=1",  # the fewest rounds a verdict rests on
            cwd=tmp_path,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=600) for p in procs]
    for p, (_, e) in zip(procs, results):
        assert p.returncode == 0, e
    parents, children = split(runs_of(out, "both"))
    assert len(parents) == 2 and {r.info.status for r in parents} == {"FINISHED"}
    # each sweep: its two jobs, judged in its own interleaved rounds (its runs' verdicts, its verdict.json)
    assert len(children) == 4 and {r.info.status for r in children} == {"FINISHED"}
    for parent in parents:
        mine = [r for r in children if r.data.tags["mlflow.parentRunId"] == parent.info.run_id]
        assert sorted((r.data.params["strategy.name"], r.data.tags["plnexp.verdict"] == "reference") for r in mine) == [
            ("fori_loop", False),
            ("scan", True),
        ]
        assert {r.data.tags["plnexp.pid"] for r in mine} == {parent.data.tags["plnexp.pid"]}


@pytest.mark.slow
@pytest.mark.own_compile_cache  # its jax_cache is empty until this fit is compiled
def test_ctrl_c_during_a_long_compiled_fit(outputs, tmp_path):
    """A scan fit is one long XLA call (here about an hour of work). Ctrl-C still ends the command in
    seconds: jaxlib checks for signals while it waits, the process exits without waiting for XLA,
    and where a call does not check (then plnexp says so) a second Ctrl-C stops it at once."""
    proc = start("run", "dataset.replication=10", "strategy=scan", "n_iter=1000000", "experiment=stuck", cwd=tmp_path)
    # a run's compiled fit goes to its compile cache (this test's own, empty until then) as soon as it
    # is compiled; the timed call comes next (a few Python lines), and the process computes inside it
    compiled = wait_for(lambda: list((outputs / "jax_cache").glob("jit_fit-*")), proc, "the fit compiled")
    then = cpu_s(proc.pid)
    wait_for(lambda: cpu_s(proc.pid) > then + 1.0, proc, f"a second of CPU inside the compiled fit ({compiled})")
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert "stops when it returns" in err and "again: stopping now" in err
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    (run,) = runs_of(outputs, "stuck")
    assert run.info.status == "KILLED" and run.data.tags["reason"] == "interrupted"
    assert f"the run {run.info.run_id} was recorded KILLED" in err, err
