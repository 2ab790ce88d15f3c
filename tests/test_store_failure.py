"""Issue #48: a store that fails mid-sweep neither hangs the sweep nor loses a result. Each store
call is bounded (store_timeout_s -> MLflow's HTTP timeout and retries; plnexp's own retries end by a
deadline), the sweep's close never raises (one line, the summary still shown), and a second signal
ends the process within seconds even while a store call hangs. Tested in-process with clients
whose calls raise or hang."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from plnexp import store as tracking
from plnexp.experiment import job_task, runner, sweep, sweep_record
from plnexp.jobs import config as C
from plnexp.store import backend
from plnexp.system import interrupts

HTTP_VARS = (backend.HTTP_TIMEOUT_VAR, backend.HTTP_RETRIES_VAR, backend.HTTP_BACKOFF_VAR)


@pytest.fixture
def http_env(monkeypatch):
    """MLflow's HTTP variables unset, and plnexp's record of those it set emptied (both restored)."""
    for key in HTTP_VARS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(backend, "_OURS", {})
    monkeypatch.setattr(backend, "_TIMEOUT_S", [backend.STORE_TIMEOUT_S])


def test_store_timeout_is_a_validated_top_level_key(outputs):
    from plnexp.experiment import plan as cli

    (job,) = cli.plan(["n_iter=5"], False, check_device=False)
    assert job.config.store_timeout_s == C.STORE_TIMEOUT_S
    assert "store_timeout_s" not in job.config.as_dict()  # not the fit's: no param, no change of its hash
    (job,) = cli.plan(["store_timeout_s=2"], False, check_device=False)
    assert job.config.store_timeout_s == 2.0 and job.name == cli.plan([], False, check_device=False)[0].name
    for bad in ("0", "-1", "soon", "true", "10000"):
        with pytest.raises(C.ConfigError, match=r"store_timeout_s=.*allowed values are numbers from 1 to 3600"):
            cli.plan([f"store_timeout_s={bad}"], False, check_device=False)


def test_set_timeout_bounds_mlflow_http_calls_unless_the_user_set_them(http_env, monkeypatch):
    backend.set_timeout(30)
    assert os.environ[backend.HTTP_TIMEOUT_VAR] == "10"  # a third per try: 3 tries in 30 s
    assert os.environ[backend.HTTP_RETRIES_VAR] == "2" and os.environ[backend.HTTP_BACKOFF_VAR] == "1"
    assert backend.store_timeout() == 30.0
    backend.set_timeout(2)  # plnexp's own values follow the config
    assert os.environ[backend.HTTP_TIMEOUT_VAR] == "1"
    monkeypatch.setenv(backend.HTTP_TIMEOUT_VAR, "77")  # the user's: kept
    backend.set_timeout(30)
    assert os.environ[backend.HTTP_TIMEOUT_VAR] == "77"
    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES

    assert MLFLOW_HTTP_REQUEST_MAX_RETRIES.get() == 2  # what MLflow's client reads at each call


def test_after_fit_retries_end_by_the_deadline(http_env, monkeypatch):
    """A store whose every call fails slowly (a server that hangs until MLflow's timeout) costs one
    store_timeout_s and a try or two, not every delay times every try."""
    backend.set_timeout(1)
    monkeypatch.setattr(backend, "AFTER_FIT_DELAYS_S", (0.2,) * 50)
    calls = []

    class Hanging:
        def log_batch(self, *a, **k):
            calls.append(time.monotonic())
            time.sleep(0.3)
            raise ConnectionError("the server does not answer")

    t0 = time.monotonic()
    with pytest.raises(ConnectionError):
        backend.after_fit(Hanging()).log_batch("run")
    assert time.monotonic() - t0 < 3.0 and 2 <= len(calls) <= 4


class _Down:
    """A client whose every call fails as a stopped tracking server makes it fail."""

    def __getattr__(self, name):
        def call(*a, **k):
            from mlflow.exceptions import MlflowException

            raise MlflowException("API request to http://127.0.0.1:1/api/2.0/mlflow/runs/search failed: refused")

        return call


def _record(uri="http://127.0.0.1:1") -> sweep_record.SweepRecord:
    return sweep_record.SweepRecord(uri, "1", "parent123", "s", 3, "elsewhere", 1, time.time() - 5)


def test_close_sweep_never_raises_when_the_store_fails(monkeypatch, capsys, outputs):
    monkeypatch.setattr(tracking, "client", lambda uri: _Down())
    monkeypatch.setattr("plnexp.store.running.client", lambda uri: _Down())
    monkeypatch.setattr("plnexp.store.queries.client", lambda uri: _Down())
    monkeypatch.setattr("plnexp.store.writes.client", lambda uri: _Down())
    record = _record()
    task = job_task.Task()  # what the driver's jobs saw, kept by the sweep's Task
    task._saw(record, 0, [runner.Row("job-a", "FINISHED", {"ms_per_iter": 1.0}, 1.5)])
    task._saw(record, 1, [runner.Row("job-b", "FAILED", {}, 0.0)])
    summary = sweep.close_sweep(record, "FINISHED", seen=task.seen)
    summary.show()
    out, err = capsys.readouterr()
    assert "job-a" in out and "job-b" in out and "parent run parent123 RUNNING" in out
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("plnexp: store error: ")
    assert "the parent run parent123 stays RUNNING until python -m plnexp sync" in lines[0]
    assert "Traceback" not in err and summary.status == "FAILED" and summary.n_failed >= 1


def test_close_sweep_when_only_closing_the_parent_fails(monkeypatch, capsys, outputs):
    monkeypatch.setattr(tracking, "end_children", lambda *a, **k: [])
    monkeypatch.setattr(sweep.resume, "rows", lambda *a, **k: [])

    def refuse(*a, **k):
        raise ConnectionError("the server went away")

    monkeypatch.setattr(tracking, "close_parent", refuse)
    summary = sweep.close_sweep(_record(), "KILLED", "interrupted by SIGINT")
    summary.show("SIGINT")
    err = capsys.readouterr().err
    assert "parent run parent123 left RUNNING" in err and "plnexp: store error: " in err
    assert "Traceback" not in err


def test_send_all_stops_at_the_first_failure_of_a_store_that_is_down(monkeypatch, outputs):
    folder = tracking.pending.folder()
    folder.mkdir(parents=True, exist_ok=True)
    uri = "http://127.0.0.1:1"
    for k in range(3):
        tracking.pending.keep(uri, f"run{k}", {"tags": {}, "status": "FINISHED"})
    tried = []

    def send(u, path):
        from mlflow.exceptions import MlflowException

        tried.append(path)
        raise MlflowException("API request failed: refused")

    monkeypatch.setattr(tracking.pending, "run_is_gone", lambda u, r: False)
    monkeypatch.setattr(tracking.pending, "send", send)
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException):
        tracking.pending.send_all(uri)
    assert len(tried) == 1 and len(tracking.pending.waiting(uri)) == 3  # every result still kept


def test_a_second_signal_ends_the_process_even_while_the_store_hangs(monkeypatch, capsys):
    """The force path's clean-up (force_stop: a store call) hangs: the process ends after FORCE_S."""
    exits: list[int] = []
    done = threading.Event()
    monkeypatch.setattr(interrupts, "GRACE_S", 0.01)
    monkeypatch.setattr(interrupts, "FORCE_S", 0.5)
    monkeypatch.setattr(interrupts.os, "_exit", lambda code: (exits.append(code), done.set()))
    guard = interrupts._Guard(lambda signum: time.sleep(60))  # a store that never answers
    guard.thread.start()
    t0 = time.monotonic()
    guard.write.send(bytes([signal.SIGINT, signal.SIGTERM]))
    assert done.wait(10)
    assert exits == [128 + signal.SIGTERM] and time.monotonic() - t0 < 3
    guard.write.close()
    guard.thread.join(timeout=5)
    guard.read.close()
    assert "the store did not answer within 0.5 s" in capsys.readouterr().err


def test_a_second_signal_during_the_clean_up_stops_now(monkeypatch, capsys):
    """The sweep's close is under way (guard.stopping()) and hangs on the store: the first signal is
    taken for the one that started it, the second ends the process without more store calls."""
    exits: list[int] = []
    forced: list[int] = []
    done = threading.Event()
    monkeypatch.setattr(interrupts, "GRACE_S", 0.01)
    monkeypatch.setattr(interrupts.os, "_exit", lambda code: (exits.append(code), done.set()))
    guard = interrupts._Guard(forced.append)
    guard.stopping()
    guard.thread.start()
    guard.write.send(bytes([signal.SIGINT, signal.SIGINT]))
    assert done.wait(10)
    assert exits == [130] and forced == []
    guard.write.close()
    guard.thread.join(timeout=5)
    guard.read.close()
    assert "the clean-up was cut short" in capsys.readouterr().err


def test_a_postgres_store_connects_within_a_third_of_the_store_timeout(http_env):
    """MLflow's SQL store on PostgreSQL gets libpq's connect_timeout from store_timeout_s (a host
    that does not answer costs seconds a try, not the kernel's minutes); the user's own is kept,
    other stores are left as they are."""
    backend.set_timeout(30)
    assert backend.engine_uri("postgresql://u@h:5/db") == "postgresql://u@h:5/db?connect_timeout=10"
    assert backend.engine_uri("postgresql+psycopg://u@h/db?sslmode=require").endswith(
        "?sslmode=require&connect_timeout=10"
    )
    assert backend.engine_uri("postgresql://u@h/db?connect_timeout=60") == "postgresql://u@h/db?connect_timeout=60"
    backend.set_timeout(1)
    assert backend.engine_uri("postgresql://u@h/db").endswith(f"connect_timeout={backend.PG_MIN_CONNECT_TIMEOUT_S}")
    for uri in ("sqlite:////tmp/x.db", "http://127.0.0.1:5000", "file:///tmp/mlruns"):
        assert backend.engine_uri(uri) == uri


def test_mlflow_sql_errors_are_not_logged_with_their_tracebacks():
    """MLflow's SQL store logs each failed query with its traceback before raising it: silenced
    (plnexp says the error it raises in one line)."""
    import logging

    backend._quiet()
    assert not logging.getLogger(backend.SQL_ERRORS_LOGGER).isEnabledFor(logging.ERROR)


def test_a_result_neither_the_store_nor_the_disk_takes_is_said_lost_in_one_line(monkeypatch, outputs):
    """The disk holding the store and pending/ is full: the fit's result cannot be kept; one line
    (ResultLost) names the run, what was lost and why (write_atomic leaves no half-written file)."""
    from mlflow.exceptions import MlflowException

    record = {
        "status": "FINISHED",
        "metrics": [["final_elbo", -355.3, 0, 1], ["ms_per_iter", 0.05, 0, 1], ["elbo", -400.0, 3, 1]],
        "tags": {},
    }

    def disk_full(*a, **k):
        raise MlflowException("(sqlite3.OperationalError) database or disk is full")

    def no_space(path, text, mode=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tracking.pending.writes, "job_record", lambda job: record)
    monkeypatch.setattr(tracking.pending.writes, "write_record", disk_full)
    monkeypatch.setattr(tracking.pending, "after_fit", lambda cl: cl)
    monkeypatch.setattr(tracking.pending, "write_atomic", no_space)
    with pytest.raises(tracking.pending.ResultLost) as raised:
        tracking.pending.finish(object(), "sqlite:///x.db", "run123", job=None)
    line = str(raised.value)
    assert "\n" not in line and isinstance(raised.value, tracking.StoreError)
    assert "lost: the FINISHED result of run run123 (final_elbo=-355.3, ms_per_iter=0.05)" in line
    assert "database or disk is full" in line and "No space left on device" in line


def test_a_client_of_a_postgres_store_that_does_not_answer_is_one_line_in_seconds(http_env, capfd):
    """MLflow's SQL store retries creating its engine for minutes when the database does not answer
    (a job's process started while PostgreSQL is down): plnexp's client reaches it once first, and
    an unreachable one is one StoreError line, within seconds, its password masked; not cached."""
    pytest.importorskip("psycopg", reason="needs plnexp's cluster extra")
    import daemons

    uri = f"postgresql://plnexp:hunter2@127.0.0.1:{daemons.free_port()}/mlflow"  # nobody listens there
    backend.set_timeout(6)
    capfd.readouterr()
    t0 = time.monotonic()
    for _ in range(2):  # not cached: tried again
        with pytest.raises(tracking.StoreError, match="PostgreSQL connection failed") as raised:
            backend.client(uri)
    assert time.monotonic() - t0 < 30
    assert "hunter2" not in str(raised.value) and "\n" not in str(raised.value)
    assert capfd.readouterr() == ("", "")
