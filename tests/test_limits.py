"""Every value that sizes memory checked before any work (plnexp.jobs.limits, #62): processes against
the data's rows and the machine's memory, n_iter's ELBO history and dataset.replication's data against
memory, each refused in one line with the estimate and the limit, exit 2, no run created."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import store_client
from plnexp.experiment import plan as cli
from plnexp.jobs import limits
from plnexp.jobs.config import ConfigError

GB = 10**9


def _config(*overrides: str):
    (job,) = cli.plan(["dataset=synthetic", "dataset.n=30", "dataset.p=5", *overrides], multirun=False)
    return job.config


def _runs(outputs) -> list:
    client = store_client(outputs)
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def test_estimates_are_the_arrays_they_count():
    """Each estimate against the sizes written out independently: the data (float64 on the host,
    the fit's dtype on the device), the ELBO history (one number of the dtype on the device and 3
    float64 on the host per iteration and replicate), and the processes (twice one's resident)."""
    config = _config("precision=float32", "n_iter=1000", "replicates=2", "dataset.replication=3")
    shape = limits.Shape.of(config.dataset)
    data = config.dataset.load()
    d = np.asarray(data.X).shape[1]
    assert (shape.rows, shape.p, shape.d) == (data.n, data.p, d) == (90, 5, d)
    found = {n.key: n.nbytes for n in limits.needs(config, shape, resident=100)}
    assert found == {"dataset.replication": 90 * (5 + d + 1) * (8 + 4), "n_iter": 1000 * 2 * (4 + 3 * 8)}
    across = _config("strategy=scan_sharded", "model=full", "processes=3")
    assert {n.key: n.nbytes for n in limits.needs(across, shape, resident=100)}["processes"] == 3 * 2 * 100
    assert "processes" not in {n.key for n in limits.needs(across, shape, local=False, resident=100)}


@pytest.mark.parametrize(
    ("overrides", "key", "allowed"),
    [
        # 1 GB: the history of 28 bytes an iteration leaves (1e9 - the data's 30 x 8 x 12 bytes) // 28
        (("n_iter=100000000",), "n_iter", (GB - 30 * 8 * 12) // 28),
        (("dataset.replication=100000000",), "dataset.replication", (GB - 1000 * 28) // (30 * 8 * 12)),
    ],
)
def test_a_value_over_the_memory_is_one_line_with_its_estimate_and_the_largest_that_fits(overrides, key, allowed):
    config = _config("precision=float32", "n_iter=1000", *overrides)
    shape = limits.Shape.of(config.dataset)
    assert shape.d == 2  # the sizes above: p + d + 1 = 8 numbers a row
    with pytest.raises(ConfigError) as e:
        limits.check(config, shape, available=(GB, "of memory available on this machine"))
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{key}=")
    assert "over the 1 GB of memory available" in line
    assert line.endswith(f"allowed values are integers from 1 to {allowed:,}")
    largest = _config("precision=float32", "n_iter=1000", f"{key}={allowed}")  # fits exactly
    limits.check(largest, limits.Shape.of(largest.dataset), available=(GB, "x"))


def test_processes_over_the_rows_or_the_memory_refused():
    config = _config("strategy=scan_sharded", "model=full", "processes=40")
    shape = limits.Shape.of(config.dataset)
    with pytest.raises(ConfigError, match=r"^processes=40: more processes than the data's 30 rows .* from 1 to 30$"):
        limits.check(config, shape, available=(100 * GB, "x"), resident=GB // 2)
    with pytest.raises(ConfigError, match=r"^processes=40: more processes than the data's 30 rows .* from 1 to 8$"):
        limits.check(config, shape, available=(9 * GB, "x"), resident=GB // 2)  # fewer still fit in memory
    ten = _config(
        "strategy=scan_sharded", "model=full", "processes=10"
    )  # 2 x 0.5 GB each; 9 GB less the data and history: 8
    with pytest.raises(ConfigError, match=r"^processes=10: needs ~10 GB .* allowed values are integers from 1 to 8$"):
        limits.check(ten, shape, available=(9 * GB, "x"), resident=GB // 2)
    limits.check(ten, shape, available=(9 * GB, "x"), resident=GB // 2, local=False)  # srun: one per task


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (
            ("strategy=scan_sharded", "model=full", "processes=1000", "dataset.replication=1"),
            "processes=1000: more processes",
        ),
        (
            ("strategy=scan_sharded", "model=full", "processes=1000", "dataset.replication=100"),
            "processes=1000: needs ~",
        ),
        (("n_iter=2147483647",), "n_iter=2147483647: needs ~60.1 GB"),
        (("dataset.replication=1000000000",), "dataset.replication=1000000000: needs ~"),
        (
            ("strategy=scan_sharded", "model=full", "processes=3", "dataset=synthetic", "dataset.n=2"),
            "processes=3: more processes",
        ),
    ],
)
def test_the_command_refuses_before_any_run(outputs, plnexp_main, monkeypatch, args, start):
    from plnexp.system import machine

    monkeypatch.setattr(machine, "available_memory", lambda: (16 * GB, "of memory available on this machine"))
    ran = plnexp_main("run", *args)
    assert ran.returncode == 2
    assert ran.stderr.count("\n") == 1 and ran.stderr.startswith(f"plnexp: error: {start}"), ran.stderr
    assert _runs(outputs) == []
    assert not (outputs / "runs").exists()


def test_a_full_disk_is_one_line_naming_the_outputs_folder_before_any_run(outputs, plnexp_main, monkeypatch):
    """#62: the outputs folder is probed with a byte written through (an empty file is made even on a
    full disk): ENOSPC is one line naming the folder, exit 2, no run."""
    import errno
    import os

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    ran = plnexp_main("run", "dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3")
    assert ran.returncode == 2
    assert ran.stderr == (
        f"plnexp: error: PLNEXP_OUTPUTS={outputs}: cannot write there (No space left on device); "
        "allowed values are writable folders\n"
    )
    assert _runs(outputs) == []
