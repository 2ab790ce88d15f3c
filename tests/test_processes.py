"""``processes=N``: one fit across N JAX processes (plnexp.experiment.processes). The row split, the
config's checks and the detection of srun in this process; the fit itself, its one run and a
process killed mid-fit as real processes (``slow``)."""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import spawn, store_client

from plnexp.core.data import row_range
from plnexp.experiment import plan as cli
from plnexp.experiment import processes
from plnexp.experiment.runner import check_processes
from plnexp.jobs import provenance
from plnexp.jobs.config import ConfigError, Device

# 41 rows: padded on 2 devices and on 4 (two processes of JAX_NUM_CPU_DEVICES=2 devices each)
SMALL = ["dataset=synthetic", "dataset.n=41", "dataset.p=6", "repeats=1", "warmup=0", "time_budget_s=0"]
FIT = ["strategy=scan_sharded", "precision=float64", "n_iter=20", *SMALL]


@pytest.mark.parametrize("n", [1, 2, 7, 41, 44])
@pytest.mark.parametrize("devices,per", [(1, 1), (2, 1), (4, 2), (4, 1), (6, 3)])
def test_row_range_gives_every_row_to_one_process_and_pads_the_last(n, devices, per):
    parts = [row_range(n, devices, first, per) for first in range(0, devices, per)]
    rows = [r for start, stop, _ in parts for r in range(start, stop)]
    assert rows == list(range(n))  # every data row once, in order
    per_device = -(-n // devices)
    for start, stop, pad in parts:
        assert (stop - start) + pad == per * per_device  # every process the same number of rows
    assert sum(pad for *_, pad in parts) == -n % devices == per_device * devices - n
    padded = [i for i, (start, stop, pad) in enumerate(parts) if pad]
    assert padded == list(range(len(parts) - len(padded), len(parts)))  # the padding rows are the last


@pytest.mark.parametrize(
    "args,message",
    [
        ((0, 2, 0, 1), "n=0: allowed values are integers >= 1"),
        ((5, 0, 0, 1), "devices=0: allowed values are integers >= 1"),
        ((5, 2, 1, 2), "first=1, count=2: allowed are devices within the mesh's 2"),
    ],
)
def test_row_range_refuses_bad_values_in_one_line(args, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        row_range(*args)


BAD = [
    (["processes=0"], "processes=0: allowed values are integers >= 1"),
    (["processes=two"], "processes='two': allowed values are integers >= 1"),
    (
        ["processes=2"],
        "processes=2: strategy=scan with model=full runs in one process; allowed with processes > 1: "
        "strategy=scan_sharded with model=full|pca",
    ),
    (
        ["strategy=scan_sharded", "model=profiled", "processes=2"],
        "processes=2: strategy=scan_sharded with model=profiled runs in one process; allowed with processes > 1: "
        "strategy=scan_sharded with model=full|pca",
    ),
    (
        ["strategy=scan_sharded", "strategy.devices=1", "processes=2"],
        "strategy.devices=1: with processes=2 the rows are split across every device of every process; "
        "allowed value is 0",
    ),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_processes_fail_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        cli.plan(overrides, multirun=False)
    assert str(err.value) == message


def test_a_sweep_refuses_processes_in_one_line():
    with pytest.raises(ConfigError) as err:
        cli.plan(["strategy=scan_sharded", "processes=2", "n_iter=3,4"], multirun=True)
    assert str(err.value) == (
        "processes=2: a fit across processes runs from python -m plnexp run; allowed values in a sweep are 1"
    )


def test_processes_is_hashed_only_away_from_1():
    """A spec without processes hashes as before it existed (resume and rerun match older runs)."""
    (one,) = cli.plan(["strategy=scan_sharded"], multirun=False)
    (two,) = cli.plan(["strategy=scan_sharded", "processes=2"], multirun=False)
    assert one.config.processes == 1 and "processes" not in provenance.hashed(one.config)
    assert provenance.hashed(two.config)["processes"] == 2
    assert provenance.config_hash(one.config) != provenance.config_hash(two.config)
    (syn,) = cli.plan(["dataset=synthetic"], multirun=False)  # pinned before processes existed (test_config)
    assert provenance.config_hash(syn.config) == "099fdd9f304f63b066fc1b8bae6f35df39dcb8065ced9e58b83a9f51c50bd996"
    assert two.name == "scan_sharded-oaks-f32-cpu-processes2"


def test_a_fit_across_processes_refuses_to_run_in_one():
    """A rerun (in process) of a processes=2 run: one line, the job FAILED, not a fit in one process."""
    (two,) = cli.plan(["strategy=scan_sharded", "processes=2"], multirun=False)
    with pytest.raises(ValueError, match=r"^processes=2: this process is one of 1 JAX process\(es\); .*srun -n 2$"):
        check_processes(two.config)
    check_processes(cli.plan(["strategy=scan_sharded"], multirun=False)[0].config)  # 1: nothing to check


@pytest.mark.parametrize(
    "environ,expected",
    [
        ({}, None),  # no SLURM: the processes start here
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"}, None),  # sbatch's script, not srun's tasks
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_NUM_TASKS": "1"}, None),  # srun -n 1: start them here
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_NUM_TASKS": "2"}, processes.Placement(None, None, None)),
    ],
)
def test_under_srun_each_task_joins_from_slurms_environment(environ, expected):
    assert processes.placement(2, environ) == expected


def test_srun_with_another_number_of_tasks_is_one_line():
    with pytest.raises(ValueError) as err:
        processes.placement(2, {"SLURM_JOB_ID": "7", "SLURM_STEP_NUM_TASKS": "3"})
    assert str(err.value) == (
        "processes=2: srun started 3 tasks; allowed are srun -n 2 (each task one process) or no srun "
        "(the 2 processes start on this machine)"
    )


def test_processes_started_here_refuse_an_accelerator_in_one_line(tmp_path, capsys):
    (spec,) = cli.plan(["strategy=scan_sharded", "processes=2"], multirun=False).specs()
    on_gpu = replace(spec, config=replace(spec.config, device=Device("gpu")))
    assert processes.run(on_gpu, "sqlite:///unused.db", str(tmp_path)) == 2
    assert capsys.readouterr().err == (
        "plnexp: error: processes=2 with device=gpu: the 2 processes started on this machine would share its "
        "accelerators; allowed are device=cpu here, or srun -n 2 with one accelerator per task\n"
    )


def _curve(cl, run) -> np.ndarray:
    history = sorted(cl.get_metric_history(run.info.run_id, "elbo"), key=lambda m: m.step)
    return np.array([m.value for m in history])


MODELS = {
    "full": [],
    # PLN-PCA's fit (block Newton rounds), its data drawn from the low-rank model
    "pca": ["model=pca", "model.rank=2", "dataset=synthetic_pca", "dataset.q=2"],
}


@pytest.mark.slow  # two processes paying every import and fitting together (~15 s)
@pytest.mark.parametrize("model", MODELS)
def test_two_processes_fit_the_curve_of_one_and_log_one_run(model, outputs, tmp_path, plnexp_main):
    fit = [*FIT, *MODELS[model], "dataset.optimum=false"]  # no best known ELBO computed: not the point
    one = plnexp_main("run", *fit, "experiment=one", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    two = plnexp_main("run", *fit, "processes=2", "experiment=two", cwd=tmp_path)  # it starts the two
    assert two.returncode == 0, two.stderr
    assert "[Gloo]" not in two.stdout
    assert "-processes2" in two.stdout and " FINISHED: 20 iter" in two.stdout.strip().splitlines()[-1]
    cl = store_client(outputs)
    (run1,) = cl.search_runs([cl.get_experiment_by_name("one").experiment_id])
    (run2,) = cl.search_runs([cl.get_experiment_by_name("two").experiment_id])  # one run, process 0's
    assert run2.info.status == "FINISHED" and run2.data.params["processes"] == "2"
    assert run2.data.tags[provenance.DATA_TAG] == run1.data.tags[provenance.DATA_TAG]  # the same data
    c1, c2 = _curve(cl, run1), _curve(cl, run2)
    assert len(c1) == len(c2) == 20
    np.testing.assert_allclose(c2, c1, rtol=1e-10, atol=0)
    assert run2.data.metrics["final_elbo"] == pytest.approx(run1.data.metrics["final_elbo"], rel=1e-10)


def _worker(launcher: int, process_id: int) -> int | None:
    """The pid of the launcher's worker ``process_id`` (from its environment), or None yet."""
    for child in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split():
        try:
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"{processes.PROCESS_ID}={process_id}".encode() in env:
            return int(child)
    return None


@pytest.mark.slow  # three processes, one killed once process 0's run exists (~20 s)
def test_a_process_killed_mid_fit_fails_the_run_in_one_line(outputs, tmp_path):
    # long enough that the kill lands inside the job (a few seconds of fit at gloo's pace)
    args = ["run", *FIT[:-4], "n_iter=5000", *SMALL, "processes=2", "experiment=killed"]
    proc = spawn([sys.executable, "-m", "plnexp", *args], cwd=tmp_path, stdout=-1, stderr=-1, text=True)
    cl = store_client(outputs)
    deadline = time.monotonic() + 120
    victim = None
    while time.monotonic() < deadline and proc.poll() is None:
        exp = cl.get_experiment_by_name("killed")
        running = [r for r in cl.search_runs([exp.experiment_id])] if exp else []
        victim = _worker(proc.pid, 1) if running else None
        if victim is not None:
            break
        time.sleep(0.2)
    assert victim is not None, "the run never started"
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("plnexp: error: the fit across 2 processes failed: process 1 of 2 was killed by SIGKILL")
    (run,) = cl.search_runs([cl.get_experiment_by_name("killed").experiment_id])
    assert run.info.status == "FAILED"
    assert not [
        r for r in cl.search_runs([e.experiment_id for e in cl.search_experiments()]) if r.info.status == "RUNNING"
    ]
