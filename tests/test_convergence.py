"""A run's convergence metrics (plnexp.measure.convergence) on hand-made curves, while_loop's stopping rule
against the compiled while_loop, and a logged run's metrics against its data's optimum."""

from __future__ import annotations

import math

import numpy as np
import pytest

import plnexp
from plnexp.measure import convergence as cv

OPT = -1000.0
# relative gaps at iterations 0..8: within 1e-3 first at 2, 1e-5 at 4, 1e-7 at 6
GAPS = np.array([1e-1, 1e-2, 5e-4, 1e-4, 5e-6, 1e-6, 5e-8, 1e-8, 1e-8])
CURVE = OPT * (1 + GAPS)


def test_keys_name_the_epsilon():
    assert [cv.eps_key(e) for e in cv.EPSILONS] == ["1e-3", "1e-5", "1e-7"]
    assert cv.iters_key(1e-5) == "iters_to_1e-5" and cv.seconds_key(1e-7) == "s_to_1e-7"


def test_iterations_and_seconds_to_each_epsilon_on_a_hand_made_curve():
    m = cv.run_metrics(CURVE, OPT, CURVE[-1], CURVE[-1], eps=1e-16, size=100, run_s=0.9, n_iter_run=9)
    assert (m["iters_to_1e-3"], m["iters_to_1e-5"], m["iters_to_1e-7"]) == (2.0, 4.0, 6.0)
    assert m["s_to_1e-3"] == pytest.approx(0.2) and m["s_to_1e-7"] == pytest.approx(0.6)  # 0.1 s per iteration
    assert m["gap_final_rel"] == pytest.approx(1e-8) and m["gap_resolution_rel"] == pytest.approx(1e-15)


def test_an_epsilon_never_reached_is_absent():
    m = cv.run_metrics(CURVE[:5], OPT, CURVE[4], CURVE[4], eps=1e-16, size=100, run_s=0.5, n_iter_run=5)
    assert m["iters_to_1e-3"] == 2.0 and "iters_to_1e-7" not in m and "s_to_1e-7" not in m
    assert cv.first_within(CURVE, OPT, 1e-9) is None


def test_an_epsilon_below_the_resolution_is_absent_though_the_curve_seems_to_reach_it():
    # float32: eps * sqrt(n p) = 1.19e-7 * 100 = 1.2e-5; the curve's 1e-7 is rounding, not a result
    f32 = float(np.finfo(np.float32).eps)
    m = cv.run_metrics(CURVE, OPT, CURVE[-1], CURVE[-1], eps=f32, size=10_000, run_s=1.0, n_iter_run=9)
    assert m["gap_resolution_rel"] == pytest.approx(f32 * 100)
    assert "iters_to_1e-3" in m and "iters_to_1e-5" not in m and "iters_to_1e-7" not in m
    # and a compiled ELBO further from the host's than that widens it
    m = cv.run_metrics(CURVE, OPT, CURVE[-1], CURVE[-1] + 0.05, eps=1e-16, size=1, run_s=1.0, n_iter_run=9)
    assert m["gap_resolution_rel"] == pytest.approx(5e-5) and "iters_to_1e-5" not in m


def test_the_final_gap_is_the_hosts_and_never_negative():
    assert cv.gap_final(OPT, OPT * (1 + 2e-4)) == pytest.approx(2e-4)
    assert cv.gap_final(OPT, OPT * (1 - 1e-6)) == 0.0  # above the best known: 0, not negative


def test_the_gap_curve_is_floored_at_the_resolution():
    g = cv.gap_curve(CURVE, OPT, 1e-6)
    np.testing.assert_allclose(g[:6], np.log10(GAPS[:6]), atol=1e-9)
    assert g[-1] == pytest.approx(-6.0)
    assert math.isfinite(cv.gap_curve([OPT], OPT, 0.0)[0])


def test_while_stop_on_a_hand_made_curve():
    c = np.array([-100.0, -100.0, -50.0, -49.9, -49.9, -49.9, -49.9])
    assert cv.while_stop(c, 1e-6, 1) == 2  # e_1 == e_0: calm once
    assert cv.while_stop(c, 1e-6, 3) == 7 - 0 and cv.while_stop(c, 1e-6, 4) == 7  # calm at 4, 5, 6: stops after 6
    assert cv.while_stop(c, 1e-9, 10) == len(c)


@pytest.mark.slow  # two compiled while_loop fits: in CI
@pytest.mark.parametrize("tol", [1e-6, 1e-9])
def test_while_stop_predicts_the_compiled_while_loop(tol):
    data = plnexp.load_oaks()
    res = plnexp.fit(
        data,
        model="profiled",
        optimizer="rprop",
        precision="float64",
        n_iter=3000,
        strategy="while_loop",
        tol=tol,
        patience=10,
        timed=False,
    )
    assert res.n_iter < 3000
    assert cv.while_stop(res.elbo[: res.n_iter], tol, 10) == res.n_iter
