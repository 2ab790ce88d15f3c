"""The host data path of a large fit (docs/concepts/memory.md, "The 60,000 x 20,000 fit"): per-row
offsets as a view of their column, float32 counts for large simulated or sparse AnnData sets, the
digest, the log-factorial and the host checks a block of rows at a time, the arrays placed without a
second host copy. Each must leave the numbers as they were: the same arrays' values, the same
digest, the same fit. The thresholds (``COMPACT_ENTRIES``, ``BLOCK_ENTRIES``) are lowered here so that
small data take the large data's path."""

from __future__ import annotations

import hashlib
import importlib.util

import jax
import numpy as np
import pytest

import plnexp
from plnexp.core import anndata_counts, simulation
from plnexp.fitting import optimum
from plnexp.core import reference
from plnexp.core.precision import PRECISIONS

CPU = jax.devices("cpu")[0]


def whole_digest(data: plnexp.Data) -> str:
    """The digest as it was computed before it went by blocks: each whole array's float64 bytes."""
    h = hashlib.sha256()
    for a in (data.Y, data.O, data.X):
        h.update(str(a.shape).encode())
        h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return h.hexdigest()


def test_digest_by_blocks_is_the_whole_arrays_digest(monkeypatch):
    oaks = plnexp.load_oaks()
    assert oaks.digest() == whole_digest(oaks) == optimum.SHIPPED["oaks"][0]
    monkeypatch.setattr(reference, "BLOCK_ENTRIES", 7 * oaks.p)  # 7 rows a block: 17 blocks, the last one short
    assert oaks.digest() == whole_digest(oaks)
    fortran = plnexp.Data(np.asfortranarray(oaks.Y), oaks.O, oaks.X)  # not C-contiguous: the same bytes
    assert fortran.digest() == whole_digest(oaks)


def test_per_row_offsets_are_a_read_only_view_of_their_column():
    Y = np.random.default_rng(0).poisson(3.0, size=(9, 4))
    totals = np.linspace(1.0, 3.0, 9)
    full = plnexp.as_data(Y, np.tile(totals[:, None], (1, 4)))
    for offsets in (totals, totals[:, None]):
        data = plnexp.as_data(Y, offsets)
        assert data.O.shape == (9, 4) and data.O.strides[1] == 0 and not data.O.flags.writeable
        np.testing.assert_array_equal(data.O, full.O)
        assert data.digest() == full.digest() == whole_digest(full)
    none = plnexp.as_data(Y)
    assert none.O.shape == (9, 4) and not none.O.any()
    with pytest.raises(plnexp.DataError, match="offset -1 at row 3, column 1"):
        plnexp.as_data(Y, np.where(np.arange(9) == 2, -1.0, totals))


@pytest.mark.slow
def test_simulate_pca_large_path_float32_counts_same_data_digest_and_fit(monkeypatch):
    """Above COMPACT_ENTRIES the counts are float32 (64-byte aligned), O a view, Sigma not kept: the
    same values, digest and fit as the float64 arrays."""
    kw = dict(n=120, p=30, q=3, zero_fraction=0.8, seed=2)
    small = plnexp.simulate_pca(**kw)
    monkeypatch.setattr(simulation, "COMPACT_ENTRIES", 1000)
    large = plnexp.simulate_pca(**kw)
    assert small.Y.dtype == np.float64 and large.Y.dtype == np.float32 and large.Y.ctypes.data % 64 == 0
    np.testing.assert_array_equal(large.Y, small.Y)
    np.testing.assert_array_equal(large.O, small.O)
    assert large.O.strides[1] == 0
    assert large.digest() == small.digest() == whole_digest(small)
    assert large.log_factorial == small.log_factorial
    assert "Sigma" in large.truth and set(dict(large.truth)) == {"B", "C"}
    np.testing.assert_array_equal(large.truth["Sigma"], large.truth["C"] @ large.truth["C"].T)
    dense = plnexp.Data(small.Y, np.array(small.O), small.X)  # O as a full array, as it was stored
    f32 = PRECISIONS["float32"]
    for block_rows in (None, 50):
        kwargs = dict(model="pca", rank=3, n_iter=4, block_rows=block_rows, timed=False)
        a, b, c = (plnexp.fit(d, **kwargs) for d in (dense, small, large))
        # small and large reach the device as the same arrays (O its (n, 1) column, Y float32): one
        # program on one layout, so their curves are equal by construction, bit for bit.
        np.testing.assert_array_equal(c.elbo, b.elbo)
        assert b.loglik == c.loglik and np.isfinite(a.loglik)
        # dense's O is a full (n, p) array: another program, whose sums XLA and the BLAS may order
        # otherwise (they do under the suite's XLA flags): equal to float32's curve tolerance.
        np.testing.assert_allclose(b.elbo, a.elbo, rtol=f32.curve_rtol)
        assert b.loglik == pytest.approx(a.loglik, rel=f32.check_rtol)


def test_simulate_pca_counts_float32_cannot_hold_go_float64(monkeypatch):
    monkeypatch.setattr(simulation, "COMPACT_ENTRIES", 100)
    monkeypatch.setattr(simulation, "FLOAT32_EXACT", 2)  # a count of 2 or more is "not exact": float64 from there on
    data = plnexp.simulate_pca(n=60, p=10, q=2, seed=1)
    monkeypatch.setattr(simulation, "COMPACT_ENTRIES", 1 << 26)
    want = plnexp.simulate_pca(n=60, p=10, q=2, seed=1)
    assert data.Y.dtype == np.float64 and (want.Y >= 2).any()
    np.testing.assert_array_equal(data.Y, want.Y)


@pytest.mark.parametrize("precision", [np.float32, np.float64])
def test_to_device_gives_the_values_of_a_plain_device_put(monkeypatch, precision):
    monkeypatch.setattr(reference, "BLOCK_ENTRIES", 5 * 114)  # the conversion in blocks of 5 rows
    monkeypatch.setattr(simulation, "COMPACT_ENTRIES", 1000)
    datasets = [
        plnexp.load_oaks(),
        plnexp.simulate_pca(50, 20, 2, 0.7),
        plnexp.as_data(np.ones((5, 3)), np.arange(1.0, 6)),
    ]
    with jax.enable_x64(precision == np.float64):
        for data in datasets:
            placed = data.to_device(precision, CPU)
            for got, a in zip(placed, (data.Y, data.O, data.X)):
                want = jax.device_put(np.asarray(a, dtype=precision), CPU)
                if a is data.O and a.strides[1] == 0:  # offsets one per row: their (n, 1) column
                    want = want[:, :1]
                assert got.shape == want.shape and got.dtype == want.dtype and got.committed
                np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
            want_o = (data.n, 1) if data.O.strides[1] == 0 else (data.n, data.p)
            assert placed.O.shape == want_o


@pytest.mark.slow
@pytest.mark.parametrize("model", ["pca", "full"])
def test_per_row_offsets_reach_the_device_as_their_column_same_fit(monkeypatch, model):
    """Offsets one per row go to the fit's device as their (n, 1) column (no n x p array there),
    which every computation broadcasts: the ELBO curve is that of the same offsets given as a full
    (n, p) array, placed as such (float64, rtol 1e-12: the same sums, in the same order)."""
    from plnexp.strategies.base import OneDevice

    rng = np.random.default_rng(5)
    n, p = 60, 12
    Y = rng.poisson(2.0, size=(n, p))
    Y[:, 0] += 1  # no empty column
    totals = rng.uniform(0.5, 2.0, n)
    row = plnexp.as_data(Y, totals)
    full = plnexp.as_data(Y, np.tile(totals[:, None], (1, p)))
    placed = []
    place = OneDevice.place

    def recording(self, data, dtype, device):
        arrays = place(self, data, dtype, device)
        placed.append(arrays.O.shape)
        return arrays

    monkeypatch.setattr(OneDevice, "place", recording)
    kwargs = dict(model=model, rank=3 if model == "pca" else None, n_iter=30, precision="float64", init="data")
    got, want = (plnexp.fit(d, timed=False, **kwargs) for d in (row, full))
    assert placed == [(n, 1), (n, p)]
    assert got.elbo.shape == (30,) and np.all(np.isfinite(got.elbo))
    np.testing.assert_allclose(got.elbo, want.elbo, rtol=1e-12)
    assert got.loglik == pytest.approx(want.loglik, rel=1e-12)


def test_float32_counts_go_to_the_cpu_without_a_copy(monkeypatch):
    monkeypatch.setattr(simulation, "COMPACT_ENTRIES", 1000)
    data = plnexp.simulate_pca(100, 40, 2)
    assert data.to_device(np.float32, CPU).Y.unsafe_buffer_pointer() == data.Y.ctypes.data


def test_log_factorial_and_host_checks_by_blocks(monkeypatch):
    data = plnexp.simulate_pca(n=400, p=50, q=3, zero_fraction=0.6, seed=4)
    whole = float(np.sum(reference.gammaln(data.Y + 1.0)))
    assert reference.log_factorial_sum(data.Y) == whole  # one block below 2**22 entries
    monkeypatch.setattr(reference, "BLOCK_ENTRIES", 37 * 50)  # 37 rows a block: 11 blocks
    assert reference.log_factorial_sum(data.Y) == pytest.approx(whole, rel=1e-14)
    assert reference.block_rows(50) == 37 and reference.block_rows(50, 8) == 8
    rng = np.random.default_rng(0)
    B, C = rng.normal(size=(1, 50)) * 0.1, rng.normal(size=(50, 3)) * 0.1
    M, S = rng.normal(size=(400, 3)), np.full((400, 3), 0.7)
    args = (data.Y, data.O, data.X, B, C, M, S)
    assert reference.pca_elbo(*args) == pytest.approx(reference.pca_elbo(*args, rows=400), rel=1e-13)
    monkeypatch.setattr(reference, "BLOCK_ENTRIES", 1 << 22)
    assert reference.block_rows(50) == reference.ROWS == 8192 and reference.block_rows(20000) == 209


@pytest.mark.skipif(importlib.util.find_spec("anndata") is None, reason="anndata is not installed")
def test_sparse_anndata_large_path_float32_counts_same_data(monkeypatch):
    import anndata
    from scipy import sparse

    Y = np.random.default_rng(3).poisson(1.5, size=(40, 12))
    Y[:, 0] += 1
    ad = anndata.AnnData(X=sparse.csr_matrix(Y.astype(np.float32)))
    want = plnexp.load_anndata(ad)
    monkeypatch.setattr(anndata_counts, "COMPACT_ENTRIES", 100)
    got = plnexp.load_anndata(ad)
    assert want.Y.dtype == np.float64 and got.Y.dtype == np.float32 and got.O.strides[1] == 0
    np.testing.assert_array_equal(got.Y, want.Y)
    np.testing.assert_array_equal(got.O, want.O)
    assert got.digest() == want.digest()
    bad = sparse.csr_matrix(np.where(np.arange(12) == 5, 0.5, Y))  # not counts: float64, and one line
    with pytest.raises(plnexp.DataError, match="non-integer count 0.5 at row 1, column 6"):
        plnexp.load_anndata(anndata.AnnData(X=bad))
