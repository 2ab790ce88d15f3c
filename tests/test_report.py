"""plnexp.report on a store whose runs are known: each job's fit is faked (chosen timings and ELBO
curves) and logged through the real runner and tracking code; the report is then read back from
the store and checked against the logged numbers, recomputed here independently."""

from __future__ import annotations

import csv
import io
import struct

import numpy as np
import pytest
from conftest import store_client

from plnexp import cli, floor, plots, provenance, report, runner, sweep, tracking
from plnexp.fitting import FitResult
from plnexp.timing import Timing

# (strategy, n rows) -> (compile_s, ms_per_iter, iterations run)
KNOWN = {
    ("eager", 30): (0.0, 10.0, 5),
    ("scan", 30): (1.2, 2.0, 8),
    ("fori_loop", 30): (1.1, 2.5, 8),
    ("eager", 60): (0.0, 12.0, 5),
    ("scan", 60): (1.3, 4.0, 8),
    ("fori_loop", 60): (1.4, 5.0, 8),
}
# the floor the n=30 jobs log (copy GB/s, dot ms: plnexp.floor's parts); the n=60 ones log none (older runs)
KNOWN_FLOOR = {30: (0.0105, 0.3)}


def known_curve(strategy: str, n: int, length: int) -> np.ndarray:
    """An ELBO curve rising to a plateau; fori_loop's and eager's differ from scan's by rounding-size noise."""
    base = -n * 1e4 * np.exp(-np.arange(length) / 2.0) - n * 100.0
    noise = {"scan": 0.0, "fori_loop": 3e-7, "eager": 1e-6}[strategy]
    return base * (1 + noise * np.sin(np.arange(length) + 1))


def fake_execute(cfg, overrides=(), name=None, output_dir="", outcome=None):
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
        outcome.floor = floor.Floor(n, cfg.dataset.p, "float32", copy_GBps, 2**20, dot_ms).metrics()
    outcome.stop()
    return outcome


def job_config(strategy: str, n: int):
    (job,) = cli.plan(
        ["dataset=synthetic", f"dataset.n={n}", "dataset.p=5", f"strategy={strategy}", "n_iter=8"], multirun=False
    )
    return job.config


def fake_sweep(tmp_path, monkeypatch, keys, name="sw", tags=None):
    """A closed sweep of the jobs ``keys`` ((strategy, n) pairs); returns its record."""
    monkeypatch.setattr(runner, "execute", fake_execute)
    uri = tracking.check_store()
    record = sweep.open_sweep(tmp_path / name, "known", "known", uri, len(keys), {"command": "test", **(tags or {})})
    for i, (strategy, n) in enumerate(keys):
        runner.run_job(
            job_config(strategy, n), (f"strategy={strategy}",), f"{strategy}-{n}", parent=record.parent, job_num=i
        )
    sweep.close_sweep(record, "FINISHED")
    return record


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name}: not a PNG"
    return struct.unpack(">II", data[16:24])


def test_report_numbers_equal_the_logged_metrics(outputs, tmp_path, monkeypatch):
    record = fake_sweep(tmp_path, monkeypatch, list(KNOWN))
    rep, folder, files = report.build(tracking.tracking_uri(), run_id=record.parent_id)
    assert folder == outputs / "reports" / "known" / record.parent_id
    assert set(files) == {"report.md", "report.csv", "elbo_curves.png", "timings.png", "scaling.png"}

    cl = store_client(outputs)
    rows = list(csv.DictReader(io.StringIO((folder / "report.csv").read_text())))
    assert len(rows) == len(KNOWN)
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

    md = (folder / "report.md").read_text()
    assert md.count("\n| ") == len(KNOWN) + 1  # header + one line per run
    table = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if line.startswith("| ")]
    col = table[0].index("× floor")
    # scan, n=30: 2.00 ms/iter over 14*30*5*4 bytes at 10.5 MB/s (0.8 ms) + 2 x 0.3 ms = 1.4 ms
    assert {(r[0], r[2], r[col]) for r in table[1:] if r[0] == "scan"} == {
        ("scan", "30×5", "1.43"),
        ("scan", "60×5", "-"),
    }
    assert "compare at iteration 5" in md
    for name in ("elbo_curves.png", "timings.png", "scaling.png"):
        w, h = png_size(folder / name)
        assert 500 <= w <= 3000 and 300 <= h <= 3000, (name, w, h)

    # the parent run: summary metrics about the largest data (n=60), the report as artifacts, a note
    parent = cl.get_run(record.parent_id)
    assert parent.data.metrics["best_ms_per_iter"] == 4.0
    assert parent.data.metrics["best_speedup_vs_eager"] == pytest.approx(3.0)
    assert parent.data.metrics["best_speedup_vs_scan"] == pytest.approx(1.0)
    assert parent.data.metrics["n_failed"] == 0 and parent.data.metrics["n_jobs"] == 6
    assert parent.data.tags["fastest_strategy"] == "scan"
    assert "ms_per_iter" in parent.data.tags["mlflow.note.content"]
    assert {a.path for a in cl.list_artifacts(record.parent_id, "report")} == {f"report/{f}" for f in files}


def test_terminal_summary_names_the_fastest_and_the_failures(outputs, tmp_path, monkeypatch):
    record = fake_sweep(tmp_path, monkeypatch, [("eager", 30), ("scan", 30), ("fori_loop", 30)])
    rep = report.load(tracking.tracking_uri(), tracking.find_run(tracking.tracking_uri(), record.parent_id))
    lines = report.summary_lines(rep)
    # 5 runs each, interquartile ranges 1.98-2.02 (scan) and 2.475-2.525 (fori_loop): apart
    assert lines[0].startswith(
        "fastest on synthetic_n30_p5_d2_s0 (30×5), float32, cpu: scan 2.00 ms/iter "
        "[1.98–2.02, 5 runs] (1.25× next: fori_loop, 5.0× eager)"
    ), lines[0]
    assert lines[-1] == "3 of 3 jobs finished"


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
    ],
)
def test_bad_report_requests_are_one_line_and_exit_2(outputs, capsys, args, message):
    assert report.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_report_on_a_job_or_a_single_run_names_the_parent(outputs, tmp_path, monkeypatch, capsys):
    record = fake_sweep(tmp_path, monkeypatch, [("scan", 30)])
    child = tracking.sweep_runs(tracking.tracking_uri(), tracking.find_run(tracking.tracking_uri(), record.parent_id))[
        0
    ]
    assert report.main(["--run", child.info.run_id]) == 2
    assert f"a job of the sweep whose parent run is {record.parent_id}" in capsys.readouterr().err
    single = runner.run_job(job_config("scan", 30), (), "single")
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
    path = plots.elbo_curves_png([plots.CurvePanel("t", curves)], tmp_path / "c.png")
    w, h = png_size(path)
    assert w >= 500 and h >= 300


def test_converged_tells_a_plateau_from_a_descent():
    i = np.arange(200.0)
    assert plots.converged(-1e3 * np.exp(-i / 10) - 5.0)
    assert not plots.converged(-1e3 + i)
    assert not plots.converged(np.array([-3.0, -2.0]))


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


def test_a_real_sweep_reports_at_its_end(swept):
    """The session's real sweep (conftest's ``swept``: ``python -m plnexp sweep``, scan and fori_loop
    on oaks, no report=false) made its report when it ended."""
    (folder,) = (swept.outputs / "reports" / "strategies").iterdir()
    assert folder.name == swept.parent_id
    md = (folder / "report.md").read_text()
    assert "| scan | oaks | 116×114 |" in md and "| fori_loop | oaks | 116×114 |" in md
    # a winner, named by the summary in the note, unless this (shared, busy) machine made the timings
    # contended or the two tie within their noise
    tags = store_client(swept.outputs).get_run(folder.name).data.tags
    note, winner = tags["mlflow.note.content"], tags["fastest_strategy"]
    if winner:
        assert winner in ("scan", "fori_loop") and f"- fastest on oaks (116×114), float32, cpu: {winner} " in note
    else:
        assert "- timings contended on oaks" in note or "- tied within noise" in note, note


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


def test_a_strategy_swept_over_its_own_option_is_one_row_per_value(outputs, tmp_path, monkeypatch):
    """strategy.tol=1e-3,1e-6 of while_loop used to overwrite itself (rows keyed on the name)."""

    def fake(cfg, overrides=(), name=None, output_dir="", outcome=None):
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
        return outcome

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
        runner.run_job(job.config, job.overrides, job.name, parent=record.parent, job_num=i)
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
        runner.run_job(job.config, job.overrides, job.name, parent=record.parent, job_num=i)
    sweep.close_sweep(record, "FINISHED")
    panels = []
    monkeypatch.setattr(report.plots, "elbo_curves_png", lambda p, path: panels.extend(p))
    rep = report.load(uri, tracking.find_run(uri, record.parent_id))
    report.figures(rep, tmp_path)
    assert len(panels) == len(rep.groups) == 4
    for panel in panels:
        assert len(panel.curves) == 2  # scan and fori_loop of one precision and model
    titles = [p.title for p in panels]
    assert len(set(titles)) == 4 and all(("float32" in t) != ("float64" in t) for t in titles)
    table = report.precision_table(rep)  # the final ELBOs side by side, and their relative gap
    assert len(table) == 2 + 4  # header, rule, one row per strategy x model
    for row in table[2:]:
        a, b, gap = (c.strip() for c in row.strip("|").split("|")[-3:])
        a, b = float(a.replace(",", "")), float(b.replace(",", ""))
        assert float(gap) == pytest.approx((a - b) / abs(b), rel=1e-2, abs=1e-12)
    for group, entries in rep.groups.items():  # each run compared with its own group's scan
        assert {e.precision for e in entries} == {group[2]} and len({e.params["model"] for e in entries}) == 1
        assert all(e.vs_scan < 1e-5 for e in entries)


def test_the_summary_counts_the_whole_grid(outputs, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "execute", fake_execute)
    uri = tracking.check_store()
    record = sweep.open_sweep(tmp_path / "g", "grid", "grid", uri, 4, {"command": "test"})
    for i, strategy in enumerate(("scan", "fori_loop")):
        runner.run_job(job_config(strategy, 30), (), strategy, parent=record.parent, job_num=i)
    sweep.close_sweep(record, "KILLED")
    rep = report.load(uri, tracking.find_run(uri, record.parent_id))
    assert report.summary_lines(rep)[-1] == "2 of 4 jobs finished (2 not started)"


def test_scaling_slopes_use_the_sizes_every_strategy_has():
    from plnexp import plots

    # scan: y = n exactly (slope 1); eager: y = n^2 at 10 and 100 but failed at 1000 (missing)
    series = {"scan": ([10, 100, 1000], [10.0, 100.0, 1000.0]), "eager": ([10, 100], [100.0, 10000.0])}
    slopes, missing, span = plots.common_slopes(series)
    assert slopes["scan"] == pytest.approx(1.0) and slopes["eager"] == pytest.approx(2.0)
    assert missing == {"scan": [], "eager": [1000.0]} and span == (10.0, 100.0)
    # a non-finite point is missing too
    slopes, missing, _ = plots.common_slopes({"a": ([10, 100, 1000], [1.0, 10.0, float("nan")])})
    assert missing == {"a": []} and slopes["a"] == pytest.approx(1.0)


def test_the_iqr_column_says_where_it_is_a_range():
    # timing.Spread: quartiles from 5 runs on, the whole range below; the table says which
    from plnexp.report import Entry, _iqr_cell

    def entry(runs_s):
        lo, hi = min(runs_s), max(runs_s)
        if len(runs_s) >= 5:
            import statistics

            lo, _, hi = statistics.quantiles(runs_s, n=4, method="inclusive")
        metrics = {"ms_per_iter": 1.0, "n_iter_run": 100.0, "run_s_lo": lo, "run_s_hi": hi, "n_runs": len(runs_s)}
        return Entry("r", "r", "FINISHED", "", "scan", "oaks", 116, 114, "cpu", "float32", {}, metrics)

    assert _iqr_cell(entry([0.10, 0.12, 0.11])) == "0.20 (range of 3)"  # (0.12 - 0.10) s / 100 iterations
    assert _iqr_cell(entry([0.10, 0.11, 0.12, 0.13, 0.30])) == "0.20"  # q3 - q1 = 0.13 - 0.11: the outlier left out
    assert _iqr_cell(Entry("r", "r", "FAILED", "", "scan", "oaks", 116, 114, "cpu", "float32", {}, {})) == "-"
