"""The config's schema: each field of a config dataclass declares its allowed values once, beside
its type and default (``n_iter: int = setting(Integer(1), 1000)``), and pydantic's core checks them.

A :class:`Rule` turns a raw value (as Hydra composed it, or as a logged config holds it) into the
field's value, or raises :class:`ConfigError` with the one line the command line prints: the key and
its allowed values (``n_iter=-5: allowed values are integers >= 1``). The config's own dataclasses
(:mod:`plnexp.jobs.config`) check every declared field in ``__post_init__`` (:func:`check_fields`),
so a config built in code is held to the same rules as one composed from ``conf/``; :func:`read`
checks one field of a node where the loader needs its value before the whole config exists.

The rules are pydantic-core schemas (``pydantic_core.core_schema``: pydantic v2's validators), built
in microseconds where pydantic's ``TypeAdapter`` takes milliseconds a field; ``pydantic_core`` is
imported at the first check, not with the config: a worker that receives its config pickled (never
built again) does not import it at all.
"""

from __future__ import annotations

import functools
from dataclasses import MISSING, dataclass, field, fields
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any

RULE = "plnexp.rule"  # the key of a field's Rule in its metadata


class ConfigError(ValueError):
    """A bad configuration value; the message is one line naming the key and the allowed values."""


@dataclass(frozen=True)
class Rule:
    """A field's allowed values: pydantic-core's ``<schema>_schema(**limits)`` (``int``, ``bool``,
    ``float``, ``str``, ``enum``, ``literal``; ``strict`` among the limits: no string or bool for a
    number, no 0 or 1 for a bool), ``null`` too where ``nullable``, a tuple of such values where
    ``many`` (a list given converts; one value is a tuple of one, ``null`` an empty one), and ``allowed``, how the error line says them.
    ``rule(key, value)`` returns the value to hold (converted: a float for a number field, an enum
    member for a name) or raises :class:`ConfigError` naming ``key`` and the value refused (the
    element of a tuple)."""

    schema: str
    allowed: str
    limits: tuple[tuple[str, Any], ...] = ()
    nullable: bool = False
    many: bool = False
    after: Callable[[Any], Any] | None = None  # then this, which returns the value held or raises ValueError

    @functools.cached_property
    def _validator(self) -> Any:
        from pydantic_core import SchemaValidator, core_schema

        schema = getattr(core_schema, f"{self.schema}_schema")(**dict(self.limits))
        if self.after is not None:
            schema = core_schema.no_info_after_validator_function(self.after, schema)
        if self.many:
            schema = core_schema.tuple_schema([schema], variadic_item_index=0, strict=False)
        return SchemaValidator(core_schema.nullable_schema(schema) if self.nullable else schema)

    def __call__(self, key: str, value: Any) -> Any:
        from pydantic_core import ValidationError

        if self.many and not isinstance(value, (list, tuple)):  # one value, or none
            value = () if value is None else (value,)
        try:
            return self._validator.validate_python(value)
        except ValidationError as e:
            raise ConfigError(f"{key}={e.errors()[0]['input']!r}: allowed values are {self.allowed}") from None


def Integer(low: int, allowed: str = "") -> Rule:
    """An integer of at least ``low`` (a bool is not one)."""
    return Rule("int", allowed or f"integers >= {low}", (("ge", low), ("strict", True)))


def Flag() -> Rule:
    """true or false (a YAML bool; not 0, 1 or a string)."""
    return Rule("bool", "true, false", (("strict", True),))


def Number(
    low: float,
    high: float | None,
    allowed: str,
    low_open: bool = False,
    high_open: bool = False,
    nullable: bool = False,
) -> Rule:
    """A finite number from ``low`` to ``high`` (either end open where ``*_open``; ``high`` None: no
    upper bound; ``null`` allowed too where ``nullable``), held as a float; ``allowed``: how the
    error line says it."""
    limits = [("allow_inf_nan", False), ("strict", True), ("gt" if low_open else "ge", low)]
    if high is not None:
        limits.append(("lt" if high_open else "le", high))
    return Rule("float", allowed, tuple(limits), nullable)


def OneOf(enum: type[Enum]) -> Rule:
    """A member of ``enum`` (a str enum built from a registry), given as its name or as itself."""
    return Rule("enum", ", ".join(e.value for e in enum), (("cls", enum), ("members", list(enum)), ("sub_type", "str")))


def Text(allowed: str, nullable: bool = False, empty: bool = False, many: bool = False) -> Rule:
    """A string, non-empty unless ``empty``; ``null`` allowed too where ``nullable``; a tuple of
    them where ``many``."""
    return Rule("str", allowed, (("strict", True),) + ((("min_length", 1),) if not empty else ()), nullable, many)


def File(allowed: str, suffix: str = "", nullable: bool = False) -> Rule:
    """The path of an existing file (its name ending in ``suffix`` where given), held resolved."""
    return Rule("str", allowed, (("strict", True),), nullable, after=functools.partial(_existing_file, suffix))


def _existing_file(suffix: str, value: str) -> str:
    if not Path(value).is_file() or (suffix and Path(value).suffix != suffix):
        raise ValueError("not an existing file")
    return str(Path(value).resolve())


def Names(names: tuple[str, ...]) -> Rule:
    """A tuple of names each one of ``names`` (a list given converts)."""
    return Rule("literal", ", ".join(names), (("expected", list(names)),), many=True)


def checked(rule: Rule) -> dict:
    """The metadata of a field whose allowed values ``rule`` declares."""
    return {RULE: rule}


def setting(rule: Rule, default: Any = MISSING) -> Any:
    """A dataclass field whose allowed values ``rule`` declares (``default``: its default)."""
    return field(default=default, metadata=checked(rule))


def read(cls: type, node: dict, name: str, prefix: str = "") -> Any:
    """Field ``name`` of ``cls`` from the raw ``node`` (its default where the node lacks it), checked."""
    f = next(f for f in fields(cls) if f.name == name)
    value = node[name] if name in node else f.default
    return f.metadata[RULE](f"{prefix}{name}", value)


def check_fields(obj: Any, prefix: str = "") -> None:
    """Check, and convert in place, every field of the frozen dataclass ``obj`` that declares a
    :class:`Rule` (in its ``__post_init__``); ``prefix``: the keys' path (``dataset.``)."""
    for f in fields(obj):
        rule = f.metadata.get(RULE)
        if rule is not None:
            object.__setattr__(obj, f.name, rule(f"{prefix}{f.name}", getattr(obj, f.name)))


def allowed_values(cls: type) -> dict[str, str]:
    """Each checked field of ``cls`` and how its allowed values read (the configuration reference)."""
    return {f.name: f.metadata[RULE].allowed for f in fields(cls) if RULE in f.metadata}
