"""plnexp.measure.floor: the machine's floor for one iteration, its per-machine cache, and the floor a job logs.

The cache tests count measurements with stand-ins for the two measuring functions (keyed by what
they measure); the real measurements run at tiny shapes (cheap), and the suite's cache is a folder
of the session (conftest), never ~/.cache."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from conftest import store_client

from plnexp.measure import floor
from plnexp.jobs import provenance
from plnexp.experiment import job_task, runner
from plnexp.jobs.spec import JobSpec
from plnexp.core.data import Data, row_offsets
from plnexp.core.model import PCA_WORK, PLN_WORK, Work
from plnexp.fitting.spec import MODEL_NAMES, model_named


def independent_floor(n: int, p: int, itemsize: int, copy_GBps: float, dot_ms: float, factor_ms: float = 0.0) -> float:
    """The full model: 14 n x p arrays read or written at the copy bandwidth, plus two n x p x p
    products and one p x p Cholesky factor with its inverse, in ms."""
    seconds_streaming = 14 * n * p * itemsize / (copy_GBps * 1e9)
    return 1e3 * seconds_streaming + 2 * dot_ms + factor_ms


def independent_pca_floor(n: int, p: int, q: int, itemsize: int, copy_GBps: float, dot_ms: float) -> float:
    """PLN-PCA of rank q, counted by hand: Y and O read (n x p each); M, S and the optimizer's two
    moments of each (6 arrays of n x q) read and written; MC', S^2 (C o C)', RC, A (C o C), R'M and
    A'S^2: six n x p x q products, each of ``dot_ms``."""
    read = 2 * n * p
    latent = 6 * n * q
    return 1e3 * (read + 2 * latent) * itemsize / (copy_GBps * 1e9) + 6 * dot_ms


def full(n: int, p: int, row_offsets: bool = False) -> floor.Iteration:
    """An iteration of the full model at (n, p)."""
    return floor.Iteration(n, p, p, PLN_WORK, row_offsets)


def stub_dot_ms(n: int, p: int, k: int) -> float:
    """The stand-in product's milliseconds: 1 ms per 1e6 n p k."""
    return 0.001 * n * p * k / 1e3


def stub_factor_ms(p: int) -> float:
    """The stand-in factorization's milliseconds: 1 ms per 1e6 p^3."""
    return 0.001 * p**3 / 1e3


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """The measurements replaced by counters returning fixed values; the cache in tmp_path."""
    monkeypatch.setenv(floor.CACHE_ENV, str(tmp_path / "cache"))
    calls = {"copy": [], "dot": [], "factor": []}

    def copy(nbytes, dtype, device=None):
        calls["copy"].append((nbytes, np.dtype(dtype).name))
        return 50.0

    def dot(n, p, k, dtype, device=None):
        calls["dot"].append((n, p, k, np.dtype(dtype).name))
        return stub_dot_ms(n, p, k)

    def factor(p, dtype, device=None):
        calls["factor"].append((p, np.dtype(dtype).name))
        return stub_factor_ms(p)

    monkeypatch.setattr(floor, "measure_copy", copy)
    monkeypatch.setattr(floor, "measure_dot", dot)
    monkeypatch.setattr(floor, "measure_factor", factor)
    return calls


def test_the_floor_is_the_streamed_arrays_plus_two_products_and_a_factorization():
    for n, p, itemsize, bw, dot, factor in [
        (11600, 114, 4, 51.0, 1.7, 0.16),
        (30, 5, 8, 200.0, 1e-3, 2e-3),
        (10**6, 2000, 4, 12.5, 900.0, 40.0),
    ]:
        assert floor.floor_ms(full(n, p), itemsize, bw, dot, factor) == pytest.approx(
            independent_floor(n, p, itemsize, bw, dot, factor), rel=1e-12
        )
    f = floor.Floor(full(11600, 114), "float32", 51.0, 2**26, 1.7, 0.16)
    assert f.ms_per_iter == pytest.approx(independent_floor(11600, 114, 4, 51.0, 1.7, 0.16), rel=1e-12)
    assert f.metrics() == {
        "floor_ms_per_iter": f.ms_per_iter,
        "floor_copy_GBps": 51.0,
        "floor_dot_ms": 1.7,
        "floor_factor_ms": 0.16,
        "floor_bytes_per_iter": 14 * 11600 * 114 * 4,
    }
    assert f.dot_GFLOPps == pytest.approx(2 * 11600 * 114 * 114 / 1.7e-3 / 1e9)
    assert (f.iteration.n, f.iteration.p) == (11600, 114)
    assert full(11600, 114).describe() == "14 n x p arrays + 2 n x p x p products + 1 p x p Cholesky and inverse"


def test_the_pca_floor_counts_n_x_q_arrays_and_six_n_x_p_x_q_products():
    for n, p, q, itemsize, bw, dot in [
        (11600, 114, 5, 4, 51.0, 0.2),
        (30, 5, 2, 8, 200.0, 1e-3),
        (10**6, 2000, 20, 4, 12.5, 9.0),
    ]:
        it = floor.Iteration(n, p, q, PCA_WORK)
        assert floor.floor_ms(it, itemsize, bw, dot) == pytest.approx(
            independent_pca_floor(n, p, q, itemsize, bw, dot), rel=1e-12
        )
        assert it.stream_bytes(itemsize) == (2 * n * p + 12 * n * q) * itemsize
        assert it.dot_shape == (n, p, q)
    f = floor.Floor(floor.Iteration(11600, 114, 5, PCA_WORK), "float32", 51.0, 2**24, 0.2)
    assert f.dot_GFLOPps == pytest.approx(2 * 11600 * 114 * 5 / 0.2e-3 / 1e9)
    assert f.metrics()["floor_bytes_per_iter"] == (2 * 11600 * 114 + 12 * 11600 * 5) * 4
    assert (
        floor.Iteration(11600, 114, 5, PCA_WORK).describe() == "2 n x p + 12 n x q arrays (q=5) + 6 n x p x q products"
    )


def test_the_pca_floor_measures_its_own_product_from_the_cache(counted):
    """A pca iteration asks the cache for its n x p x q product (never the full model's n x p x p),
    and its floor is the hand count on the stand-in measurements."""
    n, p, q = 500, 50, 3
    f = floor.cached(floor.Iteration(n, p, q, PCA_WORK), np.float32)
    assert counted["dot"] == [(n, p, q, "float32")]
    assert f.dot_ms == stub_dot_ms(n, p, q)
    assert f.ms_per_iter == pytest.approx(independent_pca_floor(n, p, q, 4, 50.0, stub_dot_ms(n, p, q)), rel=1e-12)
    # the working set: 2 n x p + 6 n x q float32 = 236 kB -> the 1 MiB floor of the buffer (the full
    # model's 8 n x p, 800 kB, too)
    assert f.copy_bytes == floor.copy_bytes(floor.Iteration(n, p, q, PCA_WORK), 4) == 2**20
    g = floor.cached(full(n, p), np.float32)  # the full model at the same shape: its own product, the same copy
    assert counted["dot"][-1] == (n, p, p, "float32") and len(counted["copy"]) == 1
    assert g.ms_per_iter == pytest.approx(
        independent_floor(n, p, 4, 50.0, stub_dot_ms(n, p, p), stub_factor_ms(p)), rel=1e-12
    )
    assert f.ms_per_iter < g.ms_per_iter


def test_offsets_one_per_row_are_one_n_x_p_stream_fewer():
    n, p, q, bw, dot = 11600, 114, 5, 51.0, 1.7
    for work, width in ((PLN_WORK, p), (PCA_WORK, q)):
        dense, rows = floor.Iteration(n, p, width, work), floor.Iteration(n, p, width, work, row_offsets=True)
        assert dense.wide_arrays - rows.wide_arrays == 1
        # one n x p array fewer, the n offsets of the column instead
        assert dense.stream_bytes(4) - rows.stream_bytes(4) == (n * p - n) * 4
        assert floor.floor_ms(dense, 4, bw, dot) - floor.floor_ms(rows, 4, bw, dot) == pytest.approx(
            1e3 * (n * p - n) * 4 / (bw * 1e9), rel=1e-9
        )
    # the full model with offsets one per row, by hand: 13 n x p arrays and the column
    expected = 1e3 * (13 * n * p + n) * 4 / (bw * 1e9) + 2 * dot
    assert floor.floor_ms(full(n, p, row_offsets=True), 4, bw, dot) == pytest.approx(expected, rel=1e-12)
    assert full(n, p, True).describe() == (
        "13 n x p arrays + the n offsets + 2 n x p x p products + 1 p x p Cholesky and inverse"
    )


def test_the_iteration_comes_from_the_models_declared_work_and_the_datas_offsets():
    rng = np.random.default_rng(0)
    n, p = 12, 6
    Y, X = rng.poisson(2.0, (n, p)).astype(float), np.ones((n, 1))
    dense = Data(Y, rng.normal(size=(n, p)), X, "dense")
    per_row = Data(Y, row_offsets(rng.normal(size=n), p), X, "per_row")
    for name in MODEL_NAMES:  # every model of the registry declares its work
        model = model_named(name, rank=2) if name == "pca" else model_named(name)
        assert isinstance(model.work, Work)
        it = floor.iteration(model, dense)
        assert (it.n, it.p, it.q, it.work, it.row_offsets) == (n, p, model.rank or p, model.work, False)
        assert floor.iteration(model, per_row).row_offsets
    assert model_named("full").work == model_named("profiled").work == PLN_WORK
    assert model_named("pca", rank=3, block_rows=4).work == PCA_WORK  # blocks change memory, not the least work
    assert floor.iteration(model_named("pca", rank=3), dense).dot_shape == (n, p, 3)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 5, 5, PLN_WORK), "n=0"),
        ((30, 5, True, PLN_WORK), "q=True"),
        ((30, 5, 5, Work(0, 6, 2), True), "row_offsets"),
    ],
)
def test_a_bad_iteration_is_a_one_line_error(args, match):
    with pytest.raises(ValueError, match=match):
        floor.Iteration(*args)


def test_the_copy_buffer_is_the_working_set_within_bounds():
    assert floor.copy_bytes(full(30, 5), 4) == 2**20  # tiny: the 1 MiB floor
    assert floor.copy_bytes(full(11600, 114), 4) == 2**26  # 8 arrays of 5.3 MB = 42 MB -> 64 MiB
    assert floor.copy_bytes(full(11600, 114), 8) == 2**27
    assert floor.copy_bytes(full(10**6, 114), 4) == 2**28  # capped at 256 MiB
    # pca of rank 5: Y, O (2 x 5.3 MB) + 6 n x q arrays (1.4 MB) = 12 MB -> 16 MiB
    assert floor.copy_bytes(floor.Iteration(11600, 114, 5, PCA_WORK), 4) == 2**24
    # offsets one per row: 7 n x p arrays + the column; 37 MB -> still 64 MiB here
    assert floor.copy_bytes(full(11600, 114, row_offsets=True), 4) == 2**26
    # ... and 4.2 MB (8 arrays) -> 8 MiB, but 3.7 MB (7 arrays + the column) -> 4 MiB here
    assert floor.copy_bytes(full(4100, 32), 4) == 2**23
    assert floor.copy_bytes(full(4100, 32, row_offsets=True), 4) == 2**22


def test_a_second_call_does_not_measure_again_and_parts_are_keyed_by_what_they_depend_on(counted, tmp_path):
    first = floor.cached(full(30, 5), np.float32)
    assert counted == {"copy": [(2**20, "float32")], "dot": [(30, 5, 5, "float32")], "factor": [(5, "float32")]}
    assert floor.cached(full(30, 5), np.float32) == first  # from the file: nothing measured
    assert len(counted["copy"]) == 1 and len(counted["dot"]) == 1 and len(counted["factor"]) == 1
    floor.cached(full(40, 5), "float32")  # another n: its own product; the same copy buffer and p x p factor
    assert counted["copy"] == [(2**20, "float32")] and counted["dot"][-1] == (40, 5, 5, "float32")
    assert counted["factor"] == [(5, "float32")]
    floor.cached(full(30, 5), np.float64)  # another dtype: both parts
    assert counted["copy"][-1] == (2**20, "float64") and counted["dot"][-1] == (30, 5, 5, "float64")
    assert len(counted["copy"]) == 2 and len(counted["dot"]) == 3
    floor.cached(floor.Iteration(30, 5, 2, PCA_WORK), np.float32)  # another product shape (n, p, q): its own
    assert counted["dot"][-1] == (30, 5, 2, "float32") and len(counted["copy"]) == 2
    assert counted["factor"] == [(5, "float32"), (5, "float64")]  # pca factors nothing
    floor.cached(full(30, 5, row_offsets=True), np.float32)  # the same product and buffer: nothing new
    assert len(counted["dot"]) == 4 and len(counted["copy"]) == 2
    # one file for this machine, naming it and holding every part measured
    (path,) = (tmp_path / "cache").glob("floor-*.json")
    data = json.loads(path.read_text())
    assert data["machine"] == floor.identity() and data["machine"]["host"] and data["machine"]["jax"]
    assert set(data["dot"]) == {"float32/30x5x5", "float32/40x5x5", "float64/30x5x5", "float32/30x5x2"}
    assert set(data["factor"]) == {"float32/5", "float64/5"}
    assert first.ms_per_iter == pytest.approx(
        independent_floor(30, 5, 4, 50.0, stub_dot_ms(30, 5, 5), stub_factor_ms(5))
    )


@pytest.mark.parametrize(
    "content",
    [
        '{"format": 1, "machine": {"ho',
        "",
        "[]",
        "null",
        "FOREIGN_MACHINE",
        "BAD_VALUES",
        "OLD_FORMAT",
    ],
)
def test_a_corrupt_or_foreign_cache_file_is_measured_again(counted, tmp_path, content):
    floor.cached(full(30, 5), np.float32)
    path = floor.cache_file(floor.identity())
    if content == "BAD_VALUES":  # this machine's file, with values no measurement gives
        data = json.loads(path.read_text())
        data["copy"] = {k: -1.0 for k in data["copy"]}
        data["dot"] = {k: "fast" for k in data["dot"]}
        content = json.dumps(data)
    if content == "OLD_FORMAT":  # this machine's file, written by an older plnexp (its products timed otherwise)
        data = json.loads(path.read_text())
        data["format"] = floor.CACHE_FORMAT - 1
        content = json.dumps(data)
    if content == "FOREIGN_MACHINE":  # the current format, another machine's
        content = json.dumps({"format": floor.CACHE_FORMAT, "machine": {}, "copy": {}, "dot": {}})
    path.write_text(content)
    f = floor.cached(full(30, 5), np.float32)
    assert len(counted["copy"]) == 2 and len(counted["dot"]) == 2
    assert f.copy_GBps == 50.0 and json.loads(path.read_text())["copy"] == {"float32/1048576": 50.0}
    assert json.loads(path.read_text())["format"] == floor.CACHE_FORMAT  # replaced
    floor.cached(full(30, 5), np.float32)  # whole again: read back
    assert len(counted["copy"]) == 2 and len(counted["dot"]) == 2


def test_the_cache_is_replaced_atomically_and_a_failed_write_leaves_the_old_file(
    counted, tmp_path, monkeypatch, caplog
):
    floor.cached(full(30, 5), np.float32)
    path = floor.cache_file(floor.identity())
    before = path.read_text()
    replaced = []
    real_replace = floor.os.replace

    def spy(src, dst):
        replaced.append((src, dst))
        real_replace(src, dst)

    monkeypatch.setattr(floor.os, "replace", spy)
    floor.cached(full(31, 5), np.float32)
    ((src, dst),) = replaced
    assert dst == path and floor.Path(src).parent == path.parent  # a complete file renamed over the old one
    assert "float32/31x5x5" in json.loads(path.read_text())["dot"]

    def broken(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(floor.os, "fsync", broken)
    before = path.read_text()
    with caplog.at_level(logging.WARNING, logger="plnexp.measure.floor"):
        f = floor.cached(full(32, 5), np.float32)  # measured and returned all the same
    assert f.dot_ms == stub_dot_ms(32, 5, 5) and "floor cache not written" in caplog.text
    assert path.read_text() == before  # the old file, whole
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left


def test_where_the_cache_goes(monkeypatch, tmp_path):
    monkeypatch.setenv(floor.CACHE_ENV, str(tmp_path / "a"))
    assert floor.cache_dir() == tmp_path / "a"
    monkeypatch.delenv(floor.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert floor.cache_dir() == tmp_path / "xdg" / "plnexp"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert floor.cache_dir() == tmp_path / "home" / ".cache" / "plnexp"


def test_an_unwritable_cache_folder_still_gives_the_floor(counted, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(floor.CACHE_ENV, str(tmp_path / "file" / "cache"))  # under a file: cannot be made
    assert floor.cached(full(30, 5), np.float32).copy_GBps == 50.0


@pytest.mark.parametrize("dtype", [np.float32, pytest.param(np.float64, marks=pytest.mark.slow)])
def test_a_real_measurement_at_a_tiny_shape(dtype, monkeypatch, tmp_path):
    monkeypatch.setenv(floor.CACHE_ENV, str(tmp_path))
    f = floor.cached(full(20, 4), dtype, "cpu")
    assert f.dtype == np.dtype(dtype).name and f.copy_bytes == 2**20
    assert 0.1 < f.copy_GBps < 1e4 and 0 < f.dot_ms < 10 and 0 < f.factor_ms < 10
    assert f.ms_per_iter == pytest.approx(
        independent_floor(20, 4, np.dtype(dtype).itemsize, f.copy_GBps, f.dot_ms, f.factor_ms)
    )
    g = floor.cached(floor.Iteration(20, 4, 2, PCA_WORK), dtype, "cpu")  # an n x p times p x q product
    assert g.copy_GBps == f.copy_GBps and 0 < g.dot_ms < 10 and g.factor_ms == 0.0
    assert g.ms_per_iter == pytest.approx(
        independent_pca_floor(20, 4, 2, np.dtype(dtype).itemsize, g.copy_GBps, g.dot_ms)
    )


def test_run_metrics_are_nan_when_measuring_fails_but_the_bytes_are_counted(monkeypatch, caplog, tmp_path):
    """The measured parts are NaN (not measured); the streamed bytes are arithmetic, logged all the
    same (else the report would fall back to the legacy 14 n x p count, wrong for pca)."""

    def broken(*a, **k):
        raise RuntimeError("no such device\nsecond line")

    monkeypatch.setenv(floor.CACHE_ENV, str(tmp_path))  # empty: measuring is attempted
    monkeypatch.setattr(floor, "measure_dot", broken)
    monkeypatch.setattr(floor, "measure_copy", broken)
    timed = [k for k in floor.METRICS if k != "floor_bytes_per_iter"]
    with caplog.at_level(logging.WARNING, logger="plnexp.measure.floor"):
        out = floor.run_metrics(full(30, 7), np.float32, "cpu")
    assert set(out) == set(floor.METRICS) and all(math.isnan(out[k]) for k in timed)
    assert out["floor_bytes_per_iter"] == 14 * 30 * 7 * 4  # the hand count: 14 n x p arrays of float32
    assert "floor not measured (RuntimeError: no such device)" in caplog.text
    pca = floor.run_metrics(floor.Iteration(30, 7, 2, PCA_WORK), np.float64, "cpu")
    assert all(math.isnan(pca[k]) for k in timed) and pca["floor_bytes_per_iter"] == (2 * 30 * 7 + 12 * 30 * 2) * 8
    bad_device = floor.run_metrics(full(30, 7), np.float32, "tpu")  # a bad device name
    assert all(math.isnan(bad_device[k]) for k in timed) and bad_device["floor_bytes_per_iter"] == 14 * 30 * 7 * 4


@pytest.mark.slow
def test_a_job_logs_its_machines_floor_measured_before_the_fit(tiny_config, outputs, monkeypatch):
    """The floor a run logs is this process's cached floor for the data's shape, measured before the
    fit runs, and its arithmetic holds on the logged parts."""
    import plnexp.fitting.engine

    order = []
    real_metrics, real_run_all = floor.run_metrics, plnexp.fitting.engine.run_all
    monkeypatch.setattr(floor, "run_metrics", lambda *a: order.append("floor") or real_metrics(*a))
    # (the job's fit owns its process; the fit computing the data's best known ELBO, plnexp.fitting.optimum, not)
    fits = lambda *a, **k: order.append("fit" if k.get("owns_process") else "optimum") or real_run_all(*a, **k)
    monkeypatch.setattr(plnexp.fitting.engine, "run_all", fits)
    job = job_task.run_job(JobSpec(tiny_config, "floored"))
    assert job.status == "FINISHED" and [o for o in order if o != "optimum"] == ["floor", "fit"]
    run = store_client(outputs).get_run(job.run_id)
    m, t = run.data.metrics, run.data.tags
    n, p = int(t["data_n"]), int(t["data_p"])
    assert (n, p) == (30, 5)
    assert m["floor_ms_per_iter"] == pytest.approx(
        independent_floor(n, p, 4, m["floor_copy_GBps"], m["floor_dot_ms"], m["floor_factor_ms"]), rel=1e-9
    )
    assert m["floor_ms_per_iter"] == pytest.approx(floor.cached(full(n, p), np.float32, "cpu").ms_per_iter, rel=1e-12)
    assert m["floor_bytes_per_iter"] == 14 * n * p * 4
    # a metric of the run, never a param: the config hash (resume, rerun) is the config's alone
    assert not any(k.startswith("floor") for k in run.data.params)
    assert t[provenance.HASH_TAG] == provenance.config_hash(tiny_config)


def stand_in_fit(datas, spec, **k):
    """A fit's result without fitting (the tests about the job around it stay fast)."""
    from plnexp.fitting.engine import FitResult
    from plnexp.measure.timing import Timing

    curve = -np.arange(10.0, 13.0)[::-1]
    timing = Timing(compile_s=0.5, first_call_s=float("nan"), run_s=0.003, ms_per_iter=1.0, runs_s=(0.003,))
    return [
        FitResult(
            curve,
            float(curve[-1]),
            {},
            3,
            timing,
            spec.model.name,
            "scan",
            "radam_clip",
            "float32",
            "cpu",
            {"final_elbo_jit": float(curve[-1])},
        )
    ]


def test_a_pca_job_logs_the_pca_floor_below_the_full_models_at_the_same_shape(counted, outputs, monkeypatch):
    """Two jobs on the same data (n=30, p=20) with the same stand-in measurements: the pca job of rank
    2 logs its own floor (2 n x p + 12 n x q arrays, six n x p x 2 products), smaller than the full
    model's (14 n x p arrays, two n x p x p products). The fits are stand-ins: the floor is measured
    before them."""
    import plnexp.fitting.engine
    from plnexp.experiment import plan

    monkeypatch.setattr(plnexp.fitting.engine, "run_all", stand_in_fit)
    monkeypatch.setattr(runner, "best_known", lambda *a: None)
    logged = {}
    for model in (["model=full"], ["model=pca", "model.rank=2"]):
        args = ["dataset=synthetic", "dataset.n=30", "dataset.p=20", "n_iter=3", *model]
        (job,) = plan.plan(args, multirun=False)
        out = job_task.run_job(JobSpec(job.config, model[0]))
        assert out.status == "FINISHED", out.reason
        logged[model[0]] = store_client(outputs).get_run(out.run_id).data.metrics
    n, p, q = 30, 20, 2
    full_m, pca_m = logged["model=full"], logged["model=pca"]
    assert full_m["floor_copy_GBps"] == pca_m["floor_copy_GBps"] == 50.0  # the same cached copy
    assert (full_m["floor_dot_ms"], pca_m["floor_dot_ms"]) == (stub_dot_ms(n, p, p), stub_dot_ms(n, p, q))
    assert full_m["floor_ms_per_iter"] == pytest.approx(
        independent_floor(n, p, 4, 50.0, stub_dot_ms(n, p, p), stub_factor_ms(p))
    )
    assert (full_m["floor_factor_ms"], pca_m["floor_factor_ms"]) == (stub_factor_ms(p), 0.0)
    assert pca_m["floor_ms_per_iter"] == pytest.approx(independent_pca_floor(n, p, q, 4, 50.0, stub_dot_ms(n, p, q)))
    assert pca_m["floor_ms_per_iter"] < full_m["floor_ms_per_iter"]
    assert pca_m["floor_bytes_per_iter"] == (2 * n * p + 12 * n * q) * 4 < full_m["floor_bytes_per_iter"]
    assert sorted(counted["dot"]) == [(n, p, q, "float32"), (n, p, p, "float32")]


@pytest.mark.slow
def test_a_job_whose_floor_fails_finishes_without_it(tiny_config, outputs, monkeypatch):
    """The fit runs and the job finishes; the floor's measured parts are not logged (NaN: not
    measured), its bytes per iteration (counted) are. The fit is a stand-in (this test is about the job around it, and stays fast)."""
    import plnexp.fitting.engine

    def broken(*a, **k):
        raise MemoryError("out of memory")

    monkeypatch.setattr(floor, "measure_dot", broken)
    monkeypatch.setenv(floor.CACHE_ENV, str(outputs / "empty_floor_cache"))
    monkeypatch.setattr(plnexp.fitting.engine, "run_all", stand_in_fit)
    job = job_task.run_job(JobSpec(tiny_config, "unfloored"))
    assert job.status == "FINISHED", job.reason
    metrics = store_client(outputs).get_run(job.run_id).data.metrics
    assert metrics["ms_per_iter"] == 1.0
    assert [k for k in metrics if k.startswith("floor_")] == ["floor_bytes_per_iter"]  # counted, not measured
