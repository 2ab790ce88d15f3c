"""Paired ratios, their order-statistic interval and the verdicts (plnexp.measure.paired), the
interleaved rounds (plnexp.fitting.rounds) with a fake clock and fake programs, and verdict.json
(plnexp.jobs.verdicts). The references are independent: the binomial coverage written out with
math.comb here, and simulated timings whose true ratio is known."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from plnexp.fitting import rounds as R
from plnexp.jobs import verdicts as V
from plnexp.measure import paired


def exact_coverage(n: int, k: int) -> float:
    """P(x_(k) <= median <= x_(n+1-k)) for a continuous distribution: 1 - 2 P(Bin(n, 1/2) <= k - 1)."""
    return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n


def test_fewest_rounds_and_the_interval_of_six_values_is_their_range():
    assert paired.min_rounds(0.95) == 6  # 1 - 2/64 = 0.969 >= 0.95 > 1 - 2/32
    assert paired.min_rounds(0.90) == 5


def test_the_rounds_a_driver_waits_for_leave_out_one_extreme_ratio_on_each_side():
    n = paired.robust_rounds(0.95)
    assert n == 9  # P(B(9, 1/2) <= 1) = 10/512 <= 0.025 < P(B(8, 1/2) <= 1) = 9/256
    values = [0.5, *([1.0] * (n - 2)), 9.0]  # one round hit by a burst on each side
    _, lo, hi = paired.median_interval(values, 0.95)
    assert (lo, hi) == (1.0, 1.0)
    _, lo8, hi8 = paired.median_interval(values[1:], 0.95)  # one round fewer: the range again
    assert (lo8, hi8) == (1.0, 9.0)
    med, lo, hi = paired.median_interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0])
    assert (med, lo, hi) == (3.5, 1.0, 6.0)
    med, lo, hi = paired.median_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert med == 3.0 and (lo, hi) == (-math.inf, math.inf)  # too few: nothing decided


@pytest.mark.parametrize("n", [6, 9, 15, 30])
def test_the_interval_covers_the_median_as_often_as_the_binomial_says(n):
    rng = random.Random(n)
    k = 1
    while exact_coverage(n, k + 1) >= 0.95:
        k += 1
    want = exact_coverage(n, k)
    trials = 3000
    hits = 0
    for _ in range(trials):
        xs = [rng.lognormvariate(0.0, 0.5) for _ in range(n)]  # median exp(0) = 1
        _, lo, hi = paired.median_interval(xs)
        hits += lo <= 1.0 <= hi
    sd = math.sqrt(want * (1 - want) / trials)
    assert want >= 0.95
    assert abs(hits / trials - want) < 4 * sd


@pytest.mark.parametrize(
    "lo, hi, verdict",
    [
        (1.10, 1.5, "slower"),
        (1.2, 2.0, "slower"),
        (0.5, 1 / 1.10, "faster"),
        (0.95, 1.05, "tied"),
        (1.05, 1.15, "unresolved"),
        (0.85, 0.95, "unresolved"),
        (-math.inf, math.inf, "unresolved"),
    ],
)
def test_verdict_by_the_minimum_effect(lo, hi, verdict):
    assert paired.verdict(lo, hi, 1.10) == verdict


def test_verdict_refuses_an_effect_below_one():
    with pytest.raises(ValueError, match="min_effect=0.9: allowed values are numbers >= 1"):
        paired.verdict(1.0, 1.0, 0.9)


def test_a_load_on_both_sides_of_a_pair_widens_nothing_it_cannot_bias():
    """A program 1.8x the reference's time, timed in rounds where a neighbour multiplies a whole
    round's times by 1 to 3 (and each run by 1-5% of jitter): the paired ratio finds 1.8 and calls it
    slower, where the ratio of the two sides' medians, timed apart, need not."""
    rng = random.Random(7)
    ref, prog = [], []
    for _ in range(12):
        load = rng.uniform(1.0, 3.0)
        ref.append(1.0 * load * rng.uniform(1.0, 1.05))
        prog.append(1.8 * load * rng.uniform(1.0, 1.05))
    r = paired.paired_ratio(prog, ref, 1.10)
    assert r.low <= 1.8 * 1.05 and r.high >= 1.8 / 1.05
    assert abs(r.median - 1.8) < 0.1
    assert r.verdict == "slower"
    tied = paired.paired_ratio(ref, [t * rng.uniform(0.98, 1.02) for t in ref], 1.10)
    assert tied.verdict == "tied"


class FakeProgram:
    """A prepared program whose run advances a fake clock by ``seconds``."""

    def __init__(self, name, seconds, clock, log):
        self.name, self.seconds, self.clock, self.log = name, seconds, clock, log
        self.cpu_s = []

    def run(self, clock=None):
        self.log.append(self.name)
        self.clock.now += self.seconds
        self.cpu_s.append(2 * self.seconds)  # two threads busy
        return self.seconds


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def test_rounds_run_every_program_once_each_in_fresh_random_orders():
    clock, log = Clock(), []
    progs = [FakeProgram(n, s, clock, log) for n, s in (("a", 1.0), ("b", 2.0), ("c", 3.0))]
    rounds = R.time_rounds(progs, min_rounds=6, max_rounds=6, budget_s=1e9, clock=clock, calibrate=lambda: 1.0)
    assert len(rounds.times) == 6 and rounds.n_dropped == 0
    assert all(sorted(o) == [0, 1, 2] for o in rounds.orders)
    assert len(set(rounds.orders)) > 1  # not one fixed order
    assert [log[3 * r : 3 * r + 3] for r in range(6)] == [[progs[i].name for i in o] for o in rounds.orders]
    assert rounds.column(1) == [2.0] * 6


def test_a_settled_program_sits_out_the_rounds_that_follow_and_its_pairs_stay_paired():
    clock, log = Clock(), []
    progs = [FakeProgram(n, s, clock, log) for n, s in (("ref", 1.0), ("slow", 5.0), ("close", 1.05))]
    rounds = R.time_rounds(
        progs,
        min_rounds=6,
        max_rounds=12,
        budget_s=1e9,
        clock=clock,
        calibrate=lambda: 1.0,
        settled=lambda r: {1},  # "slow" decided once the minimum rounds are in
    )
    assert len(rounds.times) == 12
    assert log.count("slow") == 6 and log.count("ref") == 12 and log.count("close") == 12
    assert rounds.column(1)[:6] == [5.0] * 6 and all(np.isnan(rounds.column(1)[6:]))
    assert all(sorted(o) == [0, 2] for o in rounds.orders[6:])
    assert rounds.cpu_column(2) == [2.1] * 12  # each run's CPU time, by round
    r = paired.paired_ratio(rounds.column(1), rounds.column(0), 1.10)
    assert r.n == 6 and r.median == 5.0 and r.verdict == "slower"  # the rounds it ran, paired with the reference's
    # a driver that waits for 9 kept rounds before it stops lets a settled program sit out from 6 on
    log.clear()
    kw = dict(budget_s=1e9, clock=clock, calibrate=lambda: 1.0, settled=lambda r: {1})
    late = R.time_rounds(progs, min_rounds=9, max_rounds=12, settle_after=6, **kw)
    assert len(late.times) == 12 and log.count("slow") == 6 and log.count("ref") == 12


def test_a_round_whose_calibration_moved_is_dropped_and_counted():
    clock, log = Clock(), []
    progs = [FakeProgram(n, 1.0, clock, log) for n in "ab"]
    # one calibration between rounds (each round's after is the next one's before): round 2 sees 1.0
    # before it and 2.5 after it (+150%)
    calib = iter([1.0, 1.0, 2.5] + [2.5] * 100)
    rounds = R.time_rounds(progs, min_rounds=3, max_rounds=10, budget_s=1e9, clock=clock, calibrate=lambda: next(calib))
    assert rounds.dropped[1].startswith("calibration moved +150%")
    assert rounds.n_dropped == 1 and rounds.kept[:3] == [0, 2, 3] and len(rounds.times) == 10


def test_rounds_stop_once_decided_or_out_of_budget():
    clock, log = Clock(), []
    progs = [FakeProgram(n, 1.0, clock, log) for n in "ab"]
    decided = R.time_rounds(
        progs, min_rounds=6, max_rounds=50, budget_s=1e9, clock=clock, calibrate=lambda: 1.0, decided=lambda r: True
    )
    assert len(decided.times) == 6
    spent = R.time_rounds(progs, min_rounds=2, max_rounds=50, budget_s=9.0, clock=clock, calibrate=lambda: 1.0)
    assert len(spent.times) == 5  # 2 s a round: past 9 s after the 5th
    # past the budget, rounds go on until min_rounds are kept: here every other round is dropped
    moves = iter([3.0 ** (k // 2) for k in range(200)])  # 1, 1, 3, 3, 9, ...: every other round +200%
    late = R.time_rounds(progs, min_rounds=3, max_rounds=50, budget_s=1.0, clock=clock, calibrate=lambda: next(moves))
    assert len(late.kept) == 3 and len(late.times) == 5
    # ... or until twice min_rounds ran, when nearly all are dropped (nothing decided then)
    worse = iter([3.0**k for k in range(200)])  # +200% in every round
    bad = R.time_rounds(progs, min_rounds=3, max_rounds=50, budget_s=1.0, clock=clock, calibrate=lambda: next(worse))
    assert len(bad.times) == 6 and bad.kept == []


def test_verdict_json_round_trips_and_the_headline_says_it_in_words():
    s = [
        V.StrategyResult("scan", ("r1",), "fp1", 10.0, 1.0, 1.0, 1.0, "reference", 8, 1),
        V.StrategyResult("scan_namedtuple", ("r2",), "fp1", 10.1, 1.01, 0.98, 1.03, "tied", 8, 1),
        V.StrategyResult("fori_loop", ("r3",), "fp2", 10.2, 1.02, 0.97, 1.04, "tied", 8, 1),
        V.StrategyResult("eager", ("r4",), "", 56.0, 5.6, 5.2, 6.0, "slower", 8, 1),
        V.StrategyResult("jit_per_function", ("r5",), "fp3", 19.0, 1.9, -math.inf, math.inf, "unresolved", 2, 1),
    ]
    p = [
        V.ProgramResult(("scan", "scan_namedtuple"), "fp1", 1.0, 1.0, 1.0, "reference"),
        V.ProgramResult(("fori_loop",), "fp2", 1.02, 0.97, 1.04, "tied"),
        V.ProgramResult(("eager",), "", 5.6, 5.2, 6.0, "slower"),
        V.ProgramResult(("jit_per_function",), "fp3", 1.9, -math.inf, math.inf, "unresolved"),
    ]
    g = V.GroupVerdict("oaks_x100 (11600×114), float32, cpu", "scan", 8, 1, 1.1, 0.95, 12.0, tuple(s), tuple(p))
    (back,) = V.loads(V.dumps([g]))
    assert back == g
    line = g.headline()
    assert line.startswith(
        "oaks_x100 (11600×114), float32, cpu: scan = scan_namedtuple (one program), fori_loop tied within ±4%; "
        "slower: eager 5.60× [5.20–6.00]; unresolved: jit_per_function 1.90× [too few rounds for an interval]"
    )
    assert "(paired with scan over 8 rounds, 1 dropped; minimum effect 1.10×)" in line
    with pytest.raises(ValueError, match="verdict.json: schema 2: allowed is 1"):
        V.loads('{"schema": 2, "groups": []}')
