"""What a rerun repeats (``python -m plnexp rerun RUN_ID``, :mod:`plnexp.experiment.rerun`): the
logged run found in the store (for a sweep's parent, its runs), each one's config rebuilt from its
``config.yaml`` artifact with the rerun's overrides applied (:class:`Source`), every job checked
before any run exists (:func:`prepare`).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml

from ..jobs import config as C
from ..jobs import config_load
from ..jobs import provenance
from . import runner
from .. import store
from ..jobs.config import Config, ConfigError
from ..jobs.spec import JobSpec, Kind
from .sweep_extras import peer_spec

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..store.records import RunRecord

RUN_ID = re.compile(r"^[0-9a-f]{32}$")
FORBIDDEN = ("experiment", "tracking_uri", "sweep")  # a rerun goes where its original is


@dataclass
class Source:
    """One run to rerun: the original (its record) and the config the rerun will use."""

    run: RunRecord
    original: Config
    config: Config
    peer: str | None = None  # a peer's run (tag plnexp.peer): the peer's name; its configs are the job's it followed

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def name(self) -> str:
        return self.run.name

    def spec(self, overrides=(), num: int | None = None, config: Config | None = None) -> JobSpec:
        """The rerun as a job: the config (default: the rerun's, the overrides applied), named as a
        job of that config is (precision=float64 gives ...-f64-...) when overrides change it, else
        the original's name; tagged with the run it repeats; job number ``num`` of the rerun's
        sweep. A sweep's control job reruns as the control job (its tags kept: the rerun's A/A
        pair); a peer's run as a peer's job (:func:`plnexp.experiment.sweep_extras.peer_spec`),
        its config what the peer runs beside the job it followed."""
        config = self.config if config is None else config
        rerun_of = {provenance.RERUN_TAG: self.run_id}
        if self.peer is not None:
            return peer_spec(self.peer, config, num, rerun_of, self.name)
        logged = self.run.overrides + tuple(overrides)  # (job_name names a key given twice once, as it runs)
        base = self.name.removesuffix(f"-rep{self.run.replicate}") if self.original.replicates > 1 else self.name
        name = config.job_name(logged) if overrides else base  # a replicate's run reruns as its job: one suffix
        kind = Kind.CONTROL if self.run.control else Kind.JOB
        return JobSpec(config, name, num, logged, kind, {**self.run.control_tags, **rerun_of})

    @property
    def same_config(self) -> bool:
        """Whether the rerun fits what the original did: its config hash (the original's tag, else
        its logged config's) is the rerun spec's."""
        return (self.run.config_hash or self.spec(config=self.original).hash) == self.spec().hash


# ---------------------------------------------------------------- rebuilding a run's config
def apply_overrides(node: dict, overrides: list[str]) -> DictConfig:
    """``node`` (a logged config, loadable) with Hydra-style overrides applied: ``group=option``
    replaces the group's key with what Hydra composes for that option (every group of ``conf/`` sets
    the key named after it, whatever its package), ``key=value`` sets an existing key."""
    from omegaconf import OmegaConf

    from . import plan

    parsed = plan.parse(overrides)
    plan.check_groups(parsed)
    cfg = OmegaConf.create(node)
    for text, p in zip(overrides, parsed):
        key = p.key_or_group
        if p.is_sweep_override():
            raise ConfigError(f"{text}: a rerun takes one value per key; allowed forms are key=value, group=option")
        if p.is_add() or p.is_delete() or p.is_force_add() or key.startswith(("hydra.", "hydra/")):
            raise ConfigError(f"{text}: not allowed in a rerun; allowed forms are key=value, group=option")
        if key.split(".")[0] in FORBIDDEN:
            raise ConfigError(
                f"{text}: a rerun goes to the original's experiment and store; allowed overrides are the other keys"
            )
        if key in C.GROUPS:  # the option's value of its key, as Hydra composes it, replaces the logged one
            cfg[key] = plan.group_value(key, p.get_value_element_as_str())
            continue
        plan.check_keys([p], cfg)  # as a sweep's job: a key the (logged) config does not have is one line
        OmegaConf.update(cfg, key, p.value(), merge=False)
    return cfg


def logged_node(uri: str, run: RunRecord) -> tuple[dict, Config]:
    """The loadable config of a logged run, from its ``config.yaml`` artifact, and that config
    loaded; one line if missing or made by an incompatible plnexp."""
    rid = run.run_id
    fmt = run.provenance
    if fmt is not None and fmt != provenance.PROVENANCE_VERSION:
        raise ConfigError(
            f"run {rid}: logged by plnexp {run.version or '?'} in "
            f"provenance format {fmt}; allowed values are runs of format "
            f"{provenance.PROVENANCE_VERSION} (plnexp {provenance.package_version()})"
        )
    text = store.open(uri).artifact(rid, "config.yaml")
    if text is None:
        raise ConfigError(
            f"run {rid} ({run.name}): its config artifact config.yaml is missing; allowed "
            f"values are runs logged by plnexp with their resolved config"
        )
    try:
        node = yaml.safe_load(text)
        if not isinstance(node, dict):
            raise ValueError("not a mapping")
        node = dict(node)
        if "n_iter_requested" in node:  # the resolved n_iter is re-derived from the request and the caps
            node["n_iter"] = node.pop("n_iter_requested")
        node = provenance.migrate_node(node)
        if peer_of(run) is not None:
            node = job_node_of_peer(node)
        original = config_load.load(node, check_device=False)
    except (ValueError, TypeError, yaml.YAMLError) as e:  # (a ConfigError is a ValueError)
        if isinstance(e, ConfigError) and "allowed values are paths of existing" in str(e):
            raise ConfigError(f"run {rid}: {e}") from None  # the config is fine, its data file is gone (CSV, .h5ad)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(
            f"run {rid}: made by an incompatible older plnexp (its config.yaml does not load: "
            f"{first}); allowed values are runs logged by plnexp {provenance.package_version()}"
        ) from None
    return node, original


def peer_of(run: RunRecord) -> str | None:
    """The peer whose run ``run`` is (tag ``plnexp.peer``), else None. A peer the registry no longer
    has: one line."""
    from ..jobs.peers import PEERS

    name = run.peer
    if name is not None and name not in PEERS:
        raise ConfigError(
            f"run {run.run_id}: a run of the peer {name!r}, which this plnexp does not have; "
            f"allowed values are runs of plnexp's jobs and of the peers {', '.join(PEERS)}"
        )
    return name


def job_node_of_peer(node: dict) -> dict:
    """A peer run's logged config (:meth:`plnexp.experiment.peer_runs.PeerConfig.as_dict`) as the
    config of a job the peer follows: without ``peer``, with a strategy of plnexp's (the peer's
    config takes its model, optimizer, precision and iteration cap from the peer, never from the
    job: :func:`~plnexp.experiment.peer_runs.peer_config`), the keys a peer run leaves out at
    their defaults."""
    from dataclasses import MISSING, fields

    from .peer_runs import LEFT_OUT

    node = {k: v for k, v in node.items() if k != "peer"}
    node["strategy"] = {"name": "scan"}
    for f in fields(Config):  # the keys a peer's run does not log (settings of plnexp's fits alone)
        if f.name in LEFT_OUT and f.name not in node and f.name != "n_iter_requested":  # n_iter: the cap it ran
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            if default is not MISSING:
                node[f.name] = getattr(default, "value", default)
    return node


def source(uri: str, run: RunRecord, overrides: list[str], experiment: str) -> Source:
    node, original = logged_node(uri, run)
    node = {**node, "experiment": experiment, "tracking_uri": uri}
    return Source(run, original, config_load.load(apply_overrides(node, overrides)), peer_of(run))


def find(uri: str, run_id: str) -> RunRecord:
    if not RUN_ID.match(run_id):
        raise ConfigError(
            f"run id {run_id!r}: malformed; allowed values are MLflow run ids (32 hexadecimal characters)"
        )
    run = store.open(uri).run(run_id)
    if run is None or run.deleted:
        raise ConfigError(
            f"run {run_id}: not found in the store {uri}; allowed values are ids of runs in this "
            f"store (MLFLOW_TRACKING_URI or PLNEXP_OUTPUTS selects another)"
        )
    return run


def originals(uri: str, run: RunRecord) -> list[RunRecord]:
    """The runs a rerun of ``run`` repeats: ``[run]``, or for a sweep's parent the runs of the sweep
    (its children and the FINISHED children of the sweeps it resumed: :meth:`plnexp.store.Store.sweep`)."""
    runs = store.open(uri).sweep(run)
    # a job of replicates=K is K runs of one program: it reruns as one job, each run compared (rerun.pairs)
    return [r for r in runs if r.replicate == 0] or [run]


def store_override(overrides: list[str]) -> tuple[str | None, list[str]]:
    """``tracking_uri=URI`` on a rerun's command line: the store the run is in (and the rerun goes
    to; the last one given wins), and the other overrides. Without it the store is
    ``$MLFLOW_TRACKING_URI`` or the local one under the outputs folder: never the run's logged
    ``tracking_uri``, which holds ``***`` in place of a password (:mod:`plnexp.system.redact`)."""
    given = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "tracking_uri"]
    return (given[-1] if given else None), [o for o in overrides if o.split("=", 1)[0] != "tracking_uri"]


def prepare(
    run_id: str, overrides: list[str], given_store: str | None = None
) -> tuple[str, RunRecord, list[Source], dict[str, str]]:
    """Everything before the first run exists: (store URI, original run, sources, data digests by
    run id); ``given_store``: the ``tracking_uri=`` given (:func:`store_override`). Raises ConfigError,
    DataError or StoreError (one line each; a URI holding ``***`` is refused by the store's check)."""
    from . import plan

    plan.check_outputs()
    uri = store.check_store(given_store)
    runner.load_data.cache_clear()  # a CSV file may have changed since this process read it
    find(uri, run_id)  # a malformed or unknown id fails before anything is written
    orphans = store.sweep_up_orphans(uri)  # as every command does: runs of dead processes are FAILED
    if orphans:
        print(
            f"plnexp: {len(orphans)} run(s) left RUNNING by processes of this host that no longer exist, "
            f"marked FAILED (reason=orphaned)",
            file=sys.stderr,
            flush=True,
        )
    run = find(uri, run_id)
    db = store.open(uri)
    experiment = db.experiment_name(run.experiment_id)
    for r in [run, *db.children(run)]:
        if r.status == "RUNNING":
            of = "" if r is run else f" ({r.name}) of sweep {run_id}"
            raise ConfigError(
                f"run {r.run_id}{of}: still RUNNING; allowed values are ended runs (FINISHED, FAILED, KILLED)"
            )
    sources = [source(uri, r, overrides, experiment) for r in originals(uri, run)]
    plan.check_data([plan.Job((), s.config) for s in sources])  # as run and sweep: limits, rank, sparse counts
    digests = {s.run_id: runner.load_data(s.config.dataset).digest() for s in sources}
    return uri, run, sources, digests
