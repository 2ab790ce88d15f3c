"""A group's programs compiled first, then timed in interleaved rounds.

:func:`prepare` builds one fit's program as :func:`plnexp.fitting.engine.run_all` does (same
problem, placement, initial state and compiled program) and runs it once, untimed (the warm-up).
:func:`time_rounds` then runs the prepared programs in rounds in which every program runs once (its n_iter iterations, ended by ``block_until_ready``), in
a fresh random order each round, until

- at least ``min_rounds`` kept rounds, and every program's verdict is decided (``decided``, a
  function of the kept rounds so far: :mod:`plnexp.measure.paired`) or the round budget
  ``budget_s`` is spent; past the budget, rounds go on until ``min_rounds`` are kept, or twice as
  many ran (too many dropped: the caller says so);
- ``max_rounds`` rounds ran, whatever the rest.

A program whose comparison is settled (``settled``: the caller's statistics say its verdict stands)
sits out the rounds that follow, so that the rounds' time goes to the comparisons still open: on a
sweep of every strategy, eager (the slowest by far) is named slower after the first few rounds and
the close calls among the compiled loops get the rest. The reference never sits out (every ratio is
paired with it in its round).

Each round is bracketed by the host calibration (:func:`plnexp.measure.timing.calibrate`, one
between two rounds: it ends one and starts the next): a round
during which it moved by more than :data:`DROP_TOLERANCE` (heavy contention that started or stopped
in the middle of it) is **dropped** and counted, not the whole group. A load
that lasts through a round slows both sides of its pairs alike: the paired ratios absorb it.

Interleaving, not isolation: what the machine does besides lands on every program of a round, in
random places, instead of on whichever job happened to be timed at the time.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import jax
import numpy as np

from ..core.data import Data
from ..measure import fingerprint, timing
from .engine import checked, placed
from .prepared import Prepared
from .spec import FitSpec


# A round is dropped when the host calibration around it moved by more than this (relative): heavy
# contention that started or stopped within the round. Looser than the jobs' own tolerance
# (timing.CALIBRATION_TOLERANCE): a steady load slows both sides of a pair and is kept.
DROP_TOLERANCE = 1.0


def prepare(name: str, data: Data | Sequence[Data], spec: FitSpec) -> Prepared:
    """The program of the fit ``spec`` describes on ``data`` (one data set, or one per replicate),
    compiled ahead of time, not run."""
    datas, problem, dev = checked(data, spec, False)
    x64 = spec.precision.dtype == np.float64
    with jax.enable_x64(x64), timing.persistent_cache(None):
        program, arrays, state = placed(problem, datas, spec, dev)
        compiled = program.compile(state, arrays)
        # one untimed run: the warm-up (caches, eager's first-run compiles of its primitives), and
        # the iterations a run makes (while_loop may stop early)
        out = jax.block_until_ready(compiled.run(state, arrays))
        n_run = max(int(np.max(np.asarray(out.n_run))), 1)
    return Prepared(name, n_run, fingerprint.of_executables(compiled.executables), x64, compiled, state, arrays)


@dataclass(frozen=True)
class Rounds:
    """The timed rounds of a group: ``times[r][i]`` seconds of program i in round r (every round,
    dropped ones included), ``dropped[r]`` why round r was dropped ("" when kept), ``orders[r]``
    the order the programs ran in."""

    names: tuple[str, ...]
    times: tuple[tuple[float, ...], ...]  # NaN where the program sat out the round (settled)
    dropped: tuple[str, ...]
    orders: tuple[tuple[int, ...], ...]
    seconds: float  # the rounds' wall time, the warm-up round included
    cpu: tuple[tuple[float, ...], ...] = ()  # cpu[r][i]: process CPU seconds (every thread) of that run

    @property
    def kept(self) -> list[int]:
        return [r for r, why in enumerate(self.dropped) if not why]

    def column(self, i: int) -> list[float]:
        """Program i's times in the kept rounds (NaN where it sat out)."""
        return [self.times[r][i] for r in self.kept]

    def cpu_column(self, i: int) -> list[float]:
        """Program i's process CPU seconds in the kept rounds (NaN where it sat out)."""
        return [self.cpu[r][i] for r in self.kept] if self.cpu else []

    @property
    def n_dropped(self) -> int:
        return sum(1 for why in self.dropped if why)


def time_rounds(
    programs: Sequence[Prepared],
    *,
    min_rounds: int,
    max_rounds: int,
    budget_s: float,
    decided: Callable[[Rounds], bool] = lambda rounds: False,
    settled: Callable[[Rounds], Collection[int]] = lambda rounds: (),
    settle_after: int | None = None,
    seed: int = 0,
    clock=time.perf_counter,
    calibrate: Callable[[], float] | None = None,
) -> Rounds:
    """Time ``programs`` in interleaved rounds (see the module docstring). ``decided(rounds)``: whether
    the kept rounds so far settle every comparison (the caller's statistics); ``settled(rounds)``: the
    programs whose comparison is settled, which sit out the next rounds, asked once ``settle_after`` rounds
    are kept (default ``min_rounds``: a large effect can stand on fewer rounds than the caller waits for
    before it stops); ``seed``: of the
    rounds' random orders (reproducible). ``calibrate``: the host calibration (tests pass their own)."""
    if min_rounds < 1 or max_rounds < min_rounds:
        raise ValueError(f"min_rounds={min_rounds}, max_rounds={max_rounds}: need 1 <= min_rounds <= max_rounds")
    calib = calibrate if calibrate is not None else (lambda: timing.calibrate(clock))
    rng = random.Random(seed)
    names = tuple(p.name for p in programs)
    start = clock()
    times: list[tuple[float, ...]] = []
    dropped: list[str] = []
    orders: list[tuple[int, ...]] = []
    cpus: list[tuple[float, ...]] = []
    out: frozenset[int] = frozenset()  # the programs sitting out (settled)

    def so_far() -> Rounds:
        return Rounds(names, tuple(times), tuple(dropped), tuple(orders), clock() - start, tuple(cpus))

    after = calib()  # each round's "after" is the next one's "before": one calibration between rounds
    while len(times) < max_rounds:
        order = [i for i in range(len(programs)) if i not in out]
        rng.shuffle(order)
        before = after
        row = [math.nan] * len(programs)
        cpu = [math.nan] * len(programs)
        for i in order:
            row[i] = programs[i].run(clock)
            cpu[i] = programs[i].cpu_s[-1] if programs[i].cpu_s else math.nan
        after = calib()
        moved = after / before - 1 if before > 0 else 0.0
        times.append(tuple(row))
        cpus.append(tuple(cpu))
        orders.append(tuple(order))
        dropped.append(
            f"calibration moved {100 * moved:+.0f}% during the round (dropped beyond ±{100 * DROP_TOLERANCE:.0f}%)"
            if abs(moved) > DROP_TOLERANCE
            else ""
        )
        kept = len(times) - sum(1 for why in dropped if why)
        if kept >= min_rounds and (decided(so_far()) or clock() - start >= budget_s):
            break
        if kept >= (min_rounds if settle_after is None else settle_after):
            out = frozenset(settled(so_far()))
        if clock() - start >= budget_s and len(times) >= 2 * min_rounds:
            break  # out of budget with too many rounds dropped: the caller says how many it had
    return so_far()
