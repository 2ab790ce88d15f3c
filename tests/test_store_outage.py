"""Issue #48, end to end: the store dies mid-sweep (a tracking server killed, PostgreSQL stopped, the
disk full). The sweep ends within a bounded time (``store_timeout_s`` per call, a few calls), shows
its summary, exits non-zero without a traceback, and keeps every finished fit in ``pending/``;
once the store is back, ``plnexp sync`` records each kept result and leaves no run RUNNING (the
parent included: the sweep's process is gone, so its runs are orphans the sync's sweep-up ends).

Each sweep is three tiny jobs in a row (Hydra's basic launcher: the jobs run in the sweep's
process): scan, then the test strategy ``blocking`` (tests/plugins), which waits inside its fit
until the test releases it, then fori_loop. The store fails while job 2 is blocked: its fit then
finishes against a dead store, and job 3 starts against one.

When the disk fills, the store and ``pending/`` share it: job 2's result cannot be kept either, and
one line says what was lost (plnexp.store.pending.ResultLost).

Real daemons on 127.0.0.1 (tests/daemons.py), stopped by their PID, and a tmpfs mounted for the
disk; a test skips saying why where it cannot start one or mount it. The bounds are generous (a shared, noisy machine): what they catch is minutes
of retries, not seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import daemons
from conftest import plugin_env, spawn, waiting

# dataset.optimum=false: no best known ELBO, which the sweep would fit first (not the point here)
DATA = [
    "dataset=synthetic",
    "dataset.n=30",
    "dataset.p=5",
    "n_iter=20",
    "report.control=false",
    "dataset.optimum=false",
]
GRID = "strategy.name=scan,blocking,fori_loop"
TIMEOUT_S = 6  # the sweeps' store_timeout_s: each store call bounded by it
# the sweep's end after the store failed: a few store calls (the kept write, job 3's run, the close),
# each bounded by TIMEOUT_S, and the processes' own work; minutes of retries fail it
ENDS_WITHIN_S = 30 * TIMEOUT_S


def start_sweep(uri: str, experiment: str, cwd: Path, *extra: str) -> subprocess.Popen:
    """``python -m plnexp run --multirun`` of the three jobs into ``uri``, in a session of its own,
    ended by its pid when the test ends (:func:`conftest.spawn`)."""
    return spawn(
        [
            sys.executable,
            "-m",
            "plnexp",
            "run",
            "--multirun",
            *DATA,
            GRID,
            f"experiment={experiment}",
            f"tracking_uri={uri}",
            f"store_timeout_s={TIMEOUT_S}",
            *extra,
        ],
        cwd=cwd,
        env=plugin_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def blocked(release: Path, proc: subprocess.Popen, limit_s: float = 300) -> None:
    """Wait until job 2 (``blocking``) is inside its fit: job 1's run is written by then."""
    deadline = time.monotonic() + limit_s
    while not waiting(release):
        if proc.poll() is not None:
            out, err = proc.communicate(timeout=30)
            pytest.fail(f"the sweep ended (rc {proc.returncode}) before job 2 was inside its fit:\n{out}\n{err}")
        if time.monotonic() > deadline:
            pytest.fail(f"job 2 not inside its fit within {limit_s} s")
        time.sleep(0.05)


def finish(proc: subprocess.Popen, release: Path) -> tuple[str, str, float]:
    """Release job 2 and wait for the sweep's end; (stdout, stderr, seconds it took)."""
    release.touch()
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=ENDS_WITHIN_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the sweep did not end within {ENDS_WITHIN_S} s of the store's failure")
    return out, err, time.monotonic() - t0


def kept(outputs: Path) -> list[dict]:
    """The results kept in ``<outputs>/pending`` (plnexp.store.pending)."""
    return [json.loads(p.read_text()) for p in sorted((outputs / "pending").glob("*.json"))]


def check_failed_sweep(out: str, err: str, code: int, outputs: Path) -> list[dict]:
    """What every outage must give: exit non-zero, no traceback, the summary shown (job 1 done,
    the parent left RUNNING, said), job 2's finished fit kept; returns the kept results."""
    assert code not in (0, None), (out, err)
    assert "Traceback" not in out + err, err
    assert "scan" in out and "parent run" in out and "RUNNING" in out, out  # the summary table and footer
    assert "plnexp: store error:" in err, err
    results = kept(outputs)
    assert [r["status"] for r in results] == ["FINISHED"], (results, err)
    assert results[0]["tags"]["device"], results[0]["tags"]  # a fit's result, whole
    assert "pending: kept locally" in out or "kept in" in err, (out, err)
    return results


def check_synced(uri: str, experiment: str, results: list[dict], plnexp_main, outputs: Path) -> None:
    """``plnexp sync`` with the store back: every kept result recorded, nothing kept, no run RUNNING."""
    from mlflow import MlflowClient

    ran = plnexp_main("sync", f"tracking_uri={uri}")
    assert ran.returncode == 0, ran.stderr
    assert "Traceback" not in ran.stdout + ran.stderr
    assert kept(outputs) == []
    cl = MlflowClient(tracking_uri=uri)
    exp = cl.get_experiment_by_name(experiment)
    runs = {r.info.run_id: r for r in cl.search_runs([exp.experiment_id])}
    for r in results:
        run = runs[r["run_id"]]
        assert run.info.status == "FINISHED" and run.data.params["strategy.name"] == "blocking"
        assert "final_elbo" in run.data.metrics
    assert [r.info.run_name for r in runs.values() if r.info.status == "RUNNING"] == []
    parents = [r for r in runs.values() if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FAILED", [p.info for p in parents]


# ---------------------------------------------------------------- a tracking server killed
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tracking_server_killed_mid_sweep(outputs, tmp_path, release, plnexp_main):
    folder = tmp_path / "server"
    backend = f"sqlite:///{folder / 'mlflow.db'}"
    try:
        with daemons.mlflow_server(backend, folder, workers=1) as server:
            port = int(server.uri.rsplit(":", 1)[1])
            proc = start_sweep(server.uri, "outage", tmp_path)
            blocked(release, proc)
            daemons.kill(server.pid)  # SIGKILL, its workers too
            out, err, took = finish(proc, release)
    except daemons.Unavailable as e:
        pytest.skip(f"no MLflow server here: {e}")
    results = check_failed_sweep(out, err, proc.returncode, outputs)
    with daemons.mlflow_server(backend, folder, workers=1, port=port) as server:
        check_synced(server.uri, "outage", results, plnexp_main, outputs)


# ---------------------------------------------------------------- PostgreSQL stopped
@pytest.fixture
def database():
    """A PostgreSQL 15 server of this test's (tests/daemons.py), stopped by its PID at the end."""
    with daemons.postgres_or_skip() as db:
        yield db


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.xdist_group("cluster")
@pytest.mark.timeout(900)
@pytest.mark.parametrize("through", ["direct", "server"])
def test_postgres_stopped_mid_sweep(outputs, tmp_path, release, plnexp_main, through, monkeypatch, request):
    """PostgreSQL stopped at once (``pg_ctl stop -m immediate``) while job 2 fits: the sweep's store
    is the database itself (``postgresql://``, MLflow's SQLAlchemy store in the sweep's process), or
    an MLflow server backed by it (the server stays up, its database gone: the session's server of the
    cluster group, conftest's ``pg_server``, its database started again whatever happens)."""
    if through == "server":
        shared = request.getfixturevalue("pg_server")
        database, uri = shared.db, shared.server.uri
    else:  # its password where libpq reads it, never on a command line (plnexp refuses that)
        from sqlalchemy.engine import make_url

        database = request.getfixturevalue("database")
        url = make_url(database.uri)
        monkeypatch.setenv("PGPASSWORD", str(url.password))
        uri = f"postgresql://{url.username}@{url.host}:{url.port}/{url.database}"
    proc = start_sweep(uri, "pgdown", tmp_path)
    blocked(release, proc)
    daemons.halt(database)
    try:
        out, err, took = finish(proc, release)
        results = check_failed_sweep(out, err, proc.returncode, outputs)
        assert len(err.splitlines()) < 20, err  # lines, not MLflow's pages of retries and tracebacks
    finally:
        daemons.restart(database)
    check_synced(uri, "pgdown", results, plnexp_main, outputs)


# ---------------------------------------------------------------- the disk fills
DISK = "16m"  # the tmpfs: the store (a migrated one: about 1 MB), job 1's run and artifacts, then filled


@pytest.fixture
def small_disk(tmp_path, migrated_store, compile_cache, monkeypatch):
    """The outputs folder (``PLNEXP_OUTPUTS``: the sqlite store, its artifacts, Hydra's folders,
    ``pending/``) on a tmpfs of its own (:data:`DISK`), unmounted at the end; skipped, saying why,
    where it cannot be mounted (not root, no tmpfs)."""
    import shutil

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        out = disk / "outputs"
        out.mkdir()
        shutil.copy(migrated_store, out / "mlflow.db")
        (out / "jax_cache").symlink_to(compile_cache, target_is_directory=True)  # the session's, elsewhere
        monkeypatch.setenv("PLNEXP_OUTPUTS", str(out))
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield out
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)  # a process of the test still in it


def fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to its last byte (a file of zeros); returns that file."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (1 << 20, 1 << 16, 4096, 512, 1):  # unbuffered: what is written is on the disk
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_disk_fills_mid_sweep(small_disk, tmp_path, release, plnexp_main):
    """The disk holding the outputs and the sqlite store fills while job 2 fits: its result cannot
    go to the store, nor (the same disk) to ``pending/``; the sweep says so in one line naming what
    was lost, closes without a traceback and exits non-zero; once space is freed, ``sync`` leaves
    no run RUNNING."""
    uri = f"sqlite:///{small_disk / 'mlflow.db'}"
    proc = start_sweep(uri, "full", tmp_path)
    blocked(release, proc)
    filler = fill(small_disk)
    out, err, took = finish(proc, release)
    assert proc.returncode not in (0, None), (out, err)
    assert "Traceback" not in out + err, err
    assert "scan" in out and "parent run" in out, out  # the summary
    results = kept(small_disk)
    lost = [line for line in err.splitlines() if "lost: the FINISHED result of run" in line]
    assert len(results) + len(lost) == 1, (results, err)  # job 2's fit: kept, or said lost in one line
    filler.unlink()
    ran = plnexp_main("sync", f"tracking_uri={uri}")
    assert ran.returncode == 0 and "Traceback" not in ran.stdout + ran.stderr, ran
    assert kept(small_disk) == []
    from mlflow import MlflowClient

    cl = MlflowClient(tracking_uri=uri)
    runs = cl.search_runs([cl.get_experiment_by_name("full").experiment_id])
    running = [(r.info.run_name, r.info.status) for r in runs if r.info.status == "RUNNING"]
    assert running == []
