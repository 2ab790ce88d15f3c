"""The front end of ``python -m plnexp``: which command a command line names, and the help that lists
them. Each command parses its own arguments with a :class:`plnexp.system.commandline.Parser` (the
subparser of its name, shown by ``python -m plnexp COMMAND --help``); ``run`` and ``sweep`` take
Hydra's overrides and flags (``run --help``: Hydra's help, the config groups), ``ui`` mlflow ui's
options."""

from __future__ import annotations

import argparse

from ..system.commandline import Parser, UsageError

# name: what it does, in one line (python -m plnexp --help)
COMMANDS = {
    "run": "one fit, logged; prints a one-line summary (Hydra overrides: key=value, group=option)",
    "sweep": "a grid of fits under one parent run (sweep=NAME, default sweep=default; Hydra overrides)",
    "report": "table and plots of a sweep (default: the newest)",
    "rerun": "a logged run (or a whole sweep) again, compared with the original",
    "compare": "how two runs' compiled programs differ (their logged HLO)",
    "sync": "send to the store the results kept locally when it failed",
    "ui": "mlflow ui on the project's store (127.0.0.1:5000; mlflow ui's options)",
    "doctor": "versions, devices, flags, store, ELBO vs a float64 host reference",
}
ALLOWED = ", ".join(COMMANDS)
USAGE = "python -m plnexp {" + ",".join(COMMANDS) + "} [--config-dir DIR] [overrides ...]"
EPILOG = """\
run and sweep take Hydra overrides (key=value, group=option, +key=value, ~key), -m/--multirun and
--config-dir DIR (a folder of your own configs); overrides alone mean run:
  python -m plnexp n_iter=50 strategy=fori_loop
python -m plnexp run --help lists the config groups and their options (Hydra's help);
python -m plnexp COMMAND --help shows a command's usage. Outputs (Hydra dirs, the MLflow store and
its artifacts) go to ./outputs or $PLNEXP_OUTPUTS."""


def front_end() -> Parser:
    """``python -m plnexp``'s parser: one subparser per command, listed with its line by ``--help``."""
    top = Parser(
        USAGE,
        "plnexp: Poisson log-normal fits in JAX under several JIT strategies, tracked in MLflow.",
        epilog=EPILOG,
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, max_help_position=14, width=110),
    )
    sub = top.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for name, line in COMMANDS.items():
        sub.add_parser(name, help=line, usage=f"python -m plnexp {name} ...", add_help=False)
    return top


def is_override(word: str) -> bool:
    """A Hydra override (``key=value``, ``+key=value``, ``~key``) rather than a command."""
    return "=" in word or word.startswith(("+", "~"))


def command(argv: list[str]) -> tuple[str | None, list[str]]:
    """``(COMMAND, its arguments)`` of a command line: None for ``--help``/``-h`` (the front end's
    help); ``run`` where it starts with overrides or an option (Hydra's flags, ``--multirun``,
    ``--config-dir``: a bare override list is a run); a :class:`UsageError` for no command or an
    unknown one."""
    if not argv:
        raise UsageError(f"no command; usage: {USAGE}; allowed commands are {ALLOWED} (python -m plnexp --help)")
    first = argv[0]
    if first in ("-h", "--help"):
        return None, argv[1:]
    if first in COMMANDS:
        return first, argv[1:]
    if is_override(first) or first.startswith("-"):
        return "run", argv
    raise UsageError(f"unknown command {first!r}; allowed commands are {ALLOWED}")
