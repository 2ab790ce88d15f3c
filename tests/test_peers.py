"""Peers (plnexp.jobs.peers): a peer's fit scored on plnexp's exact ELBO, its curve shifted onto it, its run
logged as one more child of a sweep, and a peer that is not installed or fails leaving the sweep be.

The scoring is checked against the tests' own float64 ELBOs (tests/reference_np.py, not
plnexp.core.reference), the PLN's and PLN-PCA's. A peer follows the job's model: pyPLNmodels' Pln beside
model=full or profiled, its PlnPCA of the job's rank beside model=pca; a model it does not fit is a
one-line ConfigError before any run. The tests of the real pyPLNmodels fit need the ``peers`` extra (CI installs it)
and skip without it, saying so."""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import sys
import time
from dataclasses import replace

import numpy as np
import pytest
from conftest import store_client
from reference_np import elbo_np, pca_elbo_np, profiled_closed_forms

import plnexp
from plnexp.experiment import plan as cli
from plnexp.experiment import job_task, peer_runs, sweep_extras
from plnexp.jobs import peers
from plnexp.jobs.tags import PEER_OF_TAG
from plnexp import store as tracking
from plnexp.jobs.config import ConfigError
from plnexp.fitting.engine import FitResult
from plnexp.measure.timing import Timing
from plnexp.experiment.job_task import Task
from plnexp.experiment.sweep_record import SweepRecord
from plnexp.jobs.spec import JobSpec, Kind

NEEDS_PYPLN = pytest.mark.skipif(
    importlib.util.find_spec("pyPLNmodels") is None,
    reason="pyPLNmodels not installed: pip install -e '.[peers]' (CI installs it)",
)


def tiny(n: int = 30, p: int = 4, seed: int = 3) -> plnexp.Data:
    return plnexp.simulate(n=n, p=p, d=2, seed=seed)


def tiny_pca(n: int = 40, p: int = 6, q: int = 2, seed: int = 3) -> plnexp.Data:
    return plnexp.simulate_pca(n=n, p=p, q=q, seed=seed)


PCA_JOB = ("dataset=synthetic_pca", "dataset.n=40", "dataset.p=6", "dataset.q=2", "model=pca", "model.rank=2")


def test_shifted_curve_moves_the_whole_curve_by_one_constant():
    curve, shift = peers.shifted_curve(np.array([-10.0, -5.0, -3.0]), -2.5, -100.0)
    assert shift == -97.5
    np.testing.assert_array_equal(curve, [-107.5, -102.5, -100.5])
    assert curve.dtype == np.float64


def test_score_is_the_exact_elbo_at_the_closed_forms():
    """score(): B and Sigma in closed form from the uncentred M and S, then plnexp's float64 ELBO with
    the exact log y!; against the tests' own closed forms (lstsq) and ELBO (a plain inverse), to 1e-10."""
    data = tiny()
    rng = np.random.default_rng(0)
    M = np.log(data.Y + 1.0) + 0.1 * rng.normal(size=data.Y.shape)  # uncentred: Z = O + M
    S = rng.uniform(0.2, 0.8, size=data.Y.shape)
    loglik, params = peers.score(data, M, S)
    B, R, Sigma = profiled_closed_forms(data.X, M, S)
    expected = elbo_np(data.Y, data.O, data.X, B, R, S, Sigma)
    assert loglik == pytest.approx(expected, rel=1e-10)
    for key, value in (("B", B), ("M", R), ("S", S), ("Sigma", Sigma)):
        np.testing.assert_allclose(params[key], value, rtol=1e-9, atol=1e-12)


def _with_peers(config, *names):
    return replace(config, report=replace(config.report, peers=tuple(names)))


def _record(total: int = 1) -> SweepRecord:
    """A sweep driven by this process (its jobs' lines printed here)."""
    return SweepRecord("sqlite:///unused.db", "0", "parent", "s", total, platform.node(), os.getpid(), time.time())


def _peer_specs(configs) -> list[JobSpec]:
    """The peers' jobs the plan adds after a grid of ``configs`` (sweep_extras.extras)."""
    grid = [JobSpec(c, f"job{i}", i) for i, c in enumerate(configs)]
    return [s for s in sweep_extras.extras(grid) if s.kind is Kind.PEER]


def test_a_peer_not_installed_is_one_line_and_no_run(tiny_config, monkeypatch, capsys):
    """The import fails (simulated: None in sys.modules): one line with the install command, its row
    left out, nothing else done (the record's store is never reached)."""
    monkeypatch.setitem(sys.modules, "pyPLNmodels", None)
    assert peers.PEERS["pyplnmodels"].available() == f"not installed ({peers.install_hint()})"
    (spec,) = _peer_specs([_with_peers(tiny_config, "pyplnmodels")])
    task = Task()
    task(spec, _record(), "")
    task(spec, _record(), "")  # said once per peer
    out = capsys.readouterr().out
    assert out == f"[peer] pyplnmodels: not installed ({peers.install_hint()}): its row is left out\n"
    assert "peers" in peers.install_hint()


def test_peers_need_the_driver_to_run_the_grid():
    """A launcher of other processes (joblib): the plan has no peer (nor control job); the basic
    launcher's plan has the peer after the grid."""
    grid = ("strategy=scan,fori_loop", "dataset=synthetic", "dataset.n=30", "dataset.p=5", "report.peers=[pyplnmodels]")
    elsewhere = cli.plan([*grid, "hydra/launcher=joblib"], multirun=True, check_device=False).specs()
    assert [s.kind for s in elsewhere] == [Kind.JOB, Kind.JOB]
    here = cli.plan(list(grid), multirun=True, check_device=False).specs()
    assert [s.kind for s in here] == [Kind.JOB, Kind.JOB, Kind.PEER] and here[-1].num == 3


def fake_peer(fit) -> peers.Peer:
    return replace(
        peers.PEERS["pyplnmodels"],
        available=lambda: None,
        fit=fit,
        versions=lambda: {"pyplnmodels_version": "0.0-test"},
        uses_gpu=lambda: False,
    )


def fake_fit(data, *, warmup, repeats):
    """A FitResult as a peer returns it (no pyPLNmodels): the data's own closed forms at log(Y + 1)."""
    loglik, params = peers.score(data, np.log(data.Y + 1.0), np.full(data.Y.shape, 0.5))
    timing = Timing(compile_s=0.0, first_call_s=np.nan, run_s=0.02, ms_per_iter=2.0, runs_s=(0.02,) * repeats)
    curve = np.linspace(loglik - 50.0, loglik - 1.0, 10)
    return FitResult(
        curve, loglik, params, 10, timing, "profiled", "fake", "rprop", "float32", "cpu", {"final_elbo_jit": loglik}
    )


def _parent(outputs, name: str) -> tracking.Parent:
    return tracking.open_parent(f"sqlite:///{outputs / 'mlflow.db'}", name, f"{name}-parent", {})


def _run_peer(pc: peer_runs.PeerConfig, parent, num: int):
    """The peer's job of ``pc`` as a sweep runs it: its spec through the one way a job runs."""
    assert pc.peer is not None
    return job_task.run_job(JobSpec(pc, pc.run_name, num, kind=Kind.PEER, peer=pc.peer.name), parent=parent)


def test_a_peers_job_logs_a_child_run_through_the_jobs_path(tiny_config, outputs):
    parent = _parent(outputs, "peer-run")
    out = _run_peer(peer_runs.peer_config(fake_peer(fake_fit), tiny_config), parent, 7)
    assert out.status == "FINISHED", out.reason
    run = store_client(outputs).get_run(out.run_id)
    tags, metrics, params = run.data.tags, run.data.metrics, run.data.params
    assert run.info.status == "FINISHED" and run.info.run_name == "pyplnmodels-synthetic_n30_p5_d2_s0-f32-cpu"
    assert tags["mlflow.parentRunId"] == parent.run_id and tags["plnexp.job"] == "7"
    assert tags[peers.PEER_TAG] == "pyplnmodels" and tags["pyplnmodels_version"] == "0.0-test"
    assert "config_hash" not in tags, "resume=true must never take a peer's run for a job's"
    assert params["strategy.name"] == "pyplnmodels" and params["peer.package"] == "pyPLNmodels"
    assert params["model"] == "profiled" and params["precision"] == "float32" and params["n_iter"] == "400"
    assert metrics["compile_s"] == 0.0 and metrics["n_iter_run"] == 10 and metrics["ms_per_iter"] == 2.0
    assert metrics["loglik"] == metrics["final_elbo"]
    history = store_client(outputs).get_metric_history(out.run_id, "elbo")
    assert sorted(m.step for m in history) == list(range(10))


def test_a_peer_that_fails_is_a_failed_run_and_one_line(tiny_config, outputs, monkeypatch, capsys):
    """Through the one way a job runs (a Task call of the plan's peer job, its record pointing at a
    real parent): one line, the run FAILED with the reason, job number total + 1, and nothing raised."""

    def broken(data, *, warmup, repeats):
        raise peers.PeerError("pyPLNmodels' ELBO is not finite")

    monkeypatch.setitem(peers.PEERS, "pyplnmodels", fake_peer(broken))
    parent = _parent(outputs, "peer-fail")
    (spec,) = _peer_specs([_with_peers(tiny_config, "pyplnmodels")])
    record = replace(_record(), uri=parent.uri, experiment_id=parent.experiment_id, parent_id=parent.run_id)
    task = Task()
    task(spec, record, "")
    assert task.failed == 0  # a peer's failure is its run's, never the sweep's
    line = capsys.readouterr().out
    assert line.startswith(
        "[peer] pyplnmodels-synthetic_n30_p5_d2_s0-f32-cpu (the default fit of pyPLNmodels on job 1's data) ... FAILED "
    )
    assert line.endswith(" s (PeerError: pyPLNmodels' ELBO is not finite)\n") and line.count("\n") == 1
    (run,) = store_client(outputs).search_runs([parent.experiment_id], f"tags.`{peers.PEER_TAG}` = 'pyplnmodels'")
    assert (
        run.info.status == "FAILED" and run.data.tags["status_reason"] == "PeerError: pyPLNmodels' ELBO is not finite"
    )
    assert run.data.tags["plnexp.job"] == "2"  # the grid's 1 job, the control's 1


# ---------------------------------------------------------------- the peer follows the job's model
def test_pca_score_is_the_exact_pca_elbo_at_the_parameters_as_they_are():
    """pca_score(): plnexp's float64 PCA ELBO with the exact log y! at B, C, M, S unchanged, against the
    tests' own per-row ELBO (tests/reference_np.py), to 1e-10; the per-row offsets' view as plnexp keeps it."""
    data = tiny_pca()
    rng = np.random.default_rng(1)
    B = rng.normal(size=(data.X.shape[1], data.p))
    C = 0.3 * rng.normal(size=(data.p, 2))
    M = rng.normal(size=(data.n, 2))
    S = rng.uniform(0.2, 0.8, size=(data.n, 2))
    loglik, params = peers.pca_score(data.Y, data.O, data.X, B, C, M, S)
    assert loglik == pytest.approx(pca_elbo_np(data.Y, data.O, data.X, B, C, M, S), rel=1e-10)
    assert sorted(params) == ["B", "C", "M", "S"] and all(v.dtype == np.float64 for v in params.values())
    np.testing.assert_array_equal(params["C"], C)


def test_the_peer_follows_the_jobs_model():
    """Pln beside full and profiled (plnexp's profiled model), PlnPCA of the job's rank beside pca:
    its class, the call as its users write it, plnexp's model and the rank."""
    peer = peers.PEERS["pyplnmodels"]
    for model in ("full", "profiled"):
        pln = peers.following(peer, model)
        assert (pln.cls, pln.model, pln.rank) == ("Pln", "profiled", None)
        assert pln.call == "Pln(Y, exog=X, offsets=O, add_const=False).fit()" == peer.call
    pca = peers.following(peer, "pca", 2)
    assert (pca.cls, pca.model, pca.rank) == ("PlnPCA", "pca", 2)
    assert pca.call == "PlnPCA(Y, exog=X, offsets=O, rank=2, add_const=False).fit()"
    assert peers.following(pca, "full") == peers.following(peer, "full")  # from the job's model alone


def _fits_no_pca(monkeypatch) -> peers.Peer:
    """pyPLNmodels' peer as if it fitted the PLN model only (every model plnexp has is one it fits)."""
    peer = peers.PEERS["pyplnmodels"]
    narrow = replace(peer, fits={k: v for k, v in peer.fits.items() if k != "pca"})
    monkeypatch.setitem(peers.PEERS, "pyplnmodels", narrow)
    return narrow


def test_a_model_the_peer_cannot_fit_is_one_line_before_any_run(monkeypatch, outputs):
    """At config validation (cli.plan: before any job of a sweep runs), naming the field and the models
    the peer fits; following() says the same as PeerError; without the peer the job is valid."""
    narrow = _fits_no_pca(monkeypatch)
    want = "model=pca with report.peers=[pyplnmodels]: allowed values are full, profiled (the models pyPLNmodels fits as a peer)"
    with pytest.raises(ConfigError) as e:
        cli.plan([*PCA_JOB, "report.peers=[pyplnmodels]"], multirun=False)
    assert str(e.value) == want
    with pytest.raises(peers.PeerError) as e2:
        peers.following(narrow, "pca", 2)
    assert str(e2.value) == want
    (job,) = cli.plan(list(PCA_JOB), multirun=False)
    assert job.config.report.peers == ()


def test_a_rank_outside_the_data_is_one_line_before_pyplnmodels_is_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyPLNmodels", None)  # an import would fail otherwise
    for rank in (0, 7, True):
        with pytest.raises(
            peers.PeerError, match=r"^rank=.*: allowed values are integers from 1 to p=6 \(the data's variables\)$"
        ):
            peers.pyplnmodels_fit(tiny_pca(), rank=rank)


def fake_pca_fit(data, *, warmup, repeats, rank):
    """A FitResult of model=pca as the peer returns it (no pyPLNmodels): scored by pca_score."""
    rng = np.random.default_rng(0)
    B, C = np.zeros((data.X.shape[1], data.p)), 0.1 * rng.normal(size=(data.p, rank))
    loglik, params = peers.pca_score(data.Y, data.O, data.X, B, C, np.zeros((data.n, rank)), np.ones((data.n, rank)))
    timing = Timing(compile_s=0.0, first_call_s=np.nan, run_s=0.02, ms_per_iter=2.0, runs_s=(0.02,) * repeats)
    curve = np.linspace(loglik - 50.0, loglik, 10)
    return FitResult(
        curve, loglik, params, 10, timing, "pca", "fake", "rprop", "float32", "cpu", {"final_elbo_jit": loglik}
    )


def test_a_pca_peer_run_is_logged_with_its_class_call_and_rank(outputs):
    """Beside a model=pca job (rank 2, block_rows 20): the fit gets rank=2; the run says PlnPCA and its
    call in its params, model pca of rank 2 without the job's blocks, its name ends as a job's does
    (-pca-rank2), and it has the criteria of a pca run (n_params of rank 2) but no convergence metrics."""
    (job,) = cli.plan([*PCA_JOB, "model.block_rows=20", "n_iter=3"], multirun=False)
    seen = []

    def fit(data, *, warmup, repeats, rank):
        seen.append(rank)
        return fake_pca_fit(data, warmup=warmup, repeats=repeats, rank=rank)

    parent = _parent(outputs, "peer-pca")
    out = _run_peer(peer_runs.peer_config(fake_peer(fit), job.config), parent, 3)
    assert out.status == "FINISHED", out.reason
    assert seen == [2]
    run = store_client(outputs).get_run(out.run_id)
    params, metrics = run.data.params, run.data.metrics
    assert run.info.run_name == "pyplnmodels-synthetic_pca_n40_p6_q2_s0-f32-cpu-pca-rank2"
    assert params["peer.class"] == "PlnPCA"
    assert params["peer.call"] == "PlnPCA(Y, exog=X, offsets=O, rank=2, add_const=False).fit()"
    assert params["model.name"] == "pca" and params["model.rank"] == "2" and "model.block_rows" not in params
    assert run.data.tags[peers.PEER_TAG] == "pyplnmodels"
    assert metrics["n_params"] == 6 * (1 + 2) - 1 and "bic" in metrics and "icl" in metrics
    assert "optimum_elbo" not in metrics  # pca has no best known ELBO (plnexp.fitting.optimum)


def test_the_pln_peer_run_says_its_class_too(tiny_config, outputs):
    pc = peer_runs.peer_config(fake_peer(fake_fit), tiny_config)
    out = _run_peer(pc, _parent(outputs, "peer-pln"), 2)
    params = store_client(outputs).get_run(out.run_id).data.params
    assert params["peer.class"] == "Pln" and params["peer.call"] == "Pln(Y, exog=X, offsets=O, add_const=False).fit()"


def test_one_peer_run_per_data_set_and_what_the_peer_fits_there(monkeypatch, outputs):
    """A grid of model=full, profiled and pca of ranks 1 and 2 on one data set: one Pln run (full and
    profiled alike) and one PlnPCA run per rank, in job order."""
    monkeypatch.setitem(peers.PEERS, "pyplnmodels", fake_peer(fake_fit))
    base = ("dataset=synthetic_pca", "dataset.n=40", "dataset.p=6", "dataset.q=2", "report.peers=[pyplnmodels]")
    configs = [
        cli.plan([*base, *extra], multirun=False)[0].config
        for extra in ((), ("model=profiled",), ("model=pca", "model.rank=1"), ("model=pca", "model.rank=2"))
    ]
    ran = [(s.peer, int(s.run_tags[PEER_OF_TAG]), s.num) for s in _peer_specs(configs)]
    assert ran == [("pyplnmodels", 0, 5), ("pyplnmodels", 2, 6), ("pyplnmodels", 3, 7)]


# ---------------------------------------------------------------- the real pyPLNmodels
@NEEDS_PYPLN
@pytest.mark.slow  # importing torch and pyPLNmodels: 4-6 s
def test_pyplnmodels_fit_is_scored_and_its_curve_shifted_onto_the_exact_elbo():
    """Its loglik is the tests' own ELBO at its fitted parameters (1e-10); its shifted curve after k
    updates is the exact ELBO of a k-iteration fit (its fits are deterministic) to its float32
    rounding (1e-6 of the ELBO; measured 3e-8)."""
    data = tiny()
    res = peers.pyplnmodels_fit(data, warmup=0, repeats=2, maxiter=30, tol=0.0)
    p = res.params
    assert res.n_iter == 30 and len(res.elbo) == 30 and res.precision == "float32"
    assert res.loglik == pytest.approx(elbo_np(data.Y, data.O, data.X, p["B"], p["M"], p["S"], p["Sigma"]), rel=1e-10)
    assert res.timing.compile_s == 0.0 and len(res.timing.runs_s) == 2 and res.timing.run_s > 0
    assert res.extra["final_elbo_jit"] == pytest.approx(res.loglik, rel=1e-12)
    assert res.extra["elbo_shift"] != 0  # Stirling's log y! and its constants: not plnexp's ELBO as is
    for k in (1, 12):
        short = peers.pyplnmodels_fit(data, warmup=0, maxiter=k, tol=0.0)
        assert res.elbo[k] == pytest.approx(short.loglik, rel=1e-6)
    assert np.all(np.diff(res.elbo) > -1e-3 * abs(res.loglik))  # and it climbs


# a sweep of two strategies on tiny synthetic data with the pyPLNmodels peer beside it
PEER_SWEEP = (
    "dataset=synthetic",
    "dataset.n=30",
    "dataset.p=5",
    "dataset.replication=1",
    "strategy=scan,fori_loop",
    "n_iter=5",
    "warmup=0",
    "report.peers=[pyplnmodels]",
)


@pytest.fixture
def capped_pyplnmodels(monkeypatch):
    """pyPLNmodels' peer in this process's registry with its fits capped at 20 iterations."""
    capped = replace(peers.PEERS["pyplnmodels"], fit=functools.partial(peers.pyplnmodels_fit, maxiter=20))
    monkeypatch.setitem(peers.PEERS, "pyplnmodels", capped)
    return capped


@NEEDS_PYPLN
@pytest.mark.slow
def test_a_sweep_with_a_peer_logs_its_run(outputs, plnexp_main, capped_pyplnmodels, tmp_path):
    """A real sweep in this process with report.peers=[pyplnmodels] (its fit capped at 20 iterations
    here): the peer's run is a child of the sweep, after the jobs (never in their interleaved rounds:
    a guest's default fit, timed once), with its metrics, its curve, the convergence metrics of the
    jobs and its tag; the sweep's count leaves it apart."""
    ran = plnexp_main("sweep", *PEER_SWEEP, "experiment=peers", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert (
        "[peer] pyplnmodels-synthetic_n30_p5_d2_s0-f32-cpu (the default fit of pyPLNmodels on job 1's data) ... done"
        in ran.stdout
    )
    assert "2/2 jobs + 1 peer run, 0 failed" in ran.stdout
    cl = store_client(outputs)
    exp = cl.get_experiment_by_name("peers")
    (run,) = [r for r in cl.search_runs([exp.experiment_id]) if r.data.tags.get(peers.PEER_TAG) == "pyplnmodels"]
    assert run.info.status == "FINISHED" and run.data.tags["plnexp.job"] == "3"  # 2 jobs, the control's number 2
    assert "plnexp.verdict" not in run.data.tags
    m = run.data.metrics
    assert m["compile_s"] == 0.0 and m["n_iter_run"] == 20 and m["run_s"] > 0 and m["ms_per_iter"] > 0
    assert m["loglik"] < 0 and m["final_elbo"] == pytest.approx(m["loglik"], rel=1e-12)
    assert "optimum_elbo" in m and "gap_final_rel" in m  # the jobs' convergence metrics apply
    assert sorted(h.step for h in cl.get_metric_history(run.info.run_id, "elbo")) == list(range(20))


@NEEDS_PYPLN
@pytest.mark.slow
def test_a_sweep_with_a_peer_reruns_whole_and_reproduces(outputs, plnexp_main, capped_pyplnmodels, tmp_path):
    """``rerun PARENT`` of a sweep with report.peers: its jobs, its control job and its peer's run
    are rerun (the peer in this process, after the jobs, as a sweep runs it), each tagged with the
    run it repeats, and every curve is the original's bit for bit (CPU, same config and environment)."""
    # report.rounds=0 and 3 timed runs a job: a control job, so that the rerun covers that kind of run too
    ran = plnexp_main(
        "sweep", *PEER_SWEEP, "report=false", "report.rounds=0", "repeats=3", "experiment=peers", cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stderr
    cl = store_client(outputs)
    exp = cl.get_experiment_by_name("peers")
    (parent,) = [r for r in cl.search_runs([exp.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    again = plnexp_main("rerun", parent.info.run_id, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "rerun ok: 4 of 4 jobs reproduced" in again.stdout  # 2 jobs, the control job, the peer's run
    # #62: the peer's run numbered past the control job's, as a sweep numbers it: a peer run, not "the control job"
    assert "3/3 jobs + 1 peer run, " in again.stdout and "the control job" not in again.stdout, again.stdout
    runs = cl.search_runs([exp.experiment_id], "tags.rerun_of != ''")
    reruns = {r.data.tags["rerun_of"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    originals = [
        r for r in cl.search_runs([exp.experiment_id]) if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    ]
    assert sorted(reruns) == sorted(r.info.run_id for r in originals) and len(originals) == 4
    (peer,) = [r for r in originals if r.data.tags.get(peers.PEER_TAG) == "pyplnmodels"]
    new = reruns[peer.info.run_id]
    assert new.data.tags[peers.PEER_TAG] == "pyplnmodels" and new.data.tags["rerun.identical"] == "true"
    for r in originals:
        assert reruns[r.info.run_id].data.tags["rerun.identical"] == "true", r.info.run_name
    alone = plnexp_main("rerun", peer.info.run_id, cwd=tmp_path)  # the peer's run by itself: a run of its own
    assert alone.returncode == 0 and "rerun ok" in alone.stdout, alone.stdout + alone.stderr


@NEEDS_PYPLN
@pytest.mark.slow  # importing torch and pyPLNmodels: 4-6 s
def test_plnpca_fit_is_scored_on_the_exact_pca_elbo_and_its_curve_shifted_onto_it():
    """PlnPCA(rank=2) on 40 x 6 counts of rank 2: its loglik is the tests' own per-row PCA ELBO at its
    fitted B, C, M, S (1e-10: both float64 at the same parameters), as is score_plnpca's on a fitted
    model (what benchmarks/pca.py calls); its shifted curve after k updates is the exact ELBO of a
    k-iteration fit (its random start seeded alike: its fits are deterministic), to its float32
    rounding (1e-6 of the ELBO)."""
    data = tiny_pca()
    res = peers.pyplnmodels_fit(data, warmup=0, repeats=1, rank=2, maxiter=30, tol=0.0)
    p = res.params
    assert res.model == "pca" and res.extra["class"] == "PlnPCA" and res.n_iter == 30 and len(res.elbo) == 30
    assert p["B"].shape == (1, 6) and p["C"].shape == (6, 2) and p["M"].shape == p["S"].shape == (40, 2)
    assert res.loglik == pytest.approx(pca_elbo_np(data.Y, data.O, data.X, p["B"], p["C"], p["M"], p["S"]), rel=1e-10)
    assert res.extra["final_elbo_jit"] == pytest.approx(res.loglik, rel=1e-12) and res.extra["elbo_shift"] != 0
    short = peers.pyplnmodels_fit(data, warmup=0, rank=2, maxiter=12, tol=0.0)
    assert res.elbo[12] == pytest.approx(short.loglik, rel=1e-6)

    # a PlnPCA fitted here as benchmarks/pca.py fits it (seeded_pyplnmodels): the sweep peer's start, its fit
    Y, O = (np.ascontiguousarray(a, dtype=np.float64) for a in (data.Y, data.O))
    with peers.seeded_pyplnmodels(Y, O, data.X, rank=2) as model, peers.quiet():
        model.fit(maxiter=12, tol=0.0)
    B, C, M, S = peers.plnpca_parameters(model)
    assert B.dtype == np.float64 and C.shape == (6, 2)
    assert peers.score_plnpca(Y, O, data.X, model)[0] == pytest.approx(pca_elbo_np(Y, O, data.X, B, C, M, S), rel=1e-10)
    assert peers.score_plnpca(Y, O, data.X, model)[0] == pytest.approx(short.loglik, rel=1e-12)  # one seed, one fit


@NEEDS_PYPLN
@pytest.mark.slow
def test_a_pca_sweep_with_the_peer_logs_plnpca_per_rank(outputs, plnexp_main, capped_pyplnmodels, tmp_path):
    """A real sweep of model=pca over ranks 1 and 2 with report.peers=[pyplnmodels] (its fits capped at
    20 iterations here): one PlnPCA run per rank, each with its class, call and rank in its params."""
    ran = plnexp_main(
        "sweep",
        *PCA_JOB[:-1],
        "model.rank=1,2",
        "strategy=scan",
        "n_iter=5",
        "repeats=1",
        "time_budget_s=0",
        "report.peers=[pyplnmodels]",
        "experiment=pca-peers",
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stderr
    assert "2/2 jobs + 2 peer runs, 0 failed" in ran.stdout
    cl = store_client(outputs)
    exp = cl.get_experiment_by_name("pca-peers")
    runs = [r for r in cl.search_runs([exp.experiment_id]) if r.data.tags.get(peers.PEER_TAG) == "pyplnmodels"]
    by_rank = {r.data.params["model.rank"]: r for r in runs}
    assert sorted(by_rank) == ["1", "2"]
    for q, run in by_rank.items():
        assert run.info.status == "FINISHED" and run.info.run_name.endswith(f"-pca-rank{q}")
        assert run.data.params["peer.class"] == "PlnPCA"
        assert run.data.params["peer.call"] == f"PlnPCA(Y, exog=X, offsets=O, rank={q}, add_const=False).fit()"
        assert run.data.metrics["n_iter_run"] == 20 and run.data.metrics["loglik"] < 0
