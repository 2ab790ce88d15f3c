"""An in-memory store for unit tests: records (:class:`~plnexp.store.records.RunRecord`) held
directly, read through the same :class:`~plnexp.store.records.Store` queries as the MLflow store.

A store is named by a ``memory:NAME`` URI (:func:`new`); ``plnexp.store.open`` answers such a URI
with the :class:`MemoryStore` of that name. Its runs are records (:meth:`MemoryStore.add`), with
their step metrics (``histories``) and text artifacts, so that a report reads a sweep from here.
Nothing of MLflow is faked: a writer still needs a real store (``tests/test_records.py`` checks that a
run written by the real path reads back from here as it does from there)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .records import RunRecord, Store
from .writes import CURVE_KEY

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


@dataclass
class MemoryStore(Store):
    """Experiments (id -> name) and runs (id -> record) held in dicts, with the runs' step metrics and
    text artifacts."""

    experiments: dict[str, str] = field(default_factory=dict)
    runs: dict[str, RunRecord] = field(default_factory=dict)
    histories: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (run, key) -> values by step
    artifacts: dict[tuple[str, str], str] = field(default_factory=dict)  # (run, path) -> text

    def experiment(self, name: str) -> str:
        """The id of the experiment ``name``, created if new."""
        found = self.find_experiment(name)
        if found is not None:
            return found
        exp_id = str(len(self.experiments) + 1)
        self.experiments[exp_id] = name
        return exp_id

    def add(
        self,
        experiment: str,
        name: str = "",
        status: str = "FINISHED",
        *,
        run_id: str | None = None,
        histories: dict | None = None,
        artifacts: dict | None = None,
        **fields: Any,
    ) -> str:
        """A run of the experiment ``experiment`` (by name); returns its id. ``fields``: the record's
        others (``params``, ``metrics``, ``tags``, ``start_time``: the run's rank when none, ...) as a
        :class:`RunRecord` takes them; ``histories``: step metrics (key -> values, step 0 first);
        ``artifacts``: text files (path -> text)."""
        run_id = run_id or uuid.uuid4().hex
        for key, values in (histories or {}).items():
            self.histories[(run_id, key)] = [float(v) for v in values]
        for path, text in (artifacts or {}).items():
            self.artifacts[(run_id, path)] = text
        if fields.get("start_time") is None:
            fields["start_time"] = len(self.runs)
        self.runs[run_id] = RunRecord(run_id, self.experiment(experiment), name, status, **fields)
        return run_id

    # ------------------------------------------------------------ the Store protocol
    def run(self, run_id: str) -> RunRecord | None:
        return self.runs.get(run_id)

    def search(
        self, experiment_ids: list[str] | None, status: str | None = None, tags: dict[str, str | None] | None = None
    ) -> list[RunRecord]:
        return [
            r
            for r in self.runs.values()
            if (experiment_ids is None or r.experiment_id in experiment_ids)
            and not r.deleted
            and status in (None, r.status)
            and all(k in r.tags and v in (None, r.tags[k]) for k, v in (tags or {}).items())
        ]

    def find_experiment(self, name: str) -> str | None:
        return next((i for i, n in self.experiments.items() if n == name), None)

    def experiment_name(self, experiment_id: str) -> str:
        return self.experiments[experiment_id]

    def experiment_names(self) -> list[str]:
        return sorted(self.experiments.values())

    def curve(self, run_id: str, key: str = CURVE_KEY) -> np.ndarray:
        return np.asarray(self.histories.get((run_id, key), []), dtype=np.float64)

    def artifact(self, run_id: str, path: str) -> str | None:
        return self.artifacts.get((run_id, path))
