"""A sweep's rerun compared run by run (:func:`plnexp.experiment.rerun.main`): each original run, every
replicate of a job of ``replicates=K`` included, beside the run that reruns it."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .. import store

if TYPE_CHECKING:
    from ..store.records import RunRecord
    from .rerun_sources import Source


def pairs(
    uri: str, parent_run: RunRecord, sources: list[Source], new_parent, n_jobs: int
) -> list[tuple[int, Source, RunRecord | None]]:
    """``(i, source, rerun)`` for each run of each of ``sources`` (``plnexp.experiment.rerun_sources.Source``,
    replicate 0 of a job): the source itself, then one per other replicate of its job (the source with
    that replicate's original run), each with its rerun among ``new_parent``'s children (None: none
    was recorded). Source ``i``'s rerun is job ``i``; a peer's (``i >= n_jobs``) is numbered past the
    control job's, ``i + 1``, as a sweep numbers its peers."""
    db = store.open(uri)
    new = {(r.job, r.replicate): r for r in db.children(new_parent) if r.job is not None}
    earlier = db.sweep(parent_run)
    out: list[tuple[int, Source, RunRecord | None]] = []
    for i, src in enumerate(sources):
        num = i if i < n_jobs else i + 1
        out.append((i, src, new.get((num, 0))))
        for k in range(1, src.original.replicates if src.peer is None else 1):
            twin = (r for r in earlier if (r.parent_id, r.job, r.replicate) == (src.run.parent_id, src.run.job, k))
            original = next(twin, None)
            if original is not None:
                out.append((i, replace(src, run=original), new.get((num, k))))
    return out
