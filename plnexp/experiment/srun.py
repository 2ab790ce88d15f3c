"""Under ``srun -n N``: every task runs the command, so the tasks must be one fit of ``processes=N``
(:mod:`plnexp.experiment.processes`: the tasks join, task 0 owns the run), checked before any work."""

from __future__ import annotations

import os
from collections.abc import Mapping


def srun_tasks(environ: Mapping[str, str] = os.environ) -> int | None:
    """The number of tasks of the ``srun`` step this process is one of (None: not started by srun)."""
    tasks = environ.get("SLURM_STEP_NUM_TASKS") if environ.get("SLURM_JOB_ID") else None
    try:
        return int(tasks) if tasks else None
    except ValueError:
        return None


def check_tasks(processes: int, multirun: bool, environ: Mapping[str, str] = os.environ) -> None:
    """Before any work: under ``srun -n N`` (N > 1) every task runs this command, so it must be one fit
    of ``processes=N`` (the tasks join, task 0 owns the run), never N fits of their own nor N sweeps;
    else one :class:`~plnexp.jobs.config.ConfigError` line naming ``processes=N``, said by task 0 (the
    other tasks exit 2 silently)."""
    from ..jobs.config import ConfigError

    tasks = srun_tasks(environ)
    if tasks is None or tasks == 1 or (processes == tasks and not multirun):
        return
    if environ.get("SLURM_PROCID", "0") != "0":  # task 0 says the line: one line for the srun, not one a task
        raise SystemExit(2)
    if multirun:
        raise ConfigError(
            f"a sweep under srun -n {tasks}: each of the {tasks} tasks would run the whole sweep; allowed is one "
            "task (no srun, or srun -n 1): hydra/launcher=submitit_slurm starts each job's tasks itself"
        )
    if processes != tasks:
        raise ConfigError(
            f"processes={processes} under srun -n {tasks}: "
            + (
                f"the {tasks} tasks would run {tasks} separate fits and log {tasks} runs"
                if processes == 1
                else f"srun started {tasks} tasks"
            )
            + f"; allowed are processes={tasks} (the tasks join in one fit, task 0 logging its run) or srun -n {processes}"
        )
