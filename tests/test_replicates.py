"""``replicates=K``: K fits in one vmapped program, each the single fit with its seed (or data set);
and ``scan_sharded`` on this suite's one device (the two-device tests: tests/test_multidevice.py).

Tolerances (relative, max |x - ref| <= tol * max |ref|): float64 1e-9 as everywhere (measured
<= 1e-14: vmap batches the same operations, the sums run in the same order).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import store_client

import plnexp
from plnexp.experiment import runner

RTOL = 1e-9
N_ITER = 50
DATA = ["dataset=synthetic", "dataset.n=30", "dataset.p=5"]


@pytest.fixture(scope="module")
def small():
    return plnexp.simulate(n=61, p=8, d=2, seed=1)


def close(a, b, tol=RTOL):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return np.max(np.abs(a - b)) <= tol * np.max(np.abs(b))


@pytest.mark.parametrize(
    "strategy,model",
    [("scan", "full"), ("while_loop", "profiled"), pytest.param("fori_loop", "full", marks=pytest.mark.slow)],
)
def test_each_replicate_is_the_single_fit_with_its_seed(strategy, model, small):
    kw = dict(
        model=model,
        optimizer="radam_clip",
        n_iter=N_ITER,
        precision="float64",
        strategy=strategy,
        init="random",
        timed=False,
    )
    batch = plnexp.fit_replicates(small, 3, seed=5, **kw)
    assert [r.replicate for r in batch] == [0, 1, 2]
    for k, got in enumerate(batch):
        want = plnexp.fit(small, seed=5 + k, **kw)
        assert got.n_iter == want.n_iter
        assert close(got.elbo, want.elbo), (k, np.max(np.abs(got.elbo - want.elbo)))
        for name in ("B", "M", "S", "Sigma"):
            assert close(got.params[name], want.params[name]), (k, name)
    # the seeds do give different fits (else the comparison above would prove nothing)
    assert abs(batch[0].elbo[0] - batch[1].elbo[0]) > 1e-3 * abs(batch[0].elbo[0])


@pytest.mark.slow
def test_replicates_of_k_data_sets_are_their_single_fits():
    datas = [plnexp.simulate(n=40, p=6, d=2, seed=10 + k) for k in range(3)]
    kw = dict(model="profiled", optimizer="rprop", n_iter=N_ITER, precision="float64", strategy="scan", timed=False)
    batch = plnexp.fit_replicates(datas, 3, **kw)
    for k, got in enumerate(batch):
        want = plnexp.fit(datas[k], **kw)
        assert close(got.elbo, want.elbo) and close(got.params["M"], want.params["M"]), k
        assert got.loglik == pytest.approx(want.loglik, rel=RTOL)
    with pytest.raises(ValueError, match=r"^replicates=3: got 2 data sets \(give 1 or 3\)$"):
        plnexp.fit_replicates(datas[:2], 3, **kw)


@pytest.mark.slow  # (two devices: tests/test_multidevice.py)
@pytest.mark.parametrize("via", ["jit", "shard_map"])
@pytest.mark.parametrize("model", ["full", "profiled"])
def test_scan_sharded_on_one_device_is_scan(model, via, small):
    """One device: the mesh has one device and the program is scan's fit on it (stated in the README)."""
    kw = dict(model=model, optimizer="radam_clip", n_iter=N_ITER, precision="float64", timed=False)
    want = plnexp.fit(small, strategy="scan", **kw)
    got = plnexp.fit(small, strategy="scan_sharded", via=via, **kw)
    assert close(got.elbo, want.elbo) and close(got.params["S"], want.params["S"])


@pytest.mark.slow
def test_a_diverged_replicate_fails_alone(monkeypatch, small):
    """The runner's verdict per replicate: a non-finite ELBO fails that run only (the divergence is
    planted in replicate 1's returned curve; the fits themselves are real)."""
    from plnexp.experiment import plan as cli
    from plnexp.fitting import engine as fitting

    real = fitting.run_all

    def one_diverges(data, spec, **kw):
        results = real(data, spec, **kw)
        results[1].elbo[7:] = np.nan
        return results

    monkeypatch.setattr(fitting, "run_all", one_diverges)
    (job,) = cli.plan([*DATA, "strategy=scan", "replicates=3", "init=random", "n_iter=20"], multirun=False)
    outs = [runner.Outcome(f"r{k}", (), job.config, replicate=k) for k in range(3)]
    runner.execute(job.config, outs)
    assert [o.status for o in outs] == ["FINISHED", "FAILED", "FINISHED"]
    assert outs[1].reason == "non-finite ELBO at iteration 7" and len(outs[1].curve()) == 7
    assert runner.combined(outs).reason == "1 of 3 replicates FAILED: non-finite ELBO at iteration 7"


@pytest.mark.slow  # ~2-3 s: in CI; the fast subset stays under 2 minutes
def test_sweep_with_replicates_logs_one_child_per_replicate(outputs, capsys):
    from plnexp.__main__ import main

    args = [
        "sweep",
        "sweep=null",
        *DATA,
        "strategy=scan",
        "replicates=3",
        "init=random",
        "n_iter=20",
        "experiment=reps",
        "report=false",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "1/1 jobs (3 runs), 0 runs failed" in out, out
    cl = store_client(outputs)
    runs = cl.search_runs([cl.get_experiment_by_name("reps").experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = sorted(
        (r for r in runs if r is not parent and "mlflow.parentRunId" in r.data.tags),
        key=lambda r: r.data.tags["replicate"],
    )
    assert [r.data.tags["replicate"] for r in children] == ["0", "1", "2"]
    assert {r.info.status for r in children} == {"FINISHED"} and parent.data.tags["n_done"] == "1"
    assert [r.info.run_name.rsplit("-", 1)[1] for r in children] == ["rep0", "rep1", "rep2"]
    # K synthetic data sets (seeds dataset.seed + k): each replicate's own data and curve
    assert len({r.data.tags["data_digest"] for r in children}) == 3
    assert len({r.data.metrics["final_elbo"] for r in children}) == 3
    for r in children:  # the batch's compile; a third of its run each
        m = r.data.metrics
        assert m["replicates"] == 3 and m["run_s"] == pytest.approx(m["batch_run_s"] / 3)
        assert len(cl.get_metric_history(r.info.run_id, "elbo")) == 20
    assert len({r.data.metrics["compile_s"] for r in children}) == 1
    # resuming finds the job done: all three replicates FINISHED under one parent
    assert main([*args, "resume=true"]) == 0
    assert "resume: all 1 jobs already FINISHED" in capsys.readouterr().out


@pytest.mark.slow
def test_rerun_of_a_replicate_and_of_a_replicates_sweep(outputs, capsys):
    """A replicate reruns in its batch and is compared with its own replicate (bit for bit); a sweep
    of replicates reruns one job per batch, not one per run."""
    from plnexp.__main__ import main

    assert (
        main(
            [
                "sweep",
                "sweep=null",
                *DATA,
                "strategy=scan",
                "replicates=3",
                "init=random",
                "n_iter=10",
                "experiment=rr",
                "report=false",
            ]
        )
        == 0
    )
    cl = store_client(outputs)
    runs = cl.search_runs([cl.get_experiment_by_name("rr").experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    (rep1,) = [r for r in runs if r.data.tags.get("replicate") == "1"]
    capsys.readouterr()
    assert main(["rerun", rep1.info.run_id]) == 0
    assert "ELBO curves: identical, bit for bit (10 iterations)" in capsys.readouterr().out
    names = sorted(r.info.run_name for r in cl.search_runs([parent.info.experiment_id]) if "rerun_of" in r.data.tags)
    assert names == sorted(r.info.run_name for r in runs if r.data.tags.get("replicate"))  # -rep1, not -rep1-rep1
    assert main(["rerun", parent.info.run_id]) == 0
    out = capsys.readouterr().out
    # #62: every replicate's run compared with its rerun, not replicate 0's alone
    assert "1 of 1 jobs reproduced" in out and out.count("identical, bit for bit") == 3, out
