"""The job spec as the spine: each job composed by Hydra once and validated once (counted), shipped
whole to the executor that runs it, and rerun from its logged spec without composing again."""

from __future__ import annotations

import pickle

import pytest
from conftest import Counter

from plnexp.__main__ import main
from plnexp.experiment import executors, plan
from plnexp.jobs import config as C
from plnexp.jobs import config_load
from plnexp.jobs import provenance
from plnexp.jobs.spec import JobSpec, Kind

TINY = ["dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3", "repeats=1", "time_budget_s=0"]
QUIET = ["report=false", "report.rounds=0", "report.control=false"]


@pytest.fixture
def counted(monkeypatch, outputs):
    """Every Hydra composition (plan's ``compose``: the only caller of Hydra's compose API) and every
    validation of a composed config (``config_load.load``) of the command, counted; ``hydra.main`` refused (no
    job reaches its run through it). The store: a copy of the session's migrated one (``outputs``)."""
    import hydra

    compose, load = Counter(plan.compose), Counter(config_load.load)
    monkeypatch.setattr(plan, "compose", compose)
    monkeypatch.setattr(config_load, "load", load)

    def refused(*a, **k):
        raise AssertionError("hydra.main was called")

    monkeypatch.setattr(hydra, "main", refused)
    return compose, load


@pytest.mark.slow
def test_a_sweep_composes_each_job_once_and_its_rerun_composes_none(counted, tmp_path, capsys):
    compose, load = counted
    jobs = ["strategy=scan,fori_loop"]
    assert main(["sweep", "sweep=null", *jobs, *TINY, *QUIET, "experiment=spine"]) == 0
    # one composition per job, and the command's own (the sweep without its swept keys: its grid
    # and its launcher); each job's config validated once, in the driver, never again in the task
    assert compose.calls == 2 + 1
    assert load.calls == 2
    out = capsys.readouterr().out
    assert out.count(" done ") == 2
    from plnexp import store as tracking

    uri = tracking.tracking_uri(None)
    cl = tracking.client(uri)
    exp = cl.get_experiment_by_name("spine").experiment_id
    (parent,) = [r for r in cl.search_runs([exp]) if "jobs" in r.data.tags]
    compose.calls = load.calls = 0
    # a rerun of the sweep: the logged specs, fed back whole; no composition (no group changes)
    assert main(["rerun", parent.info.run_id, "n_iter=4"]) in (0, 1)
    assert compose.calls == 0
    out = capsys.readouterr().out
    assert "2 jobs" in out and out.count("(run ") >= 2
    # a group override is the group's value, composed once per job at most
    compose.calls = 0
    main(["rerun", parent.info.run_id, "precision=float64"])
    assert 1 <= compose.calls <= 2


@pytest.mark.slow
def test_a_run_composes_once(counted, capsys):
    compose, load = counted
    assert main(["run", *TINY]) == 0
    assert (compose.calls, load.calls) == (1, 1)
    assert "FINISHED" in capsys.readouterr().out


def _spec(**kw) -> JobSpec:
    (job,) = plan.plan([*TINY], multirun=False, check_device=False)
    return JobSpec(job.config, job.name, **kw)


def test_a_spec_is_frozen_pickles_whole_and_hashes_as_its_config():
    spec = _spec(num=2, overrides=["n_iter=3"], tags={"rerun_of": "abc"})
    assert spec.hash == provenance.config_hash(spec.config) and len(spec.hash) == 64
    back = pickle.loads(pickle.dumps(spec))
    assert back == spec and back.hash == spec.hash and back.run_tags == {"rerun_of": "abc"}
    assert spec.overrides == ("n_iter=3",) and spec.kind is Kind.JOB
    with pytest.raises(AttributeError):
        spec.num = 3  # type: ignore[misc]
    assert spec.config.as_study().compile_cache is False and spec.config.compile_cache is None
    with pytest.raises(ValueError, match="names its peer"):
        _spec(kind=Kind.PEER)
    with pytest.raises(ValueError, match="names its peer"):
        _spec(peer="pyplnmodels")


def test_the_plan_numbers_its_specs_in_grid_order_and_names_them_apart():
    p = plan.plan(["strategy=scan,fori_loop", "repeats=1,2", *TINY[:-2]], multirun=True, check_device=False)
    specs = p.specs()
    assert [s.num for s in specs] == [0, 1, 2, 3]
    assert [s.config.strategy.name for s in specs] == ["scan", "scan", "fori_loop", "fori_loop"]
    assert len({s.name for s in specs}) == 4  # repeats, hidden in names, shown where it alone tells jobs apart
    assert p.launcher == "basic" and isinstance(p.executor(), executors.InProcess)


def test_the_launcher_choice_and_its_settings_pick_the_executor(tmp_path):
    p = plan.plan(
        ["strategy=scan,fori_loop", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *TINY],
        multirun=True,
        check_device=False,
    )
    ex = p.executor(tmp_path)
    assert isinstance(ex, executors.Joblib) and not ex.in_driver
    assert ex.options["n_jobs"] == 2 and ex.options["backend"] == "loky" and "_target_" not in ex.options
    with pytest.raises(C.ConfigError, match=r"hydra/launcher=nope: allowed values are basic, joblib, slurm"):
        executors.from_launcher("nope", {})


def test_slurm_settings_map_to_submitits_executor_as_the_submitit_launcher_maps_them(tmp_path):
    pytest.importorskip("submitit")
    ex = executors.Slurm(
        {
            "_target_": "x",
            "submitit_folder": str(tmp_path / "%j"),
            "timeout_min": 5,
            "cpus_per_task": 1,
            "partition": "debug",
            "max_num_timeout": 0,
            "gres": None,
            "stderr_to_stdout": True,
        }
    ).executor()
    params = ex._executor.parameters  # submitit's SlurmExecutor keeps what update_parameters set
    assert params["time"] == 5 and params["cpus_per_task"] == 1 and params["partition"] == "debug"
    assert "gres" not in params  # unset settings keep submitit's defaults
