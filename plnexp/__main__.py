"""``python -m plnexp run|sweep|report|rerun|compare|sync|ui|doctor [overrides]``: the command line.

:mod:`plnexp.cli.parser` parses it (one argparse app: ``--help`` lists the commands; overrides alone
mean ``run``) and :data:`HANDLERS` runs the command it names, each imported when called (``--help``
imports neither JAX nor MLflow): ``run`` and ``sweep`` (:mod:`plnexp.cli.run_sweep`) take Hydra's
overrides, Hydra answering its own help and inspection flags; ``ui`` passes its options to mlflow ui;
the others parse theirs with their own :class:`plnexp.system.commandline.Parser`. A bad command line
is one line ``plnexp: error: WHAT; usage: ...``, exit 2; a command line holding a credential is
refused before anything is read or written. Every command first sends the fits' results kept
locally when the store failed (:mod:`plnexp.store.pending`; ``sync`` does only that).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import warnings
from collections.abc import Callable

from .cli import parser as front
from .experiment import hydra_front
from .jobs.schema import ConfigError
from .system import credentials, runtime
from .system.commandline import UsageError, fail
from .system.redact import redact_text


def _overrides(ns: argparse.Namespace) -> int:
    """``run`` and ``sweep``: Hydra's flags answered by Hydra, ``--dry-run`` by the plan, else the jobs run."""
    try:
        overrides = front.searchpath(ns.config_dir, ns.overrides)
        if ns.json and not ns.dry_run:
            raise ConfigError("--json: only with --dry-run; allowed is python -m plnexp sweep --dry-run --json")
    except ConfigError as e:
        return fail(e)
    if ns.command == "sweep" and not any(a.startswith("sweep=") for a in overrides):
        overrides.insert(0, "sweep=default")
    if ns.hydra_flags:
        return _hydra_answers([*ns.hydra_flags, *(["--multirun"] if ns.multirun else []), *overrides])
    if ns.dry_run:
        from .experiment import dry_run  # type: ignore[attr-defined,unused-ignore]  # (its own branch)

        return dry_run.main(overrides, ns.json)
    from .cli import run_sweep

    return run_sweep.main(ns, overrides)


def _hydra_answers(args: list[str]) -> int:
    """Hydra's help and inspection flags: Hydra answers them, its answer shown with credentials masked;
    its error is one line."""
    code, out, err = hydra_front.answer(args)
    print(redact_text(out), end="", flush=True)
    if code != 0:
        lines = [t for t in err.strip().splitlines() if t.strip()]
        first = redact_text(lines[-1].strip()).removeprefix("plnexp: error: ") if lines else f"exit {code}"
        print(f"plnexp: error: {first}", file=sys.stderr, flush=True)
        return 2 if code == 2 else 1  # argparse's usage errors exit 2
    return 0


def _send_pending(uri: str | None) -> None:
    """The results kept locally for the store at ``uri`` (None: the default one) sent first."""
    from . import store
    from .cli.sync import send_pending

    send_pending(store.tracking_uri(uri))


def _rerun(ns: argparse.Namespace) -> int:
    from .experiment.rerun import main as rerun
    from .experiment.rerun_sources import store_override

    _send_pending(store_override(ns.args)[0])
    return rerun(ns.args)


def _report(ns: argparse.Namespace) -> int:
    from .report.summary import main as report

    _send_pending(None)
    return report(ns.args)


def _compare(ns: argparse.Namespace) -> int:
    from .report.compare import main as compare
    from .report.compare import store_of

    _send_pending(store_of(ns.args))
    return compare(ns.args)


def _sync(ns: argparse.Namespace) -> int:
    from .cli.sync import sync

    return sync(ns.args)


def _ui(ns: argparse.Namespace) -> int:
    from .cli.ui import ui

    return ui(ns.args)


def _doctor(ns: argparse.Namespace) -> int:
    from .cli.doctor import main as doctor

    return doctor(ns.args)


# each command's handler (python -m plnexp --help lists them: plnexp.cli.parser.COMMANDS)
HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _overrides,
    "sweep": _overrides,
    "report": _report,
    "rerun": _rerun,
    "compare": _compare,
    "sync": _sync,
    "ui": _ui,
    "doctor": _doctor,
}


# plnexp's own warnings shown as one line, named rather than imported (their modules import JAX)
ONE_LINE_WARNINGS = ("plnexp.core.data.DataWarning", "plnexp.measure.timing.CacheWarning")


def _show_warning(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning):
    """plnexp's own warnings (a data set's empty columns, a compile cache it cannot write) as one
    line, like its errors."""
    if any(f"{c.__module__}.{c.__qualname__}" in ONE_LINE_WARNINGS for c in category.__mro__):
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
        quiet_sacct()  # hydra/launcher=submitit_slurm on a cluster without accounting: one line, not one per poll
        with warnings.catch_warnings():  # restores the default display on return (callers in Python)
            warnings.showwarning = _show_warning
            return _main(argv)


def _main(argv: list[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    try:
        ns = front.parse(given)
    except UsageError as e:
        if not given:  # no arguments at all: the commands, then the one error line
            front.app().print_help()
        return fail(e)
    if ns is None:  # --help: printed
        return 0
    secret = credentials.secret_argument(given)
    if secret is not None:  # a spec never holds a credential: refused before anything is read or written
        return fail(ConfigError(credentials.refusal(secret)))
    if ns.command in ("run", "sweep", "rerun"):
        try:  # before Hydra, whose own error here is a 35-line traceback
            hydra_front.check_configs()
        except ConfigError as e:
            return fail(e)
    if not getattr(ns, "hydra_flags", None):  # (Hydra's help and inspection fit nothing)
        # plnexp owns this process: its settings before anything starts JAX (a job in another process,
        # which a launcher starts, applies them itself: job_task.Task)
        runtime.configure()
    return HANDLERS[ns.command](ns)


def exit_now(code: int) -> None:
    """After an interrupt: end the process without waiting for XLA. A compiled fit that Python has
    stopped waiting for may still be running in XLA's threads, and a normal interpreter exit waits for
    it (an hour, for a long scan); everything worth keeping is already recorded."""
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
