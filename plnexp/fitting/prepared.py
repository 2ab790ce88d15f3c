"""A compiled program ready to be run again: what a group's interleaved rounds time
(:mod:`plnexp.fitting.rounds`), made by :func:`plnexp.fitting.rounds.prepare` or kept from the job that
compiled it (:func:`plnexp.fitting.engine.run_all`'s ``hold``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import jax


@dataclass
class Prepared:
    """One compiled program, its data and initial state in place: ``run()`` times one run."""

    name: str
    n_iter: int  # the iterations one run makes (the longest fit of a batch)
    fingerprint: str
    x64: bool
    compiled: object = field(repr=False)
    state: object = field(repr=False)
    arrays: object = field(repr=False)
    cpu_s: list = field(default_factory=list, repr=False)  # the process CPU time of each timed run

    def run(self, clock=time.perf_counter) -> float:
        """One run, ended by ``block_until_ready``: its wall seconds (its process CPU seconds, every
        thread's, appended to :attr:`cpu_s`)."""
        with jax.enable_x64(self.x64):
            cpu0 = time.process_time()
            t0 = clock()
            jax.block_until_ready(self.compiled.run(self.state, self.arrays))  # type: ignore[attr-defined]
            wall = clock() - t0
            self.cpu_s.append(time.process_time() - cpu0)
            return wall
