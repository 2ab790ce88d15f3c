"""``python -m plnexp doctor``: can this machine be trusted to run plnexp, and give right numbers?

One line per check (``ok``, ``FAIL`` or ``info``, the check's name, what it found; an ``info`` whose
finding starts with ``warning:`` deserves a look but fails nothing), then a summary line; exit
status 0 when nothing failed, 1 otherwise. ``--json`` prints the checks as a JSON list.

The checks: package versions; JAX's devices per platform; float64 (x64) availability; the XLA
flags and whether plnexp set any (only for a jaxlib it has checked, see :mod:`plnexp.system.runtime`);
SciPy's OpenBLAS threads; the MLflow store, resolved as the commands resolve it (a local store:
reachable and writable without creating anything in it, and for sqlite the filesystem, with a
warning on NFS, Lustre, GPFS...; a tracking server: ``/health`` answers, a run created and deleted
in the experiment ``plnexp-doctor``, an artifact uploaded to it and read back, whether the
artifacts go through the server or straight to a path every node must see, and whether it requires
authentication and accepts ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``); SLURM (the client
and a controller that answers, for ``hydra/launcher=slurm``); and the numerics: on every JAX
device, for each model (full, profiled, and pca at rank 2) and precision, the jitted partial ELBO
(``model.state_elbo`` and the value of ``model.value_and_grad``) at a seeded random point on the
shipped oaks data against the float64 host reference (:mod:`plnexp.core.reference`) at the precision's tolerance
(:meth:`plnexp.core.precision.Precision.check_tolerance`), plus the reduction that jaxlib 0.10.2's CPU
backend is known to miscompile without plnexp's XLA flag.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from collections.abc import Callable

from ...system.commandline import Parser, UsageError, fail
from ...system.redact import redact, redact_text
from .check import Check, first_line
from .jitted_numerics import numerics
from .machine import devices, lapack_threads, slurm, versions, x64, xla_flags
from .store_local import store


# a check: its findings, in order
CheckFn = Callable[[], list[Check]]
CHECKS: tuple[CheckFn, ...] = (versions, devices, x64, xla_flags, lapack_threads, store, slurm, numerics)


def _guarded(fn: CheckFn) -> list[Check]:
    """A check that raises is reported as a failure of that check, never a crash of the doctor."""
    try:
        return list(fn())
    except Exception as e:  # noqa: BLE001 - a check that raises fails that check, never the doctor
        return [Check(fn.__name__, False, redact_text(f"raised {first_line(e)}"))]


def checks() -> list[Check]:
    return [c for fn in CHECKS for c in _guarded(fn)]


def summary(found: list[Check]) -> str:
    """One line: the failed checks by name, the counts, and the information lines that are warnings
    (a detail starting ``warning:``: not a failure, the exit status stays 0) by name."""
    failed = [c.name for c in found if c.ok is False]
    passed = sum(c.ok is True for c in found)
    info = sum(c.ok is None for c in found)
    warned = [c.name for c in found if c.ok is None and c.detail.startswith("warning:")]
    warnings = f"; warnings: {', '.join(warned)}" if warned else ""
    if failed:
        return f"doctor: {len(failed)} FAILED ({', '.join(failed)}), {passed} ok, {info} info{warnings}"
    return f"doctor: all {passed} checks passed ({info} info{warnings})"


def main(args: list[str]) -> int:
    """``python -m plnexp doctor [--json]``: 0 if every check passed, 1 if any failed, 2 on a bad option."""
    p = Parser("python -m plnexp doctor [--json]", __doc__.split("\n\n")[1])
    p.add_argument("--json", action="store_true", help="the checks as a JSON list")
    try:
        ns = p.parse(args)
    except UsageError as e:
        return fail(e)
    if ns is None:  # --help: printed
        return 0
    found = checks()
    # masked where printed: a check's detail names the store's URI, and the report is pasted into issues
    if ns.json:
        print(json.dumps([redact(asdict(c)) for c in found], indent=1))
    else:
        width = max(len(c.name) for c in found)
        for c in found:
            print(f"{c.label:<4}  {c.name:<{width}}  {redact_text(c.detail)}")
        print(redact_text(summary(found)))
    return 1 if any(c.ok is False for c in found) else 0
