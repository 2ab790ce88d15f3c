"""An in-memory store for unit tests: runs made from plain dicts, read back through the very
queries and records (:mod:`plnexp.store.records`) that read a real store.

A store is named by a ``memory:NAME`` URI (:func:`new`); :func:`plnexp.store.backend.client` answers
such a URI with the :class:`MemoryStore` of that name, which has the part of MLflow's client that
the reading queries call: ``get_run``, ``search_runs`` (the filters :mod:`plnexp.store.queries`
writes: ``attributes.status``, ``tags.`KEY``` with ``=``, ``!=`` or ``LIKE``, joined by ``and``),
``get_experiment``, ``get_experiment_by_name``, ``search_experiments``, ``get_metric_history`` (a
run's step metrics: :meth:`MemoryStore.add`'s ``histories``) and ``download_artifacts`` (its text
artifacts: :meth:`MemoryStore.add`'s ``artifacts``), so that a report reads a sweep from here. Nothing else of MLflow
is faked: a writer still needs a real store (``tests/test_records.py`` checks that a run written
by the real path reads back from here as it does from there)."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class _Info:
    run_id: str
    experiment_id: str
    run_name: str
    status: str
    lifecycle_stage: str
    start_time: int | None
    end_time: int | None


@dataclass(frozen=True)
class _Data:
    params: dict
    metrics: dict
    tags: dict


@dataclass(frozen=True)
class _Run:
    info: _Info
    data: _Data


@dataclass(frozen=True)
class _Step:
    step: int
    value: float


@dataclass(frozen=True)
class _Experiment:
    experiment_id: str
    name: str


class _Page(list):
    token = None  # one page holds every run


_CLAUSE = re.compile(r"^(attributes|tags|params)\.(?:`([^`]+)`|([\w.]+))\s*(=|!=|LIKE)\s*'(.*)'$", re.IGNORECASE)


def _matches(run: _Run, filter_string: str) -> bool:
    for clause in filter(None, (c.strip() for c in re.split(r"\s+and\s+", filter_string, flags=re.IGNORECASE))):
        m = _CLAUSE.match(clause)
        if m is None:
            raise ValueError(f"in-memory store: filter {clause!r} not understood")
        where, quoted, bare, op, value = m.groups()
        key = quoted or bare
        have = {"attributes": vars(run.info), "tags": run.data.tags, "params": run.data.params}[where.lower()].get(key)
        if op.upper() == "LIKE":
            pattern = "^" + ".*".join(map(re.escape, value.split("%"))) + "$"
            ok = have is not None and re.match(pattern, str(have)) is not None
        else:
            ok = (have is not None and str(have) == value) == (op == "=")
        if not ok:
            return False
    return True


@dataclass
class MemoryStore:
    """Experiments and runs held in dicts, in the shape MLflow's client returns them."""

    experiments: dict[str, _Experiment] = field(default_factory=dict)
    runs: dict[str, _Run] = field(default_factory=dict)
    histories: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (run, key) -> values by step
    artifacts: dict[tuple[str, str], str] = field(default_factory=dict)  # (run, path) -> text

    def experiment(self, name: str) -> str:
        """The id of the experiment ``name``, created if new."""
        for e in self.experiments.values():
            if e.name == name:
                return e.experiment_id
        exp_id = str(len(self.experiments) + 1)
        self.experiments[exp_id] = _Experiment(exp_id, name)
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
        run_id = run_id or uuid.uuid4().hex
        for key, values in (histories or {}).items():
            self.histories[(run_id, key)] = [float(v) for v in values]
        for path, text in (artifacts or {}).items():
            self.artifacts[(run_id, path)] = text
        info = _Info(
            run_id,
            self.experiment(experiment),
            name,
            status,
            "deleted" if deleted else "active",
            start_time if start_time is not None else len(self.runs),
            end_time,
        )
        self.runs[run_id] = _Run(info, _Data(dict(params or {}), dict(metrics or {}), dict(tags or {})))
        return run_id

    # ------------------------------------------------------------ MLflow's client, the part read
    def get_run(self, run_id: str) -> _Run:
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST

        if run_id not in self.runs:
            raise MlflowException(f"Run '{run_id}' not found", error_code=RESOURCE_DOES_NOT_EXIST)
        return self.runs[run_id]

    def search_runs(self, experiment_ids, filter_string: str = "", max_results: int = 1000, page_token=None) -> _Page:
        ids = set(experiment_ids)
        return _Page(r for r in self.runs.values() if r.info.experiment_id in ids and _matches(r, filter_string))

    def get_metric_history(self, run_id: str, key: str) -> list[_Step]:
        return [_Step(i, v) for i, v in enumerate(self.histories.get((run_id, key), []))]

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

    def get_experiment(self, experiment_id: str) -> _Experiment:
        return self.experiments[experiment_id]

    def get_experiment_by_name(self, name: str) -> _Experiment | None:
        return next((e for e in self.experiments.values() if e.name == name), None)

    def search_experiments(self, view_type=None, max_results: int | None = None) -> list[_Experiment]:
        return list(self.experiments.values())
