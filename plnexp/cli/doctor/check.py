"""One finding of ``python -m plnexp doctor`` (:class:`Check`): what every check of
:mod:`plnexp.cli.doctor` returns a list of; :func:`finding`, a check of one finding named after its
function; :func:`first_line`, how an error is told in a finding."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from ...system.commandline import first_line as first_line  # the one way an error is told in one line


@dataclass(frozen=True)
class Check:
    """One finding: ``ok`` is True (passed), False (failed) or None (information, or skipped)."""

    name: str
    ok: bool | None
    detail: str

    @property
    def label(self) -> str:
        return {True: "ok", False: "FAIL", None: "info"}[self.ok]


def finding(fn: Callable[..., tuple[bool | None, str]]) -> Callable[..., list[Check]]:
    """A check of one finding: ``fn`` returns (ok, detail); the check is named after ``fn``."""

    @functools.wraps(fn)
    def check(*args, **kwargs) -> list[Check]:
        return [Check(fn.__name__, *fn(*args, **kwargs))]

    return check
