"""Reading runs back as MLflow returns them: a run, a sweep's children, experiments, artifacts and
curves (:mod:`.records` reads runs as records on top of these). Nothing here writes to the store."""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path

import numpy as np

from ..jobs.tags import PARENT_TAG, SWEEP_TAG
from .backend import client
from .writes import CURVE_KEY, JOB_TAG, Parent


def search_all(cl, exp_ids: list[str], filter_string: str) -> list:
    """The runs of the experiments ``exp_ids`` that match ``filter_string``: every page, 100
    experiments a query (MLflow's limit)."""
    runs = []
    for start in range(0, len(exp_ids), 100):
        token = None
        while True:
            page = cl.search_runs(exp_ids[start : start + 100], filter_string, max_results=1000, page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                break
    return runs


def search_experiments(cl, filter_string: str) -> list:
    """The runs of every experiment (deleted ones included) that match ``filter_string``."""
    from mlflow.entities import ViewType

    return search_all(cl, [e.experiment_id for e in cl.search_experiments(view_type=ViewType.ALL)], filter_string)


def children(cl, parent: Parent) -> list:
    """The child runs of a sweep's parent (any status), in job order."""
    runs = search_all(cl, [parent.experiment_id], f"tags.`{PARENT_TAG}` = '{parent.run_id}'")
    return sorted(runs, key=lambda r: (int(r.data.tags.get(JOB_TAG, 0) or 0), r.info.start_time or 0))


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
    """The text of a run's artifact ``path``, or of ``path.gz`` (how a large text artifact is written:
    :data:`~plnexp.store.writes.GZIP_OVER`), or None if it has neither (or its file is gone)."""
    from mlflow.exceptions import MlflowException

    cl = client(uri)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            return Path(cl.download_artifacts(run_id, path, tmp)).read_text()
        except (MlflowException, OSError):
            pass
        try:
            return gzip.decompress(Path(cl.download_artifacts(run_id, f"{path}.gz", tmp)).read_bytes()).decode()
        except (MlflowException, OSError, EOFError, gzip.BadGzipFile):
            return None


def read_curve(uri: str, run_id: str) -> np.ndarray:
    """A run's ELBO curve (the step metric :data:`CURVE_KEY`), in step order."""
    return read_curves(uri, [run_id])[run_id]


def latest_parent(uri: str, experiment: str | None = None):
    """The newest sweep parent run, in ``experiment`` or in the whole store; None if there is none."""
    from mlflow.entities import ViewType

    cl = client(uri)
    if experiment is not None:
        exp_id = find_experiment(uri, experiment)
        exp_ids = [exp_id] if exp_id is not None else []
    else:
        exp_ids = [e.experiment_id for e in cl.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    # a sweep's parent run: tagged with its sweep (plnexp.experiment.sweep.open_sweep), itself without a parent
    parents = [r for r in search_all(cl, exp_ids, f"tags.`{SWEEP_TAG}` LIKE '%'") if PARENT_TAG not in r.data.tags]
    return max(parents, key=lambda r: r.info.start_time or 0, default=None)


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


def find_experiment(uri: str, name: str) -> str | None:
    """The id of the experiment ``name``, or None if the store has none (nothing is created)."""
    exp = client(uri).get_experiment_by_name(name)
    return exp.experiment_id if exp is not None else None
