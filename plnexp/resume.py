"""``python -m plnexp sweep ... resume=true``: finish a sweep that stopped (Ctrl-C, a crash, failed jobs).

Before the sweep opens, each job of the grid is matched against the FINISHED runs of the sweep's
experiment on the hash of its resolved config (tag ``config_hash``, see
:func:`plnexp.provenance.config_hash`; never on the run name) and on the hash of its data (tag
``data_digest``: a CSV file changed since is fitted again). A job with such a run is not run again:
the sweep's record lists it (:attr:`plnexp.sweep.SweepRecord.reused`), its Hydra job skips it, and
the summary (and the parent's ``n_done``) covers the whole grid, reusing that run's row. FAILED,
KILLED and orphaned jobs run again. The new parent run is tagged ``resumes`` with the parent runs
whose children it reuses. When every job is done already, nothing is created.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from . import provenance, runner, tracking
from .config import Config

if TYPE_CHECKING:
    from mlflow.entities import Run


class Reused(NamedTuple):
    """A job of the grid that a FINISHED run of the experiment already answers."""

    job: int  # the job's place in the grid (Hydra's job number)
    config_hash: str  # with replicate 0: the run's key (plnexp.provenance.run_key)
    run_id: str  # replicate 0's run
    parent_id: str  # the sweep it ran in ("" for a plain run)
    run_ids: tuple = ()  # every replicate's run, in replicate order (``replicates=K``: K runs)


def pop_switch(args: list[str]) -> tuple[list[str], bool]:
    """Take ``resume=true|false`` out of the command line (it is not a config key)."""
    from .cli import pop_switch

    return pop_switch(args, "resume", False)


class Match(NamedTuple):
    """What ``resume=true`` found for a grid: the jobs already answered, and, when none is, the
    FINISHED run of the experiment nearest to any job of the grid ("" when it has none)."""

    done: list[Reused]
    n_jobs: int
    experiment: str
    nearest: str = ""  # "run NAME (ID) differs by n_iter: 20 here, 100 there; ..."

    def line(self) -> str:
        """Always said when resuming: how many jobs matched, and, when none did, why not."""
        head = (
            f"resume: {len(self.done)} of {self.n_jobs} job(s) matched a FINISHED run of experiment {self.experiment!r}"
        )
        if self.done:
            return head + "; those are reused, the others run"
        if self.nearest:
            return head + f"; nearest: {self.nearest}; all jobs run"
        return head + " (it has no FINISHED job runs); all jobs run"


def _finished_job_runs(uri: str, experiment: str) -> list:
    exp_id = tracking.find_experiment(uri, experiment)
    if exp_id is None:
        return []
    return [r for r in tracking.finished_runs(uri, exp_id) if r.data.tags.get(provenance.HASH_TAG)]


def differences(config: Config, params: dict[str, str]) -> list[str]:
    """``key: here here, there there`` for each config key that identifies a fit (flattened, as logged
    in params) whose value differs from a run's params."""
    mine = provenance.comparable(config)
    out = []
    for key in sorted(mine):
        there = params.get(key)
        if there is not None and there != mine[key]:  # a key an older run did not log is not compared
            out.append(f"{key}: {mine[key]} here, {there} there")
    return out


def nearest(configs: list[Config], runs) -> str:
    """Of all (job, run) pairs, the run whose params differ from a job's config in the fewest keys,
    and how (newest run first on ties)."""
    if not runs or not configs:
        return ""
    diff, run = min(((differences(c, r.data.params), r) for r in runs for c in configs), key=lambda t: len(t[0]))
    what = "; ".join(diff) if diff else "no config key (its data changed since)"
    return f"run {run.info.run_name} ({run.info.run_id}) differs by {what}"


def match(uri: str, experiment: str, jobs) -> Match:
    """:func:`find_done`, and, when it finds nothing, the nearest FINISHED run of the experiment."""
    runs = _finished_job_runs(uri, experiment)
    done = _done(runs, jobs)
    near = "" if done else nearest([j.config for j in jobs], runs)
    return Match(done, len(jobs), experiment, near)


def find_done(uri: str, experiment: str, jobs) -> list[Reused]:
    """The jobs (``plnexp.cli.Job``) that a FINISHED run of ``experiment`` already answers (the newest
    such run for each). Reads only: nothing is created, not even the experiment."""
    return _done(_finished_job_runs(uri, experiment), jobs)


def _done(runs, jobs) -> list[Reused]:
    """A job is done when each of its replicates has a FINISHED run (the newest), all of one parent
    run (one program's batch), each on the data it was fitted on then."""
    latest: dict[tuple[str | None, str], Run] = {}
    for r in runs:  # newest first
        latest.setdefault(provenance.run_key(r.data.tags), r)
    done = []
    for i, job in enumerate(jobs):
        h = provenance.config_hash(job.config)
        keys = [(h, str(k)) for k in range(job.config.replicates)]
        if any(key not in latest for key in keys):
            continue
        found = [latest[key] for key in keys]
        parents = {r.data.tags.get("mlflow.parentRunId", "") for r in found}
        if len(parents) > 1:
            continue  # replicates of different batches: fit them again, together
        datasets = job.config.replicate_datasets()
        if any(_data_changed(r, datasets[k if len(datasets) > 1 else 0]) for k, r in enumerate(found)):
            continue  # the data changed since: fit it again
        done.append(Reused(i, h, found[0].info.run_id, parents.pop(), tuple(r.info.run_id for r in found)))
    return done


def _data_changed(run, dataset) -> bool:
    recorded = run.data.tags.get(provenance.DATA_TAG)
    return bool(recorded) and recorded != runner.load_data(dataset).digest()


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


def reused_run(record, config: Config) -> str | None:
    """In a job: the earlier run that answers ``config`` if the sweep reuses one, else None."""
    h = provenance.config_hash(config)
    return next((d.run_id for d in record.reused if d.config_hash == h), None)


def rows(uri: str, reused) -> list[dict]:
    """The reused runs as summary rows (like :func:`plnexp.tracking.end_children`'s): every
    replicate's."""
    out = []
    for d in reused:
        for k, run_id in enumerate(d.run_ids or (d.run_id,)):
            r = tracking.find_run(uri, run_id)
            if r is not None:
                out.append(
                    {
                        "name": r.info.run_name,
                        "status": r.info.status,
                        "reason": "reused",
                        "metrics": dict(r.data.metrics),
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
