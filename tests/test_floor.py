"""plnexp.floor: the machine's floor for one iteration, its per-machine cache, and the floor a job logs.

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

from plnexp import floor, provenance, runner


def independent_floor(n: int, p: int, itemsize: int, copy_GBps: float, dot_ms: float) -> float:
    """14 n x p arrays read or written at the copy bandwidth, plus two n x p x p products, in ms."""
    seconds_streaming = 14 * n * p * itemsize / (copy_GBps * 1e9)
    return 1e3 * seconds_streaming + 2 * dot_ms


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """The measurements replaced by counters returning fixed values; the cache in tmp_path."""
    monkeypatch.setenv(floor.CACHE_ENV, str(tmp_path / "cache"))
    calls = {"copy": [], "dot": []}

    def copy(nbytes, dtype, device=None):
        calls["copy"].append((nbytes, np.dtype(dtype).name))
        return 50.0

    def dot(n, p, dtype, device=None):
        calls["dot"].append((n, p, np.dtype(dtype).name))
        return 0.001 * n * p * p / 1e3

    monkeypatch.setattr(floor, "measure_copy", copy)
    monkeypatch.setattr(floor, "measure_dot", dot)
    return calls


def test_the_floor_is_the_streamed_arrays_plus_two_products():
    for n, p, itemsize, bw, dot in [(11600, 114, 4, 51.0, 1.7), (30, 5, 8, 200.0, 1e-3), (10**6, 2000, 4, 12.5, 900.0)]:
        assert floor.floor_ms(n, p, itemsize, bw, dot) == pytest.approx(
            independent_floor(n, p, itemsize, bw, dot), rel=1e-12
        )
    f = floor.Floor(11600, 114, "float32", 51.0, 2**26, 1.7)
    assert f.ms_per_iter == pytest.approx(independent_floor(11600, 114, 4, 51.0, 1.7), rel=1e-12)
    assert f.metrics() == {"floor_ms_per_iter": f.ms_per_iter, "floor_copy_GBps": 51.0, "floor_dot_ms": 1.7}
    assert f.dot_GFLOPps == pytest.approx(2 * 11600 * 114 * 114 / 1.7e-3 / 1e9)


def test_the_copy_buffer_is_the_working_set_within_bounds():
    assert floor.copy_bytes(30, 5, 4) == 2**20  # tiny: the 1 MiB floor
    assert floor.copy_bytes(11600, 114, 4) == 2**26  # 8 arrays of 5.3 MB = 42 MB -> 64 MiB
    assert floor.copy_bytes(11600, 114, 8) == 2**27
    assert floor.copy_bytes(10**6, 114, 4) == 2**28  # capped at 256 MiB


def test_a_second_call_does_not_measure_again_and_parts_are_keyed_by_what_they_depend_on(counted, tmp_path):
    first = floor.cached(30, 5, np.float32)
    assert counted == {"copy": [(2**20, "float32")], "dot": [(30, 5, "float32")]}
    assert floor.cached(30, 5, np.float32) == first  # from the file: nothing measured
    assert len(counted["copy"]) == 1 and len(counted["dot"]) == 1
    floor.cached(40, 5, "float32")  # another shape: its own product, the same 1 MiB copy buffer
    assert counted["copy"] == [(2**20, "float32")] and counted["dot"][-1] == (40, 5, "float32")
    floor.cached(30, 5, np.float64)  # another dtype: both parts
    assert counted["copy"][-1] == (2**20, "float64") and counted["dot"][-1] == (30, 5, "float64")
    assert len(counted["copy"]) == 2 and len(counted["dot"]) == 3
    # one file for this machine, naming it and holding every part measured
    (path,) = (tmp_path / "cache").glob("floor-*.json")
    data = json.loads(path.read_text())
    assert data["machine"] == floor.identity() and data["machine"]["host"] and data["machine"]["jax"]
    assert set(data["dot"]) == {"float32/30x5", "float32/40x5", "float64/30x5"}
    assert first.ms_per_iter == pytest.approx(independent_floor(30, 5, 4, 50.0, 0.001 * 30 * 25 / 1e3))


@pytest.mark.parametrize(
    "content",
    [
        '{"format": 1, "machine": {"ho',
        "",
        "[]",
        "null",
        '{"format": 1, "machine": {}, "copy": {}, "dot": {}}',
        "BAD_VALUES",
    ],
)
def test_a_corrupt_or_foreign_cache_file_is_measured_again(counted, tmp_path, content):
    floor.cached(30, 5, np.float32)
    path = floor.cache_file(floor.identity())
    if content == "BAD_VALUES":  # this machine's file, with values no measurement gives
        data = json.loads(path.read_text())
        data["copy"] = {k: -1.0 for k in data["copy"]}
        data["dot"] = {k: "fast" for k in data["dot"]}
        content = json.dumps(data)
    path.write_text(content)
    f = floor.cached(30, 5, np.float32)
    assert len(counted["copy"]) == 2 and len(counted["dot"]) == 2
    assert f.copy_GBps == 50.0 and json.loads(path.read_text())["copy"] == {"float32/1048576": 50.0}
    floor.cached(30, 5, np.float32)  # whole again: read back
    assert len(counted["copy"]) == 2 and len(counted["dot"]) == 2


def test_the_cache_is_replaced_atomically_and_a_failed_write_leaves_the_old_file(
    counted, tmp_path, monkeypatch, caplog
):
    floor.cached(30, 5, np.float32)
    path = floor.cache_file(floor.identity())
    before = path.read_text()
    replaced = []
    real_replace = floor.os.replace

    def spy(src, dst):
        replaced.append((src, dst))
        real_replace(src, dst)

    monkeypatch.setattr(floor.os, "replace", spy)
    floor.cached(31, 5, np.float32)
    ((src, dst),) = replaced
    assert dst == path and floor.Path(src).parent == path.parent  # a complete file renamed over the old one
    assert "float32/31x5" in json.loads(path.read_text())["dot"]

    def broken(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(floor.os, "fsync", broken)
    before = path.read_text()
    with caplog.at_level(logging.WARNING, logger="plnexp.floor"):
        f = floor.cached(32, 5, np.float32)  # measured and returned all the same
    assert f.dot_ms == 0.001 * 32 * 25 / 1e3 and "floor cache not written" in caplog.text
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
    assert floor.cached(30, 5, np.float32).copy_GBps == 50.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_real_measurement_at_a_tiny_shape(dtype, monkeypatch, tmp_path):
    monkeypatch.setenv(floor.CACHE_ENV, str(tmp_path))
    f = floor.cached(20, 4, dtype, "cpu")
    assert f.dtype == np.dtype(dtype).name and f.copy_bytes == 2**20
    assert 0.1 < f.copy_GBps < 1e4 and 0 < f.dot_ms < 10
    assert f.ms_per_iter == pytest.approx(independent_floor(20, 4, np.dtype(dtype).itemsize, f.copy_GBps, f.dot_ms))


def test_run_metrics_are_nan_when_measuring_fails(monkeypatch, caplog):
    def broken(*a, **k):
        raise RuntimeError("no such device\nsecond line")

    monkeypatch.setattr(floor, "measure_dot", broken)
    monkeypatch.setattr(floor, "measure_copy", broken)
    with caplog.at_level(logging.WARNING, logger="plnexp.floor"):
        out = floor.run_metrics(30, 7, np.float32, "cpu")
    assert set(out) == set(floor.METRICS) and all(math.isnan(v) for v in out.values())
    assert "floor not measured (RuntimeError: no such device)" in caplog.text
    assert all(math.isnan(v) for v in floor.run_metrics(30, 7, np.float32, "tpu").values())  # a bad device name


def test_a_job_logs_its_machines_floor_measured_before_the_fit(tiny_config, outputs, monkeypatch):
    """The floor a run logs is this process's cached floor for the data's shape, measured before the
    fit runs, and its arithmetic holds on the logged parts."""
    import plnexp.fitting

    order = []
    real_metrics, real_run_all = floor.run_metrics, plnexp.fitting.run_all
    monkeypatch.setattr(floor, "run_metrics", lambda *a: order.append("floor") or real_metrics(*a))
    # (the job's fit owns its process; the fit computing the data's best known ELBO, plnexp.optimum, not)
    fits = lambda *a, **k: order.append("fit" if k.get("owns_process") else "optimum") or real_run_all(*a, **k)
    monkeypatch.setattr(plnexp.fitting, "run_all", fits)
    job = runner.run_job(tiny_config, (), "floored")
    assert job.status == "FINISHED" and [o for o in order if o != "optimum"] == ["floor", "fit"]
    run = store_client(outputs).get_run(job.run_id)
    m, t = run.data.metrics, run.data.tags
    n, p = int(t["data_n"]), int(t["data_p"])
    assert (n, p) == (30, 5)
    assert m["floor_ms_per_iter"] == pytest.approx(
        independent_floor(n, p, 4, m["floor_copy_GBps"], m["floor_dot_ms"]), rel=1e-9
    )
    assert m["floor_ms_per_iter"] == pytest.approx(floor.cached(n, p, np.float32, "cpu").ms_per_iter, rel=1e-12)
    # a metric of the run, never a param: the config hash (resume, rerun) is the config's alone
    assert not any(k.startswith("floor") for k in run.data.params)
    assert t[provenance.HASH_TAG] == provenance.config_hash(tiny_config)


def test_a_job_whose_floor_fails_finishes_without_it(tiny_config, outputs, monkeypatch):
    """The fit runs and the job finishes; the floor is not logged (NaN: not measured). The fit is a
    stand-in (this test is about the job around it, and stays fast)."""
    import plnexp.fitting
    from plnexp.fitting import FitResult
    from plnexp.timing import Timing

    def broken(*a, **k):
        raise MemoryError("out of memory")

    def fit(datas, spec, **k):
        curve = -np.arange(10.0, 13.0)[::-1]
        timing = Timing(compile_s=0.5, first_call_s=float("nan"), run_s=0.003, ms_per_iter=1.0, runs_s=(0.003,))
        return [
            FitResult(
                curve,
                float(curve[-1]),
                {},
                3,
                timing,
                "full",
                "scan",
                "radam_clip",
                "float32",
                "cpu",
                {"final_elbo_jit": float(curve[-1])},
            )
        ]

    monkeypatch.setattr(floor, "measure_dot", broken)
    monkeypatch.setenv(floor.CACHE_ENV, str(outputs / "empty_floor_cache"))
    monkeypatch.setattr(plnexp.fitting, "run_all", fit)
    job = runner.run_job(tiny_config, (), "unfloored")
    assert job.status == "FINISHED", job.reason
    metrics = store_client(outputs).get_run(job.run_id).data.metrics
    assert metrics["ms_per_iter"] == 1.0 and not any(k.startswith("floor_") for k in metrics)
