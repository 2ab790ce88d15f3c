"""MLflow: the store, one experiment per sweep name, a parent run per sweep, a child run per job.

The only module that imports mlflow (lazily: ``python -m plnexp run`` pays for it only when it
logs). Everything goes through :class:`mlflow.MlflowClient` (no fluent "active run" state), wrapped
so that a call that meets ``database is locked`` (several processes writing one sqlite store) is
retried. A job's run is created RUNNING when the job starts (tagged with the host and PID of the
process that owns it) and written in a few short calls after the fit: params, metrics and the ELBO
curve in ``log_batch`` calls, artifacts, then its status. :func:`sweep_up_orphans` marks FAILED the
runs that a dead process left RUNNING.
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import os
import platform
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .config import REPO, Config, flatten, outputs_dir
from .provenance import HASH_TAG, RESUMES_TAG, environment_tags

log = logging.getLogger(__name__)
CURVE_KEY = "elbo"  # the ELBO per iteration (step metric)
GAP_KEY = "elbo_gap_log10"  # log10 of the gap to the run's best ELBO: what reads on MLflow's linear chart
HOST_TAG, PID_TAG, JOB_TAG = "plnexp.host", "plnexp.pid", "plnexp.job"
PROBE_TIMEOUT_S = 3.0  # an http(s) store that does not answer in this long is unreachable
SCHEMES = ("", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc")
LOCKED = ("database is locked", "database table is locked")
RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0, 2.0)


class StoreError(RuntimeError):
    """The MLflow store cannot be reached or written; one line naming its URI and where it came from."""


class Parent(NamedTuple):
    """Where a sweep's children go: the store, the experiment and the parent run."""

    uri: str
    experiment_id: str
    run_id: str


def tracking_uri(explicit: str | None = None) -> str:
    """The config key, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<outputs>/mlflow.db`` (absolute)."""
    if explicit:
        return explicit
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{outputs_dir() / 'mlflow.db'}"


def _uri_source(explicit: str | None) -> str:
    if explicit:
        return f"tracking_uri={explicit}"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return f"MLFLOW_TRACKING_URI={os.environ['MLFLOW_TRACKING_URI']}"
    return f"the store {tracking_uri()}"


def _quiet() -> None:
    for name in ("mlflow", "alembic", "sqlalchemy", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _is_locked(e: BaseException | None) -> bool:
    while e is not None:
        if any(text in str(e) for text in LOCKED):
            return True
        e = e.__cause__ or e.__context__
    return False


class _Retrying:
    """An MlflowClient whose calls are retried (with backoff) when sqlite says the database is locked."""

    def __init__(self, cl):
        self._cl = cl

    def __getattr__(self, name):
        attr = getattr(self._cl, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args, **kwargs):
            for delay in RETRY_DELAYS_S:
                try:
                    return attr(*args, **kwargs)
                except Exception as e:  # noqa: BLE001 - only a locked database is retried
                    if not _is_locked(e):
                        raise
                    log.info("%s: database is locked, retrying in %.2f s", name, delay)
                    time.sleep(delay)
            return attr(*args, **kwargs)

        return call


@lru_cache(maxsize=4)
def client(uri: str):
    """An MlflowClient on ``uri`` (cached: the sqlite engine and its migrations are paid once)."""
    from mlflow import MlflowClient

    _quiet()  # after the import: mlflow sets its own logger levels when imported
    return _Retrying(MlflowClient(tracking_uri=uri))


def _sqlite_path(uri: str) -> Path | None:
    """The database file of ``sqlite:///relative/path`` or ``sqlite:////absolute/path``."""
    rest = uri[len("sqlite://"):].split("?", 1)[0]
    if not rest.startswith("/") or rest in ("/", "/:memory:"):
        return None
    return Path(rest[1:])


@contextmanager
def _dir_lock(folder: Path):
    """An exclusive lock on a directory: two processes creating one sqlite store take turns."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _create_sqlite_store(path: Path) -> None:
    """Create a sqlite store whole or not at all: MLflow's migrations (seconds) run on a temporary
    file that is then linked into place, so an interrupt cannot leave a half-migrated store."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    _quiet()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".creating", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o644)  # what sqlite would give a new file (mkstemp makes it private)
    try:
        store = SqlAlchemyStore(f"sqlite:///{tmp}", (outputs_dir() / "artifacts").as_uri())
        store.engine.dispose()
        os.link(tmp, path)  # fails if a store appeared meanwhile: then that one is used
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def store_exists(uri: str) -> bool:
    """False for a sqlite store whose file does not exist yet (a server or other database: True)."""
    path = _sqlite_path(uri) if uri.lower().startswith("sqlite:") else None
    return path is None or path.exists()


def check_store(explicit: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> str:
    """Reach the store before any fit, in seconds; returns its URI or raises :class:`StoreError`.

    An http(s) server gets a quick probe (MLflow's own client retries for minutes); a sqlite
    store's folder must be writable, and the store is created there if it does not exist yet
    (one process at a time, whole or not at all: see :func:`_create_sqlite_store`).
    """
    uri = tracking_uri(explicit)
    where = _uri_source(explicit)
    allowed = "allowed values are a running MLflow server's http(s) URL or sqlite:///PATH in a writable folder"
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if scheme not in SCHEMES:
        raise StoreError(f"{where}: unsupported scheme {scheme!r}; {allowed}")
    if scheme in ("http", "https"):
        try:
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout).close()
        except urllib.error.HTTPError:
            pass  # something answered: MLflow's own calls below tell whether it is a tracking server
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise StoreError(f"{where}: cannot reach the MLflow server ({reason}); {allowed}") from None
    path = _sqlite_path(uri) if scheme == "sqlite" else None
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
                raise PermissionError("not writable")
        except OSError as e:
            raise StoreError(f"{where}: cannot write {path} ({e.strerror or e}); {allowed}") from None
    try:
        if path is not None:
            with _dir_lock(path.parent):
                if not path.exists():
                    _create_sqlite_store(path)
        client(uri).search_experiments(max_results=1)
    except Exception as e:  # noqa: BLE001 - any failure here is one line
        client.cache_clear()
        raise StoreError(f"{where}: {_first_line(e)}; {allowed}") from None
    return uri


def experiment_id(cl, name: str) -> str:
    """Get or create the experiment, with its artifacts under ``<outputs>/artifacts/<name>``."""
    exp = cl.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = (outputs_dir() / "artifacts" / name).as_uri()
    try:
        return cl.create_experiment(name, artifact_location=location)
    except Exception:  # created meanwhile by another process
        exp = cl.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def process_tags() -> dict[str, str]:
    """Which process owns a RUNNING run: lets :func:`sweep_up_orphans` find the runs of dead ones."""
    return {HOST_TAG: platform.node(), PID_TAG: str(os.getpid())}


def start_parent(cl, exp_id: str, name: str, tags: dict) -> str:
    run = cl.create_run(exp_id, run_name=name, tags={k: str(v) for k, v in {**process_tags(), **tags}.items()})
    return run.info.run_id


def end_run(cl, run_id: str, status: str = "FINISHED", tags: dict | None = None) -> None:
    from mlflow.entities import RunTag

    if tags:
        cl.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
    cl.set_terminated(run_id, status)


def open_parent(uri: str, experiment: str, name: str, tags: dict) -> Parent:
    """Get or create the experiment and create a sweep's RUNNING parent run in it."""
    cl = client(uri)
    exp_id = experiment_id(cl, experiment)
    return Parent(uri, exp_id, start_parent(cl, exp_id, name, tags))


def close_parent(parent: Parent, status: str, tags: dict, summary: str | None = None) -> None:
    """Log the summary table (``summary.txt``) and the tags, then end the parent run."""
    cl = client(parent.uri)
    if summary:
        cl.log_text(parent.run_id, summary, "summary.txt")
    end_run(cl, parent.run_id, status, tags)


def _metric(key: str, value: float, step: int = 0, ts: int | None = None):
    from mlflow.entities import Metric

    return Metric(key, float(value), ts or int(time.time() * 1000), step)


def start_job(cl, exp_id: str, job, parent_id: str | None = None, tags: dict | None = None) -> str:
    """Create the RUNNING run of a job that starts now (one call); returns its id.

    ``job`` is a :class:`plnexp.runner.Outcome` (its name, overrides, config, start time).
    """
    cfg: Config = job.config
    all_tags = {"mlflow.parentRunId": parent_id} if parent_id else {}
    all_tags.update(environment_tags(cfg))
    all_tags.update(process_tags())
    all_tags.update({"overrides": " ".join(job.overrides), "dataset": cfg.dataset.label, **(tags or {})})
    if job.output_dir:
        all_tags["hydra_output_dir"] = job.output_dir
    run = cl.create_run(exp_id, start_time=int(job.started * 1000), run_name=job.name,
                        tags={k: str(v) for k, v in all_tags.items()})
    return run.info.run_id


def finish_job(cl, run_id: str, job) -> None:
    """Log a job's params, metrics, curve and artifacts, then end its run with the job's status."""
    from mlflow.entities import Param, RunTag

    cfg: Config = job.config
    tags = {"status_reason": job.reason or "", "mlflow.note.content": job.note()}
    if job.status == "KILLED":
        tags["reason"] = "interrupted"
    if job.result is not None:
        tags["device"] = job.result.device
    if job.data_digest:
        tags["data_digest"] = job.data_digest
    if job.data_shape:
        tags["data_n"], tags["data_p"] = job.data_shape
    params = [Param(k, str(v)) for k, v in flatten(cfg.as_dict()).items()]
    now = int(time.time() * 1000)
    metrics = [_metric(k, v, ts=now) for k, v in job.metrics().items() if v is not None and np.isfinite(v)]
    curve = job.curve()
    metrics += [_metric(CURVE_KEY, v, step=i, ts=now) for i, v in enumerate(curve)]
    metrics += [_metric(GAP_KEY, v, step=i, ts=now) for i, v in enumerate(job.gap_curve())]
    cl.log_batch(run_id, metrics=metrics[:1000], params=params[:100],
                 tags=[RunTag(k, str(v)) for k, v in tags.items()])
    for start in range(1000, len(metrics), 1000):
        cl.log_batch(run_id, metrics=metrics[start:start + 1000])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "config.yaml").write_text(job.config_yaml())
        if len(curve):
            from .plots import elbo_png

            elbo_png(curve, f"{job.name}  ({job.status})", tmp / "elbo.png")
        if job.result is not None:
            analysis = {"cost_analysis": job.result.timing.cost_analysis,
                        "memory_analysis": job.result.timing.memory_analysis,
                        "runs_s": list(job.result.timing.runs_s)}
            (tmp / "analysis.json").write_text(json.dumps(analysis, indent=1, default=str))
        cl.log_artifacts(run_id, str(tmp))
    cl.set_terminated(run_id, job.status, end_time=int((job.ended or time.time()) * 1000))


def log_job(cl, exp_id: str, job, parent_id: str | None = None) -> str:
    """Create the run of a job that has already ended and log everything; returns its id."""
    run_id = start_job(cl, exp_id, job, parent_id)
    finish_job(cl, run_id, job)
    return run_id


def _search_all(cl, exp_ids: list[str], filter_string: str) -> list:
    runs, token = [], None
    while exp_ids:
        page = cl.search_runs(exp_ids, filter_string, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            break
    return runs


def children(cl, parent: Parent) -> list:
    """The child runs of a sweep's parent (any status), in job order."""
    runs = _search_all(cl, [parent.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.run_id}'")
    return sorted(runs, key=lambda r: (int(r.data.tags.get(JOB_TAG, 0) or 0), r.info.start_time or 0))


def end_running(cl, runs, status: str, reason: str, code: str) -> list:
    """End every run of ``runs`` still RUNNING with ``status``, tags ``reason=code`` and
    ``status_reason=reason``; returns those runs."""
    from mlflow.entities import RunTag

    ended = []
    for r in runs:
        if r.info.status != "RUNNING":
            continue
        cl.log_batch(r.info.run_id, tags=[RunTag("reason", code), RunTag("status_reason", reason)])
        cl.set_terminated(r.info.run_id, status)
        ended.append(r)
    return ended


def end_children(parent: Parent, status: str, reason: str, code: str) -> list[dict]:
    """End the parent's children still RUNNING (see :func:`end_running`); returns every child as a
    plain row: name, status, reason, metrics, job number."""
    cl = client(parent.uri)
    runs = children(cl, parent)
    if end_running(cl, runs, status, reason, code):
        runs = children(cl, parent)
    return [{"name": r.info.run_name, "status": r.info.status, "reason": r.data.tags.get("status_reason", ""),
             "metrics": dict(r.data.metrics), "job": int(r.data.tags.get(JOB_TAG, 0) or 0)} for r in runs]


def _running_here(cl, extra: str = "", status: str | None = "RUNNING") -> list:
    from mlflow.entities import ViewType

    exps = [e.experiment_id for e in cl.search_experiments(view_type=ViewType.ALL)]
    runs = []
    where = f"attributes.status = '{status}' and " if status else ""
    for start in range(0, len(exps), 100):
        runs += _search_all(cl, exps[start:start + 100], f"{where}tags.`{HOST_TAG}` = '{platform.node()}'{extra}")
    return runs


def process_runs(uri: str) -> list:
    """The runs this process created (any status), in this store."""
    return _running_here(client(uri), f" and tags.`{PID_TAG}` = '{os.getpid()}'", status=None)


def end_process_runs(uri: str, status: str, reason: str, code: str) -> list:
    """End the runs this process left RUNNING (e.g. when it must exit without unwinding)."""
    cl = client(uri)
    return end_running(cl, _running_here(cl, f" and tags.`{PID_TAG}` = '{os.getpid()}'"), status, reason, code)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (a zombie does not count)."""
    if pid <= 0:
        return True  # unknown: leave it alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def sweep_up_orphans(uri: str) -> list:
    """Mark FAILED (tag ``reason=orphaned``) the runs left RUNNING by processes of this host that no
    longer exist (a SIGKILL, a crash); returns them. Runs owned by other hosts cannot be checked
    from here and are left alone. ``sweep`` and ``run`` call it first (and so can ``report``)."""
    cl = client(uri)
    host = platform.node()
    dead = [r for r in _running_here(cl) if not _alive(int(r.data.tags.get(PID_TAG, "0") or 0))]
    for r in dead:
        pid = r.data.tags.get(PID_TAG)
        end_running(cl, [r], "FAILED", f"orphaned: process {pid} on {host} ended without closing this run",
                    "orphaned")
    return dead


# ---------------------------------------------------------------- reading runs back (rerun, resume)
def find_run(uri: str, run_id: str):
    """The run ``run_id`` of the store, or None if the store has no such run."""
    from mlflow.exceptions import MlflowException

    try:
        return client(uri).get_run(run_id)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


def experiment_name(uri: str, exp_id: str) -> str:
    return client(uri).get_experiment(exp_id).name


def read_artifact(uri: str, run_id: str, path: str) -> str | None:
    """The text of a run's artifact ``path``, or None if it is missing (or its file is gone)."""
    from mlflow.exceptions import MlflowException

    cl = client(uri)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            return Path(cl.download_artifacts(run_id, path, tmp)).read_text()
        except (MlflowException, OSError):
            return None


def read_curve(uri: str, run_id: str) -> np.ndarray:
    """A run's ELBO curve (the step metric :data:`CURVE_KEY`), in step order."""
    return read_curves(uri, [run_id])[run_id]


def sweep_children(uri: str, run) -> list:
    """The child runs of a parent run (any status), in job order."""
    return children(client(uri), Parent(uri, run.info.experiment_id, run.info.run_id))


def sweep_runs(uri: str, run) -> list:
    """The runs that make up the sweep whose parent is ``run``, in job order: its children plus the
    FINISHED children of the sweeps it resumed (tag ``resumes``) whose config it did not run itself.
    ``[]`` for a run that is not a sweep's parent."""
    own = sweep_children(uri, run)
    hashes = {r.data.tags.get(HASH_TAG) for r in own}
    earlier = []
    for pid in filter(None, run.data.tags.get(RESUMES_TAG, "").split(",")):
        prev = find_run(uri, pid)
        for r in sweep_children(uri, prev) if prev is not None else []:
            h = r.data.tags.get(HASH_TAG)
            if r.info.status == "FINISHED" and h not in hashes:
                earlier.append(r)
                hashes.add(h)
    return sorted(earlier + own, key=lambda r: int(r.data.tags.get(JOB_TAG, 0) or 0))


def is_parent(run) -> bool:
    """Whether ``run`` is a sweep's parent run (plnexp.sweep.open_sweep tags it ``sweep``)."""
    return "sweep" in run.data.tags and "mlflow.parentRunId" not in run.data.tags


def latest_parent(uri: str, experiment: str | None = None):
    """The newest sweep parent run, in ``experiment`` or in the whole store; None if there is none."""
    from mlflow.entities import ViewType

    cl = client(uri)
    if experiment is not None:
        exp_id = find_experiment(uri, experiment)
        exp_ids = [exp_id] if exp_id is not None else []
    else:
        exp_ids = [e.experiment_id for e in cl.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    newest = None
    for start in range(0, len(exp_ids), 100):
        for r in _search_all(cl, exp_ids[start:start + 100], "tags.`sweep` LIKE '%'"):
            if is_parent(r) and (newest is None or (r.info.start_time or 0) > (newest.info.start_time or 0)):
                newest = r
    return newest


def experiment_names(uri: str) -> list[str]:
    """The names of the store's active experiments."""
    from mlflow.entities import ViewType

    return sorted(e.name for e in client(uri).search_experiments(view_type=ViewType.ACTIVE_ONLY))


def read_curves(uri: str, run_ids, key: str = CURVE_KEY) -> dict[str, np.ndarray]:
    """Each run's step metric ``key`` (the ELBO curve by default), in step order."""
    cl = client(uri)
    out = {}
    for run_id in run_ids:
        history = cl.get_metric_history(run_id, key)
        out[run_id] = np.asarray([m.value for m in sorted(history, key=lambda m: m.step)], dtype=np.float64)
    return out


def log_report(uri: str, run_id: str, folder: Path, metrics: dict, tags: dict) -> None:
    """Attach a report to a sweep's parent run: the files of ``folder`` under ``report/``, its
    summary metrics and tags (a run can take them after it ended; a later report replaces them)."""
    from mlflow.entities import RunTag

    cl = client(uri)
    now = int(time.time() * 1000)
    cl.log_batch(run_id, metrics=[_metric(k, v, ts=now) for k, v in metrics.items() if np.isfinite(v)],
                 tags=[RunTag(k, str(v)) for k, v in tags.items()])
    cl.log_artifacts(run_id, str(folder), "report")


def finished_runs(uri: str, exp_id: str) -> list:
    """The FINISHED runs of an experiment, newest first."""
    runs = _search_all(client(uri), [exp_id], "attributes.status = 'FINISHED'")
    return sorted(runs, key=lambda r: -(r.info.start_time or 0))


def find_experiment(uri: str, name: str) -> str | None:
    """The id of the experiment ``name``, or None if the store has none (nothing is created)."""
    exp = client(uri).get_experiment_by_name(name)
    return exp.experiment_id if exp is not None else None


def set_tags(uri: str, run_id: str, tags: dict) -> None:
    """Add tags to a run (e.g. a rerun's verdict, once it is known), in one call."""
    from mlflow.entities import RunTag

    client(uri).log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
