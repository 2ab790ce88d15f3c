"""A fit is a value you keep (#63): FitResult pickles, saves and loads (plnexp.fitting.saved) bit for
bit in float64, names its parameters after the data, a run's model loads from ``runs:/RUN_ID`` as
the fit plnexp.fit gives, PLN-PCA's axes are orthonormal, ordered and at the fit's ELBO, and the
AnnData keys are written as scanpy's are."""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
from scipy.special import gammaln

import plnexp
from plnexp.fitting import saved

pd = pytest.importorskip("pandas")


def _counts(n=30, p=4, seed=0):
    rng = np.random.default_rng(seed)
    rows = [f"s{i}" for i in range(n)]
    counts = pd.DataFrame(rng.poisson(3, size=(n, p)), index=rows, columns=[f"g{j}" for j in range(p)])
    covariates = pd.DataFrame({"temp": rng.normal(size=n), "site": rng.choice(["a", "b"], n)}, index=rows)
    return counts, covariates


def _same_fit(a, b) -> None:
    assert a.params.keys() == b.params.keys()
    for k in a.params:
        assert a.params[k].dtype == np.float64 and np.array_equal(a.params[k], b.params[k]), k
    assert np.array_equal(a.elbo, b.elbo, equal_nan=True) and a.loglik == b.loglik and a.n_iter == b.n_iter
    for f in dataclasses.fields(a):  # every other field (names, how the fit ended, ...) kept as it was
        if f.name not in ("elbo", "params", "timing", "extra"):
            x, y = getattr(a, f.name), getattr(b, f.name)
            assert x == y or (isinstance(x, float) and np.isnan(x) and np.isnan(y)), f.name


@pytest.mark.slow
def test_save_load_pickle_round_trip_bit_for_bit_with_the_names(tmp_path):
    counts, covariates = _counts()
    res = plnexp.fit(counts, covariates=covariates, precision="float64", n_iter=15, timed=False)
    # the names are the input's: covariates x variables, rows the DataFrame's index
    assert list(res.coefficients.index) == ["intercept", "temp", "site=b"]
    assert list(res.coefficients.columns) == list(counts.columns)
    assert list(res.covariance.index) == list(counts.columns) == list(res.covariance.columns)
    assert list(res.latent.index) == list(counts.index) and list(res.latent.columns) == list(counts.columns)
    assert np.array_equal(res.coefficients.to_numpy(), res.params["B"])
    # criteria: PLNmodels' number of parameters p d + p (p + 1)/2, BIC = loglik - k/2 log n
    k = 4 * 3 + 4 * 5 // 2
    assert res.n_params == k and res.bic == pytest.approx(res.loglik - k / 2 * np.log(30), rel=1e-15)
    assert f"BIC {res.bic:.6g}" in repr(res) and f"{k} parameters" in repr(res)

    res.save(tmp_path / "fit")
    back = plnexp.load_fit(tmp_path / "fit")
    _same_fit(res, back)
    assert back.coefficients.equals(res.coefficients) and back.latent.equals(res.latent)
    assert back.extra["spec"] == res.extra["spec"] and back.extra["spec"]["precision"] == "float64"
    doc = json.loads((tmp_path / "fit" / saved.DESCRIPTION).read_text())
    assert doc["format"] == "plnexp-fit" and doc["format_version"] == saved.FORMAT_VERSION
    assert set(doc["versions"]) >= {"plnexp", "jax"} and doc["names"]["variables"] == list(counts.columns)
    with np.load(tmp_path / "fit" / saved.ARRAYS, allow_pickle=False) as npz:  # no pickled object in it
        assert sorted(npz.files) == sorted(res.params)

    _same_fit(res, pickle.loads(pickle.dumps(res)))
    timed = plnexp.fit(counts.to_numpy(), n_iter=5, precision="float64")  # a timed fit's timing pickles too
    again = pickle.loads(pickle.dumps(timed))
    assert (
        again.timing.as_metrics() == timed.timing.as_metrics() and again.timing.fingerprint == timed.timing.fingerprint
    )
    # unnamed data: y1..yp, a RangeIndex
    assert list(again.coefficients.columns) == ["y1", "y2", "y3", "y4"] and again.latent.index[-1] == 29


def test_a_folder_of_another_format_version_or_not_a_fit_is_one_line(tmp_path):
    counts, _ = _counts(n=12, p=3)
    res = plnexp.fit(counts, precision="float64", n_iter=3, timed=False)
    folder = tmp_path / "fit"
    res.save(folder)
    _same_fit(plnexp.load_fit(folder), res)
    _same_fit(pickle.loads(pickle.dumps(res)), res)
    doc = json.loads((folder / saved.DESCRIPTION).read_text())
    (folder / saved.DESCRIPTION).write_text(json.dumps({**doc, "format_version": 99}))
    with pytest.raises(saved.FitFileError, match=r"format version 99 .* reads format version 1") as e:
        plnexp.load_fit(folder)
    assert "\n" not in str(e.value)
    (folder / saved.DESCRIPTION).write_text(json.dumps({**doc, "format": "other"}))
    with pytest.raises(saved.FitFileError, match="not a plnexp fit"):
        plnexp.load_fit(folder)
    with pytest.raises(saved.FitFileError, match="no plnexp-fit.json"):
        plnexp.load_fit(tmp_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("x")
    with pytest.raises(saved.FitFileError, match="holding other files"):
        res.save(tmp_path / "other")


def test_csv_with_an_index_column_and_objects_fit_cannot_take(tmp_path):
    counts, covariates = _counts(n=8, p=3)
    counts.to_csv(tmp_path / "counts.csv")  # pandas' default: an index column first
    covariates.to_csv(tmp_path / "covariates.csv")
    with pytest.raises(plnexp.DataError, match=r"'s0' at row 1, column 1.*index_col=0") as e:
        plnexp.load_csv(tmp_path / "counts.csv")
    assert "\n" not in str(e.value)
    data = plnexp.load_csv(tmp_path / "counts.csv", covariates=tmp_path / "covariates.csv", index_col=0)
    assert data.row_names == tuple(counts.index) and data.columns == tuple(counts.columns)
    assert data.covariate_names == ("intercept", "temp", "site=b")
    assert np.array_equal(data.Y, counts.to_numpy(dtype=float))
    with pytest.raises(
        TypeError,
        match=r"counts: got a list; allowed are .*DataFrame, an anndata.AnnData \(plnexp.load_anndata reads it\)",
    ) as e:
        plnexp.fit([[1, 2], [3, 4]])
    assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match="layer='counts': allowed only with data given as an AnnData"):
        plnexp.fit(counts, layer="counts")


def _elbo_with_full_covariances(Y, O, X, B, C, M, cov) -> float:
    """The PLN-PCA ELBO where row i's posterior is N(M_i, cov_i) (cov: n x q x q), written from the
    model: sum Y Z - exp(Z + diag(C cov_i C')/2) - log Y! - KL(N(M_i, cov_i) || N(0, I))."""
    Z = O + X @ B + M @ C.T
    A = np.exp(Z + 0.5 * np.einsum("jk,ikl,jl->ij", C, cov, C))
    kl = 0.5 * (np.sum(M * M, axis=1) + np.trace(cov, axis1=1, axis2=2) - np.linalg.slogdet(cov)[1] - C.shape[1])
    return float(np.sum(Y * Z - A) - np.sum(gammaln(Y + 1.0)) - np.sum(kl))


@pytest.mark.slow
def test_pca_on_a_sparse_anndata_ordered_orthonormal_axes_at_the_fits_elbo(monkeypatch):
    anndata = pytest.importorskip("anndata")
    from scipy import sparse

    sim = plnexp.simulate_pca(n=120, p=16, q=3, seed=2)
    adata = anndata.AnnData(sparse.csr_matrix(np.asarray(sim.Y)))
    adata.obs_names = [f"cell{i}" for i in range(adata.n_obs)]
    adata.var_names = [f"gene{j}" for j in range(adata.n_vars)]
    res = plnexp.fit(adata, model="pca", rank=3, precision="float64", n_iter=60, timed=False)

    U = res.loadings.to_numpy()
    assert np.abs(U.T @ U - np.eye(3)).max() < 1e-10  # orthonormal (float64)
    C = res.params["C"]
    top = np.sort(np.linalg.eigvalsh(C @ C.T))[::-1][:3]  # the variance along each axis: C C''s eigenvalues
    assert np.all(np.diff(res.variance_ratio) <= 0)
    np.testing.assert_allclose(res.variance_ratio, top / top.sum(), rtol=1e-10)
    np.testing.assert_allclose(np.diag(U.T @ C @ C.T @ U), top, rtol=1e-10)  # U's columns carry them in order
    np.testing.assert_allclose(res.latent.to_numpy() @ U.T, res.params["M"] @ C.T, rtol=0, atol=1e-10)

    data = plnexp.load_anndata(adata)  # what fit read: library-size offsets, the intercept
    rot = res.rotated_params()
    Y = np.asarray(data.Y, dtype=np.float64)
    rotated = _elbo_with_full_covariances(Y, data.O, data.X, rot["B"], rot["C"], rot["M"], rot["S_cov"])
    assert abs(rotated - res.loglik) <= 1e-10 * abs(res.loglik)
    diagonal = np.einsum("ik,kl->ikl", res.params["S"] ** 2, np.eye(3))  # the fit's own axes: the same reference
    assert abs(
        _elbo_with_full_covariances(Y, data.O, data.X, res.params["B"], C, res.params["M"], diagonal) - res.loglik
    ) <= 1e-10 * abs(res.loglik)

    res.to_anndata(adata)
    assert np.array_equal(adata.obsm["X_pln_pca"], res.latent.to_numpy())
    assert np.array_equal(adata.varm["PLN_loadings"], U)
    uns = adata.uns["pln_pca"]
    assert uns["rank"] == 3 and uns["elbo"] == res.loglik and uns["plnexp_version"] == plnexp.__version__
    assert np.array_equal(uns["variance_ratio"], res.variance_ratio)
    assert list(res.latent.index) == list(adata.obs_names) and list(res.loadings.index) == list(adata.var_names)
    other = adata[:, ::-1].copy()
    with pytest.raises(ValueError, match="var_names"):
        res.to_anndata(other)

    # with block_rows, the AnnData's counts reach the fit sparse (as load_anndata(sparse=True) keeps them)
    from plnexp.fitting import engine

    seen = []
    run = engine.run
    monkeypatch.setattr(engine, "run", lambda data, *a, **k: seen.append(data.sparse) or run(data, *a, **k))
    blocked = plnexp.fit(adata, model="pca", rank=3, block_rows=50, precision="float64", n_iter=5, timed=False)
    assert seen == [True] and np.isfinite(blocked.loglik)


@pytest.mark.slow
def test_a_cli_run_logs_its_model_and_load_fit_runs_is_plnexp_fit_bit_for_bit(outputs, tmp_path, plnexp_main):
    counts, covariates = _counts(n=40, p=5, seed=3)
    counts.to_csv(tmp_path / "counts.csv", index=False)
    covariates.to_csv(tmp_path / "covariates.csv", index=False)
    spec = ["model=profiled", "optimizer=rprop", "precision=float64", "n_iter=30", "dataset.optimum=false"]
    ran = plnexp_main(
        "run",
        "dataset=csv",
        f"dataset.counts={tmp_path / 'counts.csv'}",
        f"dataset.covariates={tmp_path / 'covariates.csv'}",
        *spec,
    )
    assert ran.returncode == 0, ran.stderr
    run_id = re.search(r"\(run ([0-9a-f]{32})", ran.stdout + ran.stderr).group(1)
    logged = plnexp.load_fit(f"runs:/{run_id}")

    data = plnexp.load_csv(tmp_path / "counts.csv", covariates=tmp_path / "covariates.csv")
    direct = plnexp.fit(data, model="profiled", optimizer="rprop", precision="float64", n_iter=30)
    _same_fit(logged, direct)
    assert list(logged.coefficients.index) == ["intercept", "temp", "site=b"]
    assert list(logged.coefficients.columns) == list(counts.columns)
    assert not (outputs / "fits").exists() or not any((outputs / "fits").iterdir())  # sent, then removed
    with pytest.raises(saved.FitFileError, match="no such run"):
        plnexp.load_fit("runs:/" + "0" * 32)


def test_a_model_that_cannot_be_saved_is_one_warning_and_the_run_goes_on(outputs, monkeypatch, caplog):
    from plnexp.fitting.result import FitResult
    from plnexp.measure.timing import Timing
    from plnexp.store import fitted

    nan = float("nan")
    res = FitResult(
        np.array([-3.0, -2.0]),
        -2.0,
        {"B": np.zeros((1, 2)), "M": np.zeros((3, 2)), "S": np.ones((3, 2)), "Sigma": np.eye(2)},
        2,
        Timing(compile_s=nan, first_call_s=nan, run_s=nan, ms_per_iter=nan),
        "full",
        "scan",
        "rprop",
        "float64",
        "cpu",
    )
    folder = fitted.keep(res)
    assert folder is not None and plnexp.load_fit(folder).loglik == -2.0

    def full(self, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(FitResult, "save", full)
    with caplog.at_level("WARNING", logger="plnexp.store.fitted"):
        assert fitted.keep(res) is None
    (line,) = [r.getMessage() for r in caplog.records if r.name == "plnexp.store.fitted"]
    assert "No space left on device" in line and "\n" not in line
    assert [p.name for p in (outputs / "fits").iterdir()] == [Path(folder).name]  # no half-written folder left


def test_runs_uri_of_a_run_without_a_model_or_malformed_is_one_line(outputs):
    from mlflow import MlflowClient

    cl = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    run = cl.create_run(cl.create_experiment("no-model", artifact_location=(outputs / "artifacts").as_uri()))
    for source, words in (
        (f"runs:/{run.info.run_id}", "the run has no fitted model"),
        ("runs:/not-an-id", "malformed run id"),
        ("runs:/" + "0" * 32, "no such run"),
    ):
        with pytest.raises(plnexp.FitFileError, match=words) as e:
            plnexp.load_fit(source)
        assert "\n" not in str(e.value)
