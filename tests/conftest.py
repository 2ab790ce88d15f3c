"""Shared fixtures: a migrated MLflow sqlite store made once per session, copied per test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/reference_np.py: independent float64 numpy maths

import plnexp  # sets XLA_FLAGS before any test touches jax


def pytest_collection_modifyitems(config, items):
    """``multidevice`` tests need two JAX CPU devices, which must be asked for before JAX starts: the
    main run (one device) skips them saying so; ``JAX_NUM_CPU_DEVICES=2 python -m pytest -m
    multidevice`` (README's test command, .ci/run) runs them."""
    marked = [item for item in items if item.get_closest_marker("multidevice")]
    if not marked:
        return
    import jax

    if len(jax.devices("cpu")) < 2:
        skip = pytest.mark.skip(
            reason=f"{len(jax.devices('cpu'))} JAX CPU device here; run them with "
            "JAX_NUM_CPU_DEVICES=2 python -m pytest -m multidevice"
        )
        for item in marked:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def floor_cache(tmp_path_factory):
    """The floor's per-machine cache (plnexp.floor) in a folder of this session, for every test and the
    processes they start: the suite never writes to ~/.cache, and measures each shape once."""
    folder = tmp_path_factory.mktemp("floor_cache")
    before = os.environ.get("PLNEXP_FLOOR_CACHE")
    os.environ["PLNEXP_FLOOR_CACHE"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("PLNEXP_FLOOR_CACHE", None)
    else:
        os.environ["PLNEXP_FLOOR_CACHE"] = before


@pytest.fixture(scope="session", autouse=True)
def outputs_outside_the_repo(tmp_path_factory):
    """No test writes into the repository's outputs/: PLNEXP_OUTPUTS is a temporary folder for the
    whole session (plnexp.fit's compile cache goes to <outputs>/jax_cache by default); tests that
    need a store of their own use ``outputs``."""
    saved = os.environ.get("PLNEXP_OUTPUTS")
    os.environ["PLNEXP_OUTPUTS"] = str(tmp_path_factory.mktemp("session_outputs"))
    yield
    if saved is None:
        os.environ.pop("PLNEXP_OUTPUTS", None)
    else:
        os.environ["PLNEXP_OUTPUTS"] = saved


@pytest.fixture(scope="session")
def oaks():
    """The shipped oaks data, n=116, p=114, intercept only."""
    return plnexp.load_oaks()


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory) -> Path:
    """An empty MLflow sqlite store with its migrations run (the ~5 s paid once)."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def outputs(tmp_path, migrated_store, monkeypatch) -> Path:
    """A fresh outputs dir (PLNEXP_OUTPUTS) holding a copy of the migrated store."""
    out = tmp_path / "outputs"
    out.mkdir()
    shutil.copy(migrated_store, out / "mlflow.db")
    monkeypatch.setenv("PLNEXP_OUTPUTS", str(out))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return out


def store_client(outputs: Path):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{outputs / 'mlflow.db'}")


def plnexp_cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m plnexp ARGS`` in a subprocess (environment inherited, e.g. PLNEXP_OUTPUTS)."""
    return subprocess.run(
        [sys.executable, "-m", "plnexp", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
    )


@pytest.fixture
def tiny_config(outputs):
    """A valid config of a tiny synthetic fit (3 iterations), with a fresh store."""
    from plnexp import cli

    (job,) = cli.plan(["dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3"], multirun=False)
    return job.config


@pytest.fixture
def exited_pid() -> int:
    """The PID of a process of this host that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid
