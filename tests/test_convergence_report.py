"""plnexp.report.convergence_report: the race to ε (a winner only beyond the spread, the minimum effect and
the noise; absent iterations said; the control and the peer never ranked), while_loop's rule judged on
hand-made curves, the figure; then sweep=convergence run in this process at a tiny size."""

from __future__ import annotations

import math

import numpy as np
import pytest

from plnexp.jobs.tags import PEER_TAG, SWEEP_TAG
from plnexp.measure import convergence
from plnexp.report import convergence_figures
from plnexp.report import convergence_report as cr
from plnexp.report.summary import Entry, Report
from plnexp.store.records import RunRecord

N_ITER = 1000
OPTIMUM = -1000.0


def entry(strategy="scan", s_to=None, spread=0.01, *, optimizer="rprop", precision="float64", tags=None, **metrics):
    """A finished run of ``N_ITER`` iterations at 1 ms/iter whose timed runs span run_s*(1 ± spread);
    ``s_to``: ε -> steady seconds to it (iterations: seconds / 1 ms), absent where not given."""
    m = {
        "ms_per_iter": 1.0,
        "n_iter_run": N_ITER,
        "n_runs": 5,
        "run_s": 1.0,
        "run_s_lo": 1.0 - spread,
        "run_s_hi": 1.0 + spread,
        "compile_s": 0.5,
        "optimum_elbo": OPTIMUM,
        "gap_resolution_rel": 2e-14 if precision == "float64" else 1.4e-5,
        "gap_final_rel": 1e-9,
        "loglik": OPTIMUM * (1 + 1e-9),
    }
    for eps, s in (s_to or {}).items():
        m[convergence.iters_key(eps)] = round(s * 1e3)
        m[convergence.seconds_key(eps)] = s
    m.update(metrics)
    name = f"{strategy}-{optimizer}-{precision}-{(tags or {}).get('plnexp.control', '')}"
    return Entry(
        f"id-{name}",
        name,
        "FINISHED",
        "",
        strategy,
        "oaks",
        116,
        114,
        "cpu",
        precision,
        {"strategy.name": strategy, "optimizer.name": optimizer},
        m,
        tags=dict(tags or {}),
        extra=(optimizer,),
    )


def made(*entries, sweep="convergence") -> Report:
    parent = RunRecord("p", "0", "", "FINISHED", tags={SWEEP_TAG: sweep})
    return Report(sweep, parent, list(entries), ["optimizer.name"])


# ---------------------------------------------------------------- time to ε
def test_reach_scales_the_spread_by_the_share_of_iterations():
    r = cr.reach(entry(s_to={1e-3: 0.25}, spread=0.1), 1e-3)
    assert r.reached and r.iters == 250
    assert (r.s, r.lo, r.hi) == pytest.approx((0.25, 0.225, 0.275))  # run_s 0.9..1.1 x 250/1000
    assert "0.25 s [0.225–0.275], 250 iterations" == r.text()


def test_absent_iterations_say_why():
    assert cr.reach(entry(), 1e-3).why == f"not reached in {N_ITER} iterations"
    below = cr.reach(entry(precision="float32", s_to={1e-5: 0.5}), 1e-5)  # ε under float32's resolution
    assert not below.reached and below.short == "below resolution" and "1.4e-05" in below.why
    old = entry(s_to={1e-3: 0.1})
    del old.metrics["optimum_elbo"]  # a run from before the convergence metrics
    assert cr.reach(old, 1e-3).why == cr.NOT_LOGGED


def race(*entries, eps=1e-3, **kw):
    named = [(f"{e.strategy}, {e.params['optimizer.name']}", e) for e in entries]
    return cr.race(named, "oaks", eps, **kw)


def test_a_winner_is_named_only_beyond_the_spread_and_the_minimum_effect():
    clear = race(entry("scan", {1e-3: 0.2}), entry("while_loop", {1e-3: 0.4}))
    assert clear.winner == "scan, rprop"
    assert clear.line().startswith("convergence on oaks, ε=1e-3: first scan, rprop in 0.2 s [0.198–0.202]")
    assert "2.00× next: while_loop, rprop 0.4 s" in clear.line()
    # intervals overlap (±20%): tied, both named
    wide = race(entry("scan", {1e-3: 0.2}, 0.2), entry("while_loop", {1e-3: 0.22}, 0.2))
    assert wide.winner == "" and "no winner: tied within the spread" in wide.line()
    assert "scan, rprop 0.2 s" in wide.line() and "while_loop, rprop 0.22 s" in wide.line()
    # beyond the spread (±1%) but a lead of 1.05× under the minimum effect 1.10×
    small = race(entry("scan", {1e-3: 0.2}), entry("while_loop", {1e-3: 0.21}))
    assert small.winner == "" and "minimum effect 1.10×" in small.line()
    assert race(entry("scan", {1e-3: 0.2}), entry("while_loop", {1e-3: 0.21}), min_effect=1.02).winner
    # beyond both, within the A/A noise between jobs the control measured (30%)
    assert race(entry("scan", {1e-3: 0.2}), entry("while_loop", {1e-3: 0.25}), noise=0.3).winner == ""


def test_contended_timings_name_no_winner():
    runs = entry("scan", {1e-3: 0.2}), entry("while_loop", {1e-3: 0.4})
    r = cr.race([(e.strategy, e) for e in runs], "oaks", 1e-3, contended={runs[1].run_id})
    assert r.winner == "" and "no winner named, timings contended in while_loop" in r.line()
    assert "lowest median scan 0.2 s" in r.line()


def test_runs_that_do_not_reach_eps_are_counted_and_none_said():
    one = race(entry("scan", {1e-3: 0.2}), entry("while_loop"), entry("scan", optimizer="sgd"))
    assert one.winner == "scan, rprop"
    assert "the only run to reach ε" in one.line() and f"2 of 3 runs did not (not reached in {N_ITER}" in one.line()
    none = race(entry("scan", precision="float32"), entry("while_loop", precision="float32"), eps=1e-7)
    assert none.winner == "" and "none reached ε (below float32's resolution (1.4e-05))" in none.line()


def test_the_control_job_and_the_peer_are_shown_never_ranked():
    control = entry("scan", {1e-3: 0.1}, tags={"plnexp.control": "true"})
    peer = entry("scan", {1e-3: 0.01}, tags={PEER_TAG: "pyplnmodels"})
    r = race(entry("scan", {1e-3: 0.2}), entry("while_loop", {1e-3: 0.4}), control, peer)
    assert r.winner == "scan, rprop" and [n for n, _ in r.reached] == ["scan, rprop", "while_loop, rprop"]
    assert r.line().endswith("; scan, rprop (peer, not ranked): 0.01 s [0.0099–0.0101], 10 iterations")


# ---------------------------------------------------------------- while_loop's rule
def test_while_loops_rule_judged_on_a_hand_made_curve():
    """Relative changes 0.25, 0.2, 0.083, then 0, 0: with patience 2 the rule stops after 6 updates at
    tol 1e-3 (the gap there: 0.1 of the optimum -1); a tol under every change never stops it."""
    curve = np.array([-2.0, -1.5, -1.2, -1.1, -1.1, -1.1, -1.1, -1.05])
    at, never = cr.stops(curve, -1.0, 0.01, tols=(1e-3, 0.0), patience=2)
    assert (at.iters, at.stopped, at.gap, at.s) == (6, True, pytest.approx(0.1), pytest.approx(0.06))
    assert at.text() == "6 it, gap 1.0e-01, 0.06 s"
    assert (never.iters, never.stopped) == (len(curve), False) and never.gap == pytest.approx(0.05)
    assert never.text() == "no stop in 8 it (gap 5.0e-02 at the end)"


def test_while_loop_runs_are_checked_against_scans_curve():
    curve = OPTIMUM * (1 + 10 * 0.5 ** np.arange(60))  # relative change ~ 0.5^i: below 1e-6 from i ≈ 24
    scan = entry("scan")
    scan.curve = curve
    predicted = convergence.while_stop(curve, 1e-6, 10)
    assert 20 < predicted < 60
    runs = []
    for k, ran in enumerate((predicted, predicted + 2)):
        e = entry("while_loop", optimizer=f"o{k}", n_iter_run=ran)
        e.params.update({"strategy.tol": "1e-06", "strategy.patience": "10"})
        s = entry("scan", optimizer=f"o{k}")
        s.curve = curve
        runs += [s, e]
    rep = made(*runs)
    same, differ = cr.checks(rep, cr.names(rep.entries))
    assert same.line().endswith(f"ran {predicted} iterations, as scan's curve predicts")
    assert f"ran {predicted + 2} iterations, scan's curve predicts {predicted} (+2)" in differ.line()
    (*_, line) = cr.lines(rep)
    assert line.startswith("while_loop's stopping rule: 1 of 2 while_loop runs stopped where scan's curve predicts")


# ---------------------------------------------------------------- the report's parts
def test_the_headline_is_sweep_convergences_only_and_its_tables_name_every_run(tmp_path):
    runs = [
        entry("scan", {1e-3: 0.2, 1e-5: 0.5}),
        entry("while_loop", {1e-3: 0.4}),
        entry("scan", {1e-3: 0.1}, precision="float32"),
    ]
    for e in runs:
        e.curve = OPTIMUM * (1 + 0.5 ** np.arange(N_ITER // 10))
    rep = made(*runs)
    first, second, third, _ = cr.lines(rep)  # and the while_loop run checked against scan's curve
    assert "ε=1e-3: first scan, float32 in 0.1 s" in first and "ε=1e-5: first scan, float64" in second
    assert "ε=1e-7: none reached ε" in third
    table = cr.time_table(rep)
    assert len(table) == 2 + 3 and "| scan, float32 |" in "".join(table) and "below resolution" in table[2]
    assert cr.lines(made(*runs, sweep="default")) == []  # another sweep: no headline ...
    assert cr.markdown(made(*runs, sweep="default"))  # ... but the section, where it varies the precision
    assert (
        convergence_figures.figures(rep, tmp_path) == ["convergence.png"]
        and (tmp_path / "convergence.png").stat().st_size
    )
    (panel,) = convergence_figures.panels(rep)  # one model: one panel, float32 and float64 in it
    assert {line.precision for line in panel.lines} == {"float32", "float64"}
    assert panel.lines[0].x[0] == 0.5  # the curve starts at its compile time


# ---------------------------------------------------------------- sweep=convergence, end to end
TINY = (
    "sweep=convergence",
    "n_iter=100",
    "optimizer=rprop,adam",
    "model=profiled",
    "precision=float64",
    "repeats=1",
    "time_budget_s=0",
    "report.peers=[]",
    "report.rounds=0",  # the interleaved rounds: tests/test_groups.py; this report reads the jobs' curves
)


@pytest.mark.slow  # a real sweep of four tiny jobs in process (~12 s): the headline is unit-tested above
def test_sweep_convergence_runs_and_its_report_says_what_reaches_eps_first(outputs, plnexp_main, tmp_path):
    ran = plnexp_main("sweep", *TINY, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    heads = [line for line in ran.stdout.splitlines() if line.startswith("convergence on oaks")]
    assert [h.split(":")[0].rsplit("ε=", 1)[1] for h in heads] == ["1e-3", "1e-5", "1e-7"], ran.stdout
    assert "rprop" in heads[0] and "none reached ε" in heads[2]  # rprop: 1e-3 at ~76 updates; 1e-7 past 800
    assert any(line.startswith("while_loop's stopping rule: 2 of 2") for line in ran.stdout.splitlines()), ran.stdout
    (folder,) = (outputs / "reports" / "convergence").iterdir()
    text = (folder / "report.md").read_text()
    assert "## Convergence" in text and "![convergence.png](convergence.png)" in text and heads[0] in text
    assert (folder / "convergence.png").stat().st_size > 0
    assert math.isfinite(float(text.split("optimum ELBO of oaks: ")[1].split(" ")[0].replace(",", "")))
