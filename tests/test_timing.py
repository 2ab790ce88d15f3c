"""plnexp.measure.timing's protocol: what each switch costs (counted on a fake Program: no timing
assertions, these machines are noisy), cold compiles without clearing the caller's caches, and the
persistent compilation cache switch (tiny real fits)."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import numpy as np
import pytest

import plnexp
from plnexp.measure import timing
from plnexp.strategies.base import Compiled
from plnexp.system import jax_compat

N_RUN = 4


class FakeOutput(NamedTuple):
    n_run: int


class FakeProgram:
    """A Program (see plnexp.strategies.base) that counts its calls, compiles and compiled runs."""

    def __init__(self):
        self.calls = self.compiles = self.runs = 0

    def call(self, state, data):
        self.calls += 1
        return FakeOutput(N_RUN)

    def compile(self, state, data) -> Compiled:
        self.compiles += 1

        def run(state, data):
            self.runs += 1
            return FakeOutput(N_RUN)

        return Compiled(run, 0.25 * self.compiles, {"fit": {"flops": 1.0}}, {"fit": {}})


@pytest.fixture
def cleared(monkeypatch):
    """Count jax.clear_caches() instead of clearing (nothing here is compiled by XLA)."""
    count = []
    monkeypatch.setattr(timing.jax, "clear_caches", lambda: count.append(1))
    return count


class Fresh:
    """A ``fresh`` for measure: each call a new FakeProgram, kept in ``made`` (one per cold step)."""

    def __init__(self):
        self.made: list[FakeProgram] = []

    def __call__(self) -> FakeProgram:
        self.made.append(FakeProgram())
        return self.made[-1]


def test_default_is_one_compile_and_one_run(cleared):
    program = FakeProgram()
    out, t = timing.measure(program, None, None)
    assert (program.compiles, program.runs, program.calls) == (1, 1, 0)
    assert cleared == [], "a library call never clears JAX's caches"
    assert out == FakeOutput(N_RUN) and len(t.runs_s) == 1 and t.run_s == t.runs_s[0]
    assert t.compile_s == 0.25 and t.cost_analysis == {"fit": {"flops": 1.0}}
    assert t.ms_per_iter == pytest.approx(1e3 * t.run_s / N_RUN, rel=1e-12)
    for name in ("first_call_s", "compile_warm_s", "compile_cache_hits", "compile_warm_cache_hits"):
        assert math.isnan(getattr(t, name)), name
    assert 0 <= t.run_cpu_s < 10  # the process's CPU time over the run, every thread's (a fake run: little)
    assert set(t.as_metrics()) == {
        "compile_s",
        "run_s",
        "run_cpu_s",
        "ms_per_iter",
        "run_s_iqr",
        "run_s_lo",
        "run_s_hi",
        "n_runs",
        "calib_before_s",
        "calib_after_s",
        "timed_start",
        "timed_end",
    }


@pytest.mark.parametrize(
    "kwargs, counts",
    [
        ({"first_call": True}, (1, 1, 1)),  # + one cold plain call
        ({"warmup": 2}, (1, 3, 0)),  # + untimed runs
        ({"repeats": 3}, (1, 3, 0)),  # + timed runs
        ({"first_call": True, "warmup": 1, "repeats": 2}, (1, 3, 1)),
    ],
)
def test_switches_add_what_they_document(cleared, kwargs, counts):
    program = FakeProgram()
    _, t = timing.measure(program, None, None, timing.TimingSpec(**kwargs))
    assert (program.compiles, program.runs, program.calls) == counts and cleared == []
    assert len(t.runs_s) == kwargs.get("repeats", 1)
    assert min(t.runs_s) <= t.run_s <= max(t.runs_s)
    if kwargs.get("first_call"):
        assert t.first_call_s >= 0 and "first_call_s" in t.as_metrics()
    else:
        assert math.isnan(t.first_call_s) and "first_call_s" not in t.as_metrics()


def test_compile_cache_adds_one_compile(cleared, tmp_path):
    program = FakeProgram()
    before = jax.config.values["jax_compilation_cache_dir"]
    _, t = timing.measure(program, None, None, timing.TimingSpec(compile_cache_dir=tmp_path / "cache"))
    assert (program.compiles, program.runs, program.calls, len(cleared)) == (2, 1, 0, 0)
    assert (t.compile_s, t.compile_warm_s) == (0.25, 0.5)  # first compile, then the second
    assert t.compile_cache_hits == 0 and t.compile_warm_cache_hits == 0  # nothing of it went through XLA
    assert {"compile_warm_s", "compile_cache_hits", "compile_warm_cache_hits"} <= set(t.as_metrics())
    assert jax.config.values["jax_compilation_cache_dir"] == before, "the cache setting is restored"


def test_compile_cache_without_the_warm_compile(cleared, tmp_path):
    """compile_cache auto (plnexp.fit's default): the cache on, one compile, its hits counted."""
    program = FakeProgram()
    _, t = timing.measure(
        program, None, None, timing.TimingSpec(compile_cache_dir=tmp_path / "cache", warm_compile=False)
    )
    assert (program.compiles, program.runs, len(cleared)) == (1, 1, 0)
    assert t.compile_cache_hits == 0 and math.isnan(t.compile_warm_s) and math.isnan(t.compile_warm_cache_hits)
    assert "compile_cache_hits" in t.as_metrics() and "compile_warm_s" not in t.as_metrics()


def test_each_cold_step_gets_a_fresh_program_of_its_own(cleared, tmp_path):
    """The first call, the compile and the warm compile each on a program JAX has never seen (so none
    warms another), the runs on the compile's; the caller's program untouched, no cache cleared."""
    program, fresh = FakeProgram(), Fresh()
    _, t = timing.measure(program, None, None, timing.TimingSpec(2, 1, True, tmp_path / "c"), fresh=fresh)
    first, cold, warm = fresh.made
    assert (first.calls, first.compiles, first.runs) == (1, 0, 0)
    assert (cold.calls, cold.compiles, cold.runs) == (0, 1, 3), "warmup and timed runs: the compile's program"
    assert (warm.calls, warm.compiles, warm.runs) == (0, 1, 0)
    assert (program.calls, program.compiles, program.runs) == (0, 0, 0)
    assert (t.compile_s, t.compile_warm_s) == (0.25, 0.25) and cleared == []


def test_a_process_plnexp_owns_also_clears_before_each_cold_step(cleared, tmp_path):
    fresh = Fresh()
    timing.measure(
        FakeProgram(),
        None,
        None,
        timing.TimingSpec(first_call=True, compile_cache_dir=tmp_path / "c"),
        fresh=fresh,
        owns_process=True,
    )
    assert len(fresh.made) == 3 and len(cleared) == 3
    timing.measure(FakeProgram(), None, None, fresh=Fresh(), owns_process=True)
    assert len(cleared) == 4  # one compile: one clearing


@pytest.mark.parametrize("kwargs", [{"repeats": 0}, {"warmup": -1}, {"repeats": 1.5}])
def test_bad_counts_are_one_line(kwargs):
    with pytest.raises(ValueError, match=r"^(repeats|warmup)=.*: allowed values are integers >= [01]$") as err:
        timing.TimingSpec(**kwargs)
    assert "\n" not in str(err.value)


def test_persistent_cache_restores_jax_settings(tmp_path):
    names = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
        "jax_enable_compilation_cache",
    )
    before = {n: jax.config.values[n] for n in names}
    with timing.persistent_cache(tmp_path / "c"):
        assert jax.config.values["jax_compilation_cache_dir"] == str(tmp_path / "c")
        assert jax.config.values["jax_persistent_cache_min_compile_time_secs"] == 0
        assert jax.config.values["jax_persistent_cache_min_entry_size_bytes"] == -1  # no minimum
        with timing.persistent_cache(None):
            assert jax.config.values["jax_compilation_cache_dir"] is None
        assert jax.config.values["jax_compilation_cache_dir"] == str(tmp_path / "c")
    assert {n: jax.config.values[n] for n in names} == before
    assert (tmp_path / "c").is_dir()


def _entries(directory):
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


@pytest.mark.slow
def test_compile_cache_on_then_off(oaks, tmp_path):
    """A real fit: the cache dir gets entries, the second compile is served by it; a later fit of
    the very same program with the switch off neither reads nor writes it."""
    cache = tmp_path / "jax_cache"
    before = jax.config.values["jax_compilation_cache_dir"]
    res = plnexp.fit(oaks, n_iter=5, compile_cache=True, compile_cache_dir=cache)
    t = res.timing
    written = _entries(cache)
    assert written, "compile_cache=True writes cache entries"
    assert t.compile_cache_hits == 0, "a fresh cache: the first compile is a miss"
    assert math.isfinite(t.compile_warm_s) and t.compile_warm_s > 0
    assert t.compile_warm_cache_hits >= 1, "the second compile is served by the persistent cache"
    assert {"compile_s", "compile_warm_s", "compile_cache_hits", "compile_warm_cache_hits"} <= set(t.as_metrics())
    assert jax.config.values["jax_compilation_cache_dir"] == before

    hits = []

    def listener(event, **kwargs):
        if event == jax_compat.cache_hit_event():
            hits.append(event)

    jax.monitoring.register_event_listener(listener)
    try:
        off = plnexp.fit(oaks, n_iter=5, compile_cache=False)
    finally:
        jax.monitoring.unregister_event_listener(listener)
    assert hits == [], "with compile_cache=False nothing is read from the persistent cache"
    assert _entries(cache) == written, "... nor written to it"
    assert jax.config.values["jax_compilation_cache_dir"] == before
    assert math.isnan(off.timing.compile_warm_s) and "compile_warm_s" not in off.timing.as_metrics()
    np.testing.assert_allclose(off.elbo, res.elbo, rtol=1e-6)


# jax 0.10.2 records these (jax/_src/dispatch.py) with the function's name: one per trace of a
# function into a jaxpr, one per XLA compilation
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@pytest.mark.slow  # fast subset under 2 minutes: CI runs it
def test_a_second_fit_in_the_process_is_cold_again_without_clearing_caches(cleared):
    """The same fit twice in one process, the persistent cache off: the second one's first call and
    compile each trace and XLA-compile the fit again (programs built for them: JAX's in-memory caches
    cannot serve them), although no cache was cleared, and nothing comes from a persistent cache."""
    data = plnexp.simulate(n=30, p=5, d=1, seed=0)
    plnexp.fit(data, n_iter=3, compile_cache=False)
    seen, hits = [], []

    def duration(event, seconds, **kwargs):
        if event in (TRACE_EVENT, BACKEND_COMPILE_EVENT):
            seen.append((event, kwargs.get("fun_name")))

    def hit(event, **kwargs):
        if event == jax_compat.cache_hit_event():
            hits.append(event)

    jax.monitoring.register_event_duration_secs_listener(duration)
    jax.monitoring.register_event_listener(hit)
    try:
        res = plnexp.fit(data, n_iter=3, compile_cache=False, first_call=True)
    finally:
        jax.monitoring.unregister_event_duration_listener(duration)
        jax.monitoring.unregister_event_listener(hit)
    assert seen.count((TRACE_EVENT, "fit")) == 2, seen  # the first call's, the compile's
    assert seen.count((BACKEND_COMPILE_EVENT, "jit(fit)")) == 2, seen
    assert hits == [] and cleared == []
    assert res.timing.compile_s > 0 and res.timing.first_call_s > 0


def test_fit_rejects_a_non_boolean_switch(oaks):
    with pytest.raises(ValueError, match=r"^first_call='yes': allowed values are True, False$"):
        plnexp.fit(oaks, n_iter=2, first_call="yes")


# ---------------------------------------------------------------- repeats, spread, calibration
class FakeClock:
    """A clock that each compiled run advances by the next of ``seconds`` (the calibration's own
    reads advance it by 0): the protocol's decisions are counted, never timed."""

    def __init__(self, seconds):
        self.now, self.seconds, self.running = 0.0, list(seconds), False

    def __call__(self):
        return self.now

    def run(self):
        self.now += self.seconds.pop(0)


class ClockedProgram(FakeProgram):
    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def compile(self, state, data) -> Compiled:
        compiled = super().compile(state, data)

        def run(state, data):
            self.clock.run()
            return compiled.run(state, data)

        return Compiled(run, compiled.compile_s)


@pytest.mark.parametrize(
    "repeats, budget, seconds, n",
    [
        (3, 0.0, [0.4] * 10, 3),  # no budget: exactly `repeats`
        (3, 2.0, [0.4] * 10, 5),  # 0.4 s runs: the budget is spent after the 5th
        (3, 2.0, [1.5] * 10, 3),  # slow runs: `repeats` still run, past the budget
        (1, 1.0, [0.3, 0.3, 0.3, 0.3, 0.3], 4),  # 1.2 s >= 1.0 after the 4th
    ],
)
def test_runs_at_least_repeats_then_until_the_budget_is_spent(cleared, repeats, budget, seconds, n):
    clock = FakeClock(seconds)
    program = ClockedProgram(clock)
    _, t = timing.measure(program, None, None, timing.TimingSpec(repeats, time_budget_s=budget), clock=clock)
    assert program.runs == n and t.runs_s == pytest.approx(seconds[:n])
    assert t.as_metrics()["n_runs"] == n


def test_runs_stop_at_max_runs(cleared, monkeypatch):
    monkeypatch.setattr(timing, "MAX_RUNS", 7)
    clock = FakeClock([1e-6] * 20)
    program = ClockedProgram(clock)
    timing.measure(program, None, None, timing.TimingSpec(2, time_budget_s=100.0), clock=clock)
    assert program.runs == 7


def test_spread_is_the_iqr_from_five_runs_and_the_range_below():
    # by hand: inclusive quartiles of 1..9 (positions 1 + 8/4 and 1 + 3*8/4) are 3 and 7
    s = timing.Spread((5.0, 1.0, 9.0, 2.0, 8.0, 3.0, 7.0, 4.0, 6.0))
    assert (s.n, s.median, s.interval, s.width) == (9, 5.0, (3.0, 7.0), 4.0)
    # 1, 2, 4, 10, 20: q1 = 2 and q3 = 10 (exact positions 2 and 4)
    assert timing.Spread((10.0, 1.0, 20.0, 2.0, 4.0)).interval == (2.0, 10.0)
    assert timing.Spread((0.3, 0.1, 0.2)).interval == (0.1, 0.3)  # fewer than 5: the range
    assert timing.Spread((0.25,)).width == 0.0


def test_timing_logs_spread_calibration_and_window(cleared):
    clock = FakeClock([0.1, 0.3, 0.2, 0.5, 0.4])
    _, t = timing.measure(ClockedProgram(clock), None, None, timing.TimingSpec(5), clock=clock)
    m = t.as_metrics()
    assert (m["run_s"], m["run_s_lo"], m["run_s_hi"], m["run_s_iqr"], m["n_runs"]) == pytest.approx(
        (0.3, 0.2, 0.4, 0.2, 5)
    )
    assert m["ms_per_iter"] == pytest.approx(1e3 * 0.3 / N_RUN)
    assert m["calib_before_s"] == 0.0 == m["calib_after_s"]  # the fake clock does not move in it
    assert m["timed_start"] <= m["timed_end"]
    assert t.fingerprint == ""  # a program without XLA executables has none
