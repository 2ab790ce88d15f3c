"""``python -m plnexp run|sweep|report|rerun|compare|sync|ui|doctor [overrides]``: the command line.

:mod:`plnexp.cli.parser` names the command (``--help`` lists them; overrides alone mean ``run``);
``run`` and ``sweep`` hand their overrides and flags to Hydra, ``ui`` its options to mlflow ui, the
others parse theirs with argparse (:class:`plnexp.system.commandline.Parser`: a bad command line is
one line ``plnexp: error: WHAT; usage: ...``, exit 2). Every command checks its whole job list before any work: the sweep grid expanded and each job's
config composed and loaded (:mod:`plnexp.experiment.plan`), each distinct data set loaded once, the outputs
folder written to, the MLflow store reached. A problem is one line on stderr naming the key, file
or store and what is allowed, exit code 2, no run created (``HYDRA_FULL_ERROR=1`` shows the
traceback). Then the fits' results kept locally when the store failed are sent
(:mod:`plnexp.store.pending`; ``sync`` does only that), runs left RUNNING by dead processes are
marked FAILED (orphaned) and Hydra runs the job(s), the sweep's parent run owned by
:mod:`plnexp.experiment.sweep`. Ctrl-C or SIGTERM: the running job is recorded KILLED, the sweep closed KILLED,
what finished summarised; exit 130 or 143.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import warnings
from pathlib import Path

from .experiment import plan as cli
from .experiment import processes, srun
from .system import credentials, interrupts
from .experiment import resume
from .system import runtime
from .experiment import groups, job_task, sweep, sweep_dispatch, sweep_record
from . import store as tracking
from .jobs import config as C
from .core.data import DataError, DataWarning
from .system.redact import redact_text
from .measure.timing import CacheWarning
from .cli import parser as front
from .system.commandline import UsageError, fail
from .cli.sync import send_pending as _send_pending, sweep_up as _sweep_up, sync
from .cli.ui import ui

USAGE_LINE = (
    f"usage: {front.USAGE}; allowed commands are {front.ALLOWED} (python -m plnexp --help lists the commands, "
    "python -m plnexp run --help the config groups and overrides)"
)
HYDRA_FLAGS = {
    "--help",
    "-h",
    "--hydra-help",
    "--cfg",
    "-c",
    "--info",
    "-i",
    "--resolve",
    "--package",
    "-p",
    "--shell-completion",
    "-sc",
    "--version",
}


CONFIG_DIR_FLAGS = ("--config-dir", "-cd")


def config_dir_override(args: list[str]) -> list[str]:
    """``--config-dir DIR`` (or ``-cd DIR``, ``--config-dir=DIR``): the user's config folder, looked
    in after plnexp's conf/ (a sweep file ``DIR/sweep/NAME.yaml`` is then ``sweep=NAME``), as the
    override ``hydra.searchpath=[file://DIR]``."""
    out, folders = [], []
    it = iter(args)
    for a in it:
        name, eq, value = a.partition("=")
        if name in CONFIG_DIR_FLAGS:
            value = value if eq else next(it, "")
            if not value or not Path(value).is_dir():
                raise C.ConfigError(f"{name} {value}: not a folder; allowed values are existing folders of configs")
            folders.append(Path(value).resolve())
        else:
            out.append(a)
    if folders and any(a.startswith(f"{cli.SEARCHPATH}=") for a in out):
        raise C.ConfigError(f"--config-dir with {cli.SEARCHPATH}=: allowed is one of them (list every folder there)")
    if folders:
        out.append(f"{cli.SEARCHPATH}=[{','.join(f'file://{f}' for f in folders)}]")
    return out


def _check(overrides: list[str], multirun: bool):
    """Everything before the first run exists; returns the jobs and the store's URI. The device is
    checked here only when the jobs run on this machine (each job checks it again where it runs)."""
    jobs = cli.plan(overrides, multirun, check_device=cli.jobs_run_here(overrides))
    srun.check_tasks(jobs[0].config.processes, multirun)  # srun -n N: one fit of processes=N
    cli.check_data(jobs)
    cli.check_outputs()
    tracking.set_timeout(jobs[0].config.store_timeout_s)  # one value per sweep (plan.ONE_PER_SWEEP)
    uris = [tracking.check_store(u) for u in dict.fromkeys(j.config.tracking_uri for j in jobs)]
    return jobs, uris[0]


def _machinery_error(e: BaseException) -> int:
    """An error of Hydra's machinery (not of a job, which never raises): one line, exit 1."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1" or isinstance(e, SystemExit):
        raise e
    first = redact_text(str(e).strip().splitlines()[0]) if str(e).strip() else ""
    print(
        f"plnexp: error: {type(e).__name__}: {first} (HYDRA_FULL_ERROR=1 for the traceback)",
        file=sys.stderr,
        flush=True,
    )
    return 1


def run(plan: cli.Plan, uri: str) -> int:
    """A single run: the plan's one job, in this process."""
    task = job_task.Task()
    (spec,) = plan.specs()
    if spec.config.processes > 1:  # N JAX processes (started here, or one per srun task): process 0 logs the run
        job_task.write_job_dir(str(plan.run_dir()), spec.config, spec.overrides)  # as the job in this process does
        return processes.run(spec, uri, str(plan.run_dir()))
    with interrupts.handled(lambda signum: sweep.force_stop(None, uri, signal.Signals(signum).name)) as guard:
        try:
            task(spec, None, str(plan.run_dir()))
        except BaseException as e:  # noqa: BLE001 - an interrupt, or an error: one line either way
            stop = interrupts.stopped_by(e, guard)
            if stop is None:
                return _machinery_error(e)
            guard.stopping()
            tracking.end_process_runs(uri, "KILLED", f"interrupted by {stop.name}", "interrupted")
            print(f"plnexp: interrupted by {stop.name}: {sweep.killed_line(uri)}", file=sys.stderr, flush=True)
            return stop.exit_code
    return 1 if task.failed else 0


def _report(uri: str, parent_id: str) -> int:
    """The sweep's report (:mod:`plnexp.report.summary`), printed after its summary; 0, or 1 if it failed."""
    from .report import summary as report

    try:
        report.show(*report.build(uri, run_id=parent_id))
    except Exception as e:  # the sweep's runs are safe in the store: one line, exit 1
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(
            f"plnexp: error: the report failed ({type(e).__name__}: {redact_text(str(e).strip().splitlines()[0]) if str(e).strip() else ''}); "
            f"the runs are in the store: python -m plnexp report --run {parent_id}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


def multirun(overrides: list[str], jobs: cli.Plan, uri: str, resumed: bool = False, with_report: bool = True) -> int:
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

    def launch(record) -> None:
        executor = jobs.executor(sweep_dir)
        timed = executor.name in cli.LOCAL_LAUNCHERS and first.report.rounds > 0  # each group timed in rounds, here
        # the driver's jobs keep their programs for the rounds
        task = job_task.Task(held=groups.Held() if timed and executor.in_driver else None)
        verdicts = sweep_dispatch.run_jobs(task, record, sweep_dir, jobs.specs(), executor)
        groups.log_verdicts(record, verdicts)  # SLURM: each group timed in rounds on its node
        if timed:
            groups.time_groups(record, [j.config.as_study() for j in jobs], task.held)

    def header(record) -> str:
        from .experiment import presets

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


def _show_warning(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning):
    """plnexp's own warnings (a data set's empty columns, a compile cache it cannot write) as one
    line, like its errors."""
    if issubclass(category, (DataWarning, CacheWarning)):
        print(f"plnexp: warning: {redact_text(str(message))}", file=sys.stderr if file is None else file, flush=True)
    else:
        _default(message, category, filename, lineno, file, line)


class _OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"plnexp: {record.levelname.lower()}: {redact_text(record.getMessage())}"  # a failed job's reason may quote its store


def _log_to_stderr() -> None:
    """plnexp's log lines (a failed job's reason, a store retry) on stderr, one line each, for the
    command line only: Hydra is told to leave logging alone (conf/config.yaml)."""
    logger = logging.getLogger("plnexp")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_OneLine())
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    from .system.slurm import quiet_sacct

    # the one boundary: MLFLOW_TRACKING_URI's credential split off into the store client's own
    # variables (which the workers inherit), and stdout, stderr and logging masked for the command
    # (python -m plnexp masks the whole process: its last traceback too)
    with credentials.boundary():
        # plnexp owns this process: its settings before anything starts JAX (a job in another process,
        # which a launcher starts, applies them itself: job_task.Task)
        runtime.configure()
        quiet_sacct()  # hydra/launcher=submitit_slurm on a cluster without accounting: one line, not one per poll
        with warnings.catch_warnings():  # restores the default display on return (callers in Python)
            warnings.showwarning = _show_warning
            return _main(argv)


def _main(argv: list[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    try:  # the command (python -m plnexp --help lists them); each parses its own arguments
        command, args = front.command(given)
    except UsageError as e:
        if not given:  # no arguments at all: the commands, then the one error line
            front.front_end().print_help()
        return fail(e)
    if command is None:  # --help
        front.front_end().print_help()
        return 0
    secret = credentials.secret_argument(args)
    if secret is not None:  # a spec never holds a credential: refused before anything is read or written
        return fail(C.ConfigError(credentials.refusal(secret)))
    if command in ("run", "sweep", "rerun"):
        try:  # before Hydra, whose own error here is a 35-line traceback
            C.check_configs()
        except C.ConfigError as e:
            return fail(e)
    if command == "sync":
        return sync(args)
    if command == "rerun":
        from .experiment.rerun import main as rerun
        from .experiment.rerun_sources import store_override

        _send_pending(tracking.tracking_uri(store_override(args)[0]))
        return rerun(args)
    if command == "report":
        from .report.summary import main as report

        _send_pending(tracking.tracking_uri(None))
        return report(args)
    if command == "compare":
        from .report.compare import main as compare
        from .report.compare import store_of

        _send_pending(tracking.tracking_uri(store_of(args)))
        return compare(args)
    if command == "doctor":
        from .cli.doctor import main as doctor

        return doctor(args)
    if command == "ui":
        return ui(args)
    try:
        args = config_dir_override(args)
    except C.ConfigError as e:
        return fail(e)
    if command == "sweep" and not any(a.startswith("sweep=") for a in args):
        args.insert(0, "sweep=default")
    if any(a.split("=")[0] in HYDRA_FLAGS for a in args):
        from .experiment import hydra_front

        # help and inspection flags: Hydra answers them (in a process of its own), its answer shown
        # with credentials masked; its error is one line
        code, out, err = hydra_front.answer(args)
        print(redact_text(out), end="", flush=True)
        if code != 0:
            lines = [t for t in err.strip().splitlines() if t.strip()]
            first = redact_text(lines[-1].strip()).removeprefix("plnexp: error: ") if lines else f"exit {code}"
            print(f"plnexp: error: {first}", file=sys.stderr, flush=True)
            return 2 if code == 2 else 1  # argparse's usage errors exit 2
        return 0
    is_multirun = command == "sweep" or "-m" in args or "--multirun" in args
    overrides = [a for a in args if a not in ("-m", "--multirun")]
    unknown = [a for a in overrides if a.startswith("-")]
    if unknown:
        print(f"plnexp: error: unknown option {unknown[0]}; {USAGE_LINE}", file=sys.stderr)
        return 2
    is_multirun = is_multirun or any(o.startswith("sweep=") and o != "sweep=null" for o in overrides)
    overrides = [o for o in overrides if o != "sweep=null"]  # the default: no sweep file (a plain multirun)
    try:
        overrides, resumed = resume.pop_switch(overrides)
        overrides, with_report = cli.pop_switch(overrides, "report", True)
        if resumed and not is_multirun:
            raise C.ConfigError("resume=true: only for sweeps; allowed with python -m plnexp sweep or --multirun")
    except C.ConfigError as e:
        return fail(e)
    with interrupts.handled() as guard:  # nothing to record yet: an interrupt is one line
        try:
            with interrupts.deferred():  # held until the checks end: never half-way through Hydra's code
                jobs, uri = _check(overrides, is_multirun)
                _send_pending(uri)  # before the sweep-up and resume's reading of the store
                _sweep_up(uri)
        except (C.ConfigError, DataError, tracking.StoreError) as e:
            return fail(e)
        except KeyboardInterrupt as e:
            guard.stopping()
            stop = interrupts.as_interrupted(e)
            print(f"plnexp: interrupted by {stop.name} before any job started", file=sys.stderr, flush=True)
            return stop.exit_code
    return multirun(overrides, jobs, uri, resumed, with_report) if is_multirun else run(jobs, uri)


def exit_now(code: int) -> None:
    """After an interrupt: end the process without waiting for XLA. A compiled fit that Python has
    stopped waiting for may still be running in XLA's threads, and a normal interpreter exit waits for
    it (an hour, for a long scan); everything worth keeping is already recorded."""
    import logging

    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def _ran_fits_here() -> bool:
    """False when a process-pool launcher (joblib's loky) ran the jobs: its workers are gone, no XLA
    call runs here, and a normal exit lets loky clean up after itself."""
    from .system.executor_compat import loky_executor_running

    return not loky_executor_running()


if __name__ == "__main__":
    credentials.install()  # before the log handler takes its stream: the whole process is masked
    _log_to_stderr()
    code = main()
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM) and _ran_fits_here():
        exit_now(code)
    sys.exit(code)
