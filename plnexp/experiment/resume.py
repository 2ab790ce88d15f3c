"""``python -m plnexp sweep ... resume=true``: finish a sweep that stopped (Ctrl-C, a crash, failed jobs).

Before the sweep opens, each job of the grid is matched against the FINISHED runs of the sweep's
experiment on the hash of its resolved config (tag ``config_hash``, see
:func:`plnexp.jobs.provenance.config_hash`; never on the run name), on the hash of its data (tag
``data_digest``: a CSV file changed since is fitted again; drawn data are known by their config and
plnexp's commit), and on how it is measured: the timing protocol (:data:`PROTOCOL_KEYS`, params)
and the environment (:data:`SOFTWARE_KEYS`, and :data:`MACHINE_KEYS` when the jobs run on this
machine; tags), so that a run timed otherwise, or with other software, is not reused as if alike.
A key an older run did not log is not compared. A job with such a run is not run again: the
sweep's record lists it (:attr:`plnexp.experiment.sweep_record.SweepRecord.reused`), the driver never
dispatches it (:func:`plnexp.experiment.sweep_dispatch.to_run`), and the summary (and the parent's ``n_done``) covers the whole grid, reusing that run's row. FAILED,
KILLED and orphaned jobs run again. The new parent run is tagged ``resumes`` with the parent runs
whose children it reuses. When every job is done already, nothing is created.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from ..jobs import provenance
from . import runner
from .. import store
from ..jobs.config import Config, flatten

if TYPE_CHECKING:
    from ..store.records import RunRecord


class Reused(NamedTuple):
    """A job of the grid that a FINISHED run of the experiment already answers."""

    job: int  # the job's place in the grid (Hydra's job number)
    config_hash: str  # with replicate 0: the run's key (plnexp.jobs.provenance.run_key)
    run_id: str  # replicate 0's run
    parent_id: str  # the sweep it ran in ("" for a plain run)
    run_ids: tuple = ()  # every replicate's run, in replicate order (``replicates=K``: K runs)


# How a job is timed: config keys the config hash leaves out (provenance.UNHASHED), as a run's params
# hold them. A run timed otherwise answers the same fit but not the same measurement.
PROTOCOL_KEYS = ("repeats", "warmup", "time_budget_s", "first_call", "compile_cache")
# What a run's timings depend on besides its config, as its tags hold them
# (provenance.environment_tags): the software, the same wherever a job of this sweep runs (a
# cluster's nodes run the driver's install, with its environment) ...
SOFTWARE_KEYS = ("jax_version", "jaxlib_version", "optax_version", "XLA_FLAGS", "git_commit", provenance.VERSION_TAG)
# ... and what depends on the machine (device, CPU, the fused kernel's code path picked from the CPU's
# features) or is read by loading the strategy's library (torch): compared only when the jobs run on
# this machine, where the driver sees what they will see (a login node's CPU is not a GPU node's)
MACHINE_KEYS = ("platform", "device_kind", "cpu_model", "fused_isa", "torch_version")


class Match(NamedTuple):
    """What ``resume=true`` found for a grid: the jobs already answered, and the FINISHED run of
    the experiment nearest to a job left to run ("" when it has none; with jobs answered, only a
    run of such a job's very config, refused for how it was timed or run)."""

    done: list[Reused]
    n_jobs: int
    experiment: str
    nearest: str = ""  # "run NAME (ID) differs by n_iter: 20 here, 100 there; ..."

    def line(self) -> str:
        """Always said when resuming: how many jobs matched, and, when not all did, why not."""
        head = (
            f"resume: {len(self.done)} of {self.n_jobs} job(s) matched a FINISHED run of experiment {self.experiment!r}"
        )
        if self.done:
            return head + "; those are reused, the others run" + (f"; nearest: {self.nearest}" if self.nearest else "")
        if self.nearest:
            return head + f"; nearest: {self.nearest}; all jobs run"
        return head + " (it has no FINISHED job runs); all jobs run"


def differences(config: Config, params: dict[str, str]) -> list[str]:
    """``key: here here, there there`` for each config key that identifies a fit (flattened, as logged
    in params) whose value differs from a run's params."""
    return _unlike(dict(sorted(provenance.comparable(config).items())), params)


def _unlike(mine: dict[str, str], there: dict[str, str], shown=str) -> list[str]:
    """``key: here here, there there`` for each key of ``mine`` whose value differs in ``there`` (a
    key an older run did not log is not compared)."""
    return [f"{k}: {shown(v)} here, {shown(there[k])} there" for k, v in mine.items() if there.get(k) not in (None, v)]


def protocol(config: Config) -> dict[str, str]:
    """How a sweep's job of ``config`` is timed (:data:`PROTOCOL_KEYS`), as its run's params hold
    them: a sweep runs ``compile_cache`` auto as off (:meth:`~plnexp.jobs.config.Config.as_study`)."""
    flat = flatten(config.as_study().as_dict())
    return {k: str(flat[k]) for k in PROTOCOL_KEYS}


def environment(config: Config, here: bool) -> dict[str, str]:
    """The tags of :data:`SOFTWARE_KEYS` (and, ``here``: the jobs run on this machine, of
    :data:`MACHINE_KEYS`) that a run of ``config`` started now would be written with ("" for a tag
    it would not have)."""
    if here:
        tags = provenance.environment_tags(config)
    else:  # the device may not be on this machine (a GPU job from a login node): the software only
        import jax
        import jaxlib
        import optax

        tags = {
            "jax_version": jax.__version__,
            "jaxlib_version": jaxlib.__version__,
            "optax_version": optax.__version__,
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
            "git_commit": provenance.git_commit(),
            provenance.VERSION_TAG: provenance.package_version(),
        }
    return {k: tags.get(k, "") for k in SOFTWARE_KEYS + (MACHINE_KEYS if here else ())}


def _shown(value: str) -> str:
    return value if value else "(none)"


def unlike(config: Config, run: RunRecord, env: dict[str, str]) -> list[str]:
    """``key: here here, there there`` for each key of the timing protocol (params) and of the
    environment ``env`` (tags) whose value differs from ``run``'s (a key the run did not log, an
    older run's, is not compared): a run of the same config measured otherwise."""
    # the environment's tags are named by SOFTWARE_KEYS and MACHINE_KEYS
    return _unlike(protocol(config), run.params) + _unlike(env, run.tags, _shown)


def _environments() -> Callable[..., dict[str, str]]:
    """:func:`environment` of a job (``of(job)``), read once per kind of job (what its tags depend
    on: its strategy, device and precision, and whether it runs here)."""
    from .plan import jobs_run_here

    seen: dict[tuple, dict[str, str]] = {}

    def of(job) -> dict[str, str]:
        c = job.config
        here = jobs_run_here(job.overrides)
        key = (c.strategy.name, c.device.value, c.precision.name, here)
        if key not in seen:
            seen[key] = environment(c, here)
        return seen[key]

    return of


def nearest(jobs, runs, envs: Callable | None = None, *, refused_only: bool = False) -> str:
    """Of all (job, run) pairs, the run that differs from a job in the fewest keys (of its config,
    then of how it was timed and run), and how (newest run first on ties). ``refused_only``: only
    the runs of a job's very config (those its timing protocol or environment kept from reuse)."""
    envs = envs or _environments()
    pairs: list[tuple[list[str], RunRecord]] = []
    for job in jobs:
        h = provenance.config_hash(job.config)
        for r in runs:
            if refused_only and r.config_hash != h:
                continue
            pairs.append((differences(job.config, r.params) + unlike(job.config, r, envs(job)), r))
    if not pairs:
        return ""
    diff, run = min(pairs, key=lambda t: len(t[0]))
    if refused_only and not diff:
        return ""  # timed and run alike: refused for its data or its batch, nothing to name
    what = "; ".join(diff) if diff else "no config key (its data changed since)"
    return f"run {run.name} ({run.run_id}) differs by {what}"


def match(uri: str, experiment: str, jobs) -> Match:
    """The jobs (``plnexp.experiment.plan.Job``) that a FINISHED run of ``experiment`` already answers
    (the newest such run for each; reads only: nothing is created, not even the experiment), and the
    FINISHED run of the experiment nearest to the jobs left to run:
    any run when no job is answered; else only a run of a left job's config that was refused for
    how it was timed or run (the jobs an interrupted sweep never ran have none: nothing more said)."""
    runs = store.open(uri).finished_runs(experiment)
    envs = _environments()
    done = _done(runs, jobs, envs)
    answered = {d.job for d in done}
    left = [j for i, j in enumerate(jobs) if i not in answered]
    return Match(done, len(jobs), experiment, nearest(left, runs, envs, refused_only=bool(done)))


def _done(runs, jobs, envs: Callable | None = None) -> list[Reused]:
    """A job is done when each of its replicates has a FINISHED run (the newest of those timed and
    run alike: :func:`unlike`), all of one parent run (one program's batch), each on the data it was
    fitted on then."""
    envs = envs or _environments()
    by_key: dict[tuple[str | None, int], list[RunRecord]] = {}
    for r in runs:  # newest first
        by_key.setdefault(r.key, []).append(r)
    done = []
    for i, job in enumerate(jobs):
        h = provenance.config_hash(job.config)
        env = envs(job)
        found: list[RunRecord] = []
        for k in range(job.config.replicates):
            alike = [r for r in by_key.get((h, k), []) if not unlike(job.config, r, env)]
            if not alike:
                break
            found.append(alike[0])
        if len(found) < job.config.replicates:
            continue
        parents = {r.parent_id for r in found}
        if len(parents) > 1:
            continue  # replicates of different batches: fit them again, together
        datasets = job.config.replicate_datasets()
        if any(_data_changed(r, datasets[k if len(datasets) > 1 else 0]) for k, r in enumerate(found)):
            continue  # the data changed since: fit it again
        done.append(Reused(i, h, found[0].run_id, parents.pop(), tuple(r.run_id for r in found)))
    return done


def _data_changed(run: RunRecord, dataset) -> bool:
    """Whether the data of ``dataset`` differ from those ``run`` was fitted on (its ``data_digest``).
    A drawn data set (``dataset.drawn``: synthetic data) is the same for the same config (matched
    by its hash) and the same plnexp (``git_commit`` and plnexp's version, :data:`SOFTWARE_KEYS`):
    not drawn again here (at atlas scale, longer than the job to resume), unless this checkout has
    uncommitted changes (``-dirty``: its code, the draw's included, is not known by its commit)."""
    if dataset.drawn and not provenance.git_commit().endswith("-dirty"):
        return False
    return bool(run.data_digest) and run.data_digest != runner.load_data(dataset).digest()


def tags(done: list[Reused]) -> dict[str, str]:
    """The new parent's tags: ``resumes`` (the earlier parent runs whose children it reuses) and
    ``n_reused``; none when nothing is reused."""
    if not done:
        return {}
    earlier = ",".join(dict.fromkeys(d.parent_id for d in done if d.parent_id))
    return {provenance.RESUMES_TAG: earlier, "n_reused": str(len(done))}


def resuming_note(done: list[Reused]) -> str:
    if not done:
        return ""
    earlier = tags(done)[provenance.RESUMES_TAG]
    return f" (resuming: {len(done)} job(s) FINISHED earlier{', parent run(s) ' + earlier if earlier else ''})"


def all_done_line(done: list[Reused], experiment: str) -> str:
    earlier = tags(done)[provenance.RESUMES_TAG]
    return (
        f"resume: all {len(done)} jobs already FINISHED in experiment {experiment!r}"
        f"{' (parent run(s) ' + earlier + ')' if earlier else ''}; nothing to run, no run created"
    )


def rounds_owed(uri: str, configs: list[Config], done: list[Reused]) -> bool:
    """Whether a sweep whose every job FINISHED earlier still owes its interleaved rounds: rounds on
    (``report.rounds`` > 0) and a reused run of a group of two strategies or more
    (:func:`plnexp.experiment.groups.partition`) without its verdict (the tags the rounds write on each
    run they time: a Ctrl-C or a store failure during ``[rounds]`` left none). Then ``resume=true``
    opens a new parent that reuses every job and runs the rounds (their ``verdict.json`` on it)."""
    if not configs or configs[0].report.rounds == 0:
        return False
    from .groups import partition

    compared, _ = partition([(i, c) for i, c in enumerate(configs) if c.processes == 1], lambda item: item[1])
    timed = {i for group in compared for i, _ in group}
    for d in done:
        if d.job in timed:
            run = store.open(uri).run(d.run_id)
            if run is not None and not run.verdict:
                return True
    return False


def rows(uri: str, reused) -> list[dict]:
    """The reused runs as summary rows (like :func:`plnexp.store.end_children`'s): every
    replicate's."""
    out = []
    for d in reused:
        for k, run_id in enumerate(d.run_ids or (d.run_id,)):
            r = store.open(uri).run(run_id)
            if r is not None:
                out.append(
                    {
                        "name": r.name,
                        "status": r.status,
                        "reason": "reused",
                        "metrics": dict(r.metrics),
                        "job": d.job,
                        "replicate": k,
                    }
                )
    return out


def summary(uri: str, done: list[Reused]) -> str:
    """The summary table of the grid from the reused runs (when nothing is left to run)."""
    return runner.summary_table(
        [runner.Row(r["name"], r["status"], r["metrics"], r["metrics"].get("wall_s", 0.0)) for r in rows(uri, done)]
    )
