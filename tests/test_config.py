"""Every config group option and every sweep file composes (Hydra compose API) and loads into the
typed, frozen Config; every bad value is one ConfigError line naming the key and allowed values."""

from __future__ import annotations

import dataclasses
import functools
from importlib import resources

import numpy as np
import pytest

from plnexp.experiment import plan as cli
from plnexp.jobs import provenance
from plnexp.jobs import config as C

GROUP_OPTIONS = [(g, o) for g in C.GROUPS if g != "sweep" for o in C.group_options(g)]


@functools.cache
def sweep_jobs(sweep: str) -> tuple[cli.Job, ...]:
    """``cli.plan(["sweep=<sweep>"], multirun=True)``, made once per process: composing a sweep's every
    job takes ~2 s, and the jobs (frozen configs) are only read by the tests that share them."""
    return tuple(cli.plan([f"sweep={sweep}"], multirun=True))


def test_groups_cover_the_registries():
    from plnexp import STRATEGIES
    from plnexp.core.device import DEVICES
    from plnexp.core.precision import PRECISIONS
    from plnexp.core.optim import OPTIMIZERS
    from plnexp.fitting.spec import MODEL_NAMES

    assert set(C.group_options("strategy")) == set(STRATEGIES)
    assert set(C.group_options("optimizer")) == set(OPTIMIZERS)
    assert set(C.group_options("precision")) == set(PRECISIONS)
    assert set(C.group_options("device")) == set(DEVICES)
    assert set(C.group_options("model")) == set(MODEL_NAMES)
    assert {"oaks", "synthetic", "csv", "anndata", "synthetic_pca"} <= set(C.group_options("dataset"))
    assert {"default", "seed", "scaling", "precision", "optimizers"} <= set(C.group_options("sweep"))


@pytest.mark.parametrize("group,option", GROUP_OPTIONS)
def test_every_group_option_composes_and_loads(group, option, tmp_path):
    import importlib.util

    from plnexp.strategies import TORCH_STRATEGIES, torch_loops

    if group == "strategy" and option in TORCH_STRATEGIES and not torch_loops.torch_available():
        pytest.skip(
            "PyTorch not installed: pip install -e '.[torch]' (tests/test_torch.py checks the one-line refusal)"
        )
    overrides = [f"{group}={option}"]
    if (group, option) == ("dataset", "csv"):
        overrides.append(f"dataset.counts={resources.files('plnexp.datasets') / 'oaks' / 'counts.csv'}")
    if (group, option) == ("dataset", "anndata"):
        if importlib.util.find_spec("anndata") is None:
            pytest.skip("anndata not installed: pip install -e '.[single-cell]' (test_anndata checks the line)")
        (tmp_path / "cells.h5ad").write_bytes(b"")  # the config checks the path; the file is read by the data check
        overrides.append(f"dataset.path={tmp_path / 'cells.h5ad'}")
    if (group, option) == ("optimizer", "newton"):
        overrides.append("model=pca")  # PLN-PCA's own step: the other models refuse it (tests/test_pca_newton.py)
    (job,) = cli.plan(overrides, multirun=False, check_device=False)
    cfg = job.config
    assert isinstance(cfg, C.Config)
    value = getattr(cfg, group)
    name = getattr(value, "name", None) or getattr(value, "value", None)
    assert name == option
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.n_iter = 3  # type: ignore[misc] - the assignment a frozen Config refuses


@pytest.mark.parametrize(
    "sweep", [pytest.param(s, marks=[] if s == "default" else [pytest.mark.slow]) for s in C.group_options("sweep")]
)  # ~2 s each: the default one fast
def test_every_sweep_file_expands_and_loads(sweep):
    """Each sweep file's grid, composed once, and every job of it checked: it loads, and it is timed by
    the cheap protocol. Every sweep times each job at least 3 times (the report ranks nothing on fewer),
    but the default sweep, whose verdict rests on its interleaved rounds (report.rounds): its jobs run
    once after their warm-up; only the sweeps with Python-loop strategies keep one warm-up run (their
    first run compiles primitives op by op)."""
    from plnexp.strategies import torch_loops

    if sweep == "torch" and not torch_loops.torch_available():
        pytest.skip("PyTorch not installed: pip install -e '.[torch]'")
    lines = (C.CONF_DIR / "sweep" / f"{sweep}.yaml").read_text().splitlines()
    assert lines[0] == "# @package _global_"
    assert lines[1].startswith("# python -m plnexp sweep")
    jobs = sweep_jobs(sweep)
    assert len(jobs) >= 2
    assert all(isinstance(j.config, C.Config) for j in jobs)
    assert len({j.name for j in jobs}) == len(jobs), "run names must tell the jobs apart"
    # each sweep its own experiment, named after it; the default sweep's is "strategies", so that it
    # does not sit beside MLflow's built-in "Default" experiment
    assert {j.config.experiment for j in jobs} == {"strategies" if sweep == "default" else sweep}
    # the cheap protocol (it was a test of its own, which composed every sweep's grid a second time)
    for j in jobs:
        c = j.config
        protocol = (1, 0.0) if sweep == "default" else (3, 1.0)
        assert (c.repeats, c.time_budget_s, c.first_call, c.compile_cache) == (*protocol, False, None), sweep
        assert c.report.rounds > 0, sweep  # every sweep's groups are timed in interleaved rounds
        assert c.as_study().fit_spec().timing.compile_cache_dir is None, sweep  # cold compiles
        assert c.warmup == (1 if sweep in ("default", "scaling", "torch", "dispatch") else 0), sweep


def test_default_sweep_is_every_strategy_on_oaks_x100_at_equal_iterations():
    from plnexp import STRATEGIES
    from plnexp.strategies import NATIVE_STRATEGIES, TORCH_STRATEGIES

    jobs = sweep_jobs("default")
    # every JAX strategy and the native kernel scan_fused (the README's headline: #64); the PyTorch
    # baselines need the optional extra: they are asked for by name (sweep=torch)
    names = [j.config.strategy.name for j in jobs]
    assert "scan_fused" in NATIVE_STRATEGIES
    assert sorted(names) == sorted(s for s in STRATEGIES if s not in TORCH_STRATEGIES)
    # scan (the reference) first; the op-by-op strategies last, their op caches still warm for the rounds
    assert names[0] == "scan" and names[-2:] == ["jit_per_function", "eager"]
    for j in jobs:
        c = j.config
        assert (c.dataset.replication, c.precision.name, c.model.value, c.optimizer.name) == (
            100,
            "float32",
            "full",
            "radam_clip",
        )
        assert c.n_iter == c.n_iter_requested == 20  # like with like: no per-strategy cap


def test_command_line_overrides_replace_sweep_params():
    jobs = cli.plan(["sweep=scaling", "strategy=scan", "dataset.replication=1,10"], multirun=True)
    assert [(j.config.strategy.name, j.config.dataset.replication) for j in jobs] == [("scan", 1), ("scan", 10)]


def test_run_name_says_the_iterations_that_run_after_a_cap():
    (job,) = cli.plan(["strategy=eager", "n_iter=300", "+n_iter_cap.eager=5"], multirun=False)
    assert job.config.n_iter == 5 and job.name == "eager-oaks-f32-cpu-n_iter5"


def test_run_name_from_overrides():
    (job,) = cli.plan(["strategy=scan", "dataset.replication=100", "optimizer=adam"], multirun=False)
    assert job.name == "scan-oaks_x100-f32-cpu-adam"


BAD = [
    (["precision=float16"], "precision=float16: allowed values are float32, float64"),
    (["strategy=scna"], "strategy=scna: allowed values are eager"),
    (["n_iter=-5"], "n_iter=-5: allowed values are integers >= 1"),
    (["dataset.replication=0"], "dataset.replication=0: allowed values are integers >= 1"),
    (["foo=1"], "foo: unknown key; allowed keys are dataset"),
    (["+foo=1"], "foo: unknown key; allowed keys are dataset"),
    (["dataset.foo=1"], "dataset.foo: unknown key; allowed keys under dataset are name, replication"),
    (["optimizer.lr=-1"], "optimizer.lr=-1: must be a number > 0"),
    (["optimizer=adam", "optimizer.lr=inf"], "optimizer.lr=inf: must be a number > 0 and finite"),  # #62
    (["optimizer=adam", "optimizer.lr=nan"], "optimizer.lr=nan: must be a number > 0 and finite"),
    (["strategy=scan_unrolled", "strategy.unroll=0"], "strategy.unroll=0: allowed values are integers >= 1"),
    (["strategy=while_loop", "strategy.tol=-1"], "strategy.tol=-1: allowed values are numbers >= 0"),
    (["strategy.unroll=4"], "strategy.unroll: unknown key; allowed keys under strategy are name"),
    (
        ["strategy=while_loop", "strategy.unroll=4"],
        "strategy.unroll: unknown key; allowed keys under strategy are name, tol, patience",
    ),
    (["init=noise"], "init='noise': allowed values are seed, data, random"),
    (["repeats=0"], "repeats=0: allowed values are integers >= 1"),
    (["time_budget_s=-1"], "time_budget_s=-1: allowed values are numbers >= 0 (seconds)"),
    (["time_budget_s=soon"], "time_budget_s='soon': allowed values are numbers >= 0 (seconds)"),
    (["warmup=-1"], "warmup=-1: allowed values are integers >= 0"),
    (["first_call=3"], "first_call=3: allowed values are true, false"),
    (["first_call=yes"], "first_call='yes': allowed values are true, false"),
    (["compile_cache=1"], "compile_cache=1: allowed values are true, false, null"),
    (["dataset=csv", "dataset.counts=/nonexistent.csv"], "dataset.counts='/nonexistent.csv': allowed values"),
    (["strategy=scan,fori_loop"], "needs `python -m plnexp sweep` or --multirun"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_values_fail_in_one_line(overrides, message):
    with pytest.raises(C.ConfigError) as err:
        cli.plan(overrides, multirun=False)
    text = str(err.value)
    assert message in text
    assert "\n" not in text


def test_gpu_on_a_cpu_machine_is_one_line():
    import jax

    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("this machine has a GPU")
    with pytest.raises(C.ConfigError, match=r"^device='gpu': no GPU visible .* use device=cpu or device=auto$"):
        cli.plan(["device=gpu"], multirun=False)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["sweep=default", "strategy=scan,scna"], "strategy=scna: allowed values are"),
        (["sweep=default", "n_iter=5,-5"], "n_iter=-5: allowed values are integers >= 1"),
        (["sweep=default", "precision=float32,float16"], "precision=float16: allowed values are float32, float64"),
        (["sweep=nope"], "sweep=nope: allowed values are .*default, dispatch"),
    ],
)
def test_every_job_of_a_sweep_is_validated(overrides, message):
    with pytest.raises(C.ConfigError, match=message):
        cli.plan(overrides, multirun=True)


def test_load_rejects_a_cap_for_an_unknown_strategy():
    with pytest.raises(C.ConfigError, match="n_iter_cap.scna: unknown strategy"):
        cli.plan(["+n_iter_cap.scna=3"], multirun=False)


def test_flat_params_and_fit_spec():
    from plnexp.core.model import MODELS
    from plnexp.core.precision import PRECISIONS

    (job,) = cli.plan(["dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=5"], multirun=False)
    flat = C.flatten(job.config.as_dict())
    assert flat["dataset.name"] == "synthetic" and flat["dataset.n"] == 30 and flat["strategy.name"] == "scan"
    assert flat["n_iter"] == 5 and flat["precision"] == "float32"
    assert "strategy.unroll" not in flat and "strategy.mode" not in flat  # scan has no options of its own
    spec = job.config.fit_spec()  # typed objects, no names to parse again
    assert spec.n_iter == 5 and spec.strategy is job.config.strategy and spec.precision is PRECISIONS["float32"]
    assert spec.model is MODELS["profiled"] and spec.optimizer is job.config.optimizer  # run's default model


def test_timing_protocol_defaults_and_switches(tmp_path, monkeypatch):
    monkeypatch.setenv("PLNEXP_OUTPUTS", str(tmp_path))
    (job,) = cli.plan([], multirun=False)
    c = job.config
    assert (c.repeats, c.time_budget_s, c.warmup, c.first_call, c.compile_cache) == (3, 1.0, 0, False, None)
    t = c.fit_spec().timing  # compile_cache auto: the cache, one compile (tests/test_compile_cache.py)
    assert (t.repeats, t.time_budget_s, t.warmup, t.first_call, t.warm_compile) == (3, 1.0, 0, False, False)
    (job,) = cli.plan(
        ["first_call=true", "compile_cache=true", "repeats=2", "warmup=1", "time_budget_s=0"], multirun=False
    )
    t = job.config.fit_spec().timing
    assert (t.repeats, t.time_budget_s, t.warmup, t.first_call) == (2, 0.0, 1, True)
    assert t.compile_cache_dir == tmp_path.resolve() / "jax_cache" and t.warm_compile
    assert job.name == "scan-oaks-f32-cpu", "protocol switches do not rename a run"
    flat = C.flatten(job.config.as_dict())
    assert flat["first_call"] is True and flat["compile_cache"] is True


# ---------------------------------------------------------------- replication, an axis of every data set
@pytest.mark.parametrize(
    "dataset, extra, label",
    [
        pytest.param("oaks", [], "oaks_x100", marks=pytest.mark.slow),  # ~2 s each: synthetic (the defect) fast
        ("synthetic", ["dataset.n=50"], "synthetic_n50_p50_d2_s0_x100"),
        pytest.param("csv", ["dataset.counts={counts}"], "csv_counts_x100", marks=pytest.mark.slow),
    ],
)
def test_a_preset_that_sets_replication_takes_any_data_set(dataset, extra, label, tmp_path):
    """The default sweep pins dataset.replication=100: a user's dataset choice must never become an
    error under it (it was `dataset.replication: unknown key` for synthetic and csv)."""
    counts = tmp_path / "counts.csv"
    counts.write_text("a,b\n1,2\n3,0\n0,5\n")
    args = ["sweep=default", f"dataset={dataset}", *(a.format(counts=counts) for a in extra)]
    jobs = cli.plan(args, multirun=True)
    default = sweep_jobs("default")
    assert len(jobs) == len(default) and {j.config.dataset.replication for j in jobs} == {100}
    assert jobs[0].name == f"scan-{label}-f32-cpu"


def test_replication_stacks_the_rows_of_every_data_set(tmp_path):
    counts = tmp_path / "counts.csv"
    counts.write_text("a,b\n1,2\n3,0\n0,5\n")
    for args, rows in (
        (["dataset=synthetic", "dataset.n=7", "dataset.replication=3"], 7),
        (["dataset=csv", f"dataset.counts={counts}", "dataset.replication=4"], 3),
    ):
        (job,) = cli.plan(args, multirun=False)
        once = dataclasses.replace(job.config.dataset, replication=1).load()
        data = job.config.dataset.load()
        k = job.config.dataset.replication
        assert data.n == rows * k and np.array_equal(data.Y, np.tile(once.Y, (k, 1)))
        assert np.array_equal(data.X, np.tile(once.X, (k, 1))) and np.array_equal(data.O, np.tile(once.O, (k, 1)))
    jobs = cli.plan(["sweep=scaling", "dataset=csv", f"dataset.counts={counts}", "strategy=scan"], multirun=True)
    assert [j.config.dataset.replication for j in jobs] == [1, 10, 100, 400]
    with pytest.raises(C.ConfigError, match=r"^dataset.replication=0: allowed values are integers >= 1$"):
        cli.plan(["dataset=synthetic", "dataset.replication=0"], multirun=False)


def test_replication_at_1_keeps_the_hash_of_older_synthetic_and_csv_runs():
    """replication was added to synthetic and csv after runs were logged: at its default it is not
    hashed for them (resume and rerun still match the older runs); oaks always had it. (Those runs
    took run's defaults of then, the tutorial's workload, named here since #63 changed the defaults.)"""
    tutorial = ["model=full", "optimizer=radam_clip", "init=seed", "n_iter=1000"]
    (syn,) = cli.plan(["dataset=synthetic", *tutorial], multirun=False)
    assert "replication" not in provenance.hashed(syn.config)["dataset"]
    (big,) = cli.plan(["dataset=synthetic", "dataset.replication=2", *tutorial], multirun=False)
    assert provenance.hashed(big.config)["dataset"]["replication"] == 2
    assert provenance.config_hash(big.config) != provenance.config_hash(syn.config)
    (oaks,) = cli.plan(["dataset=oaks", *tutorial], multirun=False)
    assert provenance.hashed(oaks.config)["dataset"]["replication"] == 1
    # the hashes plnexp logged for these two configs before replication was added (commit 77f8968)
    assert provenance.config_hash(syn.config) == "099fdd9f304f63b066fc1b8bae6f35df39dcb8065ced9e58b83a9f51c50bd996"
    assert provenance.config_hash(oaks.config) == "d5f9d49f0bb4c4edb567c534a53f39aaef92957fa3c1993f832e6088d39df208"


def test_the_device_is_checked_before_launching_only_when_the_jobs_run_here():
    assert cli.jobs_run_here(["strategy=scan"]) and cli.jobs_run_here(["hydra/launcher=joblib"])
    assert not cli.jobs_run_here(["hydra/launcher=submitit_slurm", "strategy=scan"])
    import jax

    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("this machine has a GPU")
    with pytest.raises(C.ConfigError, match="device='gpu': no GPU visible to JAX"):
        cli.plan(["device=gpu"], multirun=False)
    (job,) = cli.plan(["device=gpu"], multirun=False, check_device=False)  # a cluster's job checks it
    assert job.config.device.value == "gpu" and job.name == "scan-oaks-f32-gpu"


def test_a_users_own_config_folder_adds_its_sweep_files(tmp_path):
    """--config-dir DIR (hydra.searchpath=[file://DIR]): DIR's sweep files are sweep options beside
    plnexp's own; a folder that does not exist is one line."""
    from plnexp.experiment import plan as cli
    from plnexp.cli.parser import parse, searchpath

    def config_dir_override(argv):
        ns = parse(["sweep", *argv])
        return searchpath(ns.config_dir, ns.overrides)

    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "mine.yaml").write_text(
        "# @package _global_\nexperiment: mine\nhydra:\n  sweeper:\n    params:\n      strategy: scan,fori_loop\n"
    )
    args = config_dir_override(["sweep=mine", "--config-dir", str(tmp_path), "n_iter=3"])
    assert args == ["sweep=mine", "n_iter=3", f"hydra.searchpath=[file://{tmp_path}]"]
    jobs = cli.plan([*args, "dataset=synthetic", "dataset.n=30", "dataset.p=5"], multirun=True)
    assert sorted(j.config.strategy.name for j in jobs) == ["fori_loop", "scan"]
    assert {j.config.experiment for j in jobs} == {"mine"}
    with pytest.raises(C.ConfigError, match=r"^sweep=theirs: allowed values are .*default, .*mine"):
        cli.plan(["sweep=theirs", f"hydra.searchpath=[file://{tmp_path}]"], multirun=True)
    with pytest.raises(C.ConfigError, match=r"^hydra.searchpath: file:///nowhere is not a folder; allowed values"):
        cli.plan(["hydra.searchpath=[file:///nowhere]"], multirun=False)
    with pytest.raises(C.ConfigError, match=r"^--config-dir /nowhere: not a folder"):
        config_dir_override(["--config-dir=/nowhere"])


SPARSE = ["dataset=synthetic_pca", "dataset.n=40", "dataset.p=8", "dataset.q=2", "dataset.sparse=true", "n_iter=3"]
PCA = ["model=pca", "model.rank=2"]


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["model=full"], "sparse counts with model='full', block_rows=None: "),
        (PCA, "sparse counts with model='pca', block_rows=None: "),
        (
            [*PCA, "model.block_rows=10", "strategy=scan_sharded", "strategy.via=jit"],
            "sparse counts with strategy='scan_sharded' and strategy.via='jit': ",
        ),
        ([*PCA, "model.block_rows=10", "strategy=eager"], "sparse counts with strategy='eager': it places the dense"),
    ],
    ids=["full", "pca-no-blocks", "sharded-jit", "eager"],
)
def test_sparse_counts_a_fit_would_refuse_are_refused_before_any_run(outputs, plnexp_main, overrides, says):
    """#62: every sparse misconfiguration is one line at validation, exit 2, no run (not a FAILED run)."""
    from conftest import store_client

    ran = plnexp_main("run", *SPARSE, *overrides)
    assert ran.returncode == 2
    assert ran.stderr.count("\n") == 1 and ran.stderr.startswith(f"plnexp: error: {says}"), ran.stderr
    cl = store_client(outputs)
    assert [r for e in cl.search_experiments() for r in cl.search_runs([e.experiment_id])] == []


def test_a_key_given_twice_is_named_once_with_its_last_value():
    """#62: a rerun's name is its logged overrides then its own (n_iter=5 then n_iter=10): each key
    once, with the value it runs with (Hydra's last), not -n_iter10-n_iter10 nor -seed2-...-seed3."""
    (job,) = cli.plan(["dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=10", "seed=3"], multirun=False)
    name = job.config.job_name(("n_iter=5", "seed=2", "n_iter=10", "seed=3"))
    assert name == f"{job.config.run_name}-n_iter10-seed3"
