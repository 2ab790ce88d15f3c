"""Hydra's private APIs, and those of Hydra's submitit launcher, that plnexp uses, each behind one
shim (docs/development.md, "Private APIs"). Written for hydra-core 1.3.8 and
hydra-submitit-launcher 1.2.0; each shim's version gate (:func:`plnexp.system.versions.gate`) says
what it does on another release (pyproject asks for hydra-core>=1.3.2).

The SLURM launcher (``hydra_plugins/plnexp_slurm``) uses the last two; elsewhere it reads and sets
a job's value through Hydra's public ``JobReturn.return_value`` property.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from typing import Any

from ..system.versions import gate, installed

HYDRA = "1.3.8"  # the hydra-core release every shim here was written for (and checked against)
SUBMITIT_LAUNCHER = "1.2.0"  # the hydra-submitit-launcher release submitit_job_args was written for


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


def clear_global_hydra() -> None:
    """Forget the config search path of the last ``hydra.main`` or ``initialize`` call, so that this
    process can start Hydra again.

    Wraps ``hydra.core.global_hydra.GlobalHydra.instance().clear()`` (hydra-core 1.3.8): ``hydra.main``
    leaves Hydra initialised, and only its ``initialize`` context managers clear it (on exit).
    Gate: on another hydra-core, warns, then calls it anyway."""
    from hydra.core.global_hydra import GlobalHydra

    gate("hydra-core", HYDRA, "hydra_compat.clear_global_hydra", "calling GlobalHydra.instance().clear() anyway")
    GlobalHydra.instance().clear()


def job_value(result) -> Any:
    """What a job left in its ``JobReturn``, whatever its status: its task's value where it completed,
    the exception it raised where it failed (None where there is none).

    Wraps ``JobReturn._return_value`` (hydra-core 1.3.8): the public ``return_value`` property raises
    a failed job's exception, after writing a line to stderr. Gate: on another hydra-core, warns and
    falls back to the public property (its stderr line swallowed), returning what it raises."""
    if gate("hydra-core", HYDRA, "hydra_compat.job_value", "reading JobReturn.return_value instead"):
        return result._return_value
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return result.return_value
    except Exception as e:  # noqa: BLE001 - the job's own error, as Hydra recorded it
        return e


def submitit_job_args(job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[tuple]:
    """The arguments, one tuple per job, that a submitit launcher's ``__call__`` takes in a job (what
    ``executor.map_array(launcher, *zip(*args))`` submits): the job's overrides, the sweep directory's
    key, its index, a placeholder id and Hydra's singletons' state.

    Wraps the private protocol of ``BaseSubmititLauncher.__call__`` and ``launch`` (of which
    ``hydra/launcher=slurm`` replaces the wait) and ``hydra.core.singleton.Singleton.get_state``
    (hydra-submitit-launcher 1.2.0, hydra-core 1.3.8): the launcher has no public way to submit
    without waiting by submitit's own watcher (``sacct``). Gate: on another
    hydra-submitit-launcher, raises a RuntimeError in one line (use ``hydra/launcher=submitit_slurm``)."""
    from hydra.core.singleton import Singleton

    found = installed("hydra-submitit-launcher")
    if found != SUBMITIT_LAUNCHER:
        raise RuntimeError(
            f"hydra/launcher=slurm was written for hydra-submitit-launcher {SUBMITIT_LAUNCHER}, this is {found}: "
            "install that release, or use hydra/launcher=submitit_slurm"
        )
    return [
        (list(o), "hydra.sweep.dir", initial_job_idx + i, f"job_id_for_{initial_job_idx + i}", Singleton.get_state())
        for i, o in enumerate(job_overrides)
    ]
