"""The config's schema: each field of a config dataclass declares its allowed values once, beside
its type and default (``n_iter: int = setting(Integer(1), 1000)``), and one function reads them.

A :class:`Check` turns a raw value (as Hydra composed it, or as a logged config holds it) into the
field's value, or raises :class:`ConfigError` with the one line the command line prints: the key and
its allowed values (``n_iter=-5: allowed values are integers >= 1``). The config's own dataclasses
(:mod:`plnexp.jobs.config`) check every declared field in ``__post_init__`` (:func:`check_fields`),
so a config built in code is held to the same rules as one composed from ``conf/``; :func:`read`
checks one field of a node where the loader needs its value before the whole config exists.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from typing import Any

CHECK = "plnexp.check"  # the key of a field's Check in its metadata


class ConfigError(ValueError):
    """A bad configuration value; the message is one line naming the key and the allowed values."""


class Check:
    """A field's allowed values: ``check(key, value)`` returns the value to hold (converted: a float
    for a number field, an enum member for a name) or raises :class:`ConfigError` naming ``key``."""

    allowed: str = ""

    def __call__(self, key: str, value: Any) -> Any:
        raise NotImplementedError

    def refuse(self, key: str, value: Any):
        raise ConfigError(f"{key}={value!r}: allowed values are {self.allowed}")


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


@dataclass(frozen=True)
class Integer(Check):
    """An integer of at least ``low`` (a bool is not one)."""

    low: int

    @property
    def allowed(self) -> str:  # type: ignore[override]
        return f"integers >= {self.low}"

    def __call__(self, key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < self.low:
            self.refuse(key, value)
        return value


@dataclass(frozen=True)
class Flag(Check):
    """true or false (a YAML bool; not 0, 1 or a string)."""

    allowed = "true, false"

    def __call__(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            self.refuse(key, value)
        return value


@dataclass(frozen=True)
class Number(Check):
    """A finite number from ``low`` to ``high`` (either end open where ``*_open``; ``high`` None: no
    upper bound), held as a float; ``allowed``: how the error line says it."""

    low: float
    high: float | None
    allowed: str = ""
    low_open: bool = False
    high_open: bool = False

    def __call__(self, key: str, value: Any) -> float:
        ok = _number(value) and math.isfinite(value)
        ok = ok and (value > self.low if self.low_open else value >= self.low)
        if ok and self.high is not None:
            ok = value < self.high if self.high_open else value <= self.high
        if not ok:
            self.refuse(key, value)
        return float(value)


@dataclass(frozen=True)
class OneOf(Check):
    """A member of ``enum`` (a str enum built from a registry), given as its name or as itself."""

    enum: type[Enum]

    @property
    def allowed(self) -> str:  # type: ignore[override]
        return ", ".join(e.value for e in self.enum)

    def __call__(self, key: str, value: Any) -> Enum:
        try:
            return self.enum(value)
        except ValueError:
            self.refuse(key, value)
            raise  # (refuse raised)


@dataclass(frozen=True)
class Text(Check):
    """A non-empty string; ``null`` allowed too where ``nullable``."""

    allowed: str
    nullable: bool = False
    empty: bool = False

    def __call__(self, key: str, value: Any) -> str | None:
        if value is None and self.nullable:
            return None
        if not isinstance(value, str) or (not value and not self.empty):
            self.refuse(key, value)
        return value


def checked(check: Check) -> dict:
    """The metadata of a field whose allowed values ``check`` declares."""
    return {CHECK: check}


def setting(check: Check, default: Any = MISSING) -> Any:
    """A dataclass field whose allowed values ``check`` declares (``default``: its default)."""
    return field(default=default, metadata=checked(check))


def check_of(cls: type, name: str) -> Check | None:
    """The :class:`Check` field ``name`` of dataclass ``cls`` declares (None: none)."""
    return next((f.metadata.get(CHECK) for f in fields(cls) if f.name == name), None)


def default_of(cls: type, name: str) -> Any:
    f = next(f for f in fields(cls) if f.name == name)
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def read(cls: type, node: dict, name: str, prefix: str = "") -> Any:
    """Field ``name`` of ``cls`` from the raw ``node`` (its default where the node lacks it), checked."""
    value = node[name] if name in node else default_of(cls, name)
    check = check_of(cls, name)
    return value if check is None else check(f"{prefix}{name}", value)


def check_fields(obj: Any, prefix: str = "") -> None:
    """Check, and convert in place, every field of the frozen dataclass ``obj`` that declares a
    :class:`Check` (in its ``__post_init__``); ``prefix``: the keys' path (``dataset.``)."""
    for f in fields(obj):
        check = f.metadata.get(CHECK)
        if check is not None:
            object.__setattr__(obj, f.name, check(f"{prefix}{f.name}", getattr(obj, f.name)))


def allowed_values(cls: type) -> dict[str, str]:
    """Each checked field of ``cls`` and how its allowed values read (the configuration reference)."""
    return {f.name: f.metadata[CHECK].allowed for f in fields(cls) if CHECK in f.metadata}
