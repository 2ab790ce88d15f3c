"""A peer's run in a sweep: the config it logs (:class:`PeerConfig`, the job's with what the peer
runs beside it), its tags and its fit (:func:`tags`, :func:`fit`), which its job runs through the jobs'
own code path (:func:`plnexp.experiment.job_task.run_job`). The peers
themselves, and how each is fitted and scored, are declared in :mod:`plnexp.jobs.peers`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..jobs.config import Config, Device, ModelName
from ..core.model import PCA_NAME
from ..core.optim import OptimizerSpec
from ..jobs.peers import PEER_TAG, Peer, following
from ..core.precision import PRECISIONS
from .runner import Outcome


# settings of plnexp's fits that a peer has not: its run's config leaves them out
LEFT_OUT = ("n_iter_cap", "n_iter_requested", "init", "gradient", "seed", "first_call", "compile_cache")


@dataclass(frozen=True)
class PeerConfig(Config):
    """The config a peer's run logs (params, ``config.yaml``): the sweep job's it stands beside (its
    data set, where it is logged, the timed runs), with what the peer runs in plnexp's words; its
    strategy is the peer's name and ``peer.*`` says the rest (:meth:`as_dict`)."""

    peer: Peer | None = None

    def as_dict(self) -> dict:
        out = super().as_dict()
        peer = self.peer
        assert peer is not None  # made by peer_config
        out["strategy"] = {"name": peer.name}
        for key in LEFT_OUT:
            out.pop(key, None)
        versions = {k.removesuffix("_version"): v for k, v in peer.versions().items()}
        out["peer"] = {
            "name": peer.name,
            "package": peer.label,
            "class": peer.cls,
            "call": peer.call,
            **peer.options,
            **versions,
        }
        return out

    @property
    def run_name(self) -> str:
        """``pyplnmodels-oaks-f32-cpu``: the peer, data, precision and device; then ``-pca-rank3``
        where it fits PLN-PCA (as a job's name ends with its ``model=pca model.rank=3``)."""
        assert self.peer is not None
        rank = f"-{PCA_NAME}-rank{self.peer.rank}" if self.peer.rank is not None else ""
        return f"{self.peer.name}-{self.dataset.label}-{self.precision.label}-{self.device.value}{rank}"


def peer_config(peer: Peer, config: Config) -> PeerConfig:
    """``config`` (a sweep job's) with what ``peer`` runs beside it (:func:`following` the job's
    model: its ``peer``): its model (pca's rank the job's), optimizer, precision and iteration cap,
    one fit (no replicates), at least one warm-up fit; its device: the job's where the peer uses a
    GPU here, else the CPU. A model the peer does not fit: :class:`PeerError` (the config refuses it
    first: :func:`plnexp.jobs.config_load.load`)."""
    peer = following(peer, config.model.value, config.rank)
    fields_of = {f: getattr(config, f) for f in Config.__dataclass_fields__}
    return replace(
        PeerConfig(**fields_of, peer=peer),
        model=ModelName(peer.model),
        rank=peer.rank,
        block_rows=None,
        optimizer=OptimizerSpec(peer.optimizer, peer.lr),
        precision=PRECISIONS[peer.precision],
        n_iter=peer.n_iter,
        n_iter_requested=peer.n_iter,
        replicates=1,
        warmup=max(config.warmup, 1),
        device=config.device if peer.uses_gpu() else Device("cpu"),
    )


def tags(pc: Config) -> dict[str, str]:
    """The tags of the peer's run (its job's :func:`plnexp.experiment.job_task.run_job` adds them):
    ``plnexp.peer=<name>`` and the peer's package versions."""
    assert isinstance(pc, PeerConfig) and pc.peer is not None  # a peer's job's config: made by peer_config
    return {PEER_TAG: pc.peer.name, **pc.peer.versions()}


def fit(pc: Config, outcomes: list[Outcome]) -> None:
    """Fit the peer of ``pc`` (:func:`peer_config`) on its data, filling its one outcome: the peer's
    job as :func:`plnexp.experiment.job_task.run_job` runs it (its run created RUNNING first, the
    convergence metrics against the data's best known ELBO apply). An error of the fit makes it FAILED
    with the reason (never raised); an interrupt is raised. Timed with ``repeats`` fits after
    ``max(warmup, 1)``."""
    from ..system import interrupts
    from ..system.commandline import first_line
    from . import runner

    assert isinstance(pc, PeerConfig) and pc.peer is not None  # a peer's job's config: made by peer_config
    peer = pc.peer  # the peer as it follows the job's model (its class, call, rank)
    (out,) = outcomes
    try:
        data = runner.load_data(pc.dataset)
        out.data_digest, out.data_shape = data.digest(), (data.n, data.p)
        out.optimum = runner.best_known(pc.dataset, peer.model)
        rank = {"rank": peer.rank} if peer.rank is not None else {}  # PLN-PCA's q (a Pln fit takes none)
        out.result = peer.fit(data, warmup=pc.warmup, repeats=pc.repeats, **rank)
    except Exception as e:  # a peer's failure is its run's, never the sweep's
        pending = interrupts.pending()
        if pending is not None:  # a Ctrl-C that a library turned into another error
            raise pending from e
        out.status, out.reason = "FAILED", first_line(e)
    out.stop()
