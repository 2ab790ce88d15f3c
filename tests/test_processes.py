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

from plnexp.core import data as D
from plnexp.core import csv_files, data_rows, simulation
from plnexp.core.data_rows import row_range
from plnexp.experiment import plan as cli
from plnexp.experiment import job_task, processes, srun
from plnexp.experiment.runner import check_processes
from plnexp.jobs import provenance
from plnexp.jobs import config as C
from plnexp.jobs.config import ConfigError, Device

# 41 rows: padded on 2 devices and on 4 (two processes of JAX_NUM_CPU_DEVICES=2 devices each)
SMALL = ["dataset=synthetic", "dataset.n=41", "dataset.p=6", "repeats=1", "warmup=0", "time_budget_s=0"]
FIT = ["strategy=scan_sharded", "model=full", "precision=float64", "n_iter=20", *SMALL]


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


def _parts(spec, processes: int) -> list:
    """The rows each of ``processes`` processes reads of ``spec``'s data (one device each)."""
    n = spec.rows()
    return [spec.load_rows(*row_range(n, processes, k, 1)[:2]) for k in range(processes)]


def _assert_rows_equal(parts, whole, read=None) -> None:
    dense = lambda Y: Y.toarray() if hasattr(Y, "toarray") else np.asarray(Y)
    assert [(d.part.start, d.part.stop, d.part.n) for d in parts] == [
        (a, b, whole.n) for a, b in zip([0, *[d.part.stop for d in parts[:-1]]], [d.part.stop for d in parts])
    ]
    for field, get in (("Y", lambda d: dense(d.Y)), ("O", lambda d: np.asarray(d.O)), ("X", lambda d: d.X)):
        joined = np.concatenate([get(d) for d in parts])
        assert joined.dtype == get(whole).dtype, field
        np.testing.assert_array_equal(joined, get(whole), err_msg=field)  # exactly: the same numbers
    assert {(d.name, d.covariate_names, d.columns) for d in parts} == {
        (whole.name, whole.covariate_names, whole.columns)
    }
    # process 0 hashes the whole data a block of rows at a time: the digest of one process's run
    read = read or (lambda a, b: data_rows.take_rows(whole, a, b))
    assert data_rows.digest_by_rows(read, whole.n, whole.p) == whole.digest()


def _specs(tmp_path) -> dict:
    from test_anndata import adata, counts, needs_anndata, write_csvs  # noqa: F401  (the same small data)

    files = write_csvs(tmp_path, counts())
    return {
        "synthetic_pca": C.SyntheticPcaData(n=41, p=7, q=2),
        # 9000 x 500 > BLOCK_ENTRIES: several blocks of rows, each its own seed; 95% zeros, kept sparse
        "synthetic_pca_blocks": C.SyntheticPcaData(n=9000, p=500, q=2, zero_fraction=0.95),
        "synthetic": C.SyntheticData(n=41, p=6),  # drawn whole, then its rows kept
        "oaks_x3": C.OaksData(replication=3, covariates=("tree",)),  # 116 rows read once, 348 made by rows
        "csv": C.CsvData(
            counts=str(files["counts"]), offsets=str(files["offsets"]), covariates=str(files["covariates"])
        ),
    }


@pytest.mark.parametrize("name", ["synthetic_pca", "synthetic_pca_blocks", "synthetic", "oaks_x3", "csv"])
@pytest.mark.parametrize("processes", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_each_process_reads_its_rows_and_together_they_are_the_data_of_one(name, processes, tmp_path):
    spec = _specs(tmp_path)[name]
    whole = spec.load()
    assert spec.rows() == whole.n
    _assert_rows_equal(_parts(spec, processes), whole, spec.load_rows)


def test_the_rows_of_sparse_synthetic_counts_are_those_of_the_whole_draw():
    whole = simulation.simulate_pca(9000, 500, 2, 0.95, sparse=True)
    parts = [simulation.simulate_pca(9000, 500, 2, 0.95, sparse=True, rows=r) for r in ((0, 4500), (4500, 9000))]
    assert all(p.sparse for p in parts)
    _assert_rows_equal(parts, whole)


def test_anndata_rows_are_read_in_backed_mode(tmp_path, monkeypatch):
    from scipy import sparse
    from test_anndata import adata, counts, needs_anndata

    if needs_anndata.args[0]:
        pytest.skip("anndata is not installed")
    import anndata

    path = tmp_path / "cells.h5ad"
    adata(sparse.csr_matrix(counts())).write_h5ad(path)
    spec = C.AnndataData(path=str(path), covariates=("batch", "depth"))
    whole = spec.load()
    modes = []
    read = anndata.read_h5ad
    monkeypatch.setattr(anndata, "read_h5ad", lambda *a, **k: modes.append(k.get("backed")) or read(*a, **k))
    parts = _parts(spec, 2)
    assert "r" in modes and None not in modes  # never read whole
    _assert_rows_equal(parts, whole)
    total = C.AnndataData(path=str(path), offsets="total")
    _assert_rows_equal(_parts(total, 2), total.load())


def test_csv_rows_skip_the_other_lines_and_name_the_files_line(tmp_path):
    (tmp_path / "c.csv").write_text("a,b\n1,2\n\n3,4\n5,x\n")
    header, Y, names = csv_files._read_csv(tmp_path / "c.csv", "counts", (0, 2))
    assert header == ["a", "b"] and Y.tolist() == [[1, 2], [3, 4]] and names is None
    with pytest.raises(D.DataError, match=r"non-numeric value 'x' at row 3, column 2"):
        csv_files._read_csv(tmp_path / "c.csv", "counts", (2, 3))
    with pytest.raises(D.DataError, match=r"rows=\(2, 5\): allowed are \(start, stop\) within its 3 rows"):
        csv_files.load_csv(tmp_path / "c.csv", rows=(2, 5))


def test_the_full_models_host_elbo_is_the_sum_of_its_rows_parts():
    from plnexp.core import reference

    data = simulation.simulate(n=41, p=5, seed=3)
    rng = np.random.default_rng(0)
    B, M, S = rng.normal(size=(2, 5)), rng.normal(size=(41, 5)) * 0.1, np.full((41, 5), 0.4)
    Sigma = np.cov(M.T) + np.eye(5)
    whole = reference.elbo(data.Y, data.O, data.X, B, M, S, Sigma)
    sums = [reference.elbo_sums(data.Y[r], data.O[r], data.X[r], B, M[r], S[r]) for r in (slice(0, 20), slice(20, 41))]
    joined, _ = reference.elbo_of_sums(*(a + b for a, b in zip(*sums)), Sigma, 41)
    assert joined == pytest.approx(whole, rel=1e-13)


BAD = [
    (["processes=0"], "processes=0: allowed values are integers >= 1"),
    (["processes=two"], "processes='two': allowed values are integers >= 1"),
    (
        ["processes=2"],
        "processes=2: strategy=scan with model=profiled runs in one process; allowed with processes > 1: "
        "strategy=scan_sharded with model=full|pca",
    ),
    (
        ["strategy=scan_sharded", "model=profiled", "processes=2"],
        "processes=2: strategy=scan_sharded with model=profiled runs in one process; allowed with processes > 1: "
        "strategy=scan_sharded with model=full|pca",
    ),
    (  # #62: the rule, before the devices are counted (64: more than this machine shows JAX)
        ["strategy=scan_sharded", "model=full", "strategy.devices=64", "processes=2"],
        "strategy.devices=64: with processes=2 the rows are split across every device of every process; "
        "allowed value is 0",
    ),
    (
        ["strategy=scan_sharded", "model=full", "strategy.devices=1", "processes=2"],
        "strategy.devices=1: with processes=2 the rows are split across every device of every process; "
        "allowed value is 0",
    ),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_processes_fail_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        cli.plan(overrides, multirun=False)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["hydra/launcher=joblib"],
            "hydra/launcher=joblib: a sweep's jobs of processes=2 start their processes from the sweep's driver "
            "or as one SLURM job of 2 tasks; allowed values with processes > 1 are basic, slurm, submitit_slurm",
        ),
        (
            ["hydra/launcher=slurm", "hydra.launcher.nodes=3"],
            "hydra.launcher.nodes=3: a job of processes=2 runs 2 SLURM tasks, the same number on each node; "
            "allowed values are the divisors of 2",
        ),
        (
            ["device=gpu"],
            "processes=2 with device=gpu: a sweep's 2 processes would share the accelerators of their machine; "
            "allowed value with processes > 1 in a sweep is device=cpu",
        ),
    ],
)
def test_a_sweep_of_processes_refuses_joblib_uneven_nodes_and_accelerators_in_one_line(overrides, message):
    """Planned under the basic launcher (workers from the driver) and under SLURM (a job of N tasks,
    on one node or on two: tests/test_cluster.py runs it); refused in one line otherwise."""
    for launcher in (["hydra/launcher=basic"], ["hydra/launcher=slurm", "hydra.launcher.nodes=2"]):
        cli.plan(["strategy=scan_sharded", "model=full", "processes=2", "n_iter=3,4", *launcher], multirun=True)
    with pytest.raises(ConfigError) as err:
        cli.plan(
            ["strategy=scan_sharded", "model=full", "processes=2", "n_iter=3,4", *overrides],
            multirun=True,
            check_device=False,
        )
    assert str(err.value) == message


def test_under_slurm_a_job_of_processes_is_a_job_of_its_own_with_that_many_tasks():
    """With rounds on, a group's jobs share one SLURM task; jobs of processes > 1 never do (their
    program spans processes the task is not): each is a unit of its own of N tasks, the rest as before."""
    from plnexp.experiment import sweep_dispatch

    grid = ["strategy=scan_sharded", "model=full", "strategy.via=jit,shard_map", "hydra/launcher=slurm"]
    specs = cli.plan([*grid, "processes=2"], multirun=True).specs()
    assert [(u.num, u.tasks) for u in sweep_dispatch.units_of(specs, rounds=True)] == [(0, 2), (1, 2)]
    specs = cli.plan(grid, multirun=True).specs()
    (group,) = sweep_dispatch.units_of(specs, rounds=True)  # one process each: the group, one task
    assert group.tasks == 1 and len(group.specs) == 2 and group.rounds


def test_processes_is_hashed_only_away_from_1():
    """A spec without processes hashes as before it existed (resume and rerun match older runs)."""
    (one,) = cli.plan(["strategy=scan_sharded", "model=full"], multirun=False)
    (two,) = cli.plan(["strategy=scan_sharded", "model=full", "processes=2"], multirun=False)
    assert one.config.processes == 1 and "processes" not in provenance.hashed(one.config)
    assert provenance.hashed(two.config)["processes"] == 2
    assert provenance.config_hash(one.config) != provenance.config_hash(two.config)
    # pinned before processes existed (test_config), with the run defaults of then (#63 changed them)
    then = ["model=full", "optimizer=radam_clip", "init=seed", "n_iter=1000"]
    (syn,) = cli.plan(["dataset=synthetic", *then], multirun=False)
    assert provenance.config_hash(syn.config) == "099fdd9f304f63b066fc1b8bae6f35df39dcb8065ced9e58b83a9f51c50bd996"
    assert two.name == "scan_sharded-oaks-f32-cpu-full-processes2"  # full: not the default model


def test_a_fit_across_processes_refuses_to_run_in_one():
    """A rerun (in process) of a processes=2 run: one line, the job FAILED, not a fit in one process."""
    (two,) = cli.plan(["strategy=scan_sharded", "model=full", "processes=2"], multirun=False)
    with pytest.raises(ValueError, match=r"^processes=2: this process is one of 1 JAX process\(es\); .*srun -n 2$"):
        check_processes(two.config)
    check_processes(cli.plan(["strategy=scan_sharded", "model=full"], multirun=False)[0].config)  # 1: nothing to check


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
    (spec,) = cli.plan(["strategy=scan_sharded", "model=full", "processes=2"], multirun=False).specs()
    on_gpu = replace(spec, config=replace(spec.config, device=Device("gpu")))
    assert processes.run(on_gpu, "sqlite:///unused.db", str(tmp_path), job_task.run_job) == 2
    assert capsys.readouterr().err == (
        "plnexp: error: processes=2 with device=gpu: the 2 processes started on this machine would share its "
        "accelerators; allowed are device=cpu here, or srun -n 2 with one accelerator per task\n"
    )


def _curve(cl, run) -> np.ndarray:
    history = sorted(cl.get_metric_history(run.info.run_id, "elbo"), key=lambda m: m.step)
    return np.array([m.value for m in history])


MODELS = {
    "full": [],
    # PLN-PCA's default fit (block Newton rounds), its data drawn from the low-rank model
    "pca": ["model=pca", "model.rank=2", "dataset=synthetic_pca", "dataset.q=2"],
    # PLN-PCA's blocked fit (blocks of 8 rows: what sparse counts need), the seed init, which reads no
    # counts (the data init's sums in blocks differ from the dense init's in rounding), and radam_clip
    # (rprop follows the sign of gradients that are rounding noise: 5e-5 apart in 20 iterations)
    "pca_sparse": [
        "model=pca",
        "model.rank=2",
        "model.block_rows=8",
        "init=seed",
        "optimizer=radam_clip",
        "strategy.via=shard_map",
        "dataset=synthetic_pca",
        "dataset.q=2",
    ],
}
# what the fit across processes adds: the blocked PLN-PCA's counts kept sparse there (each device its
# rows' CSR), the one process's dense: the same curve
ACROSS = {"pca_sparse": ["dataset.sparse=true"]}


def _runs(cl, experiment: str) -> dict:
    """The job runs of an experiment (a sweep's children, or a run's one) by their seed."""
    runs = cl.search_runs([cl.get_experiment_by_name(experiment).experiment_id])
    return {r.data.params["seed"]: r for r in runs if "seed" in r.data.params}  # not a sweep's parent


@pytest.mark.slow  # two processes paying every import and fitting together (~15 s; a sweep: twice)
@pytest.mark.parametrize("model,command", [("full", "sweep"), ("pca_sparse", "run")])
def test_two_processes_fit_the_curve_of_one_and_log_one_run(model, command, outputs, tmp_path, plnexp_main):
    """``run`` (then ``rerun`` of its run), and a sweep under the basic launcher (its driver starts
    each job's processes in turn): each job one run, process 0's, the curve of one process's fit; a
    sweep's runs children of its one parent. PLN-PCA's processes read sparse counts (``ACROSS``; its
    default dense Newton fit across processes: tests/test_cluster.py)."""
    fit = [*FIT, *MODELS[model], "dataset.optimum=false"]  # no best known ELBO computed: not the point
    seeds = ["seed=0,1"] if command == "sweep" else []
    one = plnexp_main(command, *fit, *seeds, "experiment=one", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    two = plnexp_main(command, *fit, *ACROSS.get(model, []), *seeds, "processes=2", "experiment=two", cwd=tmp_path)
    assert two.returncode == 0, two.stderr
    assert "[Gloo]" not in two.stdout
    cl = store_client(outputs)
    ones, twos = _runs(cl, "one"), _runs(cl, "two")  # one run per job, process 0's
    assert sorted(twos) == sorted(ones) == (["0", "1"] if seeds else ["0"])
    if command == "run":
        assert "-processes2" in two.stdout and " FINISHED: 20 iter" in two.stdout.strip().splitlines()[-1]
    else:
        assert len([line for line in two.stdout.splitlines() if "-processes2 ... done " in line]) == 2  # one per job
        runs = cl.search_runs([cl.get_experiment_by_name("two").experiment_id])
        (parent,) = [r for r in runs if "seed" not in r.data.params]
        assert parent.info.status == "FINISHED"
        assert {r.data.tags["mlflow.parentRunId"] for r in twos.values()} == {parent.info.run_id}
    for seed, run2 in twos.items():
        run1 = ones[seed]
        assert run2.info.status == "FINISHED" and run2.data.params["processes"] == "2"
        assert run2.data.tags[provenance.DATA_TAG] == run1.data.tags[provenance.DATA_TAG]  # the same data (CSR too)
        c1, c2 = _curve(cl, run1), _curve(cl, run2)
        assert len(c1) == len(c2) == 20
        np.testing.assert_allclose(c2, c1, rtol=1e-10, atol=0)
        assert run2.data.metrics["final_elbo"] == pytest.approx(run1.data.metrics["final_elbo"], rel=1e-10)
        # each process's peak resident memory, gathered to process 0's run (one process's run has none)
        assert all(run2.data.metrics[f"peak_rss_mb_process_{i}"] > 0 for i in (0, 1))
        assert not [k for k in run2.data.metrics if k.startswith("peak_rss_mb_process_") and k[-1] not in "01"]
        assert not [k for k in run1.data.metrics if k.startswith("peak_rss_mb")]
    if command == "run":  # rerun starts the processes again: the same curve, a run of its own
        again = plnexp_main("rerun", twos["0"].info.run_id, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip().splitlines()[-1].startswith("rerun ok: run ")
        runs = cl.search_runs([cl.get_experiment_by_name("two").experiment_id])
        (new,) = [r for r in runs if r.data.tags.get(provenance.RERUN_TAG) == twos["0"].info.run_id]
        assert new.info.status == "FINISHED" and new.data.params["processes"] == "2"
        np.testing.assert_allclose(_curve(cl, new), _curve(cl, ones["0"]), rtol=1e-10, atol=0)


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


def _kill_worker_once_running(proc, cl, experiment: str, child: bool) -> int:
    """SIGKILL worker 1 of the launcher ``proc`` as soon as its job's run (``child``: a sweep's child
    run) is RUNNING in ``experiment``; its pid."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        exp = cl.get_experiment_by_name(experiment)
        runs = cl.search_runs([exp.experiment_id]) if exp else []
        running = [r for r in runs if r.info.status == "RUNNING" and ("mlflow.parentRunId" in r.data.tags or not child)]
        victim = _worker(proc.pid, 1) if running else None
        if victim is not None:
            os.kill(victim, signal.SIGKILL)
            return victim
        time.sleep(0.2)
    raise AssertionError("the run never started")


@pytest.mark.slow  # a run's two workers, one killed once the run exists
def test_a_process_killed_mid_run_is_one_line_the_run_failed_and_the_workers_output_in_their_logs(outputs, tmp_path):
    """#62: ``run ... processes=2`` whose worker 1 is SIGKILLed: exit 1, one line on the terminal
    naming the process, its pid, the run and the workers' logs (the peer's gloo error and any C++
    stack go there, not to the terminal), the run FAILED, nothing left RUNNING."""
    args = [*FIT[:3], "n_iter=200", *SMALL, "processes=2", "experiment=killed"]
    proc = spawn([sys.executable, "-m", "plnexp", "run", *args], cwd=tmp_path, stdout=-1, stderr=-1, text=True)
    cl = store_client(outputs)
    victim = _kill_worker_once_running(proc, cl, "killed", child=False)
    out, err = proc.communicate(timeout=180)
    assert (proc.returncode, out) == (1, ""), err
    (run,) = cl.search_runs([cl.get_experiment_by_name("killed").experiment_id])
    assert run.info.status == "FAILED"
    (folder,) = (outputs / "runs").iterdir()
    assert err == (
        f"plnexp: error: the fit across 2 processes failed: process 1 of 2 (pid {victim}) was killed by SIGKILL; "
        f"run {run.info.run_id} ended FAILED; the processes' output: {folder}/process-*.log\n"
    )
    assert sorted(p.name for p in folder.glob("process-*.log")) == ["process-0.log", "process-1.log"]


# a worker of launch's tests (not a fit: what one does, by its process id): process 1 says its pid and
# PLAN's word for it, then does it; process 0 does what a peer's failure makes JAX do to it
WORKER = """
import os, signal, sys, time
plan, me = os.environ["PLAN"], os.environ["PLNEXP_PROCESS_ID"]
def peer_stopped():
    parent = os.getppid()
    for pid in open(f"/proc/{parent}/task/{parent}/children").read().split():
        if int(pid) != os.getpid() and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T":
            return True
if me == "1":
    print("pid", os.getpid(), flush=True)
    print("[Gloo] Rank 1 is connected to 1 peer ranks", file=sys.stderr, flush=True)
    if plan == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif plan == "error":
        print("plnexp: error: process 1: the fit did not finish", file=sys.stderr, flush=True)
        sys.exit(1)
    print("a warning of process 1", file=sys.stderr, flush=True)
elif plan == "stop":  # JAX's coordination service, once the stopped peer missed its heartbeats
    while not peer_stopped():
        time.sleep(0.01)
    print("F1128 client.h:80] Terminating process because the JAX distributed service detected fatal errors", file=sys.stderr)
    print("*** Check failure stack trace: ***", file=sys.stderr, flush=True)
    os.abort()
elif plan == "error":
    time.sleep(60)  # until the launcher ends it
else:
    print("a warning of process 0", file=sys.stderr, flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a stopped process is read in Linux's /proc")
@pytest.mark.parametrize(
    "plan,says",
    [
        ("stop", "was stopped (SIGSTOP or SIGTSTP) and sent no heartbeat for 20 s"),
        ("error", "exited with code 1 (process 1: the fit did not finish)"),
        ("ok", ""),
    ],
)
def test_the_launcher_names_the_failed_worker_and_keeps_the_workers_output_in_their_logs(
    plan, says, tmp_path, monkeypatch, capfd
):
    """#62: a worker stopped past JAX's heartbeat (the others aborted with a C++ stack) or one that
    exited with an error is named in the one line (its own error line with it), the runs the workers
    left RUNNING are ended FAILED with it, and nothing of the workers reaches the terminal; workers
    that all succeeded: their output said as they said it, but gloo's connection lines."""
    ended = []  # the store's part: the runs the workers left RUNNING ended with the line
    monkeypatch.setattr(processes, "_close", lambda *args: ended.append(args) or ())
    monkeypatch.setenv("PLAN", plan)
    line, run_id = processes.launch([sys.executable, "-c", WORKER], processes._local(2), "uri", 2, tmp_path)
    logs = [(tmp_path / f"process-{k}.log").read_text() for k in (0, 1)]
    pid = int(logs[1].split()[1])
    out, err = capfd.readouterr()
    if says:
        assert (out, err, run_id) == ("", "", "")
        ((uri, procs, what, first, since_ms),) = ended
        assert what == f"process 1 of 2 (pid {pid}) {says}"
        assert (uri, procs[1].pid, first) == ("uri", pid, 0)
        assert time.time() * 1000 - 60_000 < since_ms <= time.time() * 1000  # the runs of this launch only
        assert line == f"the fit across 2 processes failed: {what}; the processes' output: {tmp_path}/process-*.log"
    else:
        assert (line, run_id, ended) == ("", "", [])
        assert (out, err) == ("", f"a warning of process 0\npid {pid}\na warning of process 1\n")
    if plan == "stop":
        assert "*** Check failure stack trace: ***" in logs[0]
    assert not Path(f"/proc/{pid}").exists()  # every worker ended (the stopped one too)


@pytest.mark.slow  # a sweep's driver and two workers, one killed once its run exists; then resume=true
def test_a_process_killed_mid_sweep_fails_its_job_in_one_line_and_resume_finishes_the_grid(
    outputs, tmp_path, plnexp_main
):
    """The fit across processes fails in one line (the launcher ``run`` shares: processes.launch), its
    run ended FAILED, nothing left RUNNING, the sweep goes on and exits 1; ``resume=true`` (here in this
    process: the sweep's driver is not the point, its workers are started anew as processes) runs that
    job again and reuses the other."""
    # job 1 long enough that the kill lands inside it (the worker is killed as soon as it exists: in its
    # imports, its compile, or its fit at gloo's pace); job 2 short
    grid = ["sweep", *FIT[:-4], "n_iter=200,20", *SMALL, "processes=2", "experiment=killed"]
    proc = spawn([sys.executable, "-m", "plnexp", *grid], cwd=tmp_path, stdout=-1, stderr=-1, text=True)
    cl = store_client(outputs)
    victim = _kill_worker_once_running(proc, cl, "killed", child=True)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, (out, err)
    (line,) = [line for line in out.splitlines() if "SIGKILL" in line]
    assert line.startswith("[1/2] ") and "-n_iter200-processes2 ... FAILED " in line
    assert f"(the fit across 2 processes failed: process 1 of 2 (pid {victim}) was killed by SIGKILL; run " in line
    everything = lambda: cl.search_runs([e.experiment_id for e in cl.search_experiments()])
    assert not [r for r in everything() if r.info.status == "RUNNING"]
    job_runs = lambda: [r for r in everything() if "mlflow.parentRunId" in r.data.tags]  # (a killed run: no params)
    assert {r.data.tags["plnexp.job"]: r.info.status for r in job_runs()} == {"0": "FAILED", "1": "FINISHED"}

    resumed = plnexp_main(*grid, "resume=true", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "[2/2] " in resumed.stdout and "FINISHED earlier" in resumed.stdout
    assert "2/2 jobs (1 FINISHED earlier), 0 failed" in resumed.stdout
    runs = job_runs()  # job 0 FAILED, then FINISHED in the resumed sweep; job 1 reused, not run again
    assert sorted((r.data.tags["plnexp.job"], r.info.status) for r in runs) == [
        ("0", "FAILED"),
        ("0", "FINISHED"),
        ("1", "FINISHED"),
    ]
    (again,) = [r for r in runs if r.data.tags["plnexp.job"] == "0" and r.info.status == "FINISHED"]
    assert again.data.metrics["n_iter_run"] == 200 and again.data.params["processes"] == "2"
    assert not [r for r in everything() if r.info.status == "RUNNING"]


def test_the_rounds_leave_out_a_fit_across_processes_in_one_line(monkeypatch, capsys):
    """The driver cannot run a program spanning other processes: its job leaves its group (whose
    other strategy, alone, has no rounds), said in one line; nothing is timed."""
    from plnexp.experiment import groups

    (one,) = cli.plan(["strategy=scan", "model=full", "report.rounds=9"], multirun=False)
    (two,) = cli.plan(["strategy=scan_sharded", "model=full", "processes=2", "report.rounds=9"], multirun=False)
    members = [groups.Member(0, one.config, ("a",)), groups.Member(1, two.config, ("b",))]
    assert len(groups.partition(members)[0]) == 1  # one group, had it been timed here
    monkeypatch.setattr(groups, "finished_members", lambda record, configs: members)
    assert groups.judge_groups(None, [one.config, two.config]) == []
    assert capsys.readouterr().out == (
        "[rounds] job(s) 2 of processes > 1 left out: a fit across processes does not run in this process; "
        "their own timings stand\n"
    )


@pytest.mark.parametrize(
    ("command", "args", "says"),
    [
        (
            "run",
            (
                "strategy=scan_sharded",
                "model=full",
            ),
            "processes=1 under srun -n 2: the 2 tasks would run 2 separate fits and log 2 runs; allowed are "
            "processes=2 (the tasks join in one fit, task 0 logging its run) or srun -n 1",
        ),
        (
            "run",
            ("strategy=scan_sharded", "model=full", "processes=3"),
            "processes=3 under srun -n 2: srun started 2 tasks; ",
        ),
        ("sweep", ("sweep=null", "strategy=scan,fori_loop"), "a sweep under srun -n 2: each of the 2 tasks would "),
    ],
)
def test_under_srun_every_task_runs_one_fit_of_processes_n_or_nothing(
    outputs, plnexp_main, monkeypatch, command, args, says
):
    """#62: ``srun -n 2 python -m plnexp run`` without processes=2 (or a sweep under srun) is one line
    naming processes=N, exit 2, no run: never two fits logging two runs."""
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    monkeypatch.setenv("SLURM_PROCID", "0")
    ran = plnexp_main(command, "dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3", "model=full", *args)
    assert ran.returncode == 2
    assert ran.stderr.count("\n") == 1 and ran.stderr.startswith(f"plnexp: error: {says}"), ran.stderr
    cl = store_client(outputs)
    assert [r for e in cl.search_experiments() for r in cl.search_runs([e.experiment_id])] == []
    monkeypatch.setenv("SLURM_PROCID", "1")  # task 1 says nothing (task 0 says the line): one line for the srun
    quiet = plnexp_main(command, "dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3", "model=full", *args)
    assert (quiet.returncode, quiet.stderr, quiet.stdout) == (2, "", "")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")  # srun -n 1: this process alone, as without srun
    srun.check_tasks(1, multirun=True)
