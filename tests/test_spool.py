"""A fit's outcome is never lost: the store's writes after a fit are retried, and a result the store
still does not take is kept in ``<outputs>/pending/<run_id>.json`` (:mod:`plnexp.store.pending`)
until ``plnexp sync`` or the next command on the store sends it. In process, tiny fits, a real
(copied) sqlite store whose MLflow client is made to fail."""

from __future__ import annotations

import json

import mlflow
import pytest
from conftest import store_client

from plnexp.jobs import config as C
from plnexp.experiment import runner
from plnexp import store as tracking
from plnexp.store import backend as store_module

TINY = ["dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3", "strategy=scan", "experiment=spool"]


@pytest.fixture
def fast_retries(monkeypatch):
    monkeypatch.setattr(store_module, "AFTER_FIT_DELAYS_S", (0.01, 0.01))


@pytest.fixture
def down(monkeypatch):
    """The store fails ``log_batch`` and ``set_terminated`` (every try) while ``state["down"]`` is
    true, for the calls ``state["which"]`` accepts (all by default); ``state["calls"]`` counts the
    failed calls."""
    state = {"down": True, "which": lambda cl, run_id, kwargs: True, "calls": 0}
    for name in ("log_batch", "set_terminated"):
        real = getattr(mlflow.MlflowClient, name)

        def failing(self, run_id, *args, _real=real, **kwargs):
            if state["down"] and state["which"](self, run_id, kwargs):
                state["calls"] += 1
                raise ConnectionError("the store is down")
            return _real(self, run_id, *args, **kwargs)

        monkeypatch.setattr(mlflow.MlflowClient, name, failing)
    return state


@pytest.fixture
def fits(monkeypatch):
    """How many fits ran (calls of the runner's execute)."""
    count = {"n": 0}
    real = runner.execute

    def counted(*args, **kwargs):
        count["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "execute", counted)
    return count


def runs(outputs):
    cl = store_client(outputs)
    return cl.search_runs([e.experiment_id for e in cl.search_experiments()])


def kept(outputs):
    return sorted((outputs / "pending").glob("*"))


def elbo(outputs, run_id):
    return [m.value for m in sorted(store_client(outputs).get_metric_history(run_id, "elbo"), key=lambda m: m.step)]


def test_a_retry_that_succeeds_writes_normally(outputs, plnexp_main, fast_retries, monkeypatch):
    real, tries = mlflow.MlflowClient.set_terminated, []

    def flaky(self, run_id, *args, **kwargs):
        tries.append(run_id)
        if len(tries) == 1:
            raise mlflow.exceptions.MlflowException("503 Service Unavailable")
        return real(self, run_id, *args, **kwargs)

    monkeypatch.setattr(mlflow.MlflowClient, "set_terminated", flaky)
    ran = plnexp_main("run", *TINY)
    assert ran.returncode == 0, ran.stderr
    (run,) = runs(outputs)
    assert run.info.status == "FINISHED" and len(tries) == 2
    assert "set_terminated: the store failed, retrying in 0.01 s" in ran.stderr
    assert "pending" not in ran.stdout + ran.stderr and kept(outputs) == []


@pytest.mark.slow  # fast subset under 2 minutes: CI runs it
def test_a_result_the_store_refuses_is_kept_then_sent_by_sync(outputs, plnexp_main, fast_retries, down):
    ran = plnexp_main("run", *TINY)
    assert ran.returncode == 0, ran.stderr
    (run,) = runs(outputs)
    run_id = run.info.run_id
    assert run.info.status == "RUNNING" and "final_elbo" not in run.data.metrics
    assert down["calls"] == 3  # every try of the first write
    (path,) = kept(outputs)  # written whole: no temporary file beside it
    assert path == outputs / "pending" / f"{run_id}.json"
    assert (
        f"plnexp: warning: the store failed after the fit of run {run_id} (ConnectionError: the store is down): its "
        f"result is kept in {path}, and sent by `python -m plnexp sync` or the next plnexp command on this store"
    ) in ran.stderr
    assert "`python -m plnexp sync` or the next plnexp command on this store" in ran.stderr
    assert "FINISHED (pending: kept locally)" in ran.stdout
    record = json.loads(path.read_text())
    assert record["run_id"] == run_id and record["status"] == "FINISHED"
    assert len([m for m in record["metrics"] if m[0] == "elbo"]) == 3 and "config.yaml" in record["artifacts"]

    assert plnexp_main("sync").returncode == 1 and kept(outputs) == [path]  # the store still down
    down["down"] = False
    synced = plnexp_main("sync")
    assert synced.returncode == 0, synced.stderr
    assert synced.stdout.strip() == f"plnexp: sent the result of run {run_id} kept in {path} to the store (FINISHED)"
    (run,) = runs(outputs)
    assert run.info.status == "FINISHED" and kept(outputs) == []
    assert len(elbo(outputs, run_id)) == 3 and run.data.metrics["final_elbo"] == record_metric(record, "final_elbo")
    assert run.data.params["n_iter"] == "3" and run.data.tags["status_reason"] == ""
    artifacts = {a.path for a in store_client(outputs).list_artifacts(run_id)}
    assert {"config.yaml", "elbo.png"} <= artifacts
    again = plnexp_main("sync")
    assert again.returncode == 0 and "nothing to send" in again.stdout


def record_metric(record, key):
    return next(v for k, v, _step, _ts in record["metrics"] if k == key)


def test_sync_says_so_when_the_store_still_fails(outputs, plnexp_main, fast_retries, down):
    plnexp_main("run", *TINY)
    (path,) = kept(outputs)
    synced = plnexp_main("sync")
    assert synced.returncode == 1
    (line,) = synced.stderr.strip().splitlines()[-1:]
    assert line.startswith("plnexp: store error: sqlite:///") and "cannot send the results kept in" in line
    assert "ConnectionError: the store is down" in line and "run python -m plnexp sync again" in line
    assert kept(outputs) == [path]


@pytest.mark.slow  # fast subset under 2 minutes: CI runs it
def test_the_next_command_sends_it_before_orphans_are_swept_up(outputs, plnexp_main, fast_retries, down):
    plnexp_main("run", *TINY)
    (run,) = runs(outputs)
    # its owner gone, as when the job's process has ended since
    store_client(outputs).set_tag(run.info.run_id, tracking.PID_TAG, "999999999")
    down["down"] = False
    ran = plnexp_main("run", *TINY, "experiment=other")
    assert ran.returncode == 0, ran.stderr
    assert f"plnexp: sent the result of run {run.info.run_id}" in ran.stderr
    assert "marked FAILED" not in ran.stderr and kept(outputs) == []
    assert store_client(outputs).get_run(run.info.run_id).info.status == "FINISHED"
    assert len(elbo(outputs, run.info.run_id)) == 3


@pytest.mark.slow  # fast subset under 2 minutes: CI runs it
def test_resume_counts_a_kept_result_as_done(outputs, plnexp_main, fast_retries, down, fits, tmp_path):
    """A sweep's job whose result is kept (its run then ended FAILED when the sweep closed, the store
    back by then) is sent by the next sweep before resume reads the store: FINISHED, matched, not
    fitted again."""
    down["which"] = lambda cl, run_id, kwargs: bool(kwargs.get("metrics"))  # the job's result only
    first = plnexp_main("sweep", "sweep=null", *TINY, "report=false", cwd=tmp_path)
    assert fits["n"] == 1 and "done (pending: kept locally)" in first.stdout
    (path,) = kept(outputs)
    assert store_client(outputs).get_run(path.stem).info.status == "FAILED"  # not FINISHED while pending
    down["down"] = False
    resumed = plnexp_main("sweep", "sweep=null", *TINY, "report=false", "resume=true", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert fits["n"] == 1 and kept(outputs) == []
    assert "resume: all 1 jobs already FINISHED" in resumed.stdout
    child = store_client(outputs).get_run(path.stem)
    assert child.info.status == "FINISHED" and len(elbo(outputs, path.stem)) == 3
    assert "reason" not in child.data.tags and child.data.tags["status_reason"] == ""  # not "lost" any more


@pytest.mark.slow  # fast subset under 2 minutes: CI runs it
def test_a_sweep_sends_a_kept_result_when_it_closes(outputs, plnexp_main, fast_retries, down, tmp_path):
    """The store back by the end of the sweep: the result kept after the fit is sent before the sweep
    closes, and its summary counts the run FINISHED."""

    def first_tries(cl, run_id, kwargs):  # the 3 tries of the job's first write after the fit
        return bool(kwargs.get("metrics")) and down["calls"] < 3

    down["which"] = first_tries
    ran = plnexp_main("sweep", "sweep=null", *TINY, "report=false", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "done (pending: kept locally)" in ran.stdout and "1/1 jobs, 0 failed" in ran.stdout
    assert "plnexp: sent the result of run" in ran.stderr and kept(outputs) == []
    child = next(r for r in runs(outputs) if tracking.JOB_TAG in r.data.tags)
    assert child.info.status == "FINISHED" and len(elbo(outputs, child.info.run_id)) == 3


def test_every_param_is_logged(outputs, plnexp_main, monkeypatch):
    """No cut at 100 params: MLflow's client splits a large batch itself."""
    from plnexp.store import writes

    many = {f"extra.key{i:03d}": i for i in range(120)}
    monkeypatch.setattr(writes, "flatten", lambda d: {**C.flatten(d), **many})
    ran = plnexp_main("run", *TINY)
    assert ran.returncode == 0, ran.stderr
    (run,) = runs(outputs)
    assert len(run.data.params) > 120 and run.data.params["extra.key119"] == "119"


def test_a_kept_result_whose_run_is_gone_is_moved_aside_once(outputs, plnexp_main, fast_retries, down):
    """A result kept for a run the store no longer has (here: deleted for good) is moved out of
    pending/ by the next sync, said in one line naming where, and no later command tries it again."""
    plnexp_main("run", *TINY)
    (path,) = kept(outputs)
    (run,) = runs(outputs)
    down["down"] = False
    cl = store_client(outputs)
    cl.delete_run(run.info.run_id)
    synced = plnexp_main("sync")
    assert synced.returncode == 0, synced.stderr
    target = outputs / "pending" / "orphaned" / path.name
    assert synced.stdout.strip() == (
        f"plnexp: the store no longer has run {run.info.run_id}, whose result was kept in {path}: "
        f"moved to {target} (not sent; said once)"
    )
    assert kept(outputs) == [outputs / "pending" / "orphaned"] and target.is_file()
    again = plnexp_main("sync")
    assert again.returncode == 0 and "nothing to send" in again.stdout, again.stdout
    assert "no longer has" not in plnexp_main("run", *TINY).stderr


def test_sync_names_a_kept_file_it_cannot_read_and_exits_1(outputs, plnexp_main):
    """#62: a file in pending/ that cannot be read is named (not skipped unsaid under 'nothing to
    send'), left where it is, and sync exits 1."""
    folder = tracking.pending.folder()
    folder.mkdir(parents=True, exist_ok=True)
    torn = folder / "torn.json"
    torn.write_text('{"store": "sqlite:///x.db", "run_id": ')  # half-written
    synced = plnexp_main("sync")
    assert synced.returncode == 1
    (line,) = synced.stderr.strip().splitlines()
    assert line.startswith(f"plnexp: error: {torn}: a kept result that cannot be read (") and line.endswith("not sent")
    assert "(1 unreadable): nothing to send" in synced.stdout and torn.is_file()
