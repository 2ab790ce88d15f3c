"""A sweep's record, ``<sweep_dir>/plnexp-sweep.json``: what every job of the sweep reads (where its
parent run is, how many jobs, who drives it), written whole once by the driver
(:func:`plnexp.experiment.sweep.open_sweep`), its store's URI redacted; :func:`store_of` finds the
real one where a job reaches the store.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import resume
from .. import store
from ..jobs import config as C
from ..system.redact import redact, unredacted

RECORD_NAME = "plnexp-sweep.json"


@dataclass(frozen=True)
class SweepRecord:
    """What every job of a sweep reads: where its parent run is, how many jobs, who drives it."""

    uri: str
    experiment_id: str
    parent_id: str
    name: str
    total: int
    host: str
    pid: int
    started: float  # time.time() when the sweep opened
    clock: float = 0.0  # time.monotonic() then (one clock for the processes of a host)
    reused: tuple = ()  # resume=true: plnexp.experiment.resume.Reused of the jobs that earlier runs answer

    def __post_init__(self):  # read back from JSON: lists and dicts
        object.__setattr__(
            self, "reused", tuple(resume.Reused(*r[:4], tuple(r[4]) if len(r) > 4 else ()) for r in self.reused)
        )

    @property
    def parent(self) -> store.Parent:
        return store.Parent(self.uri, self.experiment_id, self.parent_id)


def new_sweep_dir() -> Path:
    """A fresh folder under ``<outputs>/multirun``, unique even for sweeps started in the same instant."""
    root = C.outputs_dir() / "multirun"
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=time.strftime("%Y-%m-%d_%H-%M-%S-"), dir=root))


def write_record(sweep_dir: Path, record: SweepRecord) -> Path:
    """Write the record whole or not at all; a folder that already holds one is refused. Its
    credentials are masked (:mod:`plnexp.system.redact`): the file outlives the process, and others read it."""
    path = Path(sweep_dir) / RECORD_NAME
    fd, tmp = tempfile.mkstemp(prefix=".plnexp-sweep-", dir=sweep_dir)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(redact(asdict(record)), f, indent=1)
        os.link(tmp, path)  # atomic, and fails if a record is there already
    finally:
        os.unlink(tmp)
    return path


def read_record(sweep_dir) -> SweepRecord | None:
    """The record as written: its ``uri`` redacted where it had a password (:func:`store_of`)."""
    path = Path(str(sweep_dir)) / RECORD_NAME
    if not path.is_file():
        return None
    return SweepRecord(**json.loads(path.read_text()))


def store_of(record: SweepRecord, configured: str | None) -> str:
    """The URI of the sweep's store as a job reaches it. The record the driver opened holds it whole
    (:func:`plnexp.experiment.sweep.open_sweep`: a job in the driver's process is given that record); the
    record read back from its file holds it redacted when it has a password: the real one is then the
    first that redacts to it of the job's own ``tracking_uri`` (the sweep's overrides), ``$MLFLOW_TRACKING_URI``.
    None of them: one :class:`~plnexp.jobs.config.ConfigError` line."""
    uri = unredacted(record.uri, (configured, os.environ.get("MLFLOW_TRACKING_URI")))
    if uri is None:
        raise C.ConfigError(
            f"the sweep's store {record.uri}: its password is not in this job's tracking_uri nor in "
            "MLFLOW_TRACKING_URI; allowed values are the store's full URI, given with tracking_uri= or MLFLOW_TRACKING_URI"
        )
    return uri
