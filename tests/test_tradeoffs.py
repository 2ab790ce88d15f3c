"""plnexp.report.tradeoffs: the headlines of sweep=unroll, sweep=dispatch and sweep=loop. Each headline
function on entries built by hand (known slopes, break-even, threshold crossing, a cost within the
noise), then each preset run in this process at a tiny size, its report naming what it measures."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from plnexp.jobs.tags import PEER_TAG, SWEEP_TAG
from plnexp.report import differences, dispatch_overhead, loop_forms, tradeoffs, unroll_cost
from plnexp.report.summary import Entry, Report
from plnexp.store.records import RunRecord

N_ITER = 1000


def entry(strategy, ms, spread=0.01, *, unroll=None, n=116, data="oaks", compile_s=1.0, instr=None, **extra):
    """A finished run whose timed runs' interval is ms*(1 ± spread) ms/iter."""
    metrics = {
        "ms_per_iter": ms,
        "n_iter_run": extra.pop("n_iter_run", N_ITER),
        "n_runs": 5,
        "run_s_lo": ms * (1 - spread) * N_ITER / 1e3,
        "run_s_hi": ms * (1 + spread) * N_ITER / 1e3,
        "compile_s": compile_s,
    }
    if instr is not None:
        metrics["xla_instructions"] = instr
    params = {"strategy.name": strategy, "n_iter": str(N_ITER)}
    label = strategy
    if unroll is not None:
        params["strategy.unroll"] = str(unroll)
        label = f"{strategy} unroll={unroll}"
    tags = {"hlo_fingerprint": extra.pop("fp", f"fp-{label}-{n}"), **extra.pop("tags", {})}
    return Entry(
        f"id-{label}-{n}",
        f"{label}-{data}",
        "FINISHED",
        "",
        label,
        data,
        n,
        114,
        "cpu",
        "float32",
        params,
        metrics,
        tags=tags,
    )


UNROLLS = (1, 2, 4, 8, 16, 32)
UNROLL_MS = (2.0, 1.8, 1.7, 1.6, 1.6, 1.65)


def unrolled(ms=UNROLL_MS, spread=0.01, instr=True):
    """compile_s = 0.5 + 0.02 u exactly, instructions 100 + 50 u: slopes 20 ms and 50 per step."""
    return [
        entry("scan_unrolled", m, spread, unroll=u, compile_s=0.5 + 0.02 * u, instr=100 + 50 * u if instr else None)
        for u, m in zip(UNROLLS, ms)
    ]


def test_least_squares_recovers_a_line():
    b, a, se = differences.least_squares([1, 2, 4, 8], [3 + 2 * x for x in (1, 2, 4, 8)])
    assert (b, a) == pytest.approx((2.0, 3.0)) and se == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(differences.least_squares([1, 2], [1, 2])[2])  # no error from two points


def test_unroll_slopes_best_gain_and_break_even():
    r = unroll_cost.unroll(unrolled(), "G")
    assert isinstance(r, unroll_cost.Unroll)
    assert r.slope_s == pytest.approx(0.02) and r.slope_instr == pytest.approx(50)
    assert r.best == 8 and r.gain == pytest.approx(2.0 / 1.6) and r.beyond_noise
    assert r.gain_lo == pytest.approx(2.0 * 0.99 / (1.6 * 1.01)) and r.gain_hi == pytest.approx(
        2.0 * 1.01 / (1.6 * 0.99)
    )
    # a 1000-iteration fit saves at most 0.4 s (2.0 -> 1.6 ms/iter); at 20 ms per step that pays up to unroll 21
    assert r.saved_s[0] == pytest.approx(0.4) and r.break_even[0] == pytest.approx(21.0)
    assert r.break_even[1] < 21 < r.break_even[2]  # the gain's spread
    first, second, third = r.lines()
    assert "compile time +20.0 ± 0.0 ms per extra unrolled step" in first and "XLA instructions +50 per step" in first
    assert "fastest at unroll 8" in second and "1.25×" in second
    assert "break-even at unroll ≈ 21.0" in third
    assert "compile + run lowest at unroll 8 (2.26 s against 2.52 s at unroll 1)" in third


def test_unroll_without_instruction_counts_says_not_logged():
    (first, *_) = unroll_cost.unroll(unrolled(instr=False), "G").lines()
    assert "XLA instruction count not logged" in first


def test_unroll_gain_within_the_noise_pays_for_no_compile_time():
    flat = (2.0, 1.99, 1.98, 2.01, 2.02, 2.03)  # every interval (±5%) overlaps unroll 1's
    r = unroll_cost.unroll(unrolled(flat, spread=0.05), "G")
    assert isinstance(r, unroll_cost.Unroll) and not r.beyond_noise and math.isnan(r.break_even[0])
    _, second, third = r.lines()
    assert "no unroll runs faster than unroll 1 beyond the noise" in second
    assert "break-even at unroll 1: unrolling saves no measurable run time" in third
    # beyond the runs' intervals but not beyond the between-job noise a control job measured (30%)
    assert not unroll_cost.unroll(unrolled(), "G", noise=0.3).beyond_noise
    assert "fewer than two unroll factors" in unroll_cost.unroll(unrolled()[:1], "G")


SIZES = ((116, "oaks"), (1160, "oaks_x10"), (11600, "oaks_x100"))


def sized(strategy, values):
    return [entry(strategy, ms, n=n, data=d) for (n, d), ms in zip(SIZES, values)]


def test_dispatch_overhead_crosses_the_threshold_between_two_sizes():
    runs = sized("scan", (0.2, 2.0, 20.0)) + sized("jit_per_function", (0.5, 2.4, 20.6)) + sized("eager", (6, 15, 60))
    jit, eager = dispatch_overhead.dispatch(runs, "float32, cpu")
    assert (jit.strategy, eager.strategy) == ("jit_per_function", "eager")
    assert [s.diff.share for s in jit.sizes] == pytest.approx([1.5, 0.2, 0.03])
    k, at = jit.crossing
    # 20% at n=1160, 3% at n=11600: 10% crossed at log n interpolated, 1160 * 10 ** (0.1 / 0.17)
    assert k == 2 and at == pytest.approx(1160 * 10 ** (0.1 / 0.17))
    line = jit.line()
    assert "jit_per_function − scan (each step three jitted calls" in line and "+0.3 [" in line and "(+150% [" in line
    assert "it stops mattering (under 10% of scan's ms/iter) from n=11600 on" in line
    assert f"n ≈ {at:,.0f}" in line
    assert eager.crossing == (None, math.nan) or eager.crossing[0] is None
    assert "never falls under 10% of scan's ms/iter in the sizes swept (still 200% at n=11600)" in eager.line()
    small = dispatch_overhead.dispatch(sized("scan", (1, 2, 3)) + sized("jit_per_function", (1.01, 2.01, 3.01)), "G")
    assert "under 10% of scan's ms/iter at every size swept" in small[0].line()
    assert "no scan run finished" in dispatch_overhead.dispatch(sized("eager", (1, 2, 3)), "G")


def test_dispatch_overhead_splits_into_a_fixed_part_and_one_that_grows_with_the_data():
    """overhead = 0.1 ms + 0.1 ms per 1000 rows exactly: the fixed part (the dispatch itself) is 50%, 5%
    and 0.5% of scan's ms/iter, under 10% from n=1160 on, while the whole overhead is so from 11600 on."""
    scan = (0.2, 2.0, 20.0)
    runs = sized("scan", scan) + sized("jit_per_function", [ms + 0.1 + 1e-4 * n for ms, (n, _) in zip(scan, SIZES)])
    (jit,) = dispatch_overhead.dispatch(runs, "G")
    assert jit.split == pytest.approx((0.1, 1e-4))
    k, at = jit.fixed_crossing
    assert k == 1 and at == pytest.approx(116 * 10 ** (0.4 / 0.45))
    assert jit.crossing[0] == 2
    line = jit.line()
    assert "0.1 ms/iter whatever the size (the dispatch itself), +0.1 ms/iter per 1000 rows" in line
    assert f"that fixed part falls under 10% of scan's ms/iter from n=1160 on (crossing at n ≈ {at:,.0f}" in line
    # a fixed part over the threshold everywhere: where scan's ms/iter, extrapolated, would make it 10%
    (slow,) = dispatch_overhead.dispatch(sized("scan", scan) + sized("eager", [ms + 30 for ms in scan]), "G")
    k, at = slow.fixed_crossing
    assert k is None and at == pytest.approx((30 / 0.1 - 0.0) / (19.8 / 11484), rel=0.01)
    assert "is over 10% of scan's ms/iter at every size swept (under it past n ≈" in slow.line()


def test_loop_costs_within_the_spread_are_no_measurable_cost():
    r = loop_forms.loop(
        [entry("scan", 0.40, 0.05), entry("fori_loop", 0.405, 0.05), entry("while_loop", 0.41, 0.05)], "G"
    )
    line = r.line()
    assert line.count("no measurable cost (within the runs' spread)") == 3
    assert "the loop form, fori_loop − scan" in line and "the stopping condition, while_loop − fori_loop" in line
    assert f"every run did all {N_ITER} iterations" in line


def test_loop_cost_beyond_the_spread_and_an_early_stop_are_said():
    runs = [entry("scan", 0.40), entry("fori_loop", 0.40, fp="same"), entry("while_loop", 0.50, n_iter_run=600)]
    runs[0].tags["hlo_fingerprint"] = "same"
    line = loop_forms.loop(runs, "G").line()
    assert "the stopping condition, while_loop − fori_loop = +0.1 [" in line and "(+25.0%" in line
    assert "a cost, beyond the runs' spread" in line
    assert "the loop form, fori_loop − scan = +0 [" in line and "no measurable cost" in line
    assert f"not the same work: stopped early: while_loop 600 of {N_ITER}" in line
    assert "scan = fori_loop: one compiled program" in line


def test_the_control_job_is_not_compared_and_gives_the_noise():
    control = entry("scan", 0.46, tags={"plnexp.control": "true"})
    control.run_id = "control"
    runs = [entry("scan", 0.40), entry("fori_loop", 0.44), control]  # 10% apart, beyond the ±1% intervals
    noise = differences.aa_noise(runs)
    assert noise == pytest.approx(0.15)
    r = loop_forms.loop(runs, "G", noise)
    assert r.timed["scan"].ms == 0.40  # the original, not the control
    assert "no measurable cost (within the A/A noise between jobs, 15.0%)" in r.line()
    assert "A/A noise between jobs 15.0% (the control job)" in r.line()
    # without the control's noise: beyond the spread, a result where the minimum effect allows it
    assert "a cost, beyond the runs' spread" in loop_forms.loop(runs, "G", min_effect=1.05).line()
    assert (
        "no result: a cost by 1.10×, beyond the runs' spread but under the minimum effect 1.20× (report.min_speedup)"
        in loop_forms.loop(runs, "G", min_effect=1.2).line()
    )


def test_the_preset_is_the_sweep_tag_else_the_experiment():
    def report(tag, experiment):
        return SimpleNamespace(parent=RunRecord("p", "0", "", "FINISHED", tags={SWEEP_TAG: tag}), experiment=experiment)

    assert tradeoffs.preset(report("unroll", "mine")) == "unroll"
    assert tradeoffs.preset(report("null", "loop")) == "loop"
    assert tradeoffs.preset(report("default", "strategies")) is None


def test_a_dispatch_report_compares_its_strategies_with_scan_per_precision_and_never_a_peer():
    """tradeoffs.lines on a Report: one line per strategy and precision (the data sizes together);
    a peer run (another library's fit, report.peers) is shown elsewhere, never an overhead over scan."""
    runs = sized("scan", (0.2, 2.0, 20.0)) + sized("jit_per_function", (0.5, 2.4, 20.6))
    doubles = sized("scan", (0.3, 3.0, 30.0)) + sized("jit_per_function", (0.6, 3.4, 30.6))
    for e in doubles:
        e.precision, e.run_id = "float64", e.run_id + "-64"
    peer = entry("pyplnmodels", 9.0, tags={PEER_TAG: "pyplnmodels"})
    parent = RunRecord("p", "0", "", "FINISHED", tags={SWEEP_TAG: "dispatch"})
    found = tradeoffs.lines(Report("dispatch", parent, [*runs, *doubles, peer], []))
    assert [line.split(":")[0] for line in found] == ["dispatch on float32, cpu", "dispatch on float64, cpu"]
    assert all("jit_per_function − scan" in line and "pyplnmodels" not in line for line in found)


# ---------------------------------------------------------------- the presets, end to end at a tiny size
# one timed run each (no control job then: it needs 3), the fewest jobs that give each headline
# report.rounds=0: the headlines read the jobs' own timings; the interleaved rounds are tests/test_groups.py's
TINY = ("dataset=synthetic", "dataset.n=30", "dataset.p=5", "repeats=1", "time_budget_s=0", "report.rounds=0")


@pytest.mark.slow  # three real tiny sweeps in process (~16 s): the headlines are unit-tested above
@pytest.mark.parametrize(
    "preset,overrides,says,figure",
    [
        ("unroll", ("n_iter=8", "strategy.unroll=1,2"), "extra unrolled step", "unroll.png"),
        # eager left out here: its first run compiles every primitive (seconds of CPU); its line is tested above
        (
            "dispatch",
            ("n_iter=4", "dataset.replication=1", "strategy=jit_per_function,scan"),
            "− scan (each step three jitted calls",
            "dispatch.png",
        ),
        ("loop", ("n_iter=8", "dataset.replication=1"), "the stopping condition, while_loop − fori_loop", "loop.png"),
    ],
)
def test_each_preset_runs_and_its_report_names_what_it_measures(
    preset, overrides, says, figure, outputs, plnexp_main, tmp_path
):
    ran = plnexp_main("sweep", f"sweep={preset}", *TINY, *overrides, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    headline = [line for line in ran.stdout.splitlines() if line.startswith(f"{preset} on ")]
    assert headline and any(says in line for line in headline), ran.stdout
    (folder,) = (outputs / "reports" / preset).iterdir()
    assert (folder / figure).stat().st_size > 0
    assert says in (folder / "report.md").read_text() and f"![{figure}]({figure})" in (folder / "report.md").read_text()
