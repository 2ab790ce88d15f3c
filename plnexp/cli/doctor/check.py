"""One finding of ``python -m plnexp doctor`` (:class:`Check`): what every check of
:mod:`plnexp.cli.doctor` returns a list of."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """One finding: ``ok`` is True (passed), False (failed) or None (information, or skipped)."""

    name: str
    ok: bool | None
    detail: str

    @property
    def label(self) -> str:
        return {True: "ok", False: "FAIL", None: "info"}[self.ok]
