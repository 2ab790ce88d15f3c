"""``python -m plnexp sweep OVERRIDES --dry-run [--json]``: what the sweep would run, before any of
it runs, and nothing written.

The sweep is planned exactly as ``python -m plnexp sweep OVERRIDES`` plans it
(:func:`plnexp.experiment.plan.plan`: every job composed once and validated once; a bad value is
the same one line, exit 2), and every job of the plan is shown (:meth:`~plnexp.experiment.plan.Plan.specs`:
the grid, then the control job and the peers): its kind, number, config hash (the ``config_hash``
tag its run will carry) and name. Nothing is written: no store reached or created, no outputs
folder, no Hydra folder; the data are not loaded (a data set's own checks come with the sweep).
``resume=true`` and ``report=`` are the sweep's switches, not its jobs: the plan is shown whole
(what a resumed sweep reuses is read from the store, which a dry run does not open).
"""

from __future__ import annotations

import json

from ..jobs.config import ConfigError
from ..jobs.spec import Kind
from ..system.commandline import fail
from . import plan


def sweep_overrides(overrides: list[str]) -> list[str]:
    """The overrides as ``sweep`` takes them: ``sweep=default`` where no sweep file is named,
    ``sweep=null`` (no sweep file) dropped, the switches ``resume=`` and ``report=`` taken out."""
    args = list(overrides)
    if not any(a.startswith("sweep=") for a in args):
        args.insert(0, "sweep=default")
    args = [a for a in args if a != "sweep=null"]
    for switch, default in (("resume", False), ("report", True)):
        args, _ = plan.pop_switch(args, switch, default)
    return args


def rows(overrides: list[str]) -> list[dict]:
    """Every job the sweep of ``overrides`` would run, in order, as plain values: ``kind`` (job: a
    job of the grid; control; peer), ``num`` (its run's job number), ``name``, ``hash`` (its config
    hash), ``replicates`` (its fits in one program, each a run), ``processes`` (the JAX processes
    of its one fit), ``overrides`` and, for a peer's fit, ``peer``."""
    args = sweep_overrides(overrides)
    planned = plan.plan(args, True, check_device=plan.jobs_run_here(args))
    out = []
    for spec in planned.specs():
        row = {
            "kind": spec.kind.value,
            "num": spec.num,
            "name": spec.name,
            "hash": spec.hash,
            "replicates": spec.config.replicates,
            "processes": spec.config.processes,
            "overrides": list(spec.overrides),
        }
        if spec.peer is not None:
            row["peer"] = spec.peer
        out.append(row)
    return out


def main(overrides: list[str], as_json: bool) -> int:
    """Print the sweep's plan (``as_json``: one JSON list of objects on stdout, for tools; else one
    line per job and a count of each kind); 0, or 2 with one line on a bad override."""
    try:
        jobs = rows(overrides)
    except ConfigError as e:
        return fail(e)
    if as_json:
        print(json.dumps(jobs, indent=1))
        return 0
    for j in jobs:
        more = "".join(f" {k}={j[k]}" for k in ("replicates", "processes") if j[k] > 1)
        print(f"{j['num']:>4}  {j['kind']:<7}  {j['hash'][:12]}  {j['name']}{more}")
    print(f"dry run: {Kind.counted(j['kind'] for j in jobs)}; nothing run, nothing written")
    return 0
