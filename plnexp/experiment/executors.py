"""Where a sweep's jobs run: executors that receive job specs (:class:`~plnexp.jobs.spec.JobSpec`), never
overrides, and run ``work(spec)`` for each.

- :class:`InProcess`: one after the other, in the driver (``hydra/launcher=basic``, the default; a
  single ``run``; a rerun).
- :class:`Joblib`: side by side in joblib's loky worker processes (``hydra/launcher=joblib``, with
  Hydra's joblib launcher's settings: ``hydra.launcher.n_jobs=2``, ...).
- :class:`Slurm`: one SLURM job array through submitit's public executor (``hydra/launcher=slurm`` or
  ``submitit_slurm``, with the submitit launcher's settings), waited for by
  :func:`plnexp.system.slurm.wait` (``squeue``, no ``sacct``).

Hydra stays the front end: ``hydra/launcher=...`` picks the executor and ``hydra.launcher.KEY=VALUE``
sets it, read from the composed ``hydra.launcher`` node (:func:`from_launcher`), the sweep's one
composition of its own. No Hydra launcher runs: a job's config is composed once, by ``plan``, and
shipped whole (pickled) to a worker or a SLURM task.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..jobs.config import ConfigError
from ..jobs.spec import JobSpec

Work = Callable[[JobSpec], "str | None"]

LOCAL = ("basic", "joblib")  # the launchers whose jobs run on this machine
SLURM = ("slurm", "submitit_slurm")
LAUNCHERS = (*LOCAL, *SLURM)


@dataclass(frozen=True)
class InProcess:
    """Every job in this process, in order."""

    name: str = "basic"
    in_driver: bool = True  # the jobs run in the driver: their programs can be kept for the rounds

    def run(self, work: Work, specs: Sequence[JobSpec], total: int) -> list:
        return [work(spec) for spec in specs]


@dataclass(frozen=True)
class Joblib:
    """The jobs in joblib's loky process pool (``Parallel(**options)``, as Hydra's joblib launcher
    calls it: its settings, the backend loky). Each worker prints its job's line itself."""

    options: dict = field(default_factory=dict)
    name: str = "joblib"
    in_driver: bool = False

    def run(self, work: Work, specs: Sequence[JobSpec], total: int) -> list:
        from joblib import Parallel, delayed

        return list(Parallel(**self.options)(delayed(work)(spec) for spec in specs))


@dataclass(frozen=True)
class Slurm:
    """The jobs as one SLURM job array, submitted with submitit's ``AutoExecutor`` (the submitit
    launcher's settings, mapped as it maps them: its base keys as they are, the others ``slurm_``-
    prefixed), then waited for (:func:`plnexp.system.slurm.wait`): one line per job as it ends, the
    job's own line when it left one. Never requeued (a fit is not checkpointed)."""

    params: dict = field(default_factory=dict)
    name: str = "slurm"
    in_driver: bool = False

    # the submitit launcher's settings that AutoExecutor takes as they are (the others: slurm_KEY)
    BASE = (
        "timeout_min",
        "cpus_per_task",
        "gpus_per_node",
        "tasks_per_node",
        "mem_gb",
        "nodes",
        "name",
        "stderr_to_stdout",
    )

    def executor(self):
        import submitit

        params = {k: v for k, v in self.params.items() if k != "_target_" and v is not None}
        folder = params.pop("submitit_folder")
        max_num_timeout = params.pop("max_num_timeout", 0)
        executor = submitit.AutoExecutor(cluster="slurm", folder=folder, slurm_max_num_timeout=max_num_timeout)
        executor.update_parameters(**{k if k in self.BASE else f"slurm_{k}": v for k, v in params.items()})
        return executor

    def run(self, work: Callable, items: Sequence, total: int) -> list:
        """``work(item)`` for each item (a job spec, or a unit of jobs: ``items`` name themselves,
        ``.name``) as one task of one job array; returns each task's result (None where it left
        none). A result's ``lines`` (or the result itself, a line) are printed as the task ends."""
        from ..system import slurm
        from ..system.redact import redact_text

        if not items:
            return []
        tasks = [getattr(item, "tasks", 1) for item in items]  # a job of processes=N: N, else 1
        jobs = self.submit(work, items, tasks)
        partition = self.params.get("partition")
        arrays = dict.fromkeys(j.job_id.split("_")[0] for j, k in zip(jobs, tasks) if k == 1)
        what = [f"job array {a}" for a in arrays] + [
            f"job {j.job_id} of {k} tasks" for j, k in zip(jobs, tasks) if k > 1
        ]
        print(
            f"submitted {len(jobs)} job(s) to slurm as {', '.join(what)}"
            f"{' on partition ' + str(partition) if partition else ''}; "
            f"logs: {jobs[0].paths.stdout} and the like",
            flush=True,
        )

        def on_end(e: slurm.JobEnd) -> None:
            lines = getattr(e.result, "lines", [e.result] if e.result else [])
            for line in lines:  # the jobs' own lines (plnexp.experiment.job_task.Task)
                print(line, flush=True)
            if not lines:
                item = items[e.index]
                num = getattr(item, "num", None)
                label = f"[{num + 1}/{total}] " if num is not None else ""
                why = f": {e.error}" if e.error else ""
                if tasks[e.index] > 1 and (
                    task := slurm.first_task_failure(jobs[e.index].paths.stdout, tasks[e.index])
                ):
                    why += f" ({task})"  # a job across processes: which of its tasks ended it
                print(redact_text(f"{label}{item.name}: slurm job {e.job} {e.state}{why}"), flush=True)

        return [e.result for e in slurm.wait(jobs, on_end)]

    def submit(self, work: Callable, items: Sequence, tasks: Sequence[int]) -> list:
        """Submit ``work(item)`` for each item: the items of one task as one job array; an item of
        N tasks (a job of ``processes=N``: one fit across N processes) as a job of its own with N
        tasks, ``nodes`` of the settings sharing them (each task runs ``work(item)``; task 0's
        result is the job's). In the items' order."""
        executor = self.executor()
        jobs: list = [None] * len(items)
        one = [i for i, k in enumerate(tasks) if k == 1]
        if one:
            for i, job in zip(one, executor.map_array(work, [items[i] for i in one])):
                jobs[i] = job
        nodes = int(self.params.get("nodes") or 1)
        # --kill-on-bad-exit: a task that dies ends the others at once (they would otherwise wait in
        # their next collective until JAX's coordination service gives up on it)
        srun_args = [*(self.params.get("srun_args") or []), "--kill-on-bad-exit=1"]
        for i, k in enumerate(tasks):
            if k > 1:
                executor.update_parameters(
                    nodes=nodes, tasks_per_node=tasks_per_node(k, nodes), slurm_srun_args=srun_args
                )
                jobs[i] = executor.submit(work, items[i]).task(0)
        return jobs


def tasks_per_node(tasks: int, nodes: int) -> int:
    """The SLURM tasks per node of a job of ``tasks`` tasks on ``nodes`` nodes; one-line
    ConfigError where they do not divide."""
    if tasks % nodes:
        raise ConfigError(
            f"hydra.launcher.nodes={nodes}: a job of processes={tasks} runs {tasks} SLURM tasks, the same "
            f"number on each node; allowed values are the divisors of {tasks}"
        )
    return tasks // nodes


Executor = InProcess | Joblib | Slurm


def from_launcher(name: str, node: dict[str, Any] | None) -> Executor:
    """The executor of ``hydra/launcher=name``, set by its resolved ``hydra.launcher`` node ``node``
    (Hydra's launcher config: its defaults and the command's ``hydra.launcher.KEY=VALUE``)."""
    node = dict(node or {})
    if name == "basic":
        return InProcess()
    if name == "joblib":
        options = {k: v for k, v in node.items() if k != "_target_"}
        options["backend"] = "loky"  # as Hydra's joblib launcher: processes, never threads
        for k in ("pre_dispatch", "batch_size", "max_nbytes"):  # as it reads them: numbers where they are
            value = options.get(k)
            if isinstance(value, str) and value.isdigit():
                options[k] = int(value)
        return Joblib(options)
    if name in SLURM:
        return Slurm(node, name)
    raise ConfigError(f"hydra/launcher={name}: allowed values are {', '.join(LAUNCHERS)}")
