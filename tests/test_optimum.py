"""The best known ELBO of a data set (plnexp.fitting.optimum): shipped for oaks, r times oaks's for oaks x r,
computed once by a float64 fit and read back from its cache otherwise, or given."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import plnexp
from plnexp.fitting import optimum
from plnexp.core import reference
from plnexp.jobs.config import ConfigError, OaksData, SyntheticData

SMALL = SyntheticData(n=60, p=6, d=2, seed=3)


@pytest.fixture
def counted(monkeypatch):
    """optimum.compute, counted (the real fit runs)."""
    calls = []
    real = optimum.compute

    def spy(data):
        calls.append(data.name)
        return real(data)

    monkeypatch.setattr(optimum, "compute", spy)
    return calls


@pytest.fixture
def own_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("PLNEXP_FLOOR_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / optimum.CACHE_FILE


@pytest.mark.slow  # a 1,000-iteration float64 fit: in CI
def test_a_float64_fit_reaches_the_shipped_oaks_optimum_within_1e_7():
    # rprop first gets within 1e-7 at iteration 834 (docs/concepts/convergence.md); a float64 fit of
    # 1,000 iterations, scored by the float64 host ELBO at its parameters (exact log y!)
    res = plnexp.fit(
        plnexp.load_oaks(), model="profiled", optimizer="rprop", precision="float64", n_iter=1000, timed=False
    )
    best = optimum.best_known(plnexp.load_oaks(), "profiled")
    assert best.source == "shipped" and best.elbo == optimum.SHIPPED["oaks"][2]
    assert 0 <= (best.elbo - res.loglik) / abs(best.elbo) < 1e-7
    assert optimum.best_known(plnexp.load_oaks(), "full").elbo == best.elbo  # one optimum for both models


def test_oaks_times_r_is_r_times_oaks(counted):
    oaks = plnexp.load_oaks()
    assert optimum.for_dataset(OaksData(replication=7), "full").elbo == 7 * optimum.SHIPPED["oaks"][2]
    assert counted == []  # shipped: no fit
    # why: the ELBO of the rows stacked r times, at the parameters stacked likewise (Sigma the same), is
    # r times the ELBO (float64 host reference, independent of plnexp.fitting.optimum)
    rng = np.random.default_rng(0)
    n, p = oaks.Y.shape
    B, M, S = rng.normal(size=(1, p)) * 0.1, rng.normal(size=(n, p)) * 0.3, np.full((n, p), 0.4)
    Sigma = (M.T @ M + np.diag((S * S).sum(0))) / n
    one = reference.elbo(oaks.Y, oaks.O, oaks.X, B, M, S, Sigma)
    tile = lambda a: np.tile(a, (3, 1))
    three = reference.elbo(tile(oaks.Y), tile(oaks.O), tile(oaks.X), B, tile(M), tile(S), Sigma)
    assert three == pytest.approx(3 * one, rel=1e-12)


def test_covariates_change_the_data_so_oaks_with_tree_is_not_the_shipped_optimum():
    assert plnexp.load_oaks(covariates=["tree"]).digest() != optimum.SHIPPED["oaks"][0]
    assert plnexp.load_oaks().digest() == optimum.SHIPPED["oaks"][0]


def test_a_synthetic_optimum_is_computed_once_checked_and_read_back(counted, own_cache, caplog):
    with caplog.at_level(logging.INFO, logger="plnexp.fitting.optimum"):
        first = optimum.for_dataset(SMALL, "full")
    assert counted == [SMALL.label] and first.source == "computed"
    assert "computing it once" in caplog.text and "max |gradient|" in caplog.text
    assert first.grad_max < optimum.STATIONARY  # stationary (the host's own gradient, not the fit's)
    again = optimum.for_dataset(SMALL, "profiled")  # the same family: read back
    doubled = optimum.for_dataset(SyntheticData(n=60, p=6, d=2, seed=3, replication=2), "full")
    assert counted == [SMALL.label]  # no second fit
    assert again.source == doubled.source == "cached" and again.elbo == first.elbo and doubled.elbo == 2 * first.elbo
    entry = next(iter(json.loads(own_cache.read_text())["entries"].values()))
    assert entry["settings"] == optimum.FIT and entry["n_iter"] > 0 and entry["elbo"] == first.elbo
    # no fit of the same data, however long, beats it by more than rounding
    res = plnexp.fit(SMALL.load(), model="full", optimizer="rprop", precision="float64", n_iter=3000, timed=False)
    assert res.loglik <= first.elbo + 1e-10 * abs(first.elbo)


def test_a_corrupt_cache_is_computed_again_and_rewritten_whole(counted, own_cache):
    own_cache.parent.mkdir(parents=True)
    own_cache.write_text("{not json")
    value = optimum.for_dataset(SMALL, "full")
    assert counted == [SMALL.label] and value.source == "computed"
    assert json.loads(own_cache.read_text())["format"] == optimum.CACHE_FORMAT
    assert sorted(p.name for p in own_cache.parent.iterdir()) == [optimum.CACHE_FILE]  # no temporary left


def test_a_given_optimum_is_used_as_is_and_false_means_none(counted):
    assert optimum.for_dataset(SyntheticData(n=60, p=6, optimum=-123.5), "full") == optimum.Optimum(-123.5, "given")
    assert optimum.for_dataset(SyntheticData(n=60, p=6, optimum=False), "full") is None
    assert counted == []


@pytest.mark.parametrize("bad", [True, "high", float("nan"), 0.0])
def test_a_bad_given_optimum_is_one_line_naming_the_key(bad):
    with pytest.raises(ConfigError, match=r"^dataset.optimum=.*: allowed values are null .*false .*number\)$"):
        OaksData(optimum=bad)


def test_the_host_gradient_is_the_elbos_by_finite_differences():
    data = plnexp.simulate(12, 3, 2, seed=1)
    rng = np.random.default_rng(2)
    B = rng.normal(size=(2, 3)) * 0.2
    M, S = rng.normal(size=(12, 3)) * 0.3, rng.uniform(0.3, 0.8, size=(12, 3))

    def elbo(B, M, S):  # Sigma at its closed form, as the gradient assumes
        Sigma = (M.T @ M + np.diag((S * S).sum(0))) / 12
        return reference.elbo(data.Y, data.O, data.X, B, M, S, Sigma)

    Sigma = (M.T @ M + np.diag((S * S).sum(0))) / 12
    gB, gM, gS = reference.block_gradients(data.Y, data.O, data.X, M, S, B, np.linalg.inv(Sigma))
    h = 1e-6
    for grad, which in ((gB, 0), (gM, 1), (gS, 2)):
        for index in [(0, 0), (1, 2)]:
            args = [B.copy(), M.copy(), S.copy()]
            args[which][index] += h
            up = elbo(*args)
            args[which][index] -= 2 * h
            down = elbo(*args)
            assert grad[index] == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-6)
