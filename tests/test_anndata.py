"""Single-cell data: AnnData counts (plnexp.load_anndata, dataset=anndata: the same Data, and so the
same fit, as the same counts from CSV; each bad input one line) and the low-rank generator
(plnexp.simulate_pca, dataset=synthetic_pca: its zero fraction, its truth's rank)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

import numpy as np
import pytest

import plnexp
from plnexp.core.precision import PRECISIONS
from plnexp import DataError
from plnexp.experiment import plan as cli
from plnexp.core import reference
from plnexp.jobs import config as C
from plnexp.jobs import config_load
from plnexp.core import simulation

needs_anndata = pytest.mark.skipif(
    importlib.util.find_spec("anndata") is None,
    reason="anndata is not installed: pip install -e '.[single-cell]' (test_without_anndata checks the one line)",
)
N, P = 24, 6


def counts() -> np.ndarray:
    """Small counts with no empty cell; one column of big counts (the fit's scale)."""
    Y = np.random.default_rng(5).poisson(2.0, size=(N, P))
    Y[:, 0] += 1 + np.arange(N) % 7
    return Y


def obs() -> dict:
    return {
        "batch": np.array(["b", "a", "c"] * (N // 3)),  # text: one-hot, levels sorted as text
        "depth": np.linspace(0.5, 2.0, N),
        "total": np.linspace(10.0, 40.0, N),
    }


def adata(X, layers=None, obs_columns=None):
    import anndata
    import pandas as pd

    table = pd.DataFrame(obs() if obs_columns is None else obs_columns, index=[f"cell{i}" for i in range(N)])
    if "batch" in table:
        table["batch"] = table["batch"].astype("category")  # as single-cell files store them
    var = pd.DataFrame(index=[f"gene{j}" for j in range(P)])
    return anndata.AnnData(X=X, obs=table, var=var, layers=layers or {})


def write_csvs(tmp_path, Y) -> dict:
    """The same counts, covariates and offsets (each cell's total, raw) as load_csv reads them."""
    header = ",".join(f"gene{j}" for j in range(P))
    (tmp_path / "cells.csv").write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in Y) + "\n")
    o = obs()
    rows = [f"{b},{float(d)!r}" for b, d in zip(o["batch"], o["depth"])]
    (tmp_path / "cov.csv").write_text("batch,depth\n" + "\n".join(rows) + "\n")
    totals = np.repeat(Y.sum(axis=1, keepdims=True), P, axis=1)
    (tmp_path / "off.csv").write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in totals) + "\n")
    return {"counts": tmp_path / "cells.csv", "offsets": tmp_path / "off.csv", "covariates": tmp_path / "cov.csv"}


def storages(Y):
    """(name, AnnData, layer): the counts dense in X, in a CSR layer (X another matrix), CSC in X."""
    from scipy import sparse

    return [
        ("dense X", adata(Y.astype(np.float32)), None),
        ("sparse CSR layer", adata(np.zeros((N, P)), {"counts": sparse.csr_matrix(Y)}), "counts"),
        ("sparse CSC X", adata(sparse.csc_matrix(Y.astype(np.int64))), None),
    ]


@needs_anndata
def test_h5ad_dense_and_sparse_give_the_data_and_the_fit_of_the_same_csv(tmp_path):
    Y = counts()
    files = write_csvs(tmp_path, Y)
    csv = plnexp.load_csv(**files, covariate_columns=["batch", "depth"])
    ref = plnexp.fit(csv, n_iter=5, timed=False)
    for what, ad, layer in storages(Y):
        path = tmp_path / "cells.h5ad"
        ad.write_h5ad(path)
        data = plnexp.load_anndata(path, layer=layer, covariates=["batch", "depth"])
        assert data.name == "cells" and data.columns == csv.columns == tuple(f"gene{j}" for j in range(P)), what
        assert data.covariate_names == csv.covariate_names == ("intercept", "batch=b", "batch=c", "depth"), what
        for a, b in ((data.Y, csv.Y), (data.O, csv.O), (data.X, csv.X)):
            np.testing.assert_array_equal(a, b, err_msg=what)
        assert data.digest() == csv.digest(), what
        # The CSV's offsets are a full (n, p) file, the AnnData's one total per cell (their (n, 1) column
        # on the device): two programs, whose sums XLA may order otherwise, so float32's curve tolerance.
        got = plnexp.fit(data, n_iter=5, timed=False).elbo
        np.testing.assert_allclose(got, ref.elbo, rtol=PRECISIONS["float32"].curve_rtol, err_msg=what)
        in_memory = plnexp.load_anndata(ad, layer=layer, covariates=["batch", "depth"])
        assert in_memory.digest() == csv.digest() and in_memory.name == "anndata", what


@needs_anndata
def test_offsets_library_size_none_and_an_obs_column_and_sparse_blocks(monkeypatch):
    from scipy import sparse

    Y = counts()
    monkeypatch.setattr(reference, "BLOCK_ENTRIES", 2 * P)  # densified 2 rows at a time: 12 blocks
    np.testing.assert_array_equal(plnexp.load_anndata(adata(sparse.csc_matrix(Y))).Y, Y)
    ad = adata(Y)
    by_hand = np.log(Y.sum(axis=1))[:, None] * np.ones((1, P))
    np.testing.assert_allclose(plnexp.load_anndata(ad).O, by_hand, rtol=0, atol=1e-15)
    assert not plnexp.load_anndata(ad, offsets="none").O.any()
    np.testing.assert_allclose(plnexp.load_anndata(ad, offsets="total").O[:, P - 1], np.log(obs()["total"]))


def _bad_files(tmp_path) -> dict:
    from scipy import sparse

    Y = counts()
    negative, fraction, nan = (Y.astype(np.float64) for _ in range(3))
    negative[3, 2], fraction[4, 1], nan[5, 0] = -1, 0.5, np.nan
    empty = Y.copy()
    empty[6] = 0
    o = obs()
    cases = {
        "negative.h5ad": adata(sparse.csr_matrix(negative)),
        "fraction.h5ad": adata(fraction),
        "nan.h5ad": adata(nan),
        "empty.h5ad": adata(sparse.csr_matrix(empty)),
        "ok.h5ad": adata(Y, {"raw": Y}),
        "zero_total.h5ad": adata(Y, obs_columns={**o, "total": np.where(np.arange(N) == 2, 0.0, o["total"])}),
        "gap.h5ad": adata(Y, obs_columns={**o, "depth": np.where(np.arange(N) == 7, np.nan, o["depth"])}),
        "constant.h5ad": adata(Y, obs_columns={**o, "depth": np.ones(N)}),
    }
    for name, ad in cases.items():
        ad.write_h5ad(tmp_path / name)
    (tmp_path / "broken.h5ad").write_text("not HDF5\n")
    (tmp_path / "cells.csv").write_text("a\n1\n")
    return cases


BAD = [
    ("missing.h5ad", {}, r"AnnData file .*missing.h5ad: not found; allowed values are paths of existing .h5ad"),
    ("cells.csv", {}, r"cells.csv: not an .h5ad file \(suffix '.csv'\); allowed are .h5ad files"),
    ("broken.h5ad", {}, r"broken.h5ad: not a readable .h5ad file \("),
    ("ok.h5ad", {"layer": "counts"}, r"ok.h5ad: no layer 'counts'; allowed values are raw$"),
    ("ok.h5ad", {"covariates": ["tissue"]}, r"covariate 'tissue' is not an obs column; allowed values are batch"),
    ("ok.h5ad", {"offsets": "size"}, r"offsets 'size' is not an obs column; allowed values are library_size, none or"),
    ("ok.h5ad", {"offsets": "batch"}, r"offsets column 'batch': values of type category; allowed values are finite"),
    ("negative.h5ad", {}, r"negative.h5ad \(X\): counts: negative count -1 at row 4, column 3; allowed values are non"),
    ("fraction.h5ad", {}, r"\(X\): counts: non-integer count 0.5 at row 5, column 2; allowed values are non-negative"),
    ("nan.h5ad", {}, r"\(X\): counts: missing \(NaN\) value at row 6, column 1; allowed values are non-negative"),
    ("empty.h5ad", {}, r"empty.h5ad \(X\): cell 'cell6' \(row 7\) has no counts, so its library size is 0"),
    ("zero_total.h5ad", {"offsets": "total"}, r"offsets column 'total': value 0 at row 3; allowed values are finite"),
    ("gap.h5ad", {"covariates": ["depth"]}, r"covariate 'depth' is missing at row 8 \(cell 'cell7'\); allowed values"),
    ("constant.h5ad", {"covariates": ["depth"]}, r"column 'depth' is a linear combination of the intercept"),
]


@needs_anndata
def test_each_bad_input_is_one_line_naming_the_file_and_the_place(tmp_path):
    _bad_files(tmp_path)
    for name, kwargs, message in BAD:
        with pytest.raises(DataError) as err:
            plnexp.load_anndata(tmp_path / name, **kwargs)
        assert "\n" not in str(err.value), name
        assert err.match(message), (name, str(err.value))
    with pytest.raises(TypeError, match="source: got a list; allowed are a path of an .h5ad file or an AnnData"):
        plnexp.load_anndata([[1, 2]])


def test_without_anndata_the_one_line_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "anndata", None)  # import anndata: ImportError
    with pytest.raises(DataError, match=r"^AnnData counts need the anndata package.*\[single-cell\]"):
        plnexp.load_anndata(tmp_path / "cells.h5ad")
    (tmp_path / "cells.h5ad").write_bytes(b"")
    with pytest.raises(C.ConfigError, match=r"^dataset=anndata: needs the anndata package.*\[single-cell\]"):
        cli.plan(["dataset=anndata", f"dataset.path={tmp_path / 'cells.h5ad'}"], multirun=False)


@pytest.mark.parametrize("target", [0.8, 0.9, 0.95])
def test_simulate_pca_hits_the_zero_fraction_and_keeps_a_rank_q_truth(target):
    data = plnexp.simulate_pca(n=300, p=40, q=4, zero_fraction=target, d=2, seed=1)
    assert abs((data.Y == 0).mean() - target) <= 0.01
    assert (data.n, data.p, data.d) == (300, 40, 2) and data.name == f"synthetic_pca_n300_p40_q4_d2_zf{target}_s1"
    B, C_, Sigma = data.truth["B"], data.truth["C"], data.truth["Sigma"]
    assert B.shape == (2, 40) and C_.shape == (40, 4) and np.linalg.matrix_rank(Sigma) == 4
    np.testing.assert_allclose(Sigma, C_ @ C_.T)
    again = plnexp.simulate_pca(n=300, p=40, q=4, zero_fraction=target, d=2, seed=1)
    assert again.digest() == data.digest()


def test_simulate_pca_draws_poisson_counts_of_its_truth_block_by_block(monkeypatch):
    """Without a target, the counts' means are E exp(O + XB + W) = exp(O + XB + diag(Sigma)/2); drawn
    in several blocks of rows (each its own seed), the zero fraction is still hit."""
    data = plnexp.simulate_pca(n=20000, p=4, q=2, seed=3)
    mean = np.exp(data.O + data.X @ data.truth["B"] + np.diag(data.truth["Sigma"]) / 2).mean(axis=0)
    np.testing.assert_allclose(data.Y.mean(axis=0), mean, rtol=0.06)
    assert data.name == "synthetic_pca_n20000_p4_q2_s3"
    monkeypatch.setattr(simulation, "BLOCK_ENTRIES", 64)  # 16 rows a block: 19 blocks
    small = plnexp.simulate_pca(n=300, p=4, q=2, zero_fraction=0.9, seed=3)
    assert abs((small.Y == 0).mean() - 0.9) <= 0.01
    with pytest.raises(DataError, match=r"^simulate_pca: q=5 must be an integer <= p=4"):
        plnexp.simulate_pca(n=10, p=4, q=5)
    with pytest.raises(DataError, match=r"^simulate_pca: zero_fraction=1 must be null or a number in \(0, 1\)$"):
        plnexp.simulate_pca(n=10, p=4, q=2, zero_fraction=1)


def test_synthetic_pca_config_round_trip_label_and_replication():
    args = ["dataset=synthetic_pca", "dataset.n=50", "dataset.p=8", "dataset.q=2", "dataset.zero_fraction=0.9"]
    (job,) = cli.plan([*args, "dataset.replication=2"], multirun=False)
    ds = job.config.dataset
    assert isinstance(ds, C.SyntheticPcaData) and (ds.n, ds.p, ds.q, ds.d, ds.zero_fraction) == (50, 8, 2, 1, 0.9)
    assert ds.label == "synthetic_pca_n50_p8_q2_zf0.9_s0_x2" and job.name.startswith("scan-synthetic_pca_n50")
    assert config_load.load(config_load.loadable(job.config), check_device=False) == job.config
    data, once = ds.load(), dataclasses.replace(ds, replication=1).load()
    assert data.n == 100 and np.array_equal(data.Y, np.tile(once.Y, (2, 1)))
    (default,) = cli.plan(["dataset=synthetic_pca"], multirun=False)
    assert default.config.dataset.label == "synthetic_pca_n2000_p200_q5_s0"


def test_synthetic_pca_kept_sparse_by_the_config_is_the_dense_draw():
    """``dataset.sparse=true``: the same counts as CSR, whole and by rows; hashed only when true."""
    from plnexp.jobs import provenance

    args = ["dataset=synthetic_pca", "dataset.n=50", "dataset.p=8", "dataset.q=2", "dataset.zero_fraction=0.9"]
    (dense,), (kept,) = (cli.plan([*args, *extra], multirun=False) for extra in ([], ["dataset.sparse=true"]))
    assert "sparse" not in provenance.hashed(dense.config)["dataset"]  # older runs keep their hash
    assert provenance.hashed(kept.config)["dataset"]["sparse"] is True
    assert kept.config.dataset.label == dense.config.dataset.label + "_sparse"
    want, got, rows = dense.config.dataset.load(), kept.config.dataset.load(), kept.config.dataset.load_rows(10, 30)
    assert got.sparse and rows.sparse and got.digest() == want.digest()
    np.testing.assert_array_equal(got.Y.toarray(), want.Y)
    np.testing.assert_array_equal(rows.Y.toarray(), want.Y[10:30])


@pytest.mark.parametrize(
    "extra,message",
    [
        (["dataset.q=9"], "dataset.q=9: allowed values are integers from 1 to dataset.p=8"),
        (["dataset.zero_fraction=0"], "dataset.zero_fraction=0: allowed values are null (as drawn) or numbers in"),
        (["dataset.zero_fraction=many"], "dataset.zero_fraction='many': allowed values are null"),
        (["dataset.d=0"], "dataset.d=0: allowed values are integers >= 1"),
        (["dataset.k=3"], "dataset.k: unknown key; allowed keys under dataset are name, n, p, q, d, zero_fraction"),
    ],
)
def test_synthetic_pca_bad_values_are_one_line(extra, message):
    with pytest.raises(C.ConfigError) as err:
        cli.plan(["dataset=synthetic_pca", "dataset.p=8", *extra], multirun=False)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow  # imports anndata and plans: in CI
@needs_anndata
def test_anndata_config_round_trip_label_and_bad_values(tmp_path):
    from scipy import sparse

    path = tmp_path / "pbmc.h5ad"
    adata(np.zeros((N, P)), {"counts": sparse.csr_matrix(counts())}).write_h5ad(path)
    args = ["dataset=anndata", f"dataset.path={path}", "dataset.layer=counts", "dataset.covariates=[batch]"]
    (job,) = cli.plan([*args, "dataset.replication=3"], multirun=False)
    ds = job.config.dataset
    assert isinstance(ds, C.AnndataData) and ds.layer == "counts" and ds.covariates == ("batch",)
    assert ds.offsets == "library_size"
    assert ds.label == "anndata_pbmc_counts_x3+batch"
    assert config_load.load(config_load.loadable(job.config), check_device=False) == job.config
    data = ds.load()
    assert data.n == 3 * N and data.covariate_names == ("intercept", "batch=b", "batch=c")
    cli.check_data([job])  # the layer and columns exist: no error
    for bad, message in (
        ([], "dataset.path: required, no value given (set dataset.path=...); allowed values are paths"),
        ([f"dataset.path={tmp_path / 'none.h5ad'}"], "none.h5ad': allowed values are paths of existing .h5ad files"),
        ([f"dataset.path={path}", "dataset.layer=''"], "dataset.layer='': allowed values are null (X) or the name of"),
        ([f"dataset.path={path}", "dataset.offsets=3"], "dataset.offsets=3: allowed values are library_size, none or"),
        ([f"dataset.path={path}", "dataset.covariates=[1]"], "dataset.covariates=1: allowed values are names of obs"),
    ):
        with pytest.raises(C.ConfigError) as err:
            cli.plan(["dataset=anndata", *bad], multirun=False)
        assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    (job,) = cli.plan(["dataset=anndata", f"dataset.path={path}", "dataset.layer=raw"], multirun=False)
    with pytest.raises(DataError, match=r"pbmc.h5ad: no layer 'raw'; allowed values are counts$"):
        cli.check_data([job])


@needs_anndata
@pytest.mark.parametrize("shape", [(0, P), (N, 0)], ids=["0xp", "nx0"])
@pytest.mark.parametrize("kept_sparse", [False, True], ids=["dense", "sparse"])
def test_an_empty_count_matrix_is_named_by_its_shape_dense_or_kept_sparse(shape, kept_sparse):
    """#62: 0 x p and n x 0 counts are one line giving the shape, kept sparse as dense (not a
    rank-deficient intercept, nor an n x 0 data set accepted)."""
    import anndata
    from scipy import sparse

    empty = anndata.AnnData(sparse.csr_matrix(np.zeros(shape, dtype=np.float32)))
    with pytest.raises(DataError) as err:
        plnexp.load_anndata(empty, sparse=kept_sparse, offsets="none")
    assert str(err.value) == (
        f"AnnData (X): counts: must be a non-empty 2-d table (n samples x p variables), got shape {shape}"
    )


@needs_anndata
def test_one_covariate_given_as_a_string_is_that_column():
    """#62: covariates="batch" is the column batch, not the columns b, a, t, c, h."""
    Y = counts()
    one = plnexp.load_anndata(adata(Y.astype(np.float32)), covariates="batch")
    listed = plnexp.load_anndata(adata(Y.astype(np.float32)), covariates=["batch"])
    assert one.covariate_names == listed.covariate_names == ("intercept", "batch=b", "batch=c")
    np.testing.assert_array_equal(one.X, listed.X)


@needs_anndata
@pytest.mark.parametrize("kept_sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("rows", [None, (0, 2)], ids=["whole", "rows"])
def test_an_anndata_without_counts_is_one_line(kept_sparse, rows):
    """An AnnData whose X is empty (None) is one line, dense or kept sparse, whole or some rows
    (rows: it was a TypeError from slicing None)."""
    import anndata
    import pandas as pd

    empty = anndata.AnnData(obs=pd.DataFrame(index=[f"c{i}" for i in range(3)]))
    with pytest.raises(DataError) as err:
        plnexp.load_anndata(empty, sparse=kept_sparse, offsets="none", rows=rows)
    assert str(err.value) == (
        "AnnData (X): no count matrix (X is empty); allowed are AnnData with counts in X or a layer"
    )
