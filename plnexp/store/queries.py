"""The MLflow store read as records (:class:`MlflowStore`, the :class:`~plnexp.store.records.Store`
protocol over the retrying client), the store of a URI (:func:`open`), and the searches of MLflow's
runs behind them. Nothing here writes to the store."""

from __future__ import annotations

import gzip
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import memory
from .backend import client
from .records import RunRecord, Store, record
from .writes import CURVE_KEY


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


def open(uri: str) -> Store:
    """The store of ``uri`` read as records: for a ``memory:`` URI the in-memory store of that name
    (:mod:`plnexp.store.memory`, the unit tests'), else the MLflow store."""
    return memory.store(uri) if uri.startswith(memory.SCHEME) else MlflowStore(uri)


@dataclass(frozen=True)
class MlflowStore(Store):
    """The MLflow store ``uri``, through its retrying client (:func:`plnexp.store.backend.client`)."""

    uri: str

    def run(self, run_id: str) -> RunRecord | None:
        from mlflow.exceptions import MlflowException

        try:
            return record(client(self.uri).get_run(run_id))
        except MlflowException as e:
            if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                return None
            raise

    def search(
        self, experiment_ids: list[str] | None, status: str | None = None, tags: dict[str, str | None] | None = None
    ) -> list[RunRecord]:
        from mlflow.entities import ViewType

        cl = client(self.uri)
        if experiment_ids is None:
            experiment_ids = [e.experiment_id for e in cl.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
        where = [f"attributes.status = '{status}'"] if status else []
        where += [f"tags.`{k}` = '{v}'" if v is not None else f"tags.`{k}` LIKE '%'" for k, v in (tags or {}).items()]
        return [record(r) for r in search_all(cl, experiment_ids, " and ".join(where))]

    def find_experiment(self, name: str) -> str | None:
        exp = client(self.uri).get_experiment_by_name(name)
        return exp.experiment_id if exp is not None else None

    def experiment_name(self, experiment_id: str) -> str:
        return client(self.uri).get_experiment(experiment_id).name

    def experiment_names(self) -> list[str]:
        from mlflow.entities import ViewType

        return sorted(e.name for e in client(self.uri).search_experiments(view_type=ViewType.ACTIVE_ONLY))

    def curve(self, run_id: str, key: str = CURVE_KEY) -> np.ndarray:
        history = client(self.uri).get_metric_history(run_id, key)
        return np.asarray([m.value for m in sorted(history, key=lambda m: m.step)], dtype=np.float64)

    def artifact(self, run_id: str, path: str) -> str | None:
        from mlflow.exceptions import MlflowException

        cl = client(self.uri)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                return Path(cl.download_artifacts(run_id, path, tmp)).read_text()
            except (MlflowException, OSError):
                pass
            try:
                return gzip.decompress(Path(cl.download_artifacts(run_id, f"{path}.gz", tmp)).read_bytes()).decode()
            except (MlflowException, OSError, EOFError, gzip.BadGzipFile):
                return None
