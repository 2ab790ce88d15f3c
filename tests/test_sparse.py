"""Sparse counts (issue #51, "Sparse counts"): ``simulate_pca(..., sparse=True)`` draws the same counts
as the dense draw, kept as CSR; the float64 host reference on the non-zeros is the dense one; a
device block densified from CSR is the dense block; a PLN-PCA fit with ``block_rows`` on sparse counts
gives the dense layout's ELBO curve; a fit that would densify all of them is one line naming what to use.

Tolerances: the counts, their digest and a densified block: exact (each count is copied, never
computed). The data init in blocks (sparse) vs every row at once (dense), float64: the curve to
1e-9 relative (sums over rows in another order, through an eigendecomposition or subspace iteration). Host reference sparse vs dense, float64: 1e-12 relative (the same terms summed in
another order). Fit curves sparse vs dense, float64: 1e-10 relative (the blocks are the same
arrays, so the programs compute the same numbers: measured 0).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import plnexp
from plnexp.core import reference
from plnexp.core.arrays import SparseCounts, dense_rows

KW = dict(model="pca", rank=3, block_rows=70, init="seed", n_iter=15, precision="float64", timed=False)


@pytest.fixture(scope="module")
def pair():
    """The same draw, dense and sparse: 333 rows (a multiple of no block size used), 90% zeros."""
    args = dict(n=333, p=40, q=3, zero_fraction=0.9, d=2, seed=5)
    return plnexp.simulate_pca(**args), plnexp.simulate_pca(**args, sparse=True)


@pytest.mark.parametrize("zero_fraction", [None, 0.95])
def test_simulate_pca_sparse_is_the_dense_draw(zero_fraction):
    dense = plnexp.simulate_pca(n=400, p=30, q=2, zero_fraction=zero_fraction, seed=2)
    sparse = plnexp.simulate_pca(n=400, p=30, q=2, zero_fraction=zero_fraction, seed=2, sparse=True)
    assert sparse.sparse and not dense.sparse
    assert sparse.Y.nnz == np.count_nonzero(dense.Y)
    np.testing.assert_array_equal(sparse.Y.toarray(), dense.Y)
    np.testing.assert_array_equal(sparse.X, dense.X)
    np.testing.assert_array_equal(sparse.truth["B"], dense.truth["B"])
    assert sparse.digest() == dense.digest()
    assert sparse.log_factorial == pytest.approx(dense.log_factorial, rel=1e-12)
    assert "sparse" in repr(sparse)


def test_host_reference_on_non_zeros_is_the_dense_one(pair):
    dense, sparse = pair
    rng = np.random.default_rng(0)
    n, p, d, q = dense.n, dense.p, dense.d, 3
    B, C = 0.3 * rng.normal(size=(d, p)), 0.4 * rng.normal(size=(p, q))
    M, S = rng.normal(size=(n, q)), 0.2 + rng.random((n, q))
    for rows in (None, 50):  # one block, and blocks of rows that do not divide n
        want = reference.pca_elbo(dense.Y, dense.O, dense.X, B, C, M, S, rows=rows)
        got = reference.pca_elbo(sparse.Y, sparse.O, sparse.X, B, C, M, S, rows=rows)
        assert got == pytest.approx(want, rel=1e-12)


def test_device_block_is_the_dense_block(pair):
    dense, sparse = pair
    Y = sparse.to_device(np.float64, jax.devices("cpu")[0]).Y
    assert isinstance(Y, SparseCounts) and Y.shape == dense.Y.shape
    take = jax.jit(dense_rows, static_argnums=2)
    for start, b in ((0, 70), (100, 70), (263, 70), (0, 333), (332, 1)):
        np.testing.assert_array_equal(np.asarray(take(Y, start, b)), dense.Y[start : start + b])


@pytest.mark.parametrize("optimizer", [pytest.param("rprop", marks=pytest.mark.slow), "adam"])
def test_fit_curve_sparse_equals_dense(pair, optimizer):
    dense, sparse = pair
    kw = dict(KW, optimizer=optimizer) | ({"lr": 1e-2} if optimizer == "adam" else {})
    want, got = plnexp.fit(dense, **kw), plnexp.fit(sparse, **kw)
    np.testing.assert_allclose(got.elbo, want.elbo, rtol=1e-10)
    assert got.loglik == pytest.approx(want.loglik, rel=1e-10)
    for key in ("B", "C", "M", "S"):
        np.testing.assert_allclose(got.params[key], want.params[key], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "kw, says",
    [
        (dict(block_rows=None), "allowed is model='pca' with block_rows"),
        (dict(optimizer="newton", block_rows=None), "allowed is model='pca' with block_rows"),
        (
            dict(strategy="scan_sharded"),
            r"strategy.via='jit': .* allowed value with sparse counts is strategy.via='shard_map'",
        ),
    ],
)
def test_a_fit_that_would_densify_them_is_one_line(pair, kw, says):
    _, sparse = pair
    with pytest.raises(ValueError, match=says) as e:
        plnexp.fit(sparse, **(KW | kw))
    assert "\n" not in str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize("p", [40, 1100])  # the data init's eigh of R'R, and its subspace iteration beyond 1,000
def test_data_init_in_blocks_is_the_dense_one(p):
    args = dict(n=150, p=p, q=3, zero_fraction=0.9, d=2, seed=7)
    dense, sparse = plnexp.simulate_pca(**args), plnexp.simulate_pca(**args, sparse=True)
    kw = dict(KW, init="data", optimizer="adam", lr=1e-2, n_iter=5, block_rows=40)
    want, got = plnexp.fit(dense, **kw), plnexp.fit(sparse, **kw)  # dense: the init of every row at once
    np.testing.assert_allclose(got.elbo, want.elbo, rtol=1e-9)


def test_newton_on_sparse_counts_names_the_optimizers_to_use(pair):
    _, sparse = pair
    with pytest.raises(ValueError, match="optimizer=rprop or adam"):
        plnexp.fit(sparse, **(KW | dict(optimizer="newton")))


def test_anndata_kept_sparse_is_the_dense_load(pair):
    anndata = pytest.importorskip("anndata")
    from scipy import sparse

    dense, _ = pair
    adata = anndata.AnnData(sparse.csc_matrix(dense.Y))  # stored as CSC: converted once
    adata.obs["total"] = dense.Y.sum(axis=1) + 1.0  # some cells have no counts: totals of their own
    want, got = (plnexp.load_anndata(adata, offsets="total", sparse=kept) for kept in (False, True))
    assert got.sparse and not want.sparse
    np.testing.assert_array_equal(got.Y.toarray(), want.Y)
    np.testing.assert_array_equal(got.O, want.O)
    assert got.digest() == want.digest()


def test_anndata_kept_sparse_bad_count_is_one_line():
    anndata = pytest.importorskip("anndata")
    from scipy import sparse

    Y = np.zeros((4, 3))
    Y[2, 1], Y[0, 0] = 1.5, 2.0
    with pytest.raises(plnexp.DataError, match=r"non-integer count 1.5 at row 3, column 2"):
        plnexp.load_anndata(anndata.AnnData(sparse.csr_matrix(Y)), offsets="none", sparse=True)
