"""A rerun compared with its original (:mod:`plnexp.experiment.rerun`): the ELBO curves
(:class:`Verdict`), the timings (new/original), the environment's differences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..jobs import provenance
from .. import store
from ..core.precision import PRECISIONS
from .rerun_sources import Source


# ---------------------------------------------------------------- comparing
@dataclass(frozen=True)
class Verdict:
    """How a rerun's ELBO curve compares with its original's.

    ``expect_identical`` (same config, same environment, CPU): the curves must be equal bit for bit.
    Otherwise they must agree within the precision's ``curve_rtol`` (:mod:`plnexp.core.precision`) (the
    looser of the two precisions) over the same number of iterations. A disagreement fails the
    rerun when the config is the same (only the environment moved) or when ``strict`` is asked
    for; a config changed by overrides is expected to give another curve.
    """

    identical: bool
    max_rel: float
    n_old: int
    n_new: int
    tol: float
    precision: str
    same_config: bool
    expect_identical: bool
    status_ok: bool = True  # the rerun FINISHED (or the original did not either)

    @property
    def within(self) -> bool:
        return self.n_old == self.n_new and self.max_rel <= self.tol

    @property
    def agree(self) -> bool:
        return self.status_ok and (self.identical if self.expect_identical else self.within)

    def failed(self, strict: bool = False) -> bool:
        return not self.agree and (self.same_config or strict or not self.status_ok)

    def line(self) -> str:
        if self.identical:
            return f"ELBO curves: identical, bit for bit ({self.n_new} iterations)"
        n = min(self.n_old, self.n_new)
        lengths = "" if self.n_old == self.n_new else f"; lengths differ: {self.n_old} -> {self.n_new} iterations"
        where = "within" if self.max_rel <= self.tol else "beyond"
        text = (
            f"ELBO curves: max relative difference {self.max_rel:.3g} over {n} iterations, {where} the "
            f"{self.precision} tolerance {self.tol:g}{lengths}"
        )
        if self.expect_identical:
            text += " (same config and environment on CPU: they must be identical)"
        return text


def verdict(src: Source, env_same: bool, old: np.ndarray, new: np.ndarray, status_ok: bool = True) -> Verdict:
    identical, rel = provenance.curve_difference(old, new)
    precisions = {src.original.precision.name, src.config.precision.name}
    tol = max(PRECISIONS[p].curve_rtol for p in precisions)
    precision = max(precisions, key=lambda p: PRECISIONS[p].curve_rtol)
    expect = src.same_config and env_same and src.run.platform == "cpu"
    return Verdict(identical, rel, len(old), len(new), tol, precision, src.same_config, expect, status_ok)


def timing_line(old: dict, new: dict) -> str:
    """The rerun's times over the original's. The machine floors are compared only when both runs
    counted the same bytes per iteration (``floor_bytes_per_iter``): runs logged before the floor knew
    the model counted another iteration."""

    def ratio(key, unit, fmt):
        a, b = old.get(key), new.get(key)
        if not a or b is None or not np.isfinite(a) or not np.isfinite(b):
            return "-"
        return f"{b / a:.2f}x ({fmt.format(b)} vs {fmt.format(a)} {unit})"

    floor = ratio("floor_ms_per_iter", "ms/iter", "{:.3f}")
    counted = old.get("floor_bytes_per_iter"), new.get("floor_bytes_per_iter")
    if floor != "-" and (counted[0] is None or counted[0] != counted[1]):
        floor = "- (counted differently)"
    return (
        f"timing new/original: compile {ratio('compile_s', 's', '{:.3f}')}, steady "
        f"{ratio('ms_per_iter', 'ms/iter', '{:.3f}')}, machine floor {floor}"
    )


def report_environment(src: Source, digest: str) -> list[str]:
    """The lines printed before running: environment differences and changed data files."""
    lines = provenance.changed_files(src.run.tags, src.config)
    lines += provenance.differences(src.run.tags, provenance.environment(src.config, digest))
    return lines


def compare(uri: str, src: Source, outcome, env_same: bool, strict: bool = False) -> tuple[bool, list[str]]:
    """After the rerun: whether it failed to reproduce (:meth:`Verdict.failed`; an original with no
    finished result: nothing to compare, not reproduced) and the lines."""
    db = store.open(uri)
    new_run = db.run(outcome.run_id)
    if src.run.status != "FINISHED":
        ended = "" if outcome.status == "FINISHED" else f"; the rerun ended {outcome.status}: {outcome.reason}"
        return True, [f"the original run was {src.run.status}: no finished result to compare with{ended}"]
    v = verdict(
        src,
        env_same,
        db.curve(src.run_id),
        db.curve(outcome.run_id),
        status_ok=outcome.status == "FINISHED",
    )
    store.set_tags(
        uri,
        outcome.run_id,
        {
            "rerun.identical": str(v.identical).lower(),
            "rerun.max_rel_diff": f"{v.max_rel:.3g}",
            "rerun.within_tolerance": str(v.within).lower(),
            "rerun.agrees": str(v.agree).lower(),
        },
    )
    lines = [] if v.status_ok else [f"the rerun ended {outcome.status}: {outcome.reason}"]
    lines.append(v.line())
    lines.append(timing_line(dict(src.run.metrics), dict(new_run.metrics) if new_run else {}))
    return v.failed(strict), lines
