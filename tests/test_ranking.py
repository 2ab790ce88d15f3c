"""plnexp.jobs.ranking: a strategy is called fastest only beyond the noise and the minimum effect, never
against its own program, never without a noise estimate, and never on contended timings. Entries are
built by hand (no fit, no timing)."""

from __future__ import annotations

import pytest

from plnexp.jobs import ranking
from plnexp.report.summary import Entry
from plnexp.measure.timing import CALIBRATION_LEVEL_TOLERANCE, CALIBRATION_TOLERANCE

N_ITER = 100


def entry(
    strategy,
    ms,
    spread=0.05,
    *,
    n_runs=5,
    fp=None,
    status="FINISHED",
    host="h",
    cpu="cpu A",
    window=None,
    calib=(0.015, 0.015),
    control=False,
):
    """A run whose timed runs' interval is ms*(1 ± spread) ms/iter; ``control``: the sweep's control
    job repeating the job of ``strategy`` (same config hash, fingerprint and label)."""
    metrics = {
        "ms_per_iter": ms,
        "n_iter_run": N_ITER,
        "n_runs": n_runs,
        "run_s_lo": ms * (1 - spread) * N_ITER / 1e3,
        "run_s_hi": ms * (1 + spread) * N_ITER / 1e3,
        "calib_before_s": calib[0],
        "calib_after_s": calib[1],
    }
    if window is not None:
        metrics["timed_start"], metrics["timed_end"] = window
    tags = {
        "hlo_fingerprint": fp if fp is not None else f"fp-{strategy}",
        "host": host,
        "cpu_model": cpu,
        "config_hash": f"hash-{strategy}",
    }
    if control:
        tags.update({ranking.CONTROL_TAG: "true", ranking.CONTROL_OF_TAG: "0"})
    return Entry(
        f"id-{strategy}{'-control' if control else ''}",
        f"{'control-' if control else ''}{strategy}-job",
        status,
        "",
        strategy,
        "oaks_x100",
        11600,
        114,
        "cpu",
        "float32",
        {},
        metrics,
        tags=tags,
    )


def test_a_winner_only_beyond_the_spread():
    aa = entry("scan", 7.07, control=True)  # the control job: scan again, 1% apart
    clear = [entry("scan", 7.0), entry("fori_loop", 8.0), entry("eager", 50.0, fp=""), aa]
    line = ranking.rank("G", clear, {}).line
    assert line.startswith("fastest on G: scan 7.00 ms/iter [6.65–7.35, 5 runs]"), line
    assert "1.14× next: fori_loop" in line and "7.1× eager" in line
    assert "A/A noise 1% (the control pair), minimum effect 1.10×" in line

    close = [entry("scan", 7.0), entry("fori_loop", 7.3), entry("eager", 50.0, fp=""), aa]  # 7.35 > 6.935
    line = ranking.rank("G", close, {}).line
    assert line.startswith("tied within noise (A/A noise 1% (the control pair); minimum effect 1.10×) on G: scan 7.00")
    assert "fori_loop 7.30" in line and line.endswith("; 1 slower"), line


def test_a_lead_below_the_minimum_effect_is_a_tie():
    """A 1.05× lead whose tight intervals lie apart, with no measured noise at all (the control landed
    on its original): under the minimum effect, a tie; a smaller minimum effect makes it a result."""
    entries = [entry("scan", 7.0, 0.001), entry("fori_loop", 7.35, 0.001), entry("scan", 7.0, 0.001, control=True)]
    r = ranking.rank("G", entries, {})
    assert r.winner == "" and r.tied == ("scan", "fori_loop")
    assert r.line.startswith(
        "tied within noise (A/A noise 0% (the control pair); minimum effect 1.10×) on G: scan 7.00"
    )
    r = ranking.rank("G", entries, {}, min_speedup=1.04)
    assert r.winner == "scan" and r.line.startswith("fastest on G: scan 7.00"), r.line
    assert "1.05× next: fori_loop" in r.line and "minimum effect 1.04×" in r.line


def test_a_lead_beyond_the_minimum_effect_and_the_noise_is_a_winner():
    """1.2× ahead, the A/A noise 3% (the control pair): a winner; the same lead with 25% of noise is not."""
    entries = [entry("fori_loop", 6.0, 0.01), entry("scan", 7.2, 0.01), entry("scan", 7.416, 0.01, control=True)]
    r = ranking.rank("G", entries, {})
    assert r.winner == "fori_loop" and r.noise is not None and r.noise.value == pytest.approx(0.03)
    assert r.line.startswith("fastest on G: fori_loop 6.00 ms/iter") and "1.20× next: scan" in r.line, r.line
    entries[2] = entry("scan", 9.0, 0.01, control=True)  # the same job landed 25% apart
    r = ranking.rank("G", entries, {})
    assert r.winner == "" and r.line.startswith("tied within noise (A/A noise 25% (the control pair);"), r.line


def test_no_noise_estimate_names_no_winner_and_says_why():
    """1.5× ahead with intervals far apart, but nothing measured how far two jobs differ for no reason:
    no winner, and the headline says what is missing. One pair of two strategies of one program is
    one sample: not an estimate either; two pairs are."""
    line = ranking.rank("G", [entry("scan", 6.0, 0.01), entry("fori_loop", 9.0, 0.01)], {}).line
    assert line == (
        "no winner named on G: no noise estimate: no A/A pair (needs 2 pairs of jobs of one program, or the "
        "sweep's control job); scan 6.00 ms/iter [5.94–6.06, 5 runs] leads (1.50× next: fori_loop)"
    )
    one = [
        entry("scan", 6.0, 0.01),
        entry("scan_pytree", 9.0, 0.01, fp="p"),
        entry("scan_dataclass", 9.1, 0.01, fp="p"),
    ]
    r = ranking.rank("G", one, {})
    assert r.winner == "" and r.line.startswith("no winner named on G: no noise estimate: 1 A/A pair (needs 2")
    two = [*one, entry("scan_namedtuple", 9.05, 0.01, fp="p")]
    r = ranking.rank("G", two, {})
    assert r.winner == "scan" and "A/A noise up to 1% over 2 pairs" in r.line, r.line


def test_the_control_job_is_never_a_contender_and_pairs_only_with_its_original():
    faster = entry("scan", 5.0, control=True)  # the control ran faster than anything: still not ranked
    entries = [entry("scan", 7.0), entry("fori_loop", 9.0), faster]
    assert [c.names for c in ranking.contenders(entries)] == [("scan",), ("fori_loop",)]
    aa = ranking.noise(entries)
    assert (aa.pairs, aa.control, aa.known) == (1, True, True) and aa.value == pytest.approx(0.4)
    orphan = entry("while_loop", 7.0, control=True)  # its original is not in the group: no pair
    assert ranking.noise([entry("scan", 7.0), entry("fori_loop", 9.0), orphan]).pairs == 0
    failed = entry("scan", 7.0, control=True, status="FAILED")
    line = ranking.rank("G", [entry("scan", 7.0), entry("fori_loop", 9.0), failed], {}).line
    assert line.startswith("no winner named on G: no noise estimate: no A/A pair")
    assert line.endswith("; not finished: scan (control) (FAILED)"), line


def test_one_program_is_one_contender_never_ranked_within():
    entries = [
        entry("scan_namedtuple", 7.1, fp="same"),
        entry("scan_pytree", 10.1, fp="same"),
        entry("scan_dataclass", 7.3, fp="same"),
        entry("eager", 50.0, fp=""),
    ]
    (prog, eager) = ranking.contenders(entries)
    assert prog.names == ("scan_namedtuple", "scan_pytree", "scan_dataclass")
    assert prog.ms == pytest.approx(7.3)  # the members' median, not the luckiest member
    line = ranking.rank("G", entries, {}).line
    assert line.startswith("fastest on G: scan_namedtuple = scan_pytree = scan_dataclass (one program)"), line
    assert "A/A noise up to 42% over 2 pairs" in line  # 10.1 / 7.1: what jobs of one program differ by
    # a strategy run twice (a rerun of a sweep with its control): one name, one A/A pair
    twice = [entry("scan", 7.0), entry("scan", 7.2), entry("fori_loop", 9.0)]
    assert [c.names for c in ranking.contenders(twice)] == [("scan",), ("fori_loop",)]


def test_a_lead_within_the_same_program_noise_is_a_tie():
    """Jobs of one program (an A/A test, two pairs) landed 30% apart: a 1.24× lead of another strategy,
    beyond the minimum effect and though its runs' intervals do not overlap, is within what two jobs
    differ by for no reason."""
    entries = [
        entry("scan", 5.0, 0.01),
        entry("scan_namedtuple", 6.0, 0.01, fp="same"),
        entry("scan_pytree", 6.2, 0.01, fp="same"),
        entry("scan_dataclass", 7.8, 0.01, fp="same"),
        entry("fori_loop", 9.0, 0.01),
    ]
    line = ranking.rank("G", entries, {}).line
    assert line.startswith(
        "tied within noise (A/A noise up to 30% over 2 pairs; minimum effect 1.10×) on G: scan 5.00"
    ), line
    assert "scan_namedtuple = scan_pytree = scan_dataclass (one program)" in line and line.endswith("; 1 slower")
    # a lead beyond it is a result
    entries[0] = entry("scan", 4.0, 0.01)
    assert ranking.rank("G", entries, {}).line.startswith("fastest on G: scan 4.00")


def test_too_few_runs_are_not_ranked_and_unfinished_runs_are_named():
    entries = [entry("scan", 7.0, n_runs=1), entry("fori_loop", 9.0), entry("jit_per_function", 20.0, status="FAILED")]
    line = ranking.rank("G", entries, {}).line
    assert line.startswith("not ranked on G: fewer than 3 timed runs for scan"), line
    assert line.endswith("not finished: jit_per_function (FAILED)")
    assert (
        ranking.rank("G", [entry("scan", 7.0, status="KILLED")], {}).line
        == "G: no run finished; not finished: scan (KILLED)"
    )


def test_overlapping_timed_runs_on_one_host_are_contended():
    a = entry("scan", 7.0, window=(100.0, 110.0))
    b = entry("fori_loop", 9.0, window=(105.0, 120.0))
    c = entry("while_loop", 9.0, window=(120.5, 130.0))  # after b: clean
    d = entry("eager", 50.0, window=(100.0, 130.0), host="other")  # another host: clean
    why = ranking.contention([a, b, c, d])
    assert set(why) == {a.run_id, b.run_id}
    assert "overlapped with fori_loop-job's on h" in why[a.run_id][0]
    line = ranking.rank("G", [a, b, c], why).line
    assert line.startswith("timings contended on G: do not compare (scan: timed runs overlapped"), line


@pytest.mark.parametrize(
    "after, flagged",
    [
        (1 + CALIBRATION_TOLERANCE / 2, False),
        (1 + 2 * CALIBRATION_TOLERANCE, True),
        (1 - 2 * CALIBRATION_TOLERANCE, True),
    ],
)
def test_a_calibration_that_moves_beyond_idle_flags_its_run(after, flagged):
    e = entry("scan", 7.0, calib=(0.010, 0.010 * after))
    why = ranking.contention([e])
    assert (e.run_id in why) == flagged
    if flagged:
        assert f"{100 * (after - 1):+.0f}%" in why[e.run_id][0]


def test_a_calibration_slower_than_the_hosts_best_flags_its_run():
    fast = entry("scan", 7.0, calib=(0.010, 0.0101))
    slow = entry("fori_loop", 9.0, calib=(0.010 * (1 + 1.2 * CALIBRATION_LEVEL_TOLERANCE),) * 2)  # steady, no drift
    idle = entry("while_loop", 9.0, calib=(0.010 * (1 + 0.8 * CALIBRATION_LEVEL_TOLERANCE),) * 2)  # within
    elsewhere = entry("eager", 50.0, fp="", calib=(0.030, 0.030), host="h2")  # another host: its own best
    why = ranking.contention([fast, slow, idle, elsewhere])
    assert set(why) == {slow.run_id} and "over its host's fastest in the sweep" in why[slow.run_id][0]


def test_runs_on_different_hosts_or_cpu_models_are_not_compared():
    entries = [entry("scan", 7.0, cpu="cpu A"), entry("fori_loop", 9.0, cpu="cpu B", host="h2")]
    assert ranking.rank("G", entries, {}).line.startswith(
        "timings contended on G: do not compare (timed on different CPU models (cpu A; cpu B))"
    )
    entries = [entry("scan", 7.0), entry("fori_loop", 9.0, host="h2")]
    assert ranking.rank("G", entries, {}).line.startswith(
        "timings contended on G: do not compare (timed on different hosts (h, h2))"
    )
