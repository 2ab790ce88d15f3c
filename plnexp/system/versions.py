"""The version gate of plnexp's shims over other libraries' private APIs (the ``*_compat`` modules).

Each shim was written against one release of its library (the installed version when it was
written, named in the shim's docstring). :func:`gate` says whether the installed release is that
one; where it is not, it warns once per shim, in one line (:class:`CompatWarning`), and the shim
then falls back to a public path or tries the private API anyway, as its docstring says.
"""

from __future__ import annotations

import importlib.metadata
import warnings

_warned: set[tuple[str, str]] = set()


class CompatWarning(UserWarning):
    """A shim over a library's private API runs on a release of the library that it was not written
    for (one line: the shim, the release it was written for, the one installed, what it does now)."""


def installed(dist: str) -> str | None:
    """The installed version of the distribution ``dist`` (pip's name), without a local part
    (``2.13.0+cpu`` -> ``2.13.0``); None where it is not installed."""
    try:
        return importlib.metadata.version(dist).split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def gate(dist: str, checked: str, what: str, then: str) -> bool:
    """True where ``dist`` is installed at version ``checked`` (the one the shim ``what`` was written
    for). Otherwise False, after a :class:`CompatWarning` (once per process and shim) saying ``then``:
    what the shim does instead."""
    found = installed(dist)
    if found == checked:
        return True
    if (dist, what) not in _warned:
        _warned.add((dist, what))
        warnings.warn(
            f"plnexp: {what} was written for {dist} {checked}, this is {dist} {found}: {then}",
            CompatWarning,
            stacklevel=3,
        )
    return False
