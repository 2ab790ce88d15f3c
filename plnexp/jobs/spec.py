"""A job as the project plans, ships and runs it: :class:`JobSpec`, the spine between the command
line and the store.

``plan`` (:mod:`plnexp.experiment.plan`) composes each job's config once (Hydra) and validates it once
into a frozen :class:`~plnexp.jobs.config.Config`; the spec adds what the job is in its command (its
number, its name, its kind, the tags its run gets) and nothing else. Executors
(:mod:`plnexp.experiment.executors`) receive specs, never overrides: a spec pickles whole to a joblib
worker or a SLURM task, where nothing is composed or loaded again. A spec holds no secret (a
credential in a config value is refused before any spec exists: :mod:`plnexp.system.credentials`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from . import provenance
from .config import Config

SCHEMA = 1  # JobSpec's fields and their meaning; a new field with a default keeps it


class Kind(StrEnum):
    """What a job is in its sweep: a job of the grid, the control job (a grid job's A/A repeat), or a
    peer's fit (another package's default fit of the same data, :mod:`plnexp.jobs.peers`)."""

    JOB = "job"
    CONTROL = "control"
    PEER = "peer"

    @staticmethod
    def counted(kinds) -> str:
        """How many jobs of each kind (``kinds``: a job's kind each), in order of first appearance:
        ``2 jobs, 1 control, 1 peer`` ("nothing" for none): the dry run's and a resumed sweep's count."""
        counts = Counter(str(k) for k in kinds)
        return ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in counts.items()) or "nothing"


@dataclass(frozen=True)
class JobSpec:
    """One job, resolved: its config, its place in the command (``num``: the job number its run is
    tagged with; None for a single ``run``), its run name, the overrides that named it (for the run's
    ``overrides`` tag and its name) and the tags its run gets beyond the provenance (the control job's,
    a rerun's ``rerun_of``). ``peer``: the peer's name (:data:`plnexp.jobs.peers.PEERS`) of a
    :attr:`Kind.PEER` job, whose config is the job's it follows."""

    config: Config
    name: str
    num: int | None = None
    overrides: tuple[str, ...] = ()
    kind: Kind = Kind.JOB
    tags: tuple[tuple[str, str], ...] | dict[str, str] = ()  # a tuple of pairs once made
    peer: str | None = None
    schema: int = field(default=SCHEMA, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "overrides", tuple(self.overrides))
        tags = self.tags.items() if isinstance(self.tags, dict) else self.tags
        object.__setattr__(self, "tags", tuple((str(k), str(v)) for k, v in tags))
        if (self.kind is Kind.PEER) != (self.peer is not None):
            raise ValueError(f"job {self.name}: a peer's job names its peer, and only a peer's job does")

    @property
    def hash(self) -> str:
        """The canonical hash of what the job fits (:func:`plnexp.jobs.provenance.config_hash`): what
        ``resume=true`` matches a finished run on, and what a rerun reproduces."""
        return provenance.config_hash(self.config)

    @property
    def run_tags(self) -> dict[str, str]:
        return dict(self.tags)
