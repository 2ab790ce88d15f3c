"""MLflow: the store, one experiment per sweep name, a parent run per sweep, a child run per job.

The only module that imports mlflow (lazily: ``python -m plnexp run`` pays for it only when it
logs). Everything is logged after the fit, through :class:`mlflow.MlflowClient` (no fluent
"active run" state): params, metrics and the ELBO curve in ``log_batch`` calls, then artifacts.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import tempfile
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

from .config import REPO, Config, flatten, outputs_dir

log = logging.getLogger(__name__)
CURVE_KEY = "elbo"


def tracking_uri(explicit: str | None = None) -> str:
    """The config key, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<outputs>/mlflow.db`` (absolute)."""
    if explicit:
        return explicit
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    out = outputs_dir()
    out.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{out / 'mlflow.db'}"


def _quiet() -> None:
    for name in ("mlflow", "alembic", "sqlalchemy", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)


@lru_cache(maxsize=4)
def client(uri: str):
    """An MlflowClient on ``uri`` (cached: the sqlite engine and its migrations are paid once)."""
    from mlflow import MlflowClient

    _quiet()  # after the import: mlflow sets its own logger levels when imported
    return MlflowClient(tracking_uri=uri)


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


def start_parent(cl, exp_id: str, name: str, tags: dict) -> str:
    run = cl.create_run(exp_id, run_name=name, tags={k: str(v) for k, v in tags.items()})
    return run.info.run_id


def end_run(cl, run_id: str, status: str = "FINISHED", tags: dict | None = None) -> None:
    for k, v in (tags or {}).items():
        cl.set_tag(run_id, k, str(v))
    cl.set_terminated(run_id, status)


@lru_cache(maxsize=1)
def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        commit = out.stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (commit + ("-dirty" if dirty else "")) if commit else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment_tags(config: Config) -> dict[str, str]:
    import jax
    import jaxlib
    import optax

    dev = jax.devices()[0] if config.device.value == "auto" else jax.devices(config.device.value)[0]
    return {"jax_version": jax.__version__, "jaxlib_version": jaxlib.__version__, "optax_version": optax.__version__,
            "platform": dev.platform, "device_kind": dev.device_kind, "x64": str(config.precision.value == "float64"),
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""), "git_commit": git_commit(),
            "python": platform.python_version(), "host": platform.node()}


def _metric(key: str, value: float, step: int = 0, ts: int | None = None):
    from mlflow.entities import Metric

    return Metric(key, float(value), ts or int(time.time() * 1000), step)


def log_job(cl, exp_id: str, job, parent_id: str | None = None) -> str:
    """Create the child run of one finished (or failed) job and log everything; returns its id.

    ``job`` is a :class:`plnexp.runner.Outcome`.
    """
    from mlflow.entities import Param, RunTag

    cfg: Config = job.config
    tags = {"mlflow.parentRunId": parent_id} if parent_id else {}
    tags.update(environment_tags(cfg))
    tags.update({"overrides": " ".join(job.overrides), "status_reason": job.reason or ""})
    if job.result is not None:
        tags["device"] = job.result.device
    if job.data_digest:
        tags["data_digest"] = job.data_digest
    if job.output_dir:
        tags["hydra_output_dir"] = job.output_dir
    run = cl.create_run(exp_id, start_time=int(job.started * 1000), run_name=job.name,
                        tags={k: str(v) for k, v in tags.items()})
    run_id = run.info.run_id
    params = [Param(k, str(v)) for k, v in flatten(cfg.as_dict()).items()]
    now = int(time.time() * 1000)
    metrics = [_metric(k, v, ts=now) for k, v in job.metrics().items() if v is not None and np.isfinite(v)]
    curve = job.curve()
    metrics += [_metric(CURVE_KEY, v, step=i, ts=now) for i, v in enumerate(curve)]
    cl.log_batch(run_id, metrics=metrics[:1000], params=params[:100], tags=[RunTag("mlflow.note.content", job.note())])
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
    cl.set_terminated(run_id, job.status, end_time=int(job.ended * 1000))
    return run_id
