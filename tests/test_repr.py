"""One-line reprs of a Data and a FitResult (a REPL prints them: never their n x p arrays)."""

import math

import numpy as np

import plnexp


def _check_one_line(text: str) -> None:
    assert "\n" not in text and len(text) < 300, text


def test_data_repr_is_one_line_with_name_shape_covariates_and_dtype():
    data = plnexp.load_oaks(replication=3, covariates=["tree"])
    text = repr(data)
    _check_one_line(text)
    assert text.startswith("Data(")
    assert f"n={data.n} x p={data.p}" in text and f"d={data.d} covariates" in text
    assert repr(data.name) in text and str(data.Y.dtype) in text
    assert "array" not in text and "[" not in text  # no array is printed
    simulated = plnexp.simulate(n=300, p=40, d=1, seed=1)
    text = repr(simulated)
    _check_one_line(text)
    assert f"n={simulated.n} x p={simulated.p}, d=1 covariate," in text and "truth" in text
    assert "array" not in text and repr(simulated) == str(simulated)


def test_fit_result_repr_is_one_line_with_the_run_and_its_final_elbo():
    data = plnexp.simulate(n=60, p=5, d=2, seed=0)
    res = plnexp.fit(data, n_iter=20, timed=True)
    text = repr(res)
    _check_one_line(text)
    assert text.startswith("FitResult(")
    assert f"{res.model}, {res.strategy}, {res.optimizer}" in text
    assert f"{res.n_iter}/{len(res.elbo)} iterations" in text
    assert f"ELBO {res.loglik:.6g}" in text and res.precision in text and res.device in text
    assert math.isfinite(res.timing.ms_per_iter) and f"{res.timing.ms_per_iter:.3g} ms/iter" in text
    assert "array" not in text

    untimed = plnexp.fit(data, n_iter=20, timed=False, precision="float64")
    text = repr(untimed)
    _check_one_line(text)
    assert f"ELBO {untimed.loglik:.6g}" in text and "float64" in text and "ms/iter" not in text
    assert np.isfinite(untimed.loglik)
