"""One source of truth for speed (issue #64): the sweep's printed table, report.csv, report.md's and
report.html's table, the compiled programs' table, bytes.png's points and the parent's metrics all
rank the strategies as verdict.json does, also where each job's own single timed run says otherwise.

The sweep is built in the in-memory store (:mod:`plnexp.store.memory`): its runs, their ELBO curves
and the parent's verdict.json, judged from known round times by the sweep's own judge
(:func:`plnexp.experiment.groups.judge`); the report then reads it back through the real queries."""

from __future__ import annotations

import csv
import io
import math
import re

import numpy as np
import pytest

from plnexp.experiment import groups as G
from plnexp.experiment import runner, sweep_table
from plnexp.fitting.rounds import Rounds
from plnexp.jobs import verdicts as V
from plnexp.jobs.tags import DATA_N_TAG, DATA_P_TAG, DATASET_TAG, JOB_TAG, JOBS_TAG, PARENT_TAG, SWEEP_TAG
from plnexp.report import document, headline, parent, speed
from plnexp.report import summary as report
from plnexp.report import compiler_table, csv_table, sweep_figures, table
from plnexp.store import memory

N_ITER = 20
# strategy -> (its job's one timed run, ms/iter; its ms/iter in every round; its program's fingerprint).
# The single runs rank fori_loop first and scan fourth; the rounds: scan_fused, scan, fori_loop, ...
STRATEGIES = {
    "scan": (10.0, 10.0, "fa"),
    "fori_loop": (5.0, 10.3, "fb"),  # one lucky timed run: the fastest single run, tied in the rounds
    "scan_fused": (8.0, 4.0, "fc"),
    "jit_per_function": (9.0, 14.0, "fd"),
    "eager": (50.0, 60.0, ""),
}
ROUNDS = 12


def round_times(strategies: dict, rounds: int = ROUNDS) -> list[list[float]]:
    """Round r slows every program alike by a load that comes and goes, and each by its own small
    noise: seconds per program and round."""
    out = []
    for r in range(rounds):
        load = 1 + 0.5 * (r % 4)
        out.append(
            [
                load * ms * N_ITER / 1e3 * (1 + 0.01 * math.sin(3 * r + i))
                for i, (_, ms, _) in enumerate(strategies.values())
            ]
        )
    return out


def memory_sweep(
    strategies: dict = STRATEGIES, seconds: float = 5.0, budget_s: float = 30.0, models: tuple[str, ...] = ("full",)
) -> tuple[str, str, V.GroupVerdict]:
    """A finished sweep in a new in-memory store, one group per model of ``models`` (the same
    strategies and times in each): (its URI, its parent run id, its first group's verdict)."""
    from dataclasses import replace

    uri = memory.new("one-answer")
    st = memory.store(uri)
    names = list(strategies)
    times = round_times(strategies)
    rounds = Rounds(
        tuple(names),
        tuple(map(tuple, times)),
        ("",) * len(times),
        tuple(tuple(range(len(names))) for _ in times),
        seconds,
    )
    fps = tuple(fp for _, _, fp in strategies.values())
    curve = -1e5 * (1 + np.exp(-np.arange(N_ITER) / 4.0))
    verdicts, jobs = [], 0
    for model in models:
        ids = [f"run-{model}-{i}" for i in range(len(names))]
        label = "oaks_x100 (11600×114), float32, cpu"  # as the sweep's rounds name a group: no model
        v = G.judge(names, fps, [(i,) for i in ids], rounds, [N_ITER] * len(names), 0, label, 1.10)
        v = replace(v, budget_s=budget_s, max_rounds=30)
        verdicts.append(v)
        for i, (name, (one_run, _, fp)) in enumerate(strategies.items()):
            s = v.strategies[i]
            st.add(
                "strategies",
                f"{name}-{model}-job",
                params={
                    "strategy.name": name,
                    "device": "cpu",
                    "precision": "float32",
                    "optimizer.name": "radam_clip",
                    "model": model,
                },
                metrics={
                    "ms_per_iter": one_run,
                    "run_s": one_run * N_ITER / 1e3,
                    "n_runs": 1.0,
                    "n_iter_run": float(N_ITER),
                    "compile_s": 1.0 + i,
                    "final_elbo": float(curve[-1]),
                    "xla_bytes_per_iter": 1e6 * (i + 1) if fp else math.nan,
                    **s.metrics(),
                },
                tags={
                    PARENT_TAG: "parent",
                    JOB_TAG: str(jobs),
                    DATASET_TAG: "oaks_x100",
                    DATA_N_TAG: "11600",
                    DATA_P_TAG: "114",
                    "hlo_fingerprint": fp,
                    **v.run_tags(s),
                },
                histories={"elbo": curve * (1 + 1e-7 * i)},
                run_id=ids[i],
            )
            jobs += 1
    pid = st.add(
        "strategies",
        "sweep",
        tags={SWEEP_TAG: "default", JOBS_TAG: str(jobs), "command": "sweep"},
        artifacts={V.ARTIFACT: V.dumps(verdicts)},
        run_id="parent",
    )
    return uri, pid, verdicts[0]


def verdict_order(v: V.GroupVerdict) -> list[str]:
    """The strategies as verdict.json ranks them: by paired ratio, fastest first."""
    return [s.strategy for s in sorted(v.strategies, key=lambda s: s.ratio)]


@pytest.fixture
def swept():
    uri, pid, v = memory_sweep()
    rep = report.load(uri, memory.store(uri).run(pid))
    (read,) = rep.verdicts
    return uri, rep, read


def test_the_forced_case_disagrees(swept):
    """The premise: the jobs' single runs rank otherwise than the rounds."""
    _, rep, v = swept
    single = [e.strategy for e in sorted(rep.entries, key=lambda e: e.m("ms_per_iter"))]
    assert verdict_order(v) == ["scan_fused", "scan", "fori_loop", "jit_per_function", "eager"]
    assert single[0] == "fori_loop" and single != verdict_order(v)
    assert {s.strategy: s.verdict for s in v.strategies} == {
        "scan": "reference",
        "fori_loop": "tied",
        "scan_fused": "faster",
        "jit_per_function": "slower",
        "eager": "slower",
    }


def test_every_table_ranks_as_the_verdict(swept, tmp_path):
    uri, rep, v = swept
    want = verdict_order(v)
    ratio = {s.strategy: s.ratio for s in v.strategies}
    # report.csv: rows in the verdict's order, its paired ratios the verdict's
    rows = list(csv.DictReader(io.StringIO(csv_table.csv_text(rep))))
    assert [r["strategy"] for r in rows] == want
    for r in rows:
        assert float(r["paired_ratio"]) == pytest.approx(ratio[r["strategy"]], rel=1e-12)
    # the compact table (report.md, report.html, the terminal): the same order and ratios
    (group,) = rep.groups
    cells = table.rows(rep, group)
    assert [c[0] for c in cells] == want
    col = table.head(rep, group).index("time ÷ scan")
    assert [float(c[col]) for c in cells] == pytest.approx([ratio[s] for s in want], abs=5e-4)
    assert len(table.head(rep, group)) <= table.MAX_COLUMNS
    # the compiled programs' table and bytes.png: the rounds' ms/iter, in the verdict's order
    programs = compiler_table.compiler_rows(rep, group)
    assert [p.strategies for p in programs] == want
    ms = {s.strategy: s.ms_per_iter for s in v.strategies}
    assert [p.ms_per_iter for p in programs] == pytest.approx([ms[s] for s in want], rel=1e-12)
    panel = sweep_figures.bytes_panel(rep, group)
    assert panel is not None
    assert {k: y for k, (_, y) in panel.points.items()} == pytest.approx({k: ms[k] for k in panel.points}, rel=1e-12)
    # timings.png: the bars in the verdict's order, their run time the rounds' ms/iter, whiskers the paired interval
    timing = sweep_figures.timing_panel(rep, group)
    assert timing is not None and timing.rounds and list(timing.run_s) == want
    assert [timing.run_s[k] for k in want] == pytest.approx([ms[k] * N_ITER / 1e3 for k in want], rel=1e-12)
    low = {s.strategy: s.low * s.ms_per_iter / s.ratio * N_ITER / 1e3 for s in v.strategies}
    assert [timing.run_span[k][0] for k in want] == pytest.approx([low[k] for k in want], rel=1e-12)
    # the files: report.md's and report.html's tables in that order; the figures inline in the html
    folder = tmp_path / "r"
    files = report.write(rep, folder)
    assert files[0] == "report.html"
    page = (folder / "report.html").read_text()
    assert re.findall(r"<tr><td>([a-z_]+)", page) == want
    assert 'src="data:image/png;base64,' in page and "<script" not in page
    assert page.index("Verdict") < page.index("<table>")
    md = (folder / "report.md").read_text()
    assert [
        line.split(" | ")[0].removeprefix("| ") for line in md.splitlines() if re.match(r"\| [a-z_]+ \| [0-9]", line)
    ] == want
    assert "× eager" not in md and "× reference" not in md  # one convention: time ÷ the reference's


def test_the_printed_table_shows_the_verdicts_figures(swept):
    uri, rep, v = swept
    st = memory.store(uri)
    rows = [runner.Row(e.name, e.status, dict(st.runs[e.run_id].metrics), 1.0) for e in rep.entries]
    text = sweep_table.table(rows)
    lines = text.splitlines()
    printed = {}
    for line in lines[2 : 2 + len(rows)]:
        fields = line.split()
        printed[fields[0].removesuffix("-full-job")] = float(fields[5])  # job, status, iter, compile_s, ms/iter, ratio
    ratio = {s.strategy: s.ratio for s in v.strategies}
    assert printed == pytest.approx(ratio, abs=5e-4)
    assert sorted(printed, key=printed.__getitem__) == verdict_order(v)
    assert " 5.00 " not in text  # fori_loop's lucky single run is no speed of the table


def test_each_runs_ratio_tag_reads_as_the_verdict(swept):
    """The dashboard's ratio column (a tag: shown as written) says the verdict's ratio and interval."""
    uri, rep, v = swept
    st = memory.store(uri)
    for s in v.strategies:
        (run_id,) = s.runs
        text = st.runs[run_id].tags[V.RATIO_TAG]
        if s.verdict == V.REFERENCE:
            assert text == "1 (the reference)"
        else:
            m = re.fullmatch(r"(\d\.\d{3})× \[(\d\.\d\d)–(\d\.\d\d)\]", text)
            assert m is not None, text
            assert [float(x) for x in m.groups()] == pytest.approx([s.ratio, s.low, s.high], abs=5e-3)


def test_the_parents_metrics_are_the_verdicts(swept):
    _, rep, v = swept
    metrics, tags = parent.metrics_and_tags(rep)
    fused = next(s for s in v.strategies if s.strategy == "scan_fused")
    assert tags["fastest_strategy"] == "scan_fused" == v.fastest()
    assert metrics["best_ms_per_iter"] == pytest.approx(fused.ms_per_iter, rel=1e-12)
    assert metrics["best_speedup_vs_scan"] == pytest.approx(1 / fused.ratio, rel=1e-12)
    assert metrics["best_speedup_lo"] <= metrics["best_speedup_vs_scan"] <= metrics["best_speedup_hi"]
    assert (metrics["n_faster"], metrics["n_tied"], metrics["n_slower"]) == (1, 1, 2)


def test_no_faster_strategy_no_best_of_and_a_plain_headline():
    """Without scan_fused nothing is faster than scan: the parent names no winner and logs no best_*
    figure, although fori_loop's single run is half scan's."""
    strategies = {k: val for k, val in STRATEGIES.items() if k != "scan_fused"}
    uri, pid, _ = memory_sweep(strategies)
    rep = report.load(uri, memory.store(uri).run(pid))
    metrics, tags = parent.metrics_and_tags(rep)
    assert tags["fastest_strategy"] == ""
    assert not any(k.startswith("best_") for k in metrics)
    lines = report.summary_lines(rep)
    assert lines[0] == (
        "oaks_x100 (11600×114), float32, cpu: no compiled loop is measurably faster than scan "
        f"({ROUNDS} rounds, minimum effect 1.10×)"
    )
    assert lines[1].startswith("tied with scan (within ±") and lines[1].endswith(": fori_loop")
    assert lines[2].startswith("slower: jit_per_function 1.40× [") and re.search(r"eager (5\.9\d|6\.0\d)× \[", lines[2])


def test_the_headline_names_the_fastest_with_its_interval(swept):
    _, rep, v = swept
    first = report.summary_lines(rep)[0]
    fused = next(p for p in v.programs if p.names == ("scan_fused",))
    assert first.startswith(
        f"oaks_x100 (11600×114), float32, cpu: fastest: scan_fused, {fused.ratio:.2f}× scan's time "
        f"[{fused.low:.2f}–{fused.high:.2f}], {1 / fused.ratio:.1f}× as fast"
    )
    assert fused.ratio == pytest.approx(0.4, rel=0.02)


def test_an_unresolved_verdict_says_why_and_which_value_decides_it():
    """fori_loop 1.08× scan on a machine whose load swings the rounds widely: its interval straddles
    the minimum effect when the 30 s budget ends the rounds; the headline says so and names a larger
    budget, whose rounds (at the same pace, the interval narrowing as 1/sqrt(rounds)) leave the bound out."""
    v0 = G.judge(
        ("scan", "fori_loop"),
        ("fa", "fb"),
        (("a",), ("b",)),
        Rounds(
            ("scan", "fori_loop"),
            tuple((1.0, 1.08 * (1 + 0.06 * ((-1) ** r) * (r % 3))) for r in range(9)),
            ("",) * 9,
            ((0, 1),) * 9,
            31.0,
        ),
        (1, 1),
        0,
        "G",
        1.10,
    )
    from dataclasses import replace

    v = replace(v0, budget_s=30.0, max_rounds=30)
    (p,) = v.of("unresolved")
    assert p.low < 1.10 < p.high
    text = headline.lines(v, "G")[-1]
    assert text.startswith("unresolved: fori_loop 1.08× [") and f"{headline.BUDGET_KEY}=30" in text
    m = re.search(r"report\.rounds_budget_s=(\d+)", text.split("; ")[-1])
    assert m is not None
    budget = float(m.group(1))
    need = headline.rounds_needed(v, p)
    # independent check: at `need` rounds the interval's half-width (log scale) shrinks by sqrt(9 / need)
    half = max(math.log(p.high / p.ratio), math.log(p.ratio / p.low)) * math.sqrt(v.rounds / need)
    assert p.ratio * math.exp(half) <= 1.10 * (1 + 1e-9)  # its median below the bound: the upper end clears it
    assert budget >= need * v.seconds / v.rounds > 30.0


def test_speed_without_rounds_is_said_to_be_the_jobs_own(swept):
    _, rep, _ = swept
    rep.verdicts.clear()  # a sweep with report.rounds=0
    e = next(e for e in rep.entries if e.strategy == "fori_loop")
    s = speed.of(rep, e)
    assert s.basis == speed.OWN and s.ms_per_iter == 5.0 and s.ratio == pytest.approx(0.5)
    assert "ms/iter (own runs)" in table.head(rep, e.group)
    doc = [block if block[0] != "ul" else ("ul", ["a plain headline"], "verdict") for block in report.document(rep, [])]
    page = document.page(doc, None)  # no figure: no file read
    assert page.index("a plain headline") < page.index("<table>")


def test_group_labels_name_the_model_that_tells_two_groups_apart():
    """Two groups that differ by model alone (as sweep=fused's): each headline names its model, so
    that no two read the same, and each group's table ranks its own runs."""
    uri, pid, _ = memory_sweep(models=("full", "profiled"))
    rep = report.load(uri, memory.store(uri).run(pid))
    firsts = [line for line in report.summary_lines(rep) if ": fastest: " in line]
    assert [line.split(": fastest: ")[0] for line in firsts] == [
        "oaks_x100 (11600×114), float32, cpu, model=full",
        "oaks_x100 (11600×114), float32, cpu, model=profiled",
    ]
    for group in rep.groups:
        assert [c[0] for c in table.rows(rep, group)] == [
            "scan_fused",
            "scan",
            "fori_loop",
            "jit_per_function",
            "eager",
        ]


def test_every_preset_says_how_long_it_takes():
    """Each conf/sweep preset states its duration in one "# Takes:" line, which the sweep prints at
    its start; a preset without one (a user's own) prints nothing."""
    from plnexp.experiment import presets
    from plnexp.jobs.config import CONF_DIR

    names = sorted(p.stem for p in (CONF_DIR / "sweep").glob("*.yaml"))
    assert "default" in names and "fused" in names
    for name in names:
        line = presets.takes_line(name, CONF_DIR)
        assert re.match(rf"^sweep={name} takes (about |\d).+ on (an idle )?a? ?2-core CPU", line), (name, line)
    assert presets.takes_line("no-such-preset", CONF_DIR) == ""
    # the default sweep runs the README's headline strategy
    assert "scan_fused" in (CONF_DIR / "sweep" / "default.yaml").read_text().split("strategy:")[-1]
