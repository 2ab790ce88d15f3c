"""The jobs a sweep runs after its grid, in its driver: its control job (:func:`control_reference`)
and its peers' fits, planned with the grid (:func:`extras`, from
:meth:`plnexp.experiment.plan.Plan.specs`), from the grid's configs alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..jobs import config as C
from ..jobs.spec import JobSpec, Kind


def control_reference(configs: list[C.Config]) -> int | None:
    """The job of a sweep's grid (in job order) that its control job repeats
    (:func:`extras`): the first whose strategy is ``scan`` (the reference strategy
    of the report's ``× scan``), else the first job. None when the sweep has no control job:
    ``report.control=false``, rounds on (``report.rounds`` > 0: they measure the noise, paired:
    :mod:`plnexp.experiment.groups`), fewer than 2 jobs, or no timings compared (one strategy only, or the
    reference timed fewer than :data:`plnexp.jobs.ranking.MIN_RUNS` times, ``repeats``: the report ranks
    nothing then)."""
    from ..jobs.ranking import MIN_RUNS

    if len(configs) < 2 or not configs[0].report.control or configs[0].report.rounds > 0:
        return None
    if len({repr(c.strategy.as_dict()) for c in configs}) < 2:
        return None
    ref = reference_of(configs)
    return ref if configs[ref].repeats >= MIN_RUNS else None


def reference_of(configs: Sequence[C.Config]) -> int:
    """The reference among ``configs`` (a grid's: the job its control job repeats; a group's, by
    :mod:`plnexp.experiment.groups`: the job its ratios divide by): the first whose strategy is
    ``scan``, else the first."""
    return next((i for i, c in enumerate(configs) if c.strategy.name == "scan"), 0)


def extras(grid: list[JobSpec]) -> list[JobSpec]:
    """The jobs a sweep runs after its grid, in the driver, decided from the grid's configs alone.

    The **control job**: the grid's reference job (:func:`control_reference`) once more, same
    config, named ``control-<its name>``, tagged ``plnexp.control=true`` and ``plnexp.control_of=<its
    job number>``, job number ``len(grid)``. The report pairs it with its original as an A/A test of
    the between-job noise (:func:`plnexp.jobs.ranking.noise`) and never ranks it. Only where the
    driver runs every job of the grid, one after the other (the basic launcher): with a launcher of
    other processes the jobs' timings are contended or not comparable anyway. It runs only if its
    reference finished (or was reused: a resumed sweep runs it again, an earlier control is never
    reused).

    The **peers** (``report.peers``: other packages' fits of the same model,
    :mod:`plnexp.jobs.peers`): each peer's default fit once per data set of the grid and model it
    fits there (:func:`plnexp.jobs.peers.following`: pyPLNmodels' Pln for full and profiled alike,
    its PlnPCA once per rank), in job order, job numbers from ``len(grid) + 1``; the spec's config is
    what the peer runs (:func:`plnexp.experiment.peer_runs.peer_config`), tagged ``plnexp.peer_of``
    with the job whose data it fits. A peer is a guest: not installed, it is one line and no run;
    failed, its run is FAILED; neither changes the sweep's status nor its exit code."""
    from ..jobs import peers as P
    from ..jobs.tags import CONTROL_OF_TAG, CONTROL_TAG
    from ..jobs.tags import PEER_OF_TAG

    if not grid:
        return []
    configs = [s.config for s in grid]
    out = []
    ref = control_reference(configs)
    if ref is not None:
        job = grid[ref]
        tags = {CONTROL_TAG: "true", CONTROL_OF_TAG: str(ref)}
        out.append(JobSpec(job.config, f"control-{job.name}", len(grid), job.overrides, Kind.CONTROL, tags))
    num = len(grid) + 1
    for name in configs[0].report.peers:
        first: dict = {}  # (data set, what the peer fits beside the job) -> its first job
        for i, c in enumerate(configs):
            fits = P.following(P.PEERS[name], c.model.value, c.rank)
            first.setdefault((c.dataset, fits.cls, fits.rank), i)
        for i in first.values():
            out.append(peer_spec(name, configs[i], num, {PEER_OF_TAG: str(i)}))
            num += 1
    return out


def peer_spec(peer: str, config: C.Config, num: int | None, tags: dict[str, str], name: str | None = None) -> JobSpec:
    """The job of the peer named ``peer`` beside a job of ``config``: its config what the peer runs
    there (:func:`plnexp.experiment.peer_runs.peer_config`), its run named ``name`` (default: the
    peer's run name), job number ``num``, tagged ``tags``. A sweep's peers (:func:`extras`) and a
    rerun's (:meth:`plnexp.experiment.rerun_sources.Source.spec`) are made here."""
    from ..jobs.peers import PEERS
    from .peer_runs import peer_config

    pc = peer_config(PEERS[peer], config)
    return JobSpec(pc, name or pc.run_name, num, (), Kind.PEER, tags, peer=peer)
