"""``python -m plnexp run`` and ``sweep``: Hydra's overrides planned into jobs, checked, then run.

Every check comes before any work: the sweep grid expanded and each job's config composed and loaded
(:mod:`plnexp.experiment.plan`), each distinct data set loaded once, the outputs folder written to,
the MLflow store reached. A problem is one line on stderr naming the key, file or store and what is
allowed, exit code 2, no run created (``HYDRA_FULL_ERROR=1`` shows the traceback). Then the fits'
results kept locally when the store failed are sent (:mod:`plnexp.store.pending`), runs left RUNNING
by dead processes are marked FAILED (orphaned) and the job(s) run, the sweep's parent run owned by
:mod:`plnexp.experiment.sweep`. Ctrl-C or SIGTERM: the running job is recorded KILLED, the sweep
closed KILLED, what finished summarised; exit 130 or 143.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from .. import store
from ..core.data import DataError
from ..experiment import groups, job_task, plan, processes, resume, srun, sweep, sweep_dispatch, sweep_record
from ..jobs import config as C
from ..system import interrupts
from ..system.commandline import fail, first_line
from .sync import send_pending, sweep_up


def _check(overrides: list[str], multirun: bool):
    """Everything before the first run exists; returns the jobs and the store's URI. The device is
    checked here only when the jobs run on this machine (each job checks it again where it runs)."""
    jobs = plan.plan(overrides, multirun, check_device=plan.jobs_run_here(overrides))
    srun.check_tasks(jobs[0].config.processes, multirun)  # srun -n N: one fit of processes=N
    plan.check_data(jobs)
    plan.check_outputs()
    store.set_timeout(jobs[0].config.store_timeout_s)  # one value per sweep (plan.ONE_PER_SWEEP)
    uris = [store.check_store(u) for u in dict.fromkeys(j.config.tracking_uri for j in jobs)]
    return jobs, uris[0]


def _machinery_error(e: BaseException) -> int:
    """An error of Hydra's machinery (not of a job, which never raises): one line, exit 1."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1" or isinstance(e, SystemExit):
        raise e
    print(f"plnexp: error: {first_line(e)} (HYDRA_FULL_ERROR=1 for the traceback)", file=sys.stderr, flush=True)
    return 1


def run(jobs: plan.Plan, uri: str) -> int:
    """A single run: the plan's one job, in this process."""
    task = job_task.Task()
    (spec,) = jobs.specs()
    if spec.config.processes > 1:  # N JAX processes (started here, or one per srun task): process 0 logs the run
        job_task.write_job_dir(str(jobs.run_dir()), spec.config, spec.overrides)  # as the job in this process does
        return processes.run(spec, uri, str(jobs.run_dir()), job_task.run_job)
    with interrupts.handled(lambda signum: sweep.force_stop(None, uri, signal.Signals(signum).name)) as guard:
        try:
            task(spec, None, str(jobs.run_dir()))
        except BaseException as e:  # noqa: BLE001 - an interrupt, or an error: one line either way
            stop = interrupts.stopped_by(e, guard)
            if stop is None:
                return _machinery_error(e)
            guard.stopping()
            store.end_process_runs(uri, "KILLED", f"interrupted by {stop.name}", "interrupted")
            print(f"plnexp: interrupted by {stop.name}: {sweep.killed_line(uri)}", file=sys.stderr, flush=True)
            return stop.exit_code
    return 1 if task.failed else 0


def _report(uri: str, parent_id: str) -> int:
    """The sweep's report (:mod:`plnexp.report.summary`), printed after its summary; 0, or 1 if it failed."""
    from ..report import summary as report

    try:
        report.show(*report.build(uri, run_id=parent_id))
    except Exception as e:  # the sweep's runs are safe in the store: one line, exit 1
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(
            f"plnexp: error: the report failed ({first_line(e)}); "
            f"the runs are in the store: python -m plnexp report --run {parent_id}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


def multirun(overrides: list[str], jobs: plan.Plan, uri: str, resumed: bool = False, with_report: bool = True) -> int:
    name = next((o.split("=", 1)[1] for o in overrides if o.startswith("sweep=")), "multirun")
    given = next((o.split("=", 1)[1] for o in overrides if o.startswith("hydra.sweep.dir=")), None)
    first = jobs[0].config
    found = resume.match(uri, first.experiment, jobs) if resumed else None
    done = found.done if found else []
    if found and len(done) < len(jobs):  # (all done: all_done_line says so)
        print(found.line(), flush=True)
    owed = resumed and len(done) == len(jobs) and resume.rounds_owed(uri, [j.config for j in jobs], done)
    if owed:  # every job done, the rounds not: a new parent reuses them all and runs the rounds
        print(
            f"resume: all {len(done)} jobs already FINISHED in experiment {first.experiment!r}; their rounds did "
            "not finish (no verdict): a new parent run reuses the jobs and runs the rounds",
            flush=True,
        )
    if resumed and len(done) == len(jobs) and not owed:  # nothing left to run: nothing is created
        print(resume.summary(uri, done), flush=True)
        print(resume.all_done_line(done, first.experiment), flush=True)
        return 0
    sweep_dir = Path(given.strip("'\"")).resolve() if given else sweep_record.new_sweep_dir()
    seen: dict = {}  # what the driver's jobs saw (job_task.Task.seen): this sweep's alone

    def launch(record) -> None:
        executor = jobs.executor(sweep_dir)
        timed = executor.name in plan.LOCAL_LAUNCHERS and first.report.rounds > 0  # each group timed in rounds, here
        # the driver's jobs keep their programs for the rounds
        task = job_task.Task(held=groups.Held() if timed and executor.in_driver else None, seen=seen)
        verdicts = sweep_dispatch.run_jobs(task, record, sweep_dir, jobs.specs(), executor)  # SLURM: timed on its node
        if timed:  # the groups timed in rounds here, once every job ran
            verdicts += groups.judge_groups(record, [j.config.as_study() for j in jobs], task.held)
        groups.log_verdicts(record, verdicts)

    def header(record) -> str:
        from ..experiment import presets

        takes = presets.takes_line(name, C.CONF_DIR)  # what the preset says of itself (its "# Takes:" line)
        return (
            f"sweep {name}: {len(jobs)} jobs, experiment {first.experiment!r}, parent run "
            f"{record.parent_id}{resume.resuming_note(done)}" + (f"\n{takes}" if takes else "")
        )

    try:
        end = sweep.session(
            sweep_dir,
            name,
            first.experiment,
            uri,
            len(jobs),
            {"command": " ".join(["sweep", *overrides, *(["resume=true"] if resumed else [])]), **resume.tags(done)},
            launch,
            header=header,
            reused=tuple(done),
            seen=seen,
        )
    except C.ConfigError as e:
        return fail(e)
    if end.stop is not None:
        return end.stop.exit_code
    if end.error is not None:
        return _machinery_error(end.error)
    if end.summary.store_error:  # said in one line; the report would read the store that failed
        return 1
    code = _report(uri, end.record.parent_id) if with_report and end.summary.rows else 0
    return 1 if end.summary.n_failed or end.summary.n_missing or end.summary.n_skipped else code


def main(ns: argparse.Namespace, overrides: list[str]) -> int:
    """``run`` or ``sweep`` with ``overrides`` (Hydra's flags answered already): checked, then run."""
    is_multirun = (
        ns.command == "sweep" or ns.multirun or any(o.startswith("sweep=") and o != "sweep=null" for o in overrides)
    )
    overrides = [o for o in overrides if o != "sweep=null"]  # the default: no sweep file (a plain multirun)
    try:
        overrides, resumed = plan.pop_switch(overrides, "resume", False)
        overrides, with_report = plan.pop_switch(overrides, "report", True)
        if resumed and not is_multirun:
            raise C.ConfigError("resume=true: only for sweeps; allowed with python -m plnexp sweep or --multirun")
    except C.ConfigError as e:
        return fail(e)
    with interrupts.handled() as guard:  # nothing to record yet: an interrupt is one line
        try:
            with interrupts.deferred():  # held until the checks end: never half-way through Hydra's code
                jobs, uri = _check(overrides, is_multirun)
                send_pending(uri)  # before the sweep-up and resume's reading of the store
                sweep_up(uri)
        except (C.ConfigError, DataError, store.StoreError) as e:
            return fail(e)
        except KeyboardInterrupt as e:
            guard.stopping()
            stop = interrupts.as_interrupted(e)
            print(f"plnexp: interrupted by {stop.name} before any job started", file=sys.stderr, flush=True)
            return stop.exit_code
    return multirun(overrides, jobs, uri, resumed, with_report) if is_multirun else run(jobs, uri)
