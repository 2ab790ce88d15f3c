"""Reproducible reruns (``python -m plnexp rerun``), provenance tags and resumable sweeps
(``resume=true``), against a real (copied) sqlite store and real tiny fits."""

from __future__ import annotations

import os
import re
import signal

import numpy as np
import pytest
from conftest import store_client, waiting

from plnexp.experiment import plan as cli
from plnexp.jobs import provenance
from plnexp.experiment import rerun_verdict
from plnexp.experiment import resume
from plnexp.experiment import sweep_dispatch
from plnexp.experiment import job_task, runner
from plnexp.jobs.spec import JobSpec
from plnexp.experiment import sweep, sweep_record
from plnexp import store as tracking
from plnexp.jobs import config as C
from plnexp.__main__ import main

TINY = ["dataset=synthetic", "dataset.n=50", "dataset.p=5", "n_iter=5", "strategy=scan", "experiment=rr"]


def original(overrides=(), parent=None, job_num=None):
    (job,) = cli.plan([*TINY, *overrides], multirun=False)
    out = job_task.run_job(JobSpec(job.config, job.name, job_num, job.overrides), parent=parent)
    assert out.status == "FINISHED", out.reason
    return out


def all_runs(outputs):
    cl = store_client(outputs)
    exps = [e.experiment_id for e in cl.search_experiments()]
    return cl.search_runs(exps) if exps else []


def reruns_of(outputs, run_id):
    return [r for r in all_runs(outputs) if r.data.tags.get("rerun_of") == run_id]


def curve(outputs, run_id):
    hist = store_client(outputs).get_metric_history(run_id, "elbo")
    return [m.value for m in sorted(hist, key=lambda m: m.step)]


# ---------------------------------------------------------------- provenance
@pytest.mark.slow
def test_config_hash_ignores_where_and_how_it_is_timed_only():
    (base,) = cli.plan(TINY, multirun=False, check_device=False)
    same = [
        "experiment=other",
        "repeats=3",
        "warmup=2",
        "time_budget_s=5",
        "first_call=true",
        "compile_cache=true",
        "tracking_uri=sqlite:////x.db",
    ]
    (moved,) = cli.plan([*TINY, *same], multirun=False, check_device=False)
    assert provenance.config_hash(moved.config) == provenance.config_hash(base.config)
    for change in (
        "n_iter=6",
        "precision=float64",
        "seed=1",
        "strategy=fori_loop",
        "optimizer.lr=0.02",
        "dataset.n=51",
        "model=full",
        "gradient=autodiff",
        "device=auto",
    ):
        (other,) = cli.plan([*TINY, change], multirun=False, check_device=False)
        assert provenance.config_hash(other.config) != provenance.config_hash(base.config), change


@pytest.mark.slow
def test_every_run_carries_its_provenance(outputs):
    out = original()
    run = store_client(outputs).get_run(out.run_id)
    t = run.data.tags
    assert t["config_hash"] == provenance.config_hash(out.config)
    assert t["plnexp.version"] == provenance.package_version() and t["plnexp.provenance"] == "1"
    assert t["git_dirty"] in ("true", "false") and t["git_commit"]
    assert t["seeds"] == "seed=0 dataset.seed=0" and "command" in t
    assert t["data_digest"] == out.config.dataset.load().digest()  # the arrays actually fitted
    assert "config.yaml" in {a.path for a in store_client(outputs).list_artifacts(out.run_id)}


def test_curve_difference():
    a = np.array([-10.0, -9.0, -8.0])
    assert provenance.curve_difference(a, a.copy()) == (True, 0.0)
    same, rel = provenance.curve_difference(a, a * (1 + 1e-7))
    assert not same and rel == pytest.approx(1e-7, rel=1e-3)
    assert provenance.curve_difference(a, a[:2]) == (False, 0.0)


# ---------------------------------------------------------------- rerun
def test_verdict_rules():
    def v(rel, same_config=True, expect=False, n=(5, 5), ok=True):
        return rerun_verdict.Verdict(
            rel == 0.0 and n[0] == n[1], rel, n[0], n[1], 1e-5, "float32", same_config, expect, ok
        )

    assert not v(0.0, expect=True).failed()  # bit for bit where it must be
    assert v(1e-9, expect=True).failed()  # within the tolerance is not enough on the same CPU environment
    assert not v(1e-6).failed() and v(1e-3).failed()  # same config elsewhere: the tolerance decides
    assert v(0.0, n=(5, 4)).failed()  # a curve of another length never agrees
    assert not v(1e-3, same_config=False).failed()  # overrides: reported only ...
    assert v(1e-3, same_config=False).failed(strict=True)  # ... unless strict
    assert not v(1e-6, same_config=False).failed(strict=True)
    assert v(0.0, ok=False).failed()  # the rerun did not finish
    assert "beyond the float32 tolerance 1e-05" in v(1e-3).line()
    assert v(0.0).line() == "ELBO curves: identical, bit for bit (5 iterations)"


def test_timing_line_says_how_the_machine_floor_moved():
    old = {"compile_s": 1.0, "ms_per_iter": 2.0, "floor_ms_per_iter": 0.5, "floor_bytes_per_iter": 4800.0}
    new = {"compile_s": 1.5, "ms_per_iter": 3.0, "floor_ms_per_iter": 1.0, "floor_bytes_per_iter": 4800.0}
    assert rerun_verdict.timing_line(old, new) == (
        "timing new/original: compile 1.50x (1.500 vs 1.000 s), steady 1.50x "
        "(3.000 vs 2.000 ms/iter), machine floor 2.00x (1.000 vs 0.500 ms/iter)"
    )
    assert rerun_verdict.timing_line({"ms_per_iter": 2.0}, new).endswith("machine floor -")  # an original older than it
    # floors that counted different iterations are not compared: an original logged before the floor
    # knew the model (no floor_bytes_per_iter), or another count of bytes
    legacy = {k: v for k, v in old.items() if k != "floor_bytes_per_iter"}
    assert rerun_verdict.timing_line(legacy, new).endswith("machine floor - (counted differently)")
    assert rerun_verdict.timing_line(old, {**new, "floor_bytes_per_iter": 2400.0}).endswith(
        "machine floor - (counted differently)"
    )
    unmeasured = {**new, "floor_ms_per_iter": float("nan")}  # the rerun's floor not measured, its bytes counted
    assert rerun_verdict.timing_line(old, unmeasured).endswith("machine floor -")


def test_rerun_on_the_same_machine_is_bit_for_bit(outputs, capsys):
    out = original()
    code = main(["rerun", out.run_id])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "same environment" in text and "ELBO curves: identical, bit for bit (5 iterations)" in text
    assert "timing new/original: compile" in text
    assert re.search(r", machine floor \d+\.\d\dx \(\d+\.\d+ vs \d+\.\d+ ms/iter\)", text), text  # both logged one
    (new,) = reruns_of(outputs, out.run_id)
    assert (
        new.info.status == "FINISHED"
        and new.info.experiment_id == store_client(outputs).get_run(out.run_id).info.experiment_id
    )
    assert new.data.tags["config_hash"] == provenance.config_hash(out.config)
    assert curve(outputs, new.info.run_id) == curve(outputs, out.run_id)
    assert new.data.tags["rerun.identical"] == "true" and new.data.tags["rerun.agrees"] == "true"


@pytest.mark.slow
def test_rerun_with_a_precision_override_reports_the_difference(outputs, capsys):
    # the tutorial's workload (radam_clip from the seed's start), whose float32 curve leaves float64's
    # (the converging default agrees across precisions within float32's tolerance here)
    out = original(["n_iter=200", "model=full", "optimizer=radam_clip", "init=seed"])
    assert main(["rerun", out.run_id, "precision=float64"]) == 0  # another experiment: reported only
    text = capsys.readouterr().out
    assert "x64 (x64): 'False' -> 'True'" in text
    assert "ELBO curves: max relative difference" in text and "beyond the float32 tolerance 1e-05" in text
    assert main(["rerun", out.run_id, "precision=float64", "--strict"]) == 1
    assert "FAILED to reproduce" in capsys.readouterr().out
    new = reruns_of(outputs, out.run_id)
    assert len(new) == 2 and {r.data.params["precision"] for r in new} == {"float64"}
    assert {r.data.tags["rerun.within_tolerance"] for r in new} == {"false"}
    assert float(new[0].data.tags["rerun.max_rel_diff"]) > 1e-5


@pytest.mark.slow
def test_environment_drift_is_reported_field_by_field(outputs, capsys):
    out = original()
    drift = {
        "jax_version": "0.0.1",
        "jaxlib_version": "0.0.2",
        "optax_version": "0.0.3",
        "platform": "gpu",
        "device_kind": "Imaginary GPU",
        "x64": "True",
        "XLA_FLAGS": "--xla_made_up",
        "git_commit": "deadbeef",
        "git_dirty": "maybe",
        "data_digest": "0" * 64,
        "plnexp.version": "0.0.0",
    }
    cl = store_client(outputs)
    for k, v in drift.items():
        cl.set_tag(out.run_id, k, v)
    code = main(["rerun", out.run_id])
    text = capsys.readouterr().out
    assert f"{len(drift)} difference(s) from the original" in text
    for key, value in drift.items():
        assert f"({key}): {value!r} -> " in text, key
    # the same config on "another platform": the curves need only agree within the tolerance
    assert code == 0 and "ELBO curves: identical" in text


@pytest.mark.slow
def test_a_changed_csv_file_is_reported_before_rerunning(outputs, tmp_path, capsys):
    sim = np.random.default_rng(0).poisson(3.0, size=(40, 4))
    counts = tmp_path / "counts.csv"
    counts.write_text("a,b,c,d\n" + "\n".join(",".join(map(str, row)) for row in sim) + "\n")
    (job,) = cli.plan(["dataset=csv", f"dataset.counts={counts}", "n_iter=5", "experiment=rr"], multirun=False)
    out = job_task.run_job(JobSpec(job.config, job.name, overrides=job.overrides))
    assert store_client(outputs).get_run(out.run_id).data.tags["data_sha256.counts"] == provenance.file_sha256(counts)
    sim[0, 0] += 5
    counts.write_text("a,b,c,d\n" + "\n".join(",".join(map(str, row)) for row in sim) + "\n")
    code = main(["rerun", out.run_id])
    text = capsys.readouterr().out
    before_running = text.split("FINISHED:")[0]
    assert f"dataset.counts file {counts} changed since the original run" in before_running
    assert "data hash (data_digest)" in before_running
    assert code == 1 and "FAILED to reproduce" in text  # same config, other data: not reproduced
    counts.unlink()
    assert main(["rerun", out.run_id]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == f"plnexp: error: run {out.run_id}: dataset.counts='{counts}': allowed values are paths of "
        f"existing CSV files"
    ), err


@pytest.mark.slow
def test_bad_reruns_are_one_line_and_create_nothing(outputs, capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    out = original()
    cl = tracking.client(tracking.tracking_uri())
    exp = cl.get_experiment_by_name("rr").experiment_id
    no_config = cl.create_run(exp, run_name="no-config").info.run_id
    cl.set_terminated(no_config, "FINISHED")
    old = cl.create_run(exp, run_name="old").info.run_id
    cl.log_text(old, "frobnicate: 1\nn_iter: 5\n", "config.yaml")
    cl.set_terminated(old, "FINISHED")
    running = cl.create_run(exp, run_name="running").info.run_id
    newer = original(["seed=3"]).run_id
    store_client(outputs).set_tag(newer, "plnexp.provenance", "99")
    cases = [
        (["nothex"], ["run id 'nothex': malformed", "32 hexadecimal"]),
        (["0123456789abcdef0123456789abcdef"], ["not found in the store", "allowed values are ids of runs"]),
        ([no_config], ["config artifact config.yaml is missing"]),
        ([old], ["made by an incompatible older plnexp", "frobnicate"]),
        ([newer], ["provenance format 99", "allowed values are runs of format 1"]),
        ([running], ["still RUNNING", "allowed values are ended runs"]),
        ([out.run_id, "strategy=scna"], ["strategy=scna: allowed values are"]),
        ([out.run_id, "experiment=x"], ["experiment=x", "original's experiment"]),
        ([out.run_id, "nonsense=1"], ["nonsense: unknown key"]),
        ([out.run_id, "--frob"], ["unknown option --frob", "--strict"]),
        ([], ["no run id", "usage: python -m plnexp rerun"]),
    ]
    import jax

    if not any(d.platform == "gpu" for d in jax.devices()):
        cases.append(([out.run_id, "device=gpu"], ["device='gpu'", "use device=cpu"]))
    before = {r.info.run_id for r in all_runs(outputs)}
    for args, words in cases:
        code = main(["rerun", *args])
        captured = capsys.readouterr()
        err = captured.err.strip()
        assert code == 2, (args, captured.out, err)
        assert len(err.splitlines()) == 1 and err.startswith("plnexp: error: "), err
        for w in words:
            assert w in err, (w, err)
    assert {r.info.run_id for r in all_runs(outputs)} == before


@pytest.mark.slow
def test_rerun_a_whole_sweep(outputs, tmp_path, capsys):
    uri = tracking.check_store()
    record = sweep.open_sweep(tmp_path / "sw", "s", "rr", uri, 2, {})
    kids = [original([f"seed={i}"], parent=record.parent, job_num=i) for i in range(2)]
    sweep.close_sweep(record)
    code = main(["rerun", record.parent_id])
    text = capsys.readouterr().out
    assert code == 0, text
    assert text.count("ELBO curves: identical, bit for bit") == 2 and "2 of 2 jobs reproduced" in text
    (new_parent,) = reruns_of(outputs, record.parent_id)
    assert new_parent.info.status == "FINISHED"
    children = [r for r in all_runs(outputs) if r.data.tags.get("mlflow.parentRunId") == new_parent.info.run_id]
    assert sorted(r.data.tags["rerun_of"] for r in children) == sorted(k.run_id for k in kids)
    assert {r.info.status for r in children} == {"FINISHED"}


@pytest.mark.slow
def test_a_sweep_with_its_control_job_reruns_whole_bit_for_bit(outputs, capsys):
    """Every run a sweep makes reruns from its logged spec: the grid's jobs and the control job (the
    reference job again, its tags kept: still the A/A pair of the reference's rerun)."""
    grid = ["strategy=scan,fori_loop", "repeats=3", "time_budget_s=0", "report.rounds=0", "report=false"]
    assert main(["sweep", "sweep=null", *[t for t in TINY if not t.startswith("strategy=")], *grid]) == 0
    cl = store_client(outputs)
    runs = cl.search_runs([cl.get_experiment_by_name("rr").experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    (control,) = [r for r in runs if r.data.tags.get("plnexp.control") == "true"]
    capsys.readouterr()
    assert main(["rerun", parent.info.run_id]) == 0
    out = capsys.readouterr().out
    assert "3 of 3 jobs reproduced" in out and out.count("identical, bit for bit") == 3, out
    (again,) = reruns_of(outputs, control.info.run_id)
    assert (
        again.data.tags["plnexp.control"] == "true" and again.data.tags["plnexp.job"] == control.data.tags["plnexp.job"]
    )
    assert curve(outputs, again.info.run_id) == curve(outputs, control.info.run_id)


@pytest.mark.slow
def test_a_pca_run_reruns_bit_for_bit(outputs, capsys):
    out = original(["dataset=synthetic_pca", "dataset.n=40", "dataset.p=8", "model=pca", "model.rank=2"])
    assert out.config.rank == 2
    assert main(["rerun", out.run_id]) == 0
    assert "ELBO curves: identical, bit for bit (5 iterations)" in capsys.readouterr().out


# ---------------------------------------------------------------- resume
def test_resume_switch():
    assert cli.pop_switch(["a=1", "resume=true"], "resume", False) == (["a=1"], True)
    assert cli.pop_switch(["resume=false"], "resume", False) == ([], False)
    assert cli.pop_switch(["a=1"], "resume", False) == (["a=1"], False)
    with pytest.raises(C.ConfigError, match=r"^resume=maybe: allowed values are true, false$"):
        cli.pop_switch(["resume=maybe"], "resume", False)


def test_resume_only_for_sweeps(outputs, capsys):
    assert main(["run", *TINY, "resume=true"]) == 2
    assert "resume=true: only for sweeps" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_reuses_finished_jobs_and_summarises_the_whole_grid(outputs, tmp_path, monkeypatch, capsys):
    """The bookkeeping of a resumed sweep, with a stand-in fit: FINISHED jobs are reused, FAILED ones
    run again, the summary covers the grid, the parent is tagged with the sweep it completes."""
    statuses = iter(["FINISHED", "FAILED", "FINISHED", "FINISHED"])

    def fake_execute(cfg, outcomes):
        (outcome,) = outcomes
        outcome.status = next(statuses)
        outcome.ended = outcome.started + 1.0
        return outcomes

    monkeypatch.setattr(runner, "execute", fake_execute)
    uri = tracking.check_store()
    jobs = cli.plan([*TINY, "seed=0,1,2"], multirun=True)
    first = sweep.open_sweep(tmp_path / "a", "s", "rr", uri, 3, {})
    for i in (0, 1):  # then "interrupted": job 2 never ran (a sweep's jobs run as a study: Config.as_study)
        job_task.run_job(JobSpec(jobs[i].config.as_study(), jobs[i].name, i, jobs[i].overrides), parent=first.parent)
    sweep.close_sweep(first, "KILLED", "interrupted by SIGINT")
    done = resume.match(uri, "rr", jobs).done
    assert [(d.job, d.parent_id) for d in done] == [(0, first.parent_id)]
    assert done[0].config_hash == provenance.config_hash(jobs[0].config)
    second = sweep.open_sweep(tmp_path / "b", "s", "rr", uri, 3, resume.tags(done), reused=tuple(done))
    assert sweep_record.read_record(tmp_path / "b") == second  # what the jobs read
    # the driver dispatches the plan minus the reused job: job 0 is not run again, job 1 is
    capsys.readouterr()
    assert [s.num for s in sweep_dispatch.to_run(second, jobs.specs())] == [1, 2]
    said = capsys.readouterr().out
    assert f"[1/3] {jobs[0].name} FINISHED earlier (run {done[0].run_id}): skipped" in said
    assert "resume: runs 2 jobs; reuses 1 job(s)" in said
    for i in (1, 2):
        job_task.run_job(JobSpec(jobs[i].config.as_study(), jobs[i].name, i, jobs[i].overrides), parent=second.parent)
    summary = sweep.close_sweep(second)
    assert summary.status == "FINISHED" and [r.status for r in summary.rows] == ["FINISHED"] * 3
    assert [r.name for r in summary.rows] == [j.name for j in jobs]
    assert summary.reused == (jobs[0].name,) and "3/3 jobs (1 FINISHED earlier), 0 failed" in summary.footer()
    assert summary.fit_s == 2.0  # the two jobs fitted here (1 s each), not the reused one
    parent = store_client(outputs).get_run(second.parent_id)
    assert parent.data.tags["resumes"] == first.parent_id and parent.data.tags["n_done"] == "3"
    assert len(resume.match(uri, "rr", jobs).done) == 3  # a third resume has nothing left to run


def test_resume_draws_no_synthetic_data_again_and_compares_a_files_digest(tmp_path, monkeypatch):
    """resume's check of the data: a drawn data set (synthetic) is known by its config (matched on
    its hash) and plnexp's commit, so it is not drawn again (at atlas scale the draw took longer
    than the job to resume), unless the checkout has uncommitted changes; a file's data are read
    and their digest compared: a CSV file changed since is fitted again."""
    from types import SimpleNamespace

    def never(dataset):
        raise AssertionError(f"{dataset.label} drawn again")

    other = SimpleNamespace(data_digest="0" * 64)  # whatever the run logged
    drawn = (C.SyntheticData(n=20, p=4), C.SyntheticPcaData(n=20, p=10, q=2))
    with monkeypatch.context() as m:
        m.setattr(runner, "load_data", never)
        m.setattr(provenance, "git_commit", lambda: "0123abc")
        for spec in drawn:
            assert spec.drawn and not resume._data_changed(other, spec)
    with monkeypatch.context() as m:  # a checkout with uncommitted changes: its draw may differ, compared
        m.setattr(provenance, "git_commit", lambda: "0123abc-dirty")
        for spec in drawn:
            assert resume._data_changed(other, spec)
    counts = tmp_path / "counts.csv"

    def changed_since(logged) -> bool:  # as a resume in a new process sees it: nothing loaded yet
        runner.load_data.cache_clear()
        try:
            return resume._data_changed(logged, csv)
        finally:
            runner.load_data.cache_clear()

    sim = np.random.default_rng(0).poisson(3.0, size=(20, 3))
    np.savetxt(counts, sim, fmt="%d", delimiter=",", header="a,b,c", comments="")
    csv = C.CsvData(counts=str(counts))
    logged = SimpleNamespace(data_digest=csv.load().digest())
    assert not csv.drawn and not changed_since(logged)
    sim[0, 0] += 1
    np.savetxt(counts, sim, fmt="%d", delimiter=",", header="a,b,c", comments="")
    assert changed_since(logged)


@pytest.mark.slow
def test_resume_an_interrupted_sweep_subprocess(outputs, tmp_path, blocking, plnexp_main):
    """A sweep interrupted in a real process (SIGINT), resumed by the next commands (here in this one):
    scan's two jobs finish, then the first ``blocking`` job is inside its fit when the signal lands,
    the last never starts. What the interrupted command says and leaves in the store is checked here
    for SIGINT (for SIGTERM: test_sweep.py::test_interrupt_mid_sweep)."""
    from test_sweep import BLOCKING, check_interrupted, runs_of, split, start, wait_for

    n = 4
    # report.rounds=0: the control job (which a resumed sweep runs again) instead of interleaved rounds;
    # report=false: no report at the end (resume is the point here, the report is tested with the sweep)
    grid = [*TINY, "experiment=res", "strategy.name=scan,blocking", "seed=0,1", "report.rounds=0", "report=false"]

    def finished():
        exp = store_client(outputs).get_experiment_by_name("res")
        runs = store_client(outputs).search_runs([exp.experiment_id]) if exp else []
        return [r for r in split(runs)[1] if r.info.status == "FINISHED"]

    proc = start("sweep", "sweep=null", *grid, cwd=tmp_path)
    (pid,) = wait_for(lambda: waiting(blocking), proc, "the third job inside its fit")
    assert pid == proc.pid  # the basic launcher: the jobs run in the sweep's process
    k = len(finished())
    proc.send_signal(signal.SIGINT)
    check_interrupted(proc, signal.SIGINT, "2 of 4 jobs finished, 1 killed, 0 failed, 1 not started", outputs, "res")
    _, children = split(runs_of(outputs, "res"))
    assert sorted((r.info.run_name.split("-")[0], r.info.status) for r in children) == [
        (BLOCKING, "KILLED"),
        ("scan", "FINISHED"),
        ("scan", "FINISHED"),
    ]
    finished_before = finished()
    assert k <= len(finished_before) < n
    assert sorted(r.info.run_name.split("-")[0] for r in finished_before) == ["scan", "scan"]
    blocking.touch()  # the blocking jobs run through from here on
    resumed = plnexp_main("sweep", "sweep=null", *grid, "resume=true", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "FINISHED earlier (run " in resumed.stdout
    assert resumed.stdout.startswith(
        f"resume: {len(finished_before)} of {n} job(s) matched a FINISHED run of "
        f"experiment 'res'; those are reused, the others run\n"
    ), resumed.stdout
    # two strategies timed 3 times: the resumed sweep runs its control job (scan's again) at its end
    assert f"{n}/{n} jobs + the control job ({len(finished_before)} FINISHED earlier), 0 failed" in resumed.stdout
    runs = store_client(outputs).search_runs([store_client(outputs).get_experiment_by_name("res").experiment_id])
    parents, children = split(runs)
    done = [r for r in children if r.info.status == "FINISHED" and "plnexp.control" not in r.data.tags]
    assert len(done) == n
    assert len({r.data.tags["config_hash"] for r in done}) == n  # no duplicate config
    (control,) = [r for r in children if "plnexp.control" in r.data.tags]  # the interrupted sweep ran none
    assert control.info.status == "FINISHED" and control.info.run_name.startswith("control-scan-")
    new_parent = next(p for p in parents if "resumes" in p.data.tags)
    assert new_parent.info.status == "FINISHED" and new_parent.data.tags["n_done"] == str(n)
    other = plnexp_main(
        "sweep",
        "sweep=null",
        *[a for a in grid if a != "n_iter=5"],
        "n_iter=6",
        "resume=true",
        cwd=tmp_path,
    )  # nothing matches: says why, runs every job
    assert other.returncode == 0, other.stderr
    first = other.stdout.splitlines()[0]
    assert first.startswith(f"resume: 0 of {n} job(s) matched") and "differs by n_iter: 6 here, 5 there;" in first
    runs = store_client(outputs).search_runs([store_client(outputs).get_experiment_by_name("res").experiment_id])
    again = plnexp_main("sweep", "sweep=null", *grid, "resume=true", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"all {n} jobs already FINISHED" in again.stdout
    assert len(store_client(outputs).search_runs([new_parent.info.experiment_id])) == len(runs)  # nothing new


@pytest.mark.slow
def test_resume_says_how_many_jobs_matched_and_names_the_nearest_run(outputs, monkeypatch):
    """resume=true is never silent: the matched count always, and when nothing matched (n_iter is
    hashed) the nearest FINISHED run and the keys by which it differs (the command prints the line:
    test_resume_an_interrupted_sweep_subprocess)."""
    monkeypatch.setattr(runner, "execute", _finished)
    uri = tracking.check_store()
    jobs = cli.plan([*TINY, "seed=0,1"], multirun=True)
    for job in jobs:
        job_task.run_job(JobSpec(job.config.as_study(), job.name, overrides=job.overrides))
    found = resume.match(uri, "rr", jobs)
    assert len(found.done) == 2 and found.line() == (
        "resume: 2 of 2 job(s) matched a FINISHED run of experiment 'rr'; those are reused, the others run"
    )
    other = cli.plan([*TINY, "seed=0,1", "n_iter=20"], multirun=True)
    found = resume.match(uri, "rr", other)
    assert found.done == [] and "resume: 0 of 2 job(s) matched a FINISHED run of experiment 'rr'" in found.line()
    assert "differs by n_iter: 20 here, 5 there; all jobs run" in found.line()
    near = cli.plan([*TINY, "seed=7", "n_iter=20", "strategy=fori_loop"], multirun=True)
    line = resume.match(uri, "rr", near).line()
    assert "; n_iter: 20 here, 5 there; seed: 7 here, " in line and "strategy.name: fori_loop here, scan there" in line
    assert "(it has no FINISHED job runs)" in resume.match(uri, "nothing-here", other).line()


def _finished(cfg, outcomes):
    (outcome,) = outcomes
    outcome.ended = outcome.started + 0.5
    return outcomes


@pytest.mark.slow
def test_resume_reuses_only_runs_timed_and_run_alike(outputs, monkeypatch):
    """A FINISHED run of the same config timed otherwise (another repeats) or run with other
    software (another XLA_FLAGS, as the provenance reads it) is not reused: the job runs again and
    the line names the run and the key that differs."""
    monkeypatch.setattr(runner, "execute", _finished)
    uri = tracking.check_store()
    jobs = cli.plan([*TINY, "seed=0,1", "repeats=1"], multirun=True)
    for job in jobs:
        job_task.run_job(JobSpec(job.config.as_study(), job.name, overrides=job.overrides))
    assert len(resume.match(uri, "rr", jobs).done) == 2  # alike: reused
    found = resume.match(uri, "rr", cli.plan([*TINY, "seed=0,1", "repeats=2"], multirun=True))
    assert found.done == [] and found.line().endswith("differs by repeats: 2 here, 1 there; all jobs run")
    before = os.environ.get("XLA_FLAGS", "")
    flags = f"{before} --xla_cpu_enable_fast_math=false".strip()
    monkeypatch.setenv("XLA_FLAGS", flags)
    found = resume.match(uri, "rr", jobs)
    assert found.done == [] and found.line().endswith(
        f"differs by XLA_FLAGS: {flags} here, {before or '(none)'} there; all jobs run"
    )


@pytest.mark.slow
def test_resume_runs_the_jobs_timed_otherwise_in_process(outputs, tmp_path, monkeypatch, plnexp_main):
    """The command line: a sweep, then the same grid with one more value of repeats, resumed. The
    job of the new value (the same config hash) runs, named apart, and the line says why."""
    monkeypatch.setattr(runner, "execute", _finished)
    base = ["sweep", "sweep=null", *TINY, "report=false"]
    first = plnexp_main(*base, "repeats=1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    again = plnexp_main(*base, "repeats=1,2", "resume=true", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    line = again.stdout.splitlines()[0]
    assert line.startswith("resume: 1 of 2 job(s) matched a FINISHED run of experiment 'rr'; those are reused, ")
    assert line.endswith(" differs by repeats: 2 here, 1 there"), line
    assert "[1/2] scan-synthetic_n50_p5_d2_s0-f32-cpu-n_iter5-repeats1 FINISHED earlier (run " in again.stdout
    assert "2/2 jobs (1 FINISHED earlier), 0 failed" in again.stdout
    children = [r for r in all_runs(outputs) if "mlflow.parentRunId" in r.data.tags]
    assert sorted((r.info.run_name, r.data.params["repeats"]) for r in children) == [
        ("scan-synthetic_n50_p5_d2_s0-f32-cpu-n_iter5", "1"),  # the first sweep's: one value, not named
        ("scan-synthetic_n50_p5_d2_s0-f32-cpu-n_iter5-repeats2", "2"),
    ]


@pytest.mark.slow  # a fit and its rerun (~4 s)
def test_a_rerun_with_overrides_is_named_as_its_config(outputs, capsys):
    out = original()
    assert out.name == "scan-synthetic_n50_p5_d2_s0-f32-cpu-n_iter5"
    assert main(["rerun", out.run_id, "precision=float64", "strategy=fori_loop"]) == 0
    (new,) = reruns_of(outputs, out.run_id)
    assert new.info.run_name == "fori_loop-synthetic_n50_p5_d2_s0-f64-cpu-n_iter5"


def test_runs_are_identified_by_config_hash_and_replicate():
    from plnexp.experiment import plan as cli
    from plnexp.jobs import provenance
    from plnexp.experiment import resume
    from plnexp.store.records import RunRecord

    (job,) = cli.plan(["dataset=synthetic", "dataset.n=30", "dataset.p=3", "n_iter=5"], multirun=False)
    h = provenance.config_hash(job.config)

    def run(run_id, **tags):
        return RunRecord(run_id, "1", "", "FINISHED", tags=tags)

    # a run of another replicate of the same config does not answer the job (replicate 0)
    assert resume._done([run("a" * 32, config_hash=h, replicate="1")], [job]) == []
    # a run logged before replicates were tagged is replicate 0
    (done,) = resume._done([run("b" * 32, config_hash=h)], [job])
    assert (done.job, done.config_hash, done.run_id) == (0, h, "b" * 32)


@pytest.mark.slow  # three tiny fits and their reruns (~10 s)
def test_a_rerun_that_fails_or_has_nothing_to_compare_is_not_reproduced(outputs, tmp_path, capsys):
    """#62: a rerun that ends FAILED exits 1 (the original FAILED too: nothing to compare), and a
    sweep's rerun counts a job whose original has no finished result among those not reproduced."""
    uri = tracking.check_store()
    record = sweep.open_sweep(tmp_path / "sw", "s", "rr", uri, 2, {})
    good = original(parent=record.parent, job_num=0)
    # adam's first step of 1e38 overflows float32: a non-finite ELBO at iteration 1, the run FAILED
    (job,) = cli.plan([*TINY, "optimizer=adam", "optimizer.lr=1e38"], multirun=False)
    bad = job_task.run_job(JobSpec(job.config, job.name, 1, job.overrides), parent=record.parent)
    assert bad.status == "FAILED" and "non-finite ELBO" in bad.reason
    sweep.close_sweep(record)
    capsys.readouterr()
    assert main(["rerun", bad.run_id]) == 1
    out = capsys.readouterr().out
    assert "the original run was FAILED: no finished result to compare with; the rerun ended FAILED" in out
    assert out.rstrip().splitlines()[-1].startswith("rerun FAILED to reproduce: run ")
    assert main(["rerun", record.parent_id]) == 1
    out = capsys.readouterr().out
    assert "rerun FAILED to reproduce: 1 of 2 jobs reproduced: " in out and f"{bad.name} did not" in out
    assert out.rsplit("reproduced: ", 1)[1].startswith(f"{bad.name} did not;") and good.name != bad.name


@pytest.mark.slow  # a tiny fit (~3 s)
def test_a_run_killed_before_it_logged_anything_can_be_rerun(outputs, capsys):
    """#62: a run's config is logged when it is created, so a run whose processes were SIGKILLed (a
    fit across processes: nothing logged at its end) can be rerun: the rerun finishes, and with
    nothing to compare it is not called reproduced (exit 1)."""
    (job,) = cli.plan(TINY, multirun=False)
    uri = tracking.check_store()
    cl = tracking.client(uri)
    out = runner.Outcome(job.name, tuple(job.overrides), job.config)
    run_id = tracking.start_job(cl, tracking.experiment_id(cl, "rr"), out)
    cl.set_terminated(run_id, "KILLED")  # as the launcher ends the run of a worker killed mid-fit
    assert tracking.open(uri).artifact(run_id, "config.yaml") == out.config_yaml()
    assert main(["rerun", run_id]) == 1
    text = capsys.readouterr().out
    assert "the original run was KILLED: no finished result to compare with" in text, text
    (new,) = reruns_of(outputs, run_id)
    assert new.info.status == "FINISHED" and new.info.run_name == job.name


def test_a_rerun_whose_h5ad_file_is_gone_names_the_file(outputs, tmp_path, capsys):
    """#62: a deleted data file is named as such (as a CSV's is), not as a run of an older plnexp."""
    anndata = pytest.importorskip("anndata")
    path = tmp_path / "cells.h5ad"
    anndata.AnnData(np.random.default_rng(0).poisson(2.0, (20, 4)).astype(np.float32)).write_h5ad(path)
    (job,) = cli.plan(["dataset=anndata", f"dataset.path={path}", "n_iter=3", "experiment=rr"], multirun=False)
    cl = tracking.client(tracking.check_store())
    out = runner.Outcome(job.name, tuple(job.overrides), job.config)
    run_id = tracking.start_job(cl, tracking.experiment_id(cl, "rr"), out)
    cl.set_terminated(run_id, "FAILED")
    path.unlink()
    capsys.readouterr()
    assert main(["rerun", run_id]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"plnexp: error: run {run_id}: dataset.path="), err
    assert "allowed values are paths of existing .h5ad files" in err and "older plnexp" not in err
    assert reruns_of(outputs, run_id) == []


@pytest.mark.slow  # a tiny fit (~3 s)
def test_a_rerun_whose_overrides_exceed_the_machine_is_refused_before_any_run(outputs, capsys, monkeypatch):
    """#62: a rerun's jobs get run's and sweep's checks (plan.check_data): an n_iter whose ELBO
    history the memory cannot hold is one line, exit 2, no rerun."""
    from plnexp.system import machine

    out = original()
    monkeypatch.setattr(machine, "available_memory", lambda: (10**9, "of memory available on this machine"))
    capsys.readouterr()
    assert main(["rerun", out.run_id, "n_iter=100000000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("plnexp: error: n_iter=100000000: needs ~2.8 GB"), err
    assert reruns_of(outputs, out.run_id) == []
