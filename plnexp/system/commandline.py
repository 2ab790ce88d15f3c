"""The command lines' parsing and their one-line errors: :class:`Parser` (argparse whose every
error is one line ``plnexp: error: WHAT; usage: ...``, exit 2) and :func:`fail` (the one line of a bad
input, whatever the command). The front end that picks the command is :mod:`plnexp.cli.parser`."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from .redact import redact_text


class UsageError(ValueError):
    """A command line that does not parse: one line naming what is wrong and the command's usage."""

    kind = "error"


def fail(e: Exception) -> int:
    """One line on stderr for bad input, ``plnexp: KIND: MESSAGE`` (KIND: the exception's ``kind``,
    ``error``, ``data error``, ``store error``), exit code 2; with ``HYDRA_FULL_ERROR=1`` the exception
    is raised instead (its traceback), except a command line that does not parse."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1" and not isinstance(e, UsageError):
        raise e
    kind = getattr(e, "kind", "error")
    print(f"plnexp: {kind}: {redact_text(str(e))}", file=sys.stderr, flush=True)  # an override may hold a password
    return 2


def first_line(e: BaseException) -> str:
    """An exception in one line: ``TYPE: the first line of its message`` (credentials masked), or
    ``TYPE`` alone."""
    text = str(e).strip()
    return f"{type(e).__name__}: {redact_text(text.splitlines()[0])}" if text else type(e).__name__


class Helped(Exception):
    """The help was printed (``-h``/``--help``): the command ends, exit 0."""


def _plain(message: str) -> str:
    """argparse's own messages in plnexp's words."""
    needs = re.fullmatch(r"argument (?:\S+/)?(\S+): expected one argument", message)
    return f"{needs.group(1)}: needs a value" if needs else message


class Parser(argparse.ArgumentParser):
    """argparse for one plnexp command: ``usage`` (without its ``usage: ``) is printed as given, the
    ``description`` as written, options are never abbreviated, every error is a :class:`UsageError`
    (``WHAT; usage: USAGE``) and :meth:`parse` returns None once ``--help`` is printed. ``unknown``:
    the words for an argument the command does not take (``{arg}``, ``{allowed}``: its options)."""

    def __init__(
        self,
        usage: str,
        description: str = "",
        unknown: str = "unknown {kind} {arg}; allowed options are {allowed}",
        **kwargs,
    ):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        kwargs.setdefault("prog", "python -m plnexp")
        self.options: dict[str, str] = {}  # each option's dest: its name (--min-speedup), but help's
        super().__init__(usage=usage, description=description, allow_abbrev=False, **kwargs)
        self.unknown = unknown

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if action.option_strings and action.dest != "help":
            self.options[action.dest] = max(action.option_strings, key=len)
        return action

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{_plain(message)}; usage: {self.usage}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if status == 0:  # after --help
            raise Helped
        self.error((message or "").strip())

    def allowed(self) -> str:
        """The command's options, but help: ``--strict, --out``; ``none`` without any."""
        return ", ".join(self.options.values()) or "none"

    def parse(self, args: Sequence[str]) -> argparse.Namespace | None:
        """The options and positional arguments (options and positionals in any order); None when the
        help was asked for (and printed). An argument the command does not take: a :class:`UsageError`."""
        try:
            ns, extra = self.parse_known_intermixed_args(list(args))
        except Helped:
            return None
        if extra:
            arg = extra[0]
            kind = "option" if arg.startswith("-") else "argument"
            self.error(self.unknown.format(kind=kind, arg=arg, allowed=self.allowed()))
        return ns
