"""Peers (plnexp.peers): a peer's fit scored on plnexp's exact ELBO, its curve shifted onto it, its run
logged as one more child of a sweep, and a peer that is not installed or fails leaving the sweep be.

The scoring is checked against the tests' own float64 ELBO (tests/reference_np.py, not
plnexp.reference). The tests of the real pyPLNmodels fit need the ``peers`` extra (CI installs it)
and skip without it, saying so."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import time
from dataclasses import replace

import numpy as np
import pytest
from conftest import store_client
from reference_np import elbo_np, profiled_closed_forms

import plnexp
from plnexp import peers, tracking
from plnexp.fitting import FitResult
from plnexp.timing import Timing
from plnexp.sweep import GridJob, SweepRecord, Task

NEEDS_PYPLN = pytest.mark.skipif(
    importlib.util.find_spec("pyPLNmodels") is None,
    reason="pyPLNmodels not installed: pip install -e '.[peers]' (CI installs it)",
)


def tiny(n: int = 30, p: int = 4, seed: int = 3) -> plnexp.Data:
    return plnexp.simulate(n=n, p=p, d=2, seed=seed)


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


def _task(config, total: int = 1) -> Task:
    record = SweepRecord("sqlite:///unused.db", "0", "parent", "s", total, "host", os.getpid(), time.time())
    return Task(record=record, grid={i: GridJob(config, (), f"job{i}", "FINISHED") for i in range(total)})


def test_a_peer_not_installed_is_one_line_and_no_run(tiny_config, monkeypatch, capsys):
    """The import fails (simulated: None in sys.modules): one line with the install command, its row
    left out, nothing else done (the record's store is never reached)."""
    monkeypatch.setitem(sys.modules, "pyPLNmodels", None)
    assert peers.PEERS["pyplnmodels"].available() == f"not installed ({peers.install_hint()})"
    _task(_with_peers(tiny_config, "pyplnmodels")).peers()
    out = capsys.readouterr().out
    assert out == f"[peer] pyplnmodels: not installed ({peers.install_hint()}): its row is left out\n"
    assert "peers" in peers.install_hint()


def test_peers_need_this_process_to_have_run_the_grid(tiny_config, capsys):
    task = _task(_with_peers(tiny_config, "pyplnmodels"), total=2)
    del task.grid[1]  # a job ran elsewhere (a launcher of other processes): no peer, silently
    task.peers()
    assert capsys.readouterr().out == ""


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


def test_run_peer_logs_a_child_run_through_the_jobs_path(tiny_config, outputs):
    parent = _parent(outputs, "peer-run")
    out = peers.run_peer(fake_peer(fake_fit), tiny_config, parent, job_num=7)
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
    """Through the sweep's hook (Task.peers, its record pointing at a real parent): one line, the run
    FAILED with the reason, job number total + 1, and nothing raised."""

    def broken(data, *, warmup, repeats):
        raise peers.PeerError("pyPLNmodels' ELBO is not finite")

    monkeypatch.setitem(peers.PEERS, "pyplnmodels", fake_peer(broken))
    parent = _parent(outputs, "peer-fail")
    task = _task(_with_peers(tiny_config, "pyplnmodels"))
    assert task.record is not None
    task.record = replace(task.record, uri=parent.uri, experiment_id=parent.experiment_id, parent_id=parent.run_id)
    task.peers()
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


@NEEDS_PYPLN
@pytest.mark.slow
def test_a_sweep_with_a_peer_logs_its_run(outputs, plnexp_main, monkeypatch, tmp_path):
    """A real sweep in this process with report.peers=[pyplnmodels] (its fit capped at 20 iterations
    here): the peer's run is a child of the sweep, after the control job, with its metrics, its curve,
    the convergence metrics of the jobs and its tag; the sweep's count leaves it apart."""
    capped = replace(peers.PEERS["pyplnmodels"], fit=functools.partial(peers.pyplnmodels_fit, maxiter=20))
    monkeypatch.setitem(peers.PEERS, "pyplnmodels", capped)
    ran = plnexp_main(
        "sweep",
        "dataset=synthetic",
        "dataset.n=30",
        "dataset.p=5",
        "dataset.replication=1",
        "strategy=scan,fori_loop",
        "n_iter=5",
        "warmup=0",
        "report.peers=[pyplnmodels]",
        "experiment=peers",
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stderr
    assert (
        "[peer] pyplnmodels-synthetic_n30_p5_d2_s0-f32-cpu (the default fit of pyPLNmodels on job 1's data) ... done"
        in ran.stdout
    )
    assert "2/2 jobs + the control job + 1 peer run, 0 failed" in ran.stdout
    cl = store_client(outputs)
    exp = cl.get_experiment_by_name("peers")
    (run,) = [r for r in cl.search_runs([exp.experiment_id]) if r.data.tags.get(peers.PEER_TAG) == "pyplnmodels"]
    assert run.info.status == "FINISHED" and run.data.tags["plnexp.job"] == "3"  # 2 jobs, the control's 2
    m = run.data.metrics
    assert m["compile_s"] == 0.0 and m["n_iter_run"] == 20 and m["run_s"] > 0 and m["ms_per_iter"] > 0
    assert m["loglik"] < 0 and m["final_elbo"] == pytest.approx(m["loglik"], rel=1e-12)
    assert "optimum_elbo" in m and "gap_final_rel" in m  # the jobs' convergence metrics apply
    assert sorted(h.step for h in cl.get_metric_history(run.info.run_id, "elbo")) == list(range(20))
