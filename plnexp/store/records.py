"""A run of the store read back as one typed, frozen :class:`RunRecord`, and the :class:`Store` protocol
whose queries answer records: :meth:`~Store.run`, :meth:`~Store.sweep` (a sweep's runs),
:meth:`~Store.children`, :meth:`~Store.finished` and :meth:`~Store.finished_runs`, ... (a store:
``plnexp.store.open(uri)``). Readers outside the store (resume, rerun, groups, the reports, compare,
``sync``'s sweep-up) read these fields, never an MLflow run's raw tags.

:data:`SCHEMA` numbers the mapping below; a change of a field's meaning or source bumps it.

The mapping (MLflow run -> field). Attributes of the run:

================  ==============================================================
``run_id``        ``info.run_id``
``experiment_id`` ``info.experiment_id``
``name``          ``info.run_name``
``status``        ``info.status`` (RUNNING, FINISHED, FAILED, KILLED)
``deleted``       ``info.lifecycle_stage == "deleted"``
``start_time``    ``info.start_time`` (ms since the epoch; None unknown)
``end_time``      ``info.end_time`` (ms; None while RUNNING)
``params``        ``data.params``: the flattened config, as logged (a plain dict)
``metrics``       ``data.metrics``: each metric's latest value (a plain dict)
``tags``          ``data.tags``: every tag, as logged (the provenance compares them whole)
================  ==============================================================

Tags (each name from its one declaration: :mod:`plnexp.jobs.tags`, :mod:`plnexp.jobs.provenance`,
:mod:`plnexp.store.owners`, :mod:`plnexp.store.writes`):

=================  ==========================================  =================================
field              tag                                         read as
=================  ==========================================  =================================
``parent_id``      ``mlflow.parentRunId`` (PARENT_TAG)         "" for a run without a parent
``status_reason``  ``status_reason`` (STATUS_REASON_TAG)       ""
``reason``         ``reason`` (REASON_TAG)                     ""
``job``            ``plnexp.job`` (JOB_TAG)                    int; None: absent or not a number
``kind``           ``plnexp.peer`` / ``plnexp.control``        :class:`~plnexp.jobs.spec.Kind`: PEER
                   (PEER_TAG, CONTROL_TAG)                     with a peer's name, CONTROL when the
                                                               control tag is ``true``, else JOB
``control_of``     ``plnexp.control_of`` (CONTROL_OF_TAG)      int or None
``peer``           ``plnexp.peer`` (PEER_TAG)                  str or None
``replicate``      ``replicate`` (REPLICATE_TAG)               int; 0 when absent (older runs)
``rerun_of``       ``rerun_of`` (RERUN_TAG)                    ""
``config_hash``    ``config_hash`` (HASH_TAG)                  str or None
``overrides``      ``overrides`` (OVERRIDES_TAG)               tuple, split on spaces
``owner``          ``plnexp.host``, ``plnexp.pid``, ...,       :func:`~plnexp.store.owners.owner_of`
                   ``plnexp.slurm_job`` (owners' tags)         (None: no owner named)
``verdict``        ``plnexp.verdict`` (VERDICT_TAG)            ""
``reference``      ``plnexp.reference`` (REFERENCE_TAG)        ""
``group``          ``plnexp.group`` (GROUP_TAG)                ""
``data_digest``    ``data_digest`` (DATA_TAG)                  ""
``dataset``        ``dataset`` (DATASET_TAG)                   ""
``data_shape``     ``data_n``, ``data_p`` (DATA_N/P_TAG)       (n, p), either None when unknown
``platform``       ``platform`` (PLATFORM_TAG)                 ""
``fingerprint``    ``hlo_fingerprint`` (FINGERPRINT_TAG)       ""
``provenance``     ``plnexp.provenance`` (FORMAT_TAG)          str or None (older runs: none)
``version``        ``plnexp.version`` (VERSION_TAG)            ""
``sweep``          ``sweep`` (SWEEP_TAG), a parent's           str or None
``jobs``           ``jobs`` (JOBS_TAG), a parent's             int or None
``command``        ``command`` (COMMAND_TAG), a parent's       ""
``resumes``        ``resumes`` (RESUMES_TAG), a parent's       tuple of parent run ids
=================  ==========================================  =================================

:data:`FIELDS` holds the tag table for code (the tests read the mapping back both ways through it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, overload

from ..jobs.provenance import DATA_TAG, FORMAT_TAG, HASH_TAG, PLATFORM_TAG, REPLICATE_TAG, RERUN_TAG, RESUMES_TAG
from ..jobs.provenance import VERSION_TAG
from ..jobs.spec import Kind
from ..jobs.tags import COMMAND_TAG, CONTROL_OF_TAG, CONTROL_TAG, DATA_N_TAG, DATA_P_TAG, DATASET_TAG, GROUP_TAG
from ..jobs.tags import JOB_TAG, JOBS_TAG, OVERRIDES_TAG, PARENT_TAG, PEER_TAG, REASON_TAG, REFERENCE_TAG
from ..jobs.tags import STATUS_REASON_TAG, SWEEP_TAG, VERDICT_TAG
from . import owners
from .owners import Owner
from .writes import CURVE_KEY, FINGERPRINT_TAG, Parent

if TYPE_CHECKING:
    import numpy as np

SCHEMA = 1  # the mapping of the module's docstring; a field whose source or meaning changes bumps it


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _text(text: str | None) -> str:
    return text or ""


def _maybe(text: str | None) -> str | None:
    return text


def _job(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _replicate(text: str | None) -> int:
    return int(text or 0)  # 0 when absent: runs logged before replicates were tagged


def _words(text: str | None) -> tuple[str, ...]:
    return tuple(filter(None, (text or "").split(" ")))


def _ids(text: str | None) -> tuple[str, ...]:
    return tuple(filter(None, (text or "").split(",")))


T = TypeVar("T")


class _Tag(Generic[T]):
    """A field of :class:`RunRecord` read from one tag of the run: ``read`` of its value (None where
    the run has none)."""

    def __init__(self, key: str, read: Callable[[str | None], T]):
        self.key, self.read = key, read

    @overload
    def __get__(self, record: None, owner: type) -> _Tag[T]: ...
    @overload
    def __get__(self, record: RunRecord, owner: type) -> T: ...
    def __get__(self, record, owner):
        return self if record is None else self.read(record.tags.get(self.key))


@dataclass(frozen=True)
class RunRecord:
    """One run of the store, read back (see the module's docstring for where each field comes from)."""

    run_id: str
    experiment_id: str
    name: str
    status: str
    deleted: bool = False
    start_time: int | None = None
    end_time: int | None = None
    params: dict[str, str] = field(default_factory=dict, repr=False)
    metrics: dict[str, float] = field(default_factory=dict, repr=False)
    tags: dict[str, str] = field(default_factory=dict, repr=False)
    schema: int = field(default=SCHEMA, compare=False, repr=False)

    # ------------------------------------------------------------ what the run is in its sweep
    parent_id = _Tag(PARENT_TAG, _text)
    job = _Tag(JOB_TAG, _job)
    peer = _Tag(PEER_TAG, _maybe)
    control_of = _Tag(CONTROL_OF_TAG, _int)
    replicate = _Tag(REPLICATE_TAG, _replicate)
    rerun_of = _Tag(RERUN_TAG, _text)
    config_hash = _Tag(HASH_TAG, _maybe)
    overrides = _Tag(OVERRIDES_TAG, _words)
    # ------------------------------------------------------------ how it ended
    status_reason = _Tag(STATUS_REASON_TAG, _text)
    reason = _Tag(REASON_TAG, _text)
    # ------------------------------------------------------------ the verdict of its group's rounds
    verdict = _Tag(VERDICT_TAG, _text)
    reference = _Tag(REFERENCE_TAG, _text)
    group = _Tag(GROUP_TAG, _text)
    # ------------------------------------------------------------ its data and environment
    data_digest = _Tag(DATA_TAG, _text)
    dataset = _Tag(DATASET_TAG, _text)
    platform = _Tag(PLATFORM_TAG, _text)
    fingerprint = _Tag(FINGERPRINT_TAG, _text)
    provenance = _Tag(FORMAT_TAG, _maybe)
    version = _Tag(VERSION_TAG, _text)
    # ------------------------------------------------------------ a sweep's parent run
    sweep = _Tag(SWEEP_TAG, _maybe)
    jobs = _Tag(JOBS_TAG, _int)
    command = _Tag(COMMAND_TAG, _text)
    resumes = _Tag(RESUMES_TAG, _ids)

    # ------------------------------------------------------------ fields of several tags
    @property
    def kind(self) -> Kind:
        if self.peer is not None:
            return Kind.PEER
        return Kind.CONTROL if self.tags.get(CONTROL_TAG) == "true" else Kind.JOB

    @property
    def control(self) -> bool:
        """The sweep's control job (its reference job run again, never ranked)."""
        return self.kind is Kind.CONTROL

    @property
    def control_tags(self) -> dict[str, str]:
        """The control job's own tags, as logged (a rerun of the control job keeps them)."""
        return {k: self.tags[k] for k in (CONTROL_TAG, CONTROL_OF_TAG) if k in self.tags}

    @property
    def key(self) -> tuple[str | None, int]:
        """What identifies the run's fit: its config hash and replicate."""
        return self.config_hash, self.replicate

    @property
    def owner(self) -> Owner | None:
        return owners.owner_of(self.tags)

    @property
    def data_shape(self) -> tuple[int | None, int | None]:
        return _int(self.tags.get(DATA_N_TAG)), _int(self.tags.get(DATA_P_TAG))

    @property
    def is_parent(self) -> bool:
        """Whether the run is a sweep's parent run (tagged with its sweep, itself without a parent)."""
        return self.sweep is not None and not self.parent_id


# field -> the tag it is read from (one tag each; kind, owner and data_shape read several: see the docstring)
FIELDS = {name: d.key for name, d in vars(RunRecord).items() if isinstance(d, _Tag)}


def record(run) -> RunRecord:
    """The record of a run as MLflow's client returns it (``info`` and ``data``)."""
    info, data = run.info, run.data
    return RunRecord(
        info.run_id,
        info.experiment_id,
        info.run_name or "",
        info.status,
        info.lifecycle_stage == "deleted",
        info.start_time,
        info.end_time,
        dict(data.params),
        {k: float(v) for k, v in data.metrics.items()},
        dict(data.tags),
    )


# ---------------------------------------------------------------- the store, read as records
class Store(Protocol):
    """A store read as records: the MLflow one (:class:`plnexp.store.queries.MlflowStore`) or an
    in-memory one (:class:`plnexp.store.memory.MemoryStore`, the unit tests'); :func:`plnexp.store.open`
    gives the store of a URI. Each implements the first seven methods; the queries after them
    (a sweep's runs, the finished runs of config hashes, ...) are the same for both, written once here."""

    def run(self, run_id: str) -> RunRecord | None:
        """The run ``run_id`` (deleted or not), or None if the store has no such run."""
        ...

    def search(
        self, experiment_ids: list[str] | None, status: str | None = None, tags: dict[str, str | None] | None = None
    ) -> list[RunRecord]:
        """The runs (not deleted) of the experiments ``experiment_ids`` (None: every active one) with
        ``status`` (None: any) and the ``tags`` (each with that value; None: with any value)."""
        ...

    def find_experiment(self, name: str) -> str | None:
        """The id of the experiment ``name``, or None if the store has none (nothing is created)."""
        ...

    def experiment_name(self, experiment_id: str) -> str: ...

    def experiment_names(self) -> list[str]:
        """The names of the store's active experiments, sorted."""
        ...

    def curve(self, run_id: str, key: str = CURVE_KEY) -> np.ndarray:
        """A run's step metric ``key`` (the ELBO curve by default), in step order."""
        ...

    def artifact(self, run_id: str, path: str) -> str | None:
        """The text of a run's artifact ``path``, or of ``path.gz`` (how a large text artifact is
        written: :data:`~plnexp.store.writes.GZIP_OVER`), or None if it has neither."""
        ...

    def children(self, parent: RunRecord | Parent) -> list[RunRecord]:
        """The child runs of a sweep's parent run (a record or the sweep's :class:`Parent`), any
        status, in job order."""
        runs = self.search([parent.experiment_id], tags={PARENT_TAG: parent.run_id})
        return sorted(runs, key=lambda r: (r.job or 0, r.start_time or 0))

    def sweep(self, parent: RunRecord | str) -> list[RunRecord]:
        """The runs that make up the sweep whose parent run is ``parent`` (a record or its id), in job
        order: its children, and the FINISHED children of the sweeps it resumed (:attr:`RunRecord.resumes`)
        whose fit (config hash, replicate) none of its own job runs answers. A control job repeats its
        reference job's config (one config hash): an earlier sweep's control stands for no job (it is
        left out), and this sweep's own control hides no earlier run. ``[]`` for a run that is not a
        sweep's parent (it has no children)."""
        found = parent if isinstance(parent, RunRecord) else self.run(parent)
        if found is None:
            return []
        own = self.children(found)
        have = {r.key for r in own if not r.control}
        earlier = []
        for pid in found.resumes:
            resumed = self.run(pid)
            for r in self.children(resumed) if resumed is not None else []:
                if r.status == "FINISHED" and not r.control and r.key not in have:
                    earlier.append(r)
                    have.add(r.key)
        return sorted(earlier + own, key=lambda r: r.job or 0)

    def finished_runs(self, experiment: str) -> list[RunRecord]:
        """The FINISHED job runs of the experiment ``experiment`` (by name), newest first: those with a
        config hash, a sweep's control jobs left out (one repeats its reference job's config but answers
        no job of a grid). ``[]`` when there is no such experiment (nothing is created)."""
        exp_id = self.find_experiment(experiment)
        runs = self.search([exp_id], "FINISHED") if exp_id is not None else []
        return sorted((r for r in runs if r.config_hash and not r.control), key=lambda r: -(r.start_time or 0))

    def finished(self, experiment: str, hashes: Iterable[str]) -> dict[str, list[RunRecord]]:
        """The FINISHED job runs (:meth:`finished_runs`) that answer each of the config ``hashes``, newest
        first (a hash of ``replicates=K`` has a run per replicate, and a config may have run several
        times); a hash no run answers is left out."""
        wanted = set(hashes)
        out: dict[str, list[RunRecord]] = {}
        for r in self.finished_runs(experiment):
            if r.config_hash in wanted:
                out.setdefault(r.config_hash, []).append(r)
        return out

    def latest_parent(self, experiment: str | None = None) -> RunRecord | None:
        """The newest sweep's parent run, in ``experiment`` or in the whole store; None if there is none."""
        ids = None
        if experiment is not None:
            exp_id = self.find_experiment(experiment)
            ids = [exp_id] if exp_id is not None else []
        parents = [r for r in self.search(ids, tags={SWEEP_TAG: None}) if r.is_parent]
        return max(parents, key=lambda r: r.start_time or 0, default=None)
