"""plnexp.fitting.spec: what one fit is, checked when it is built (before any work), and the defaults that
depend on the model."""

from __future__ import annotations

import pytest

from plnexp.fitting import spec
from plnexp.core.model import MODELS, pca_model
from plnexp.core.optim import OptimizerSpec
from plnexp.strategies import StrategySpec


def test_every_model_starts_from_the_data_by_default():
    # the defaults that converge (issue #63); the tutorial's seed start is named by its sweeps
    assert spec.parse(model="pca", rank=2).init == "data"
    assert spec.parse().init == "data"
    assert spec.parse(model="full").init == "data"
    assert spec.parse(model="profiled").init == "data"


@pytest.mark.parametrize("init", spec.INITS)
def test_an_init_named_is_kept_whatever_the_model(init):
    assert spec.parse(model="pca", rank=2, init=init).init == init
    assert spec.parse(model="full", init=init).init == init


def test_fit_spec_without_init_takes_the_models_default():
    parts = (OptimizerSpec("rprop"), StrategySpec.of("scan"))
    assert spec.FitSpec(pca_model(3), *parts).init == "data"
    assert spec.FitSpec(MODELS["full"], *parts).init == "data"
    assert spec.FitSpec(pca_model(3), *parts, init=None).init == "data"
    assert spec.FitSpec(pca_model(3), *parts, init="random").init == "random"


def test_n_iter_up_to_the_loops_int32_counter():
    assert spec.N_ITER_MAX == 2**31 - 1
    assert spec.parse(n_iter=2**31 - 1).n_iter == 2**31 - 1


@pytest.mark.parametrize("n_iter", [2**31, 3 * 10**9, 10**12, 0, -5, 3e9, 1e12, 10.0, True, "100"])
def test_n_iter_out_of_range_is_one_line_naming_the_range(n_iter):
    with pytest.raises(ValueError) as err:
        spec.parse(n_iter=n_iter)
    assert str(err.value) == f"n_iter={n_iter!r}: allowed values are integers from 1 to 2147483647"


def test_rank_above_the_datas_p_is_one_line():
    spec.check_rank(114, 114)
    with pytest.raises(ValueError) as err:
        spec.check_rank(500, 114, "model.rank")
    assert str(err.value) == "model.rank=500: allowed values are integers from 1 to the data's p (114)"
