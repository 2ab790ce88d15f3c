"""Hydra's private API that plnexp uses, behind one shim (docs/development.md, "Private APIs").
Written for hydra-core 1.3.8; the shim's version gate (:func:`plnexp.system.versions.gate`) says
what it does on another release (pyproject asks for hydra-core>=1.3.2). No Hydra launcher runs
plnexp's jobs (:mod:`plnexp.experiment.executors`), so none of Hydra's job machinery is used.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..system.versions import gate

HYDRA = "1.3.8"  # the hydra-core release every shim here was written for (and checked against)


def parse_overrides(overrides: Sequence[str]) -> list:
    """``overrides`` parsed by Hydra's override grammar: its ``Override`` objects, in order; a
    ``HydraException`` (Hydra's own message) for a bad one.

    Wraps ``hydra.core.override_parser.overrides_parser.OverridesParser`` (hydra-core 1.3.8, not
    documented): Hydra's public compose API composes a config from overrides but never hands them
    back parsed (a sweep's values, a group's option). Gate: on another hydra-core, warns, then uses
    it anyway."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    gate("hydra-core", HYDRA, "hydra_compat.parse_overrides", "using its OverridesParser anyway")
    return OverridesParser.create().parse_overrides(list(overrides))
