"""``python -m plnexp``'s command line: one argparse app (:func:`app`), a subparser per command, each
naming its handler (:mod:`plnexp.__main__` runs it). ``run`` and ``sweep`` take Hydra's overrides as
their remainder, with ``--config-dir``, ``-m``/``--multirun`` (and for ``sweep`` ``--dry-run``,
``--json``), Hydra's help and inspection flags (``run --help``: Hydra's help, the config groups) kept
in order for Hydra to answer; the other commands' words go to the command's own parser, in its
module (``python -m plnexp COMMAND --help``), ``ui``'s to mlflow ui. Overrides alone mean ``run``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..jobs.schema import ConfigError
from ..system.commandline import Helped, Parser, UsageError

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
USAGE_LINE = (
    f"usage: {USAGE}; allowed commands are {ALLOWED} (python -m plnexp --help lists the commands, "
    "python -m plnexp run --help the config groups and overrides)"
)
EPILOG = """\
run and sweep take Hydra overrides (key=value, group=option, +key=value, ~key), -m/--multirun and
--config-dir DIR (a folder of your own configs); overrides alone mean run:
  python -m plnexp n_iter=50 strategy=fori_loop
sweep --dry-run prints the jobs the sweep would run and writes nothing (--json: as JSON).
python -m plnexp run --help lists the config groups and their options (Hydra's help);
python -m plnexp COMMAND --help shows a command's usage. Outputs (Hydra dirs, the MLflow store and
its artifacts) go to ./outputs or $PLNEXP_OUTPUTS."""
SEARCHPATH = "hydra.searchpath"

# Hydra's help and inspection flags (hydra.main's own), with the values each takes: Hydra answers them
# (the long name last: argparse names an option by its last name in its errors)
HYDRA_FLAGS: tuple[tuple[tuple[str, ...], int | str | None], ...] = (
    (("-h", "--help"), 0),
    (("--hydra-help",), 0),
    (("-c", "--cfg"), None),
    (("-i", "--info"), "?"),
    (("--resolve",), 0),
    (("-p", "--package"), None),
    (("-sc", "--shell-completion"), 0),
    (("--version",), 0),
)


class _HydraFlag(argparse.Action):
    """One of Hydra's flags, kept with its value in the order given (``hydra_flags``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = [] if values is None else [values] if isinstance(values, str) else list(values)
        namespace.hydra_flags = [*namespace.hydra_flags, option_string, *given]


def _overrides_parser(p: Parser, sweep: bool) -> None:
    """``run``'s and ``sweep``'s arguments: Hydra's overrides, its flags, and plnexp's own options."""
    p.set_defaults(hydra_flags=[], dry_run=False, json=False)
    for names, nargs in HYDRA_FLAGS:
        p.add_argument(*names, nargs=nargs, action=_HydraFlag, help=argparse.SUPPRESS)
    p.add_argument("-cd", "--config-dir", action="append", default=[], metavar="DIR")
    p.add_argument("-m", "--multirun", action="store_true")
    if sweep:
        p.add_argument("--dry-run", action="store_true", help="print the jobs the sweep would run; write nothing")
        p.add_argument("--json", action="store_true", help="with --dry-run: the jobs as JSON")
    p.add_argument("overrides", nargs="*")


def app() -> Parser:
    """``python -m plnexp``'s parser: one subparser per command, listed with its line by ``--help``."""
    top = Parser(
        USAGE,
        "plnexp: Poisson log-normal fits in JAX under several JIT strategies, tracked in MLflow.",
        epilog=EPILOG,
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, max_help_position=14, width=110),
    )
    sub = top.add_subparsers(dest="command", title="commands", metavar="COMMAND", parser_class=Parser)
    for name, line in COMMANDS.items():
        if name in ("run", "sweep"):
            _overrides_parser(sub.add_parser(name, help=line, usage=USAGE, add_help=False), name == "sweep")
        else:  # no prefix: every word, options included, goes as given to the command's own parser
            p = sub.add_parser(name, help=line, usage=f"python -m plnexp {name} ...", add_help=False, prefix_chars="\0")
            p.add_argument("args", nargs="*")
    return top


def is_override(word: str) -> bool:
    """A Hydra override (``key=value``, ``+key=value``, ``~key``) rather than a command."""
    return "=" in word or word.startswith(("+", "~"))


def parse(argv: list[str]) -> argparse.Namespace | None:
    """The command line's namespace (``command``; ``args`` for a command with a parser of its own,
    ``overrides`` and the options for ``run`` and ``sweep``); None once ``--help`` is printed. An
    override or an option first means ``run``; no command, an unknown one or an unknown option: a
    :class:`UsageError`."""
    if not argv:
        raise UsageError(f"no command; usage: {USAGE}; allowed commands are {ALLOWED} (python -m plnexp --help)")
    first = argv[0]
    if first not in COMMANDS and first not in ("-h", "--help"):
        if not (is_override(first) or first.startswith("-")):
            raise UsageError(f"unknown command {first!r}; allowed commands are {ALLOWED}")
        argv = ["run", *argv]
    try:
        ns, extra = app().parse_known_args(argv)
    except Helped:
        return None
    if extra and ns.command not in ("run", "sweep"):
        raise UsageError(f"unknown argument {extra[0]}; {USAGE_LINE}")
    if extra:  # argparse leaves the overrides after an option aside, in their order
        ns.overrides = [*ns.overrides, *extra]
        unknown = [a for a in extra if a.startswith("-")]
        if unknown:
            raise UsageError(f"unknown option {unknown[0]}; {USAGE_LINE}")
    return ns


def searchpath(folders: list[str], overrides: list[str]) -> list[str]:
    """``--config-dir DIR`` (repeatable): the user's config folders, looked in after plnexp's conf/ (a
    sweep file ``DIR/sweep/NAME.yaml`` is then ``sweep=NAME``), as the override
    ``hydra.searchpath=[file://DIR]`` after ``overrides``."""
    for f in folders:
        if not f or not Path(f).is_dir():
            raise ConfigError(f"--config-dir {f}: not a folder; allowed values are existing folders of configs")
    if folders and any(a.startswith(f"{SEARCHPATH}=") for a in overrides):
        raise ConfigError(f"--config-dir with {SEARCHPATH}=: allowed is one of them (list every folder there)")
    paths = ",".join(f"file://{Path(f).resolve()}" for f in folders)
    return [*overrides, f"{SEARCHPATH}=[{paths}]"] if folders else overrides
