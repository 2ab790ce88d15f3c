"""plnexp.report.summary on a store whose runs are known: each job's fit is faked (chosen timings and ELBO
curves) and logged through the real runner and tracking code; the report is then read back from
the store and checked against the logged numbers, recomputed here independently."""

from __future__ import annotations

import csv
import io
import struct

import numpy as np
import pytest
from conftest import store_client

from plnexp.experiment import plan as cli
from plnexp.measure import floor
from plnexp.measure import plots
from plnexp.jobs import provenance
from plnexp.jobs import ranking
from plnexp.report import compiler_table, sweep_figures, sweep_plots
from plnexp.report import headline as plain
from plnexp.report import summary as report
from plnexp.experiment import job_task, runner
from plnexp.jobs.spec import JobSpec
from plnexp.experiment import sweep
from plnexp import store as tracking
from plnexp.fitting.engine import FitResult
from plnexp.core.model import PLN_WORK
from plnexp.measure.timing import Timing

# (strategy, n rows) -> (compile_s, ms_per_iter, iterations run)
KNOWN = {
    ("eager", 30): (0.0, 10.0, 5),
    ("scan", 30): (1.2, 2.0, 8),
    ("fori_loop", 30): (1.1, 2.5, 8),
    ("eager", 60): (0.0, 12.0, 5),
    ("scan", 60): (1.3, 4.0, 8),
    ("fori_loop", 60): (1.4, 5.0, 8),
}
# the floor the n=30 jobs log (copy GB/s, dot ms: plnexp.measure.floor's parts); the n=60 ones log none (older runs)
KNOWN_FLOOR = {30: (0.0105, 0.3)}


def known_curve(strategy: str, n: int, length: int) -> np.ndarray:
    """An ELBO curve rising to a plateau; fori_loop's and eager's differ from scan's by rounding-size noise."""
    base = -n * 1e4 * np.exp(-np.arange(length) / 2.0) - n * 100.0
    noise = {"scan": 0.0, "fori_loop": 3e-7, "eager": 1e-6}[strategy]
    return base * (1 + noise * np.sin(np.arange(length) + 1))


def fake_execute(cfg, outcomes):
    (outcome,) = outcomes
    n = cfg.dataset.n
    compile_s, ms, length = KNOWN[(cfg.strategy.name, n)]
    curve = known_curve(cfg.strategy.name, n, length)
    runs = tuple(ms * length / 1e3 * (1 + d) for d in (-0.02, 0.01, 0.0, -0.01, 0.02))  # median: ms/iter
    timing = Timing(
        compile_s=compile_s, first_call_s=float("nan"), run_s=ms * length / 1e3, ms_per_iter=ms, runs_s=runs
    )
    outcome.result = FitResult(
        curve,
        float(curve[-1]),
        {},
        length,
        timing,
        "full",
        cfg.strategy.name,
        "radam_clip",
        "float32",
        "TFRT_CPU_0",
        {"final_elbo_jit": float(curve[-1]) + 1.0},
    )
    outcome.data_digest, outcome.data_shape = "abc", (n, cfg.dataset.p)
    if n in KNOWN_FLOOR:
        copy_GBps, dot_ms = KNOWN_FLOOR[n]
        it = floor.Iteration(n, cfg.dataset.p, cfg.dataset.p, PLN_WORK)  # the full model's
        outcome.floor = floor.Floor(it, "float32", copy_GBps, 2**20, dot_ms).metrics()
    outcome.stop()
    return outcomes


def job_config(strategy: str, n: int):
    (job,) = cli.plan(
        ["dataset=synthetic", f"dataset.n={n}", "dataset.p=5", f"strategy={strategy}", "n_iter=8"], multirun=False
    )
    return job.config


def fake_sweep(tmp_path, monkeypatch, keys, name="sw", tags=None, control=None):
    """A closed sweep of the jobs ``keys`` ((strategy, n) pairs); returns its record. ``control``: one
    of the keys, run again after the grid as the sweep's control job (tagged as plnexp.experiment.sweep_extras.extras
    tags it): the same fake timings, an A/A pair 0% apart."""
    monkeypatch.setattr(runner, "execute", fake_execute)
    uri = tracking.check_store()
    record = sweep.open_sweep(tmp_path / name, "known", "known", uri, len(keys), {"command": "test", **(tags or {})})
    for i, (strategy, n) in enumerate(keys):
        job_task.run_job(
            JobSpec(job_config(strategy, n), f"{strategy}-{n}", i, (f"strategy={strategy}",)), parent=record.parent
        )
    if control is not None:
        strategy, n = control
        job_task.run_job(
            JobSpec(
                job_config(strategy, n),
                f"control-{strategy}-{n}",
                len(keys),
                (f"strategy={strategy}",),
                tags={ranking.CONTROL_TAG: "true", ranking.CONTROL_OF_TAG: str(keys.index(control))},
            ),
            parent=record.parent,
        )
    sweep.close_sweep(record, "FINISHED")
    return record


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name}: not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
def test_report_numbers_equal_the_logged_metrics(outputs, tmp_path, monkeypatch):
    record = fake_sweep(tmp_path, monkeypatch, list(KNOWN), control=("scan", 60))
    rep, folder, files = report.build(tracking.tracking_uri(), run_id=record.parent_id)
    assert folder == outputs / "reports" / "known" / record.parent_id
    assert set(files) == {"report.html", "report.md", "report.csv", "elbo_curves.png", "timings.png", "scaling.png"}

    cl = store_client(outputs)
    rows = list(csv.DictReader(io.StringIO((folder / "report.csv").read_text())))
    assert len(rows) == len(KNOWN) + 1  # and the control job's row, marked
    (control,) = [r for r in rows if r["strategy"] == "scan (control)"]
    assert cl.get_run(control["run_id"]).data.tags[ranking.CONTROL_TAG] == "true"
    rows.remove(control)
    by_key = {}
    for row in rows:
        run = cl.get_run(row["run_id"])
        m = run.data.metrics
        for col in ("compile_s", "run_s", "ms_per_iter", "final_elbo", "n_iter_run"):
            assert float(row[col]) == m[col], (row["strategy"], col)
        assert row["shape"] == f"{run.data.tags['data_n']}x5"
        by_key[(row["strategy"], int(run.data.tags["data_n"]))] = (row, m, run.info.run_id)

    for (strategy, n), (row, m, run_id) in by_key.items():
        eager_ms = by_key[("eager", n)][1]["ms_per_iter"]
        scan_ms = by_key[("scan", n)][1]["ms_per_iter"]
        assert float(row["speedup_vs_eager"]) == pytest.approx(eager_ms / m["ms_per_iter"], rel=1e-12)
        assert float(row["speedup_vs_scan"]) == pytest.approx(scan_ms / m["ms_per_iter"], rel=1e-12)
        # agreement with scan's curve, recomputed from the logged step metric, over the common length
        mine = np.array([x.value for x in sorted(cl.get_metric_history(run_id, "elbo"), key=lambda x: x.step)])
        scan = np.array(
            [x.value for x in sorted(cl.get_metric_history(by_key[("scan", n)][2], "elbo"), key=lambda x: x.step)]
        )
        k = min(len(mine), len(scan))
        assert k == min(KNOWN[(strategy, n)][2], 8)
        expected = np.max(np.abs(mine[:k] - scan[:k]) / np.abs(scan[:k]))
        assert float(row["max_rel_diff_to_scan"]) == pytest.approx(expected, rel=1e-9, abs=1e-300)
        # eager ran 5 iterations, the others 8: the table also compares at the common length 5
        assert float(row["elbo_at_common_length"]) == mine[4]
        # x floor: the run's ms/iter over the floor it logged, recomputed from the floor's logged parts
        if n in KNOWN_FLOOR:
            copy_GBps, dot_ms = m["floor_copy_GBps"], m["floor_dot_ms"]
            assert (copy_GBps, dot_ms) == KNOWN_FLOOR[n]
            floor_ms = 1e3 * 14 * n * 5 * 4 / (copy_GBps * 1e9) + 2 * dot_ms
            assert float(row["x_floor"]) == pytest.approx(m["ms_per_iter"] / floor_ms, rel=1e-9)
        else:  # a run that logged no floor
            assert row["x_floor"] == "" and "floor_ms_per_iter" not in m

    # scan, n=30: 2.00 ms/iter over 14*30*5*4 bytes at 10.5 MB/s (0.8 ms) + 2 x 0.3 ms = 1.4 ms
    assert float(
        next(r for r, _, _ in by_key.values() if r["strategy"] == "scan" and r["shape"] == "30x5")["x_floor"]
    ) == (pytest.approx(2.0 / 1.4, rel=1e-3))
    md = (folder / "report.md").read_text()
    assert md.count("\n| ") == len(KNOWN) + 1 + 2  # per group (2) a header, one line per run (the control's too)
    assert "Compiled programs" not in md  # no run logged XLA's figures (the compiler table's own tests below)
    table = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if line.startswith("| ")]
    # without rounds each group ranks its jobs' own medians, fastest first, said to be so
    assert table[0][:3] == ["strategy", "ms/iter (own runs)", "time ÷ scan"]
    assert [(r[0], r[1]) for r in table if r[0] != "strategy"] == [
        ("scan", "2.00"),
        ("fori_loop", "2.50"),
        ("eager", "10.00"),
        ("scan", "4.00"),
        ("fori_loop", "5.00"),
        ("eager", "12.00"),
        ("scan (control)", "4.00"),
    ]
    assert "compare at iteration 5" in md
    for name in ("elbo_curves.png", "timings.png", "scaling.png"):
        w, h = png_size(folder / name)
        assert 500 <= w <= 3000 and 300 <= h <= 3000, (name, w, h)

    # the parent run: summary metrics about the largest data (n=60), the report as artifacts, a note
    parent = cl.get_run(record.parent_id)
    assert parent.data.metrics["best_ms_per_iter"] == 4.0
    assert parent.data.metrics["best_speedup_vs_eager"] == pytest.approx(3.0)
    assert parent.data.metrics["best_speedup_vs_scan"] == pytest.approx(1.0)
    assert parent.data.metrics["n_failed"] == 0 and parent.data.metrics["n_jobs"] == 6  # the grid's
    # scan 1.25× fori_loop at n=60, the control's A/A pair 0% apart: a winner beyond the noise
    assert parent.data.tags["fastest_strategy"] == "scan"
    assert "the control job" in parent.data.tags["mlflow.note.content"]
    assert "ms_per_iter" in parent.data.tags["mlflow.note.content"]
    assert {a.path for a in cl.list_artifacts(record.parent_id, "report")} == {f"report/{f}" for f in files}


def test_terminal_summary_names_the_fastest_and_the_failures(outputs, tmp_path, monkeypatch):
    keys = [("eager", 30), ("scan", 30), ("fori_loop", 30)]
    record = fake_sweep(tmp_path, monkeypatch, keys, control=("scan", 30))
    rep = report.load(tracking.tracking_uri(), tracking.open(tracking.tracking_uri()).run(record.parent_id))
    lines = report.summary_lines(rep)
    # 5 runs each, interquartile ranges 1.98-2.02 (scan) and 2.475-2.525 (fori_loop): apart; the
    # control job landed on scan's timings (0% apart)
    assert lines[0].startswith(
        "fastest on synthetic_n30_p5_d2_s0 (30×5), float32, cpu: scan 2.00 ms/iter "
        "[1.98–2.02, 5 runs] (1.25× next: fori_loop, 5.0× eager; A/A noise 0% (the control pair), "
        "minimum effect 1.10×)"
    ), lines[0]
    assert lines[-1] == "3 of 3 jobs + the control job finished"
    # at report time, another minimum effect: 1.25× is not 1.3×
    again = report.load(tracking.tracking_uri(), rep.parent, min_speedup=1.3)
    assert report.summary_lines(again)[0].startswith(
        "tied within noise (A/A noise 0% (the control pair); minimum effect 1.30×)"
    )
    # the same sweep without its control job: no noise estimate, no winner, said so
    plain = fake_sweep(tmp_path, monkeypatch, keys, name="plain")
    rep = report.load(tracking.tracking_uri(), tracking.open(tracking.tracking_uri()).run(plain.parent_id))
    assert report.summary_lines(rep)[0].startswith(
        "no winner named on synthetic_n30_p5_d2_s0 (30×5), float32, cpu: no noise estimate: no A/A pair"
    )
    assert report.parent_metrics(rep, [])[1]["fastest_strategy"] == ""


@pytest.mark.slow
def test_one_data_size_has_no_scaling_plot_and_equal_lengths_no_common_column(outputs, tmp_path, monkeypatch):
    record = fake_sweep(tmp_path, monkeypatch, [("scan", 30), ("fori_loop", 30)])
    _, folder, files = report.build(tracking.tracking_uri(), run_id=record.parent_id)
    assert "scaling.png" not in files and not (folder / "scaling.png").exists()
    assert "elbo_at_common_length" not in (folder / "report.csv").read_text().splitlines()[0]


@pytest.mark.slow
def test_a_resumed_sweep_reports_the_runs_it_reused(outputs, tmp_path, monkeypatch):
    first = fake_sweep(tmp_path, monkeypatch, [("scan", 30), ("fori_loop", 30)], "a")
    second = fake_sweep(tmp_path, monkeypatch, [("eager", 30)], "b", {provenance.RESUMES_TAG: first.parent_id})
    rep, _, _ = report.build(tracking.tracking_uri(), run_id=second.parent_id)
    assert sorted(e.strategy for e in rep.entries) == ["eager", "fori_loop", "scan"]


@pytest.mark.slow
def test_a_second_report_replaces_the_first_whole(outputs, tmp_path, monkeypatch):
    record = fake_sweep(tmp_path, monkeypatch, [("scan", 30), ("fori_loop", 30)])
    _, folder, _ = report.build(tracking.tracking_uri(), run_id=record.parent_id)
    (folder / "stale.txt").write_text("from an earlier report")
    report.build(tracking.tracking_uri(), run_id=record.parent_id)
    assert not (folder / "stale.txt").exists() and (folder / "report.md").exists()
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temporary folder left


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "holds no sweep (no parent run); run `python -m plnexp sweep` first"),
        (["--run", "0123456789abcdef"], "--run 0123456789abcdef: not found in the store"),
        (["--experiment", "nope"], "--experiment nope: no such experiment in the store"),
        (["--colour", "red"], "--colour: unknown argument; allowed are --experiment, --run, --out"),
        (["--run"], "--run: needs a value"),
        (["--min-speedup", "0.9"], "--min-speedup=0.9: allowed values are numbers >= 1"),
        (["--min-speedup=fast"], "--min-speedup='fast': allowed values are numbers >= 1"),
    ],
)
def test_bad_report_requests_are_one_line_and_exit_2(outputs, capsys, args, message):
    assert report.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_report_on_a_job_or_a_single_run_names_the_parent(outputs, tmp_path, monkeypatch, capsys):
    record = fake_sweep(tmp_path, monkeypatch, [("scan", 30)])
    child = tracking.open(tracking.tracking_uri()).sweep(record.parent_id)[0]
    assert report.main(["--run", child.run_id]) == 2
    assert f"a job of the sweep whose parent run is {record.parent_id}" in capsys.readouterr().err
    single = job_task.run_job(JobSpec(job_config("scan", 30), "single"))
    assert report.main(["--run", single.run_id]) == 2
    assert "a single run, not a sweep" in capsys.readouterr().err


def test_report_without_a_store_creates_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PLNEXP_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert report.main([]) == 2
    assert "does not exist yet: no sweep to report on" in capsys.readouterr().err
    assert not (tmp_path / "out" / "mlflow.db").exists()


@pytest.mark.slow
def test_report_out_and_newest_sweep_of_an_experiment(outputs, tmp_path, monkeypatch, capsys):
    fake_sweep(tmp_path, monkeypatch, [("scan", 30)], "a")
    newest = fake_sweep(tmp_path, monkeypatch, [("scan", 30), ("eager", 30)], "b")
    assert report.main(["--experiment", "known", "--out", str(tmp_path / "mine")]) == 0
    out = capsys.readouterr().out
    assert f"also on parent run {newest.parent_id}" in out
    assert (tmp_path / "mine" / "report.md").exists()


@pytest.mark.parametrize("others", [{}, {"fori_loop": "same"}, {"fori_loop": "same", "eager": "noisy"}])
def test_elbo_curves_png_with_curves_equal_to_scan_bit_for_bit(tmp_path, others):
    scan = known_curve("scan", 30, 8)
    curves = {
        "scan": scan,
        **{k: scan.copy() if v == "same" else known_curve("eager", 30, 8) for k, v in others.items()},
    }
    path = sweep_plots.elbo_curves_png([sweep_plots.CurvePanel("t", curves)], tmp_path / "c.png")
    w, h = png_size(path)
    assert w >= 500 and h >= 300


def test_a_runs_elbo_figure_fits_its_fixed_margins_at_any_scale(tmp_path):
    """elbo_png's fixed margins (no layout engine) hold every label of the figure, whatever the
    ELBO's scale and sign, an offset on its axis, NaN at its start or a long run."""
    i = np.arange(300.0)
    decay = 1 + np.exp(-i / 30)
    curves = [-s * decay for s in (1e-3, 10.0, 1e4, 2e5, 5e5, 1e12)] + [2e5 * decay, -123456.7 - 3.3 * decay]
    curves += [np.where(i < 5, np.nan, -2e5 * decay), -2e5 * (1 + np.exp(-np.arange(100_000) / 3e3))]
    title = "scan_full_float32_synthetic_n50_p20_d2_s0_seed=3  (FINISHED)"
    for curve in curves:
        fig = plots.elbo_figure(curve, title)
        assert fig.get_layout_engine() is None
        fig.draw_without_rendering()
        box, (w, h) = fig.get_tightbbox(), fig.get_size_inches()
        assert 0 <= box.x0 and box.x1 <= w and 0 <= box.y0 and box.y1 <= h, (curve[-1], box)
    assert png_size(plots.elbo_png(curves[2], title, tmp_path / "e.png")) == (600, 350)


def test_converged_tells_a_plateau_from_a_descent():
    i = np.arange(200.0)
    assert sweep_plots.converged(-1e3 * np.exp(-i / 10) - 5.0)
    assert not sweep_plots.converged(-1e3 + i)
    assert not sweep_plots.converged(np.array([-3.0, -2.0]))


def test_gap_curve_is_log10_of_the_gap_to_the_best_floored_at_the_precision(outputs):
    config = job_config("scan", 30)
    o = runner.Outcome("x", (), config)
    curve = np.array([-1000.0, -10.0, -1.0, -1.0])
    fake = FitResult(
        curve,
        -1.0,
        {},
        4,
        Timing(compile_s=0, first_call_s=0, run_s=0, ms_per_iter=0),
        "full",
        "scan",
        "sgd",
        "float32",
        "cpu",
    )
    o.result = fake
    eps = float(np.finfo(np.float32).eps)
    np.testing.assert_allclose(o.gap_curve(), np.log10([999.0, 9.0, eps, eps]))


@pytest.mark.slow
def test_a_real_sweep_reports_at_its_end(swept):
    """The session's real sweep (conftest's ``swept``: ``python -m plnexp sweep``, scan and fori_loop
    on oaks, no report=false) made its report when it ended, led by the verdict of its interleaved
    rounds (plnexp.experiment.groups: no control job then), which the parent's note and tag carry."""
    (folder,) = (swept.outputs / "reports" / "strategies").iterdir()
    assert folder.name == swept.parent_id
    md = (folder / "report.md").read_text()
    assert "oaks (116×114), float32, cpu:" in md and "\n| scan | " in md and "\n| fori_loop | " in md
    rep = report.load(swept.uri, tracking.open(swept.uri).run(swept.parent_id))
    (verdict,) = rep.verdicts
    assert verdict.reference == "scan" and {s.strategy for s in verdict.strategies} == {"scan", "fori_loop"}
    first = plain.lines(verdict, rep.group_label(next(iter(rep.groups))))[0]  # the plain headline
    assert md.index("## Verdict") < md.index(first) < md.index("## Runs") < md.index("## Glossary")
    assert "report.html" in {p.name for p in folder.iterdir()}
    # one source of truth: report.csv's rows and ratios are the verdict's, fastest first
    rows = list(csv.DictReader(io.StringIO((folder / "report.csv").read_text())))
    ranked = sorted(verdict.strategies, key=lambda s: s.ratio)
    assert [r["strategy"] for r in rows] == [s.strategy for s in ranked]
    assert [float(r["paired_ratio"]) for r in rows] == pytest.approx([s.ratio for s in ranked], rel=1e-12)
    tags = store_client(swept.outputs).get_run(folder.name).data.tags
    note, winner = tags["mlflow.note.content"], tags["fastest_strategy"]
    assert f"- {first}" in note
    assert winner == verdict.fastest()  # one source: the rounds
    fori = next(s for s in verdict.strategies if s.strategy == "fori_loop")
    if winner:  # named only beyond the minimum effect, from the paired interval
        assert fori.verdict in ("faster", "slower") and winner == ("fori_loop" if fori.verdict == "faster" else "scan")
    assert not any(e.control for e in rep.entries)  # the rounds replace the control job


@pytest.mark.slow
def test_a_sweep_told_not_to_report_makes_no_report(outputs, monkeypatch, plnexp_main):
    """report=false: the sweep ends without its report (its fits faked: the switch is the point here;
    a real sweep's report is checked above)."""
    monkeypatch.setattr(runner, "execute", fake_execute)
    args = ["sweep", "sweep=null", "dataset=synthetic", "dataset.n=30", "dataset.p=5", "strategy=scan", "n_iter=8"]
    ran = plnexp_main(*args, "report=false")
    assert ran.returncode == 0, ran.stderr
    assert not (outputs / "reports").exists()
    cl = store_client(outputs)
    runs = cl.search_runs([e.experiment_id for e in cl.search_experiments()])
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}  # the sweep ran: parent and job


@pytest.mark.slow
def test_a_strategy_swept_over_its_own_option_is_one_row_per_value(outputs, tmp_path, monkeypatch):
    """strategy.tol=1e-3,1e-6 of while_loop used to overwrite itself (rows keyed on the name)."""

    def fake(cfg, outcomes):
        (outcome,) = outcomes
        tol = getattr(cfg.strategy.options, "tol", 0.0)
        length = 8 if tol < 1e-4 else 5  # the looser tolerance stops earlier
        curve = known_curve("scan", 30, length)
        timing = Timing(
            compile_s=1.0,
            first_call_s=float("nan"),
            run_s=2.0 * length / 1e3,
            ms_per_iter=2.0,
            runs_s=(2.0 * length / 1e3,),
        )
        outcome.result = FitResult(
            curve,
            float(curve[-1]),
            {},
            length,
            timing,
            "full",
            cfg.strategy.name,
            "radam_clip",
            "float32",
            "TFRT_CPU_0",
            {"final_elbo_jit": float(curve[-1])},
        )
        outcome.data_digest, outcome.data_shape = "abc", (30, 5)
        outcome.stop()
        return outcomes

    monkeypatch.setattr(runner, "execute", fake)
    uri = tracking.check_store()
    jobs = cli.plan(
        [
            "dataset=synthetic",
            "dataset.n=30",
            "dataset.p=5",
            "n_iter=8",
            "strategy=while_loop",
            "strategy.tol=1e-3,1e-6",
        ],
        multirun=True,
    )
    record = sweep.open_sweep(tmp_path / "o", "options", "options", uri, 3, {"command": "test"})
    (scan,) = cli.plan(["dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=8"], multirun=False)
    for i, job in enumerate([scan, *jobs]):
        job_task.run_job(JobSpec(job.config, job.name, i, job.overrides), parent=record.parent)
    sweep.close_sweep(record, "FINISHED")
    rep, folder, _ = report.build(uri, run_id=record.parent_id)
    rows = list(csv.DictReader(io.StringIO((folder / "report.csv").read_text())))
    assert sorted(r["strategy"] for r in rows) == ["scan", "while_loop tol=0.001", "while_loop tol=1e-06"]
    assert {r["strategy"]: int(float(r["n_iter_run"])) for r in rows}["while_loop tol=0.001"] == 5


@pytest.mark.slow
def test_panels_and_references_never_cross_precision_or_model(outputs, tmp_path, monkeypatch):
    """sweep=precision's shape: float32/float64 x full/profiled. Each ELBO panel and each curve
    comparison stays inside one group (the old report drew all four in one panel against scan f32 full)."""
    monkeypatch.setattr(runner, "execute", fake_execute)
    uri = tracking.check_store()
    jobs = cli.plan(
        [
            "dataset=synthetic",
            "dataset.n=30",
            "dataset.p=5",
            "n_iter=8",
            "strategy=scan,fori_loop",
            "precision=float32,float64",
            "model=full,profiled",
        ],
        multirun=True,
    )
    record = sweep.open_sweep(tmp_path / "p", "precision", "precision", uri, len(jobs), {"command": "test"})
    for i, job in enumerate(jobs):
        job_task.run_job(JobSpec(job.config, job.name, i, job.overrides), parent=record.parent)
    sweep.close_sweep(record, "FINISHED")
    panels = []
    monkeypatch.setattr(sweep_plots, "elbo_curves_png", lambda p, path: panels.extend(p))
    rep = report.load(uri, tracking.open(uri).run(record.parent_id))
    sweep_figures.figures(rep, tmp_path)
    assert len(panels) == len(rep.groups) == 4
    for panel in panels:
        assert len(panel.curves) == 2  # scan and fori_loop of one precision and model
    titles = [p.title for p in panels]
    assert len(set(titles)) == 4 and all(("float32" in t) != ("float64" in t) for t in titles)
    # one row per run, float32 beside float64: the float64 ELBO at its parameters, the compiled one, their
    # difference (fake_execute: compiled = loglik + 1), the float64 ELBO relative to the float64 run's
    table = report.precision_table(rep)
    assert len(table) == 2 + 8  # header, rule, one row per strategy x model x precision
    number = lambda c: float(c.strip().replace(",", ""))
    rows = [row.strip("|").split("|") for row in table[2:]]
    base = {tuple(c.strip() for c in r[:5]): number(r[6]) for r in rows if r[5].strip() == "float64"}
    for cells in rows:
        key, precision = tuple(c.strip() for c in cells[:5]), cells[5].strip()
        loglik, compiled, diff = (number(c) for c in cells[6:9])
        assert diff == pytest.approx(compiled - loglik, abs=0.11) and diff == pytest.approx(1.0, abs=0.11)
        if precision == "float64":
            assert cells[9].strip() == "-"
        else:
            assert number(cells[9]) == pytest.approx((loglik - base[key]) / abs(base[key]), rel=1e-2, abs=1e-12)
        assert cells[10].strip() in ("not logged",) or float(cells[10]) >= 0  # gap_final_rel where logged
    for group, entries in rep.groups.items():  # each run compared with its own group's scan
        assert {e.precision for e in entries} == {group[2]} and len({e.params["model"] for e in entries}) == 1
        assert all(e.vs_scan < 1e-5 for e in entries)


def test_the_summary_counts_the_whole_grid(outputs, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "execute", fake_execute)
    uri = tracking.check_store()
    record = sweep.open_sweep(tmp_path / "g", "grid", "grid", uri, 4, {"command": "test"})
    for i, strategy in enumerate(("scan", "fori_loop")):
        job_task.run_job(JobSpec(job_config(strategy, 30), strategy, i), parent=record.parent)
    sweep.close_sweep(record, "KILLED")
    rep = report.load(uri, tracking.open(uri).run(record.parent_id))
    assert report.summary_lines(rep)[-1] == "2 of 4 jobs finished (2 not started)"


def test_scaling_slopes_use_the_sizes_every_strategy_has():

    # scan: y = n exactly (slope 1); eager: y = n^2 at 10 and 100 but failed at 1000 (missing)
    series = {"scan": ([10, 100, 1000], [10.0, 100.0, 1000.0]), "eager": ([10, 100], [100.0, 10000.0])}
    slopes, missing, span = sweep_plots.common_slopes(series)
    assert slopes["scan"] == pytest.approx(1.0) and slopes["eager"] == pytest.approx(2.0)
    assert missing == {"scan": [], "eager": [1000.0]} and span == (10.0, 100.0)
    # a non-finite point is missing too
    slopes, missing, _ = sweep_plots.common_slopes({"a": ([10, 100, 1000], [1.0, 10.0, float("nan")])})
    assert missing == {"a": []} and slopes["a"] == pytest.approx(1.0)


def test_the_iqr_column_is_the_spread_of_the_timed_runs():
    # timing.Spread: quartiles from 5 runs on, the whole range below; report.csv's n_runs beside it says which
    from plnexp.report.csv_table import _iqr_ms
    from plnexp.report.summary import Entry

    def entry(runs_s):
        lo, hi = min(runs_s), max(runs_s)
        if len(runs_s) >= 5:
            import statistics

            lo, _, hi = statistics.quantiles(runs_s, n=4, method="inclusive")
        metrics = {"ms_per_iter": 1.0, "n_iter_run": 100.0, "run_s_lo": lo, "run_s_hi": hi, "n_runs": len(runs_s)}
        return Entry("r", "r", "FINISHED", "", "scan", "oaks", 116, 114, "cpu", "float32", {}, metrics)

    assert _iqr_ms(entry([0.10, 0.12, 0.11])) == pytest.approx(0.20)  # (0.12 - 0.10) s / 100 iterations
    assert _iqr_ms(entry([0.10, 0.11, 0.12, 0.13, 0.30])) == pytest.approx(0.20)  # q3 - q1 = 0.13 - 0.11: no outlier
    assert np.isnan(_iqr_ms(Entry("r", "r", "FAILED", "", "scan", "oaks", 116, 114, "cpu", "float32", {}, {})))


# ---------------------------------------------------------------- the compiler table, bytes.png
MiB = 2**20
XLA = ("trace_s", "lower_s", "xla_compile_s", "xla_instructions", "xla_fusions", "xla_flops_per_iter")


def xla_entry(strategy, ms, fp, *, compile_s=1.0, peak=100 * MiB, nbytes=50 * MiB, control=False, spread=0.01):
    """A finished run on oaks x100 (11600 x 114, float32) whose program ``fp`` XLA described (``fp``
    "": no XLA program, no such figures, as eager and PyTorch log)."""
    metrics = {
        "ms_per_iter": ms,
        "n_iter_run": 100,
        "n_runs": 5,
        "run_s_lo": ms * (1 - spread) / 10,
        "run_s_hi": ms * (1 + spread) / 10,
        "compile_s": compile_s if fp else 0.0,
    }
    if fp:
        metrics.update(
            trace_s=0.2 * compile_s,
            lower_s=0.1 * compile_s,
            xla_compile_s=0.7 * compile_s,
            xla_instructions=1234.0,
            xla_fusions=56.0,
            xla_flops_per_iter=3.5e9,
            xla_bytes_per_iter=nbytes,
            peak_bytes=peak,
        )
    tags = {"hlo_fingerprint": fp, "host": "h", "cpu_model": "c", "config_hash": f"h-{strategy}"}
    if control:
        tags.update({ranking.CONTROL_TAG: "true", ranking.CONTROL_OF_TAG: "0"})
    name = f"{'control-' if control else ''}{strategy}"
    return report.Entry(
        f"id-{name}", name, "FINISHED", "", strategy, "oaks_x100", 11600, 114, "cpu", "float32", {}, metrics, tags=tags
    )


def hand_report(entries) -> report.Report:
    """A report of hand-built entries (no store): the parent run a stand-in."""
    from types import SimpleNamespace

    parent = SimpleNamespace(
        info=SimpleNamespace(run_id="p", status="FINISHED"),
        data=SimpleNamespace(tags={"sweep": "t", "jobs": str(sum(not e.control for e in entries))}),
    )
    rep = report.Report("t", parent, entries, [])  # a stand-in parent run
    report.compare(rep)
    return rep


def test_the_compiler_table_reads_xlas_figures_and_dashes_what_is_missing():
    entries = [
        xla_entry("scan", 7.0, "aaaaaaaaaaaa", nbytes=80 * MiB),
        xla_entry("scan_namedtuple", 7.1, "bbbbbbbbbbbb", compile_s=1.2),
        xla_entry("scan_pytree", 7.3, "bbbbbbbbbbbb", compile_s=1.4),
        xla_entry("eager", 50.0, ""),
        xla_entry("scan", 7.05, "aaaaaaaaaaaa", control=True, nbytes=1.0),  # never a row of its own
    ]
    rows = compiler_table.compiler_rows(hand_report(entries), next(iter(hand_report(entries).groups)))
    assert [(r.program, r.strategies) for r in rows] == [
        ("aaaaaaaa", "scan"),
        ("bbbbbbbb", "scan_namedtuple = scan_pytree"),
        ("–", "eager"),
    ]
    floor_bytes = 14 * 11600 * 114 * 4  # the floor's 14 n x p float32 arrays
    assert rows[0].bytes_x_floor == pytest.approx(80 * MiB / floor_bytes)
    assert rows[1].values["compile_s"] == pytest.approx(1.3)  # the median over the program's runs
    assert rows[1].values["xla_compile_s"] == pytest.approx(0.7 * 1.3)
    lines = compiler_table.compiler_table(hand_report(entries))
    header = next(line for line in lines if line.startswith("| program"))
    assert header == (
        "| program | strategies | ms/iter | instructions | fusions | bytes/iter | bytes/iter ÷ floor bytes | "
        "flops/iter | peak memory | compile s | trace s | lower s | XLA compile s |"
    )
    table = [line for line in lines if line.startswith("| ")][1:]
    assert table[0] == (
        f"| aaaaaaaa | scan | 7.00 | 1,234 | 56 | 80.0 MiB | {80 * MiB / floor_bytes:.2f} | 3.50 GFLOP | "
        "100.0 MiB | 1.000 | 0.200 | 0.100 | 0.700 |"
    )
    assert table[2] == "| – | eager | 50.00 | – | – | – | – | – | – | 0.000 | – | – | – |"  # absent: "–"
    # runs older than XLA's figures (or eager and PyTorch alone): no table, no bytes.png panel, no error
    old = [xla_entry("scan", 7.0, ""), xla_entry("fori_loop", 8.0, "")]
    assert compiler_table.compiler_table(hand_report(old)) == []
    rep = hand_report(old)
    assert sweep_figures.bytes_panel(rep, next(iter(rep.groups))) is None


@pytest.mark.parametrize(
    "compile_s, peak, said",
    [
        ((1.0, 2.3), (100, 110), "; they differ in compile time (scan_unrolled 2.3× scan's)"),
        ((1.0, 1.4), (100, 180), "; they differ in peak memory (scan_unrolled 1.8× scan's)"),
        ((1.0, 1.6), (100, 160), "; they differ in compile time (scan_unrolled 1.6× scan's) and peak memory"),
        ((1.0, 1.4), (100, 140), ""),  # under report.DIFFER (1.5×): nothing to add
    ],
)
def test_a_tie_still_says_what_differs_beyond_the_threshold(compile_s, peak, said):
    entries = [
        xla_entry("scan", 7.0, "a", compile_s=compile_s[0], peak=peak[0] * MiB),
        xla_entry("scan_unrolled", 7.2, "u", compile_s=compile_s[1], peak=peak[1] * MiB),  # 1.03×: tied
        xla_entry("scan", 7.0, "a", compile_s=compile_s[0], peak=peak[0] * MiB, control=True),
    ]
    rep = hand_report(entries)
    line = report.ranked_line(rep, next(iter(rep.groups)))
    assert line.startswith("tied within noise (A/A noise 0% (the control pair); minimum effect 1.10×) on oaks_x100")
    if said:
        assert said in line, line
    else:
        assert "differ in" not in line, line
    # one program's strategies are named as one in the tie
    entries.append(xla_entry("scan_pytree", 7.1, "u", compile_s=compile_s[1], peak=peak[1] * MiB))
    assert "scan_unrolled = scan_pytree (one program)" in report.ranked_line(
        hand_report(entries), ("oaks_x100", "cpu", "float32")
    )


@pytest.mark.slow
def test_bytes_png_has_a_labelled_point_per_program(tmp_path):
    entries = [
        xla_entry("scan", 7.0, "a", nbytes=80 * MiB),
        xla_entry("scan_namedtuple", 7.1, "b", nbytes=81 * MiB),
        xla_entry("scan_pytree", 7.3, "b", nbytes=81 * MiB),
        xla_entry("jit_per_function", 14.0, "j", nbytes=900 * MiB),
        xla_entry("eager", 50.0, ""),
    ]
    rep = hand_report(entries)
    panel = sweep_figures.bytes_panel(rep, next(iter(rep.groups)))
    assert panel is not None
    assert panel.points == {
        "scan": (80 * MiB, 7.0),
        "scan_namedtuple = scan_pytree": (81 * MiB, pytest.approx(7.2)),
        "jit_per_function": (900 * MiB, 14.0),
    }
    assert panel.missing == ["eager"] and panel.floor_bytes == 14 * 11600 * 114 * 4
    w, h = png_size(sweep_plots.bytes_png([panel, panel], tmp_path / "b.png"))
    assert 500 <= w <= 3000 and 300 <= h <= 3000


@pytest.mark.slow
def test_a_sweep_with_xlas_figures_reports_them(outputs, tmp_path, monkeypatch):
    """Runs that log XLA's figures (their fits faked, the figures added to what they log): the table
    and bytes.png in the report, the figures per run in report.csv."""
    logged = runner.Outcome.metrics

    def with_xla(self):
        out = logged(self)
        if self.result is not None and self.config.strategy.name != "eager":
            nbytes = {"scan": 20e3, "fori_loop": 24e3}[self.config.strategy.name]
            out.update(dict.fromkeys(XLA, 1.0), xla_bytes_per_iter=nbytes, peak_bytes=4e5)
        return out

    monkeypatch.setattr(runner.Outcome, "metrics", with_xla)
    record = fake_sweep(tmp_path, monkeypatch, [("eager", 30), ("scan", 30), ("fori_loop", 30)], control=("scan", 30))
    _, folder, files = report.build(tracking.tracking_uri(), run_id=record.parent_id)
    assert "bytes.png" in files and png_size(folder / "bytes.png")[0] >= 500
    md = (folder / "report.md").read_text()
    assert "Compiled programs" in md and "| – | eager |" in md
    rows = {r["strategy"]: r for r in csv.DictReader(io.StringIO((folder / "report.csv").read_text()))}
    assert float(rows["scan"]["xla_bytes_per_iter"]) == 20e3 and rows["eager"]["xla_bytes_per_iter"] == ""
    assert float(rows["scan"]["bytes_x_floor"]) == pytest.approx(20e3 / (14 * 30 * 5 * 4))


# ---------------------------------------------------------------- the control job, in a real sweep
TINY_GRID = [
    "sweep=null",
    "dataset=synthetic",
    "dataset.n=30",
    "dataset.p=5",
    "n_iter=5",
    "warmup=0",
    "time_budget_s=0",
]


@pytest.mark.slow  # three tiny real fits in process (~10 s)
def test_a_sweep_runs_its_control_job_and_the_report_uses_it(outputs, tmp_path, plnexp_main):
    """Two strategies timed 3 times (repeats: the default), without interleaved rounds
    (report.rounds=0): after the grid, scan's job runs again as the control job (job number 2,
    tagged), the grid counts 2 jobs, and the report pairs it with scan's."""
    ran = plnexp_main("sweep", *TINY_GRID, "strategy=fori_loop,scan", "experiment=ctl", "report.rounds=0", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert (
        "[control] control-scan-synthetic_n30_p5_d2_s0-f32-cpu-n_iter5 (job 2 again: the report's A/A pair) ... done"
        in (ran.stdout)
    ), ran.stdout
    assert "2/2 jobs + the control job, 0 failed" in ran.stdout
    cl = store_client(outputs)
    runs = cl.search_runs([cl.get_experiment_by_name("ctl").experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {r.info.run_name: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    control = children.pop("control-scan-synthetic_n30_p5_d2_s0-f32-cpu-n_iter5")
    assert control.info.status == "FINISHED" and parent.info.status == "FINISHED"
    assert control.data.tags[ranking.CONTROL_TAG] == "true" and control.data.tags[ranking.CONTROL_OF_TAG] == "1"
    assert control.data.tags[tracking.JOB_TAG] == "2" and control.data.tags[ranking.MIN_SPEEDUP_TAG] == "1.1"
    (scan,) = [r for r in children.values() if r.data.params["strategy.name"] == "scan"]
    assert control.data.tags[provenance.HASH_TAG] == scan.data.tags[provenance.HASH_TAG]
    assert parent.data.tags["n_done"] == "2" and parent.data.tags["jobs"] == "2"
    # the report: the control is a row, never a contender, and the group's A/A pair
    rep = report.load(tracking.tracking_uri(), tracking.record(parent))
    ((_, entries),) = rep.groups.items()
    aa = ranking.noise(entries)
    assert aa.control and aa.known and aa.pairs == 1
    assert sorted(n for c in rep.contenders[next(iter(rep.groups))] for n in c.names) == ["fori_loop", "scan"]
    assert report.summary_lines(rep)[-1] == "2 of 2 jobs + the control job finished"
    headline = report.summary_lines(rep)[0]
    assert "timings contended" in headline or "(the control pair)" in headline, headline


@pytest.mark.slow  # four sweeps through Hydra and the store (~7 s): the rule itself is unit-tested in test_ranking
def test_no_control_job_when_off_with_one_strategy_or_too_few_runs(outputs, tmp_path, monkeypatch, plnexp_main):
    """Without rounds (report.rounds=0, where a control job could run): report.control=false; a sweep
    of one strategy (nothing compared); repeats=1 (the report ranks nothing on fewer than 3 timed
    runs): the grid alone (fits faked: the plan is the point). With rounds there is never one
    (tests/test_groups.py)."""
    monkeypatch.setattr(runner, "execute", fake_execute)
    grid = ["sweep=null", "dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=8", "report=false"]
    grid.append("report.rounds=0")
    for i, extra in enumerate(
        (
            ["strategy=scan,fori_loop", "report.control=false"],
            ["strategy=scan", "seed=0,1"],
            ["strategy=scan,fori_loop", "repeats=1"],
        )
    ):
        ran = plnexp_main("sweep", *grid, *extra, f"experiment=off{i}", cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr
        assert "[control]" not in ran.stdout and "2/2 jobs, 0 failed" in ran.stdout, ran.stdout
        cl = store_client(outputs)
        runs = cl.search_runs([cl.get_experiment_by_name(f"off{i}").experiment_id])
        assert len(runs) == 3 and not any(ranking.CONTROL_TAG in r.data.tags for r in runs)
    # the sweep's values are one per sweep: checked before any run
    ran = plnexp_main("sweep", *grid, "strategy=scan,fori_loop", "report.min_speedup=1.1,1.2", cwd=tmp_path)
    assert (
        ran.returncode == 2
        and "report.min_speedup=1.1,1.2: a sweep's report ranks with one minimum effect" in ran.stderr
    )


@pytest.mark.slow
def test_a_resumed_sweep_runs_its_control_again_and_reports_its_original(outputs, tmp_path, monkeypatch, plnexp_main):
    """The control job repeats scan's config (one config hash): resume=true never takes it for scan's
    job, runs a control again, and the report pairs it with scan's earlier run (fits faked, on the data's
    real digest: resume matches it)."""

    def fake(cfg, outcomes):
        (outcome,) = outcomes
        fake_execute(cfg, outcomes)
        outcome.data_digest = runner.load_data(cfg.dataset).digest()
        return outcomes

    monkeypatch.setattr(runner, "execute", fake)
    grid = ["sweep=null", "dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=8", "experiment=res"]
    grid.append("report.rounds=0")  # the control job runs where no interleaved rounds do
    first = plnexp_main("sweep", *grid, "strategy=scan,fori_loop", cwd=tmp_path)
    assert first.returncode == 0 and "[control]" in first.stdout, first.stderr
    again = plnexp_main("sweep", *grid, "strategy=scan,fori_loop,eager", "resume=true", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "resume: 2 of 3 job(s) matched" in again.stdout and "[control] control-scan" in again.stdout, again.stdout
    assert "3/3 jobs + the control job (2 FINISHED earlier), 0 failed" in again.stdout, again.stdout
    uri = tracking.tracking_uri()
    rep = report.load(uri, tracking.open(uri).latest_parent("res"))
    assert sorted(e.label for e in rep.entries) == ["eager", "fori_loop", "scan", "scan (control)"]
    (control,) = [e for e in rep.entries if e.control]
    (scan,) = [e for e in rep.entries if e.strategy == "scan" and not e.control]
    assert control.tags["mlflow.parentRunId"] == rep.parent.run_id != scan.tags["mlflow.parentRunId"]
    assert ranking.original(control, rep.groups[control.group]) is scan
    assert report.summary_lines(rep)[0].startswith("fastest on synthetic_n30_p5_d2_s0 (30×5), float32, cpu: scan")


@pytest.mark.parametrize(
    "override, message",
    [
        ("report.min_speedup=0.9", "report.min_speedup=0.9: allowed values are numbers >= 1 (a factor: 1.10 names"),
        ("report.min_speedup=fast", "report.min_speedup='fast': allowed values are numbers >= 1"),
        ("report.min_speedup=true", "report.min_speedup=True: allowed values are numbers >= 1"),
        ("report.control=maybe", "report.control='maybe': allowed values are true, false"),
        ("report.colour=red", "report.colour: unknown key; allowed keys under report are min_speedup, control"),
    ],
)
def test_report_settings_are_validated_config_keys(override, message):
    with pytest.raises(cli.ConfigError) as e:
        cli.plan([override], multirun=False, check_device=False)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_report_settings_are_not_part_of_the_fit():
    """Not in the run's name, its params or its config hash (resume=true matches the same fit)."""
    (plain,) = cli.plan([], multirun=False, check_device=False)
    (set_,) = cli.plan(["report.min_speedup=1.5", "report.control=false"], multirun=False, check_device=False)
    assert set_.config.report.min_speedup == 1.5 and set_.config.report.control is False
    assert plain.config.report.min_speedup == ranking.MIN_SPEEDUP == 1.10 and plain.config.report.control
    assert set_.name == plain.name and "report" not in set_.config.as_dict()
    assert provenance.config_hash(set_.config) == provenance.config_hash(plain.config)
