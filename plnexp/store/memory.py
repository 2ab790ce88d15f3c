"""An in-memory store for unit tests: runs made from plain dicts, read back through the very
queries and records (:mod:`plnexp.store.records`) that read a real store.

A store is named by a ``memory:NAME`` URI (:func:`new`); :func:`plnexp.store.backend.client` answers
such a URI with the :class:`MemoryStore` of that name, which has the part of MLflow's client that
the reading queries call: ``get_run``, ``search_runs`` (any filter string, read by MLflow's own
search filter: :func:`plnexp.store.mlflow_compat.filter_runs`),
``get_experiment``, ``get_experiment_by_name``, ``search_experiments``, ``get_metric_history`` (a
run's step metrics: :meth:`MemoryStore.add`'s ``histories``) and ``download_artifacts`` (its text
artifacts: :meth:`MemoryStore.add`'s ``artifacts``), so that a report reads a sweep from here. Nothing else of MLflow
is faked: a writer still needs a real store (``tests/test_records.py`` checks that a run written
by the real path reads back from here as it does from there)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import mlflow_compat

if TYPE_CHECKING:
    from mlflow.entities import Experiment, Metric, Run

SCHEME = "memory:"  # the URIs of in-memory stores: memory:NAME
_STORES: dict[str, MemoryStore] = {}


def new(name: str = "test") -> str:
    """A new, empty in-memory store (replacing one of that name); returns its URI."""
    uri = f"{SCHEME}{name}"
    _STORES[uri] = MemoryStore()
    return uri


def store(uri: str) -> MemoryStore:
    """The in-memory store of ``uri`` (made by :func:`new`)."""
    try:
        return _STORES[uri]
    except KeyError:
        raise KeyError(f"{uri}: no such in-memory store (plnexp.store.memory.new makes one)") from None


class _Page(list):
    token = None  # one page holds every run


@dataclass
class MemoryStore:
    """Experiments and runs held in dicts, as MLflow's own entities (``Run``, ``Experiment``, ``Metric``)."""

    experiments: dict[str, Experiment] = field(default_factory=dict)
    runs: dict[str, Run] = field(default_factory=dict)
    histories: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (run, key) -> values by step
    artifacts: dict[tuple[str, str], str] = field(default_factory=dict)  # (run, path) -> text

    def experiment(self, name: str) -> str:
        """The id of the experiment ``name``, created if new."""
        found = self.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        from mlflow.entities import Experiment

        exp_id = str(len(self.experiments) + 1)
        self.experiments[exp_id] = Experiment(exp_id, name, "", "active")
        return exp_id

    def add(
        self,
        experiment: str,
        name: str = "",
        status: str = "FINISHED",
        *,
        params: dict | None = None,
        metrics: dict | None = None,
        tags: dict | None = None,
        start_time: int | None = None,
        end_time: int | None = None,
        run_id: str | None = None,
        deleted: bool = False,
        histories: dict | None = None,
        artifacts: dict | None = None,
    ) -> str:
        """A run of the experiment ``experiment`` (by name), from plain dicts; returns its id.
        ``histories``: step metrics (key -> values, step 0 first); ``artifacts``: text files (path -> text)."""
        from mlflow.entities import Metric, Param, Run, RunData, RunInfo, RunTag

        run_id = run_id or uuid.uuid4().hex
        for key, values in (histories or {}).items():
            self.histories[(run_id, key)] = [float(v) for v in values]
        for path, text in (artifacts or {}).items():
            self.artifacts[(run_id, path)] = text
        info = RunInfo(
            run_id,
            self.experiment(experiment),
            "",
            status,
            start_time if start_time is not None else len(self.runs),
            end_time,
            "deleted" if deleted else "active",
            run_name=name,
        )
        data = RunData(
            [Metric(k, v, 0, 0) for k, v in (metrics or {}).items()],
            [Param(k, str(v)) for k, v in (params or {}).items()],
            [RunTag(k, str(v)) for k, v in (tags or {}).items()],
        )
        self.runs[run_id] = Run(info, data)
        return run_id

    # ------------------------------------------------------------ MLflow's client, the part read
    def get_run(self, run_id: str) -> Run:
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST

        if run_id not in self.runs:
            raise MlflowException(f"Run '{run_id}' not found", error_code=RESOURCE_DOES_NOT_EXIST)
        return self.runs[run_id]

    def search_runs(self, experiment_ids, filter_string: str = "", max_results: int = 1000, page_token=None) -> _Page:
        ids = set(experiment_ids)
        runs = [r for r in self.runs.values() if r.info.experiment_id in ids]
        return _Page(mlflow_compat.filter_runs(runs, filter_string))

    def get_metric_history(self, run_id: str, key: str) -> list[Metric]:
        from mlflow.entities import Metric

        return [Metric(key, v, 0, i) for i, v in enumerate(self.histories.get((run_id, key), []))]

    def download_artifacts(self, run_id: str, path: str, dst_path: str) -> str:
        """The artifact written under ``dst_path``; MlflowException where the run has none there."""
        from pathlib import Path

        from mlflow.exceptions import MlflowException

        if (run_id, path) not in self.artifacts:
            raise MlflowException(f"run {run_id}: no artifact {path}")
        out = Path(dst_path) / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(self.artifacts[(run_id, path)])
        return str(out)

    def get_experiment(self, experiment_id: str) -> Experiment:
        return self.experiments[experiment_id]

    def get_experiment_by_name(self, name: str) -> Experiment | None:
        return next((e for e in self.experiments.values() if e.name == name), None)

    def search_experiments(self, view_type=None, max_results: int | None = None) -> list[Experiment]:
        return list(self.experiments.values())
