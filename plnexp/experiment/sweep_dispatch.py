"""A sweep's jobs handed to its executor (:func:`run_jobs`): the plan's jobs less those a resumed
sweep reuses (:func:`to_run`), each one :class:`~plnexp.experiment.job_task.Task` call in its folder
(:func:`job_of`), in the driver or a worker process; under SLURM, a task's unit of jobs
(:class:`Unit`: a job alone, or a group and its rounds on one node) and the N tasks of a fit across
N processes (:func:`across_in_worker`). The sweep around them: :mod:`plnexp.experiment.sweep`.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, replace
from pathlib import Path

from ..jobs.spec import JobSpec, Kind
from . import executors, groups
from .job_task import Task
from .sweep_record import SweepRecord, store_of


def job_dir(sweep_dir: Path, num: int | None) -> str:
    """A sweep job's folder: ``<sweep dir>/<job number>`` (as Hydra's ``hydra.sweep.subdir``)."""
    return str(Path(sweep_dir) / str(num or 0))


def job_of(task: Task, record: SweepRecord, sweep_dir: str, spec: JobSpec) -> str | None:
    """A sweep's job in its folder, in the driver or a worker process (a joblib worker, a SLURM
    task): what executors run, ``partial``-ed with all but the spec."""
    return task(spec, record, job_dir(Path(sweep_dir), spec.num))


@dataclass(frozen=True)
class Unit:
    """Jobs a SLURM task runs one after the other: a job alone, or a group (the jobs that differ only
    by strategy, :func:`plnexp.experiment.groups.group_key`) followed by its rounds, so that every
    ratio of the group is measured on one node, in one process."""

    specs: tuple[JobSpec, ...]
    rounds: bool = False

    @property
    def tasks(self) -> int:
        """The SLURM tasks the unit's job is one of: ``processes`` of a job of one fit across
        processes (each task one process), else 1."""
        return self.specs[0].config.processes if len(self.specs) == 1 else 1

    @property
    def num(self) -> int | None:
        """The job number of a unit of one job (None for a group)."""
        return self.specs[0].num if len(self.specs) == 1 else None

    @property
    def name(self) -> str:
        more = len(self.specs) - 1
        return f"{self.specs[0].name}{f' and {more} more (a group: rounds on its node)' if more else ''}"


@dataclass
class Finished:
    """What a SLURM task hands back: its jobs' lines and its group's verdicts (logged by the driver)."""

    lines: list[str]
    verdicts: list


def units_of(specs, rounds: bool) -> list[Unit]:
    """The SLURM tasks of a sweep: with rounds, each group of two strategies or more is one task
    (its jobs in job order, then its rounds); every other job is a task of its own."""
    if not rounds:
        return [Unit((s,)) for s in specs]
    across = [s for s in specs if s.config.processes > 1]  # never in a group (plnexp.experiment.groups)
    compared, alone = groups.partition([s for s in specs if s.config.processes == 1])
    alone += across
    units = [Unit(tuple(members), rounds=True) for members in compared] + [Unit((s,)) for s in alone]
    return sorted(units, key=lambda u: u.specs[0].num or 0)


def unit_in_worker(task: Task, record: SweepRecord, sweep_dir: str, unit: Unit) -> Finished:
    """A SLURM task: its unit's jobs here, one after the other (their programs kept), then the
    group's rounds on this node; the verdicts go back to the driver, which logs them. One of the
    tasks of a job of ``processes`` > 1: :func:`across_in_worker`."""
    if unit.tasks > 1:
        return across_in_worker(task, record, sweep_dir, unit.specs[0])
    task = replace(task, held=groups.Held() if unit.rounds else None, ended={})
    lines = [job_of(task, record, sweep_dir, spec) for spec in unit.specs]
    verdicts = []
    if unit.rounds:
        configs = {s.num: s.config.as_study() for s in unit.specs if s.num is not None}
        uri = store_of(record, unit.specs[0].config.tracking_uri)
        verdicts = groups.judge_groups(replace(record, uri=uri), configs, task.held)
        node = platform.node()
        for v in verdicts:
            dropped = f", {v.dropped} dropped" if v.dropped else ""
            lines.append(f"[rounds] {v.label}: {v.rounds} rounds{dropped} in {v.seconds:.1f} s on {node}")
    return Finished([line for line in lines if line], verdicts)


def across_in_worker(task: Task, record: SweepRecord, sweep_dir: str, spec: JobSpec) -> Finished:
    """One of the N tasks of the SLURM job of a job of ``processes=N`` (:class:`plnexp.experiment.executors.Slurm`
    submits it with N tasks): join the others first (``jax.distributed.initialize()`` reads SLURM's
    environment, as under ``srun -n N python -m plnexp run``); then task 0 runs the job as any SLURM
    task does (its run logged, a child of the sweep's parent; its line back to the driver, which
    reads task 0's result) and the others fit with it, reporting nothing. A task that fails ends
    non-zero with one line (the driver's wait reports the job)."""
    from ..system import runtime
    from . import processes

    n = spec.config.processes
    runtime.configure()  # this process's settings before JAX starts (as a worker: processes.worker)
    processes.placement(n)  # srun started another number of tasks: one line (ValueError)
    processes.Placement(None, None, None).initialize()
    import jax

    if jax.process_index() == 0:
        line = job_of(replace(task, held=None, ended={}), record, sweep_dir, spec)
        finished = Finished([line] if line else [], [])
    else:
        config, output_dir = spec.config.as_study(), job_dir(Path(sweep_dir), spec.num)
        if processes.follow(config, spec.overrides, spec.name, output_dir) != 0:
            raise RuntimeError(f"job {spec.name}: process {jax.process_index()} of {n} did not finish")
        finished = Finished([], [])
    jax.distributed.shutdown()  # waits for the others: process 0 is logging the run
    return finished


def to_run(record: SweepRecord, specs) -> list[JobSpec]:
    """The plan minus what is finished: the jobs of ``specs`` that a resumed sweep does not reuse
    (:attr:`~plnexp.experiment.sweep_record.SweepRecord.reused`: the grid's jobs whose hash a FINISHED
    run answers, timed and run alike, :func:`plnexp.experiment.resume.match`). Each reused job is
    one line, then how many of each kind run and how many are reused. The control job and the peers
    always run again (never reused)."""
    reused = {d.job: d for d in record.reused}
    if not reused:
        return list(specs)
    out = []
    for spec in specs:
        d = reused.get(spec.num) if spec.kind is Kind.JOB else None
        if d is None:
            out.append(spec)
        else:
            print(f"[{d.job + 1}/{record.total}] {spec.name} FINISHED earlier (run {d.run_id}): skipped", flush=True)
    print(f"resume: runs {Kind.counted(s.kind for s in out)}; reuses {len(specs) - len(out)} job(s)", flush=True)
    return out


def run_jobs(task: Task, record: SweepRecord, sweep_dir: Path, specs, executor: executors.Executor) -> list:
    """The plan's jobs (:meth:`plnexp.experiment.plan.Plan.specs`: the grid, then the control job and
    the peers where the driver runs the grid) less those a resumed sweep reuses (:func:`to_run`),
    through ``executor``: each one :class:`Task` call where the executor runs it. Under SLURM with
    rounds on (``report.rounds``), each group is one SLURM task (:class:`Unit`) and the groups'
    verdicts come back (the driver logs them: :func:`plnexp.experiment.groups.log_verdicts`)."""
    from functools import partial

    specs = to_run(record, specs)
    if isinstance(executor, executors.Slurm):
        units = units_of(specs, rounds=bool(specs) and specs[0].config.report.rounds > 0)
        results = executor.run(partial(unit_in_worker, task, record, str(sweep_dir)), units, record.total)
        return [v for r in results if r is not None for v in r.verdicts]
    executor.run(partial(job_of, task, record, str(sweep_dir)), specs, record.total)
    return []
