"""A sweep's groups timed in interleaved rounds after its grid (plnexp.experiment.groups): the
verdicts in verdict.json, on each run (metrics and tags), in the report's headline and in the
experiment's study view, from one real sweep; and the judging of rounds with a known answer."""

from __future__ import annotations

import getpass
import json
import math

import pytest
from conftest import store_client

from plnexp.experiment import groups as G
from plnexp.fitting.rounds import Rounds
from plnexp.jobs import verdicts as V

TINY = ("dataset.replication=1", "n_iter=5")


def rounds_of(times: list[list[float]], dropped: list[str] | None = None) -> Rounds:
    n = len(times)
    return Rounds(
        tuple(f"p{i}" for i in range(len(times[0]))),
        tuple(tuple(t) for t in times),
        tuple(dropped or [""] * n),
        tuple(tuple(range(len(times[0]))) for _ in range(n)),
        1.0,
    )


def test_judge_pools_one_programs_names_and_pairs_by_round():
    """Round r slows everything by the factor (1 + r): the paired ratios see through it. p1 is the
    reference's program under another name (A/A: tied), p2 twice as slow per iteration, p3 runs half
    the iterations in the same time (per iteration: twice as slow too)."""
    times = [[(1 + r) * 1.0, (1 + r) * 1.01 ** (r % 3), (1 + r) * 2.0, (1 + r) * 1.0] for r in range(7)]
    v = G.judge(
        ("scan", "scan_pytree", "eager", "while_loop"),
        ("fa", "fa", "", "fb"),
        (("r0",), ("r1",), ("r2",), ("r3",)),
        rounds_of(times),
        (10, 10, 10, 5),
        0,
        "oaks",
        1.10,
    )
    by = {s.strategy: s for s in v.strategies}
    assert by["scan"].verdict == "reference" and by["scan_pytree"].verdict == "tied"
    assert by["eager"].verdict == by["while_loop"].verdict == "slower"
    assert by["eager"].ratio == pytest.approx(2.0) and by["while_loop"].ratio == pytest.approx(2.0)
    assert by["eager"].ms_per_iter == pytest.approx(1e3 * 2.0 * 4 / 10)  # the median round's (r = 3)
    (ref,) = [p for p in v.programs if p.verdict == "reference"]
    assert ref.names == ("scan", "scan_pytree")  # one program, named together
    assert v.rounds == 7 and v.dropped == 0 and v.note == ""


def test_one_program_timed_once_counts_once_in_its_pooled_ratio():
    """Two names of one program timed as one share one column (NaN where the program sat out): their
    pooled ratio rests on the rounds it ran, not on each round twice."""
    nan = math.nan
    times = [[1.0, 1.2 + 0.01 * r, 1.2 + 0.01 * r] for r in range(9)] + [[1.0, nan, nan]] * 3
    v = G.judge(
        ("scan", "scan_namedtuple", "scan_pytree"),
        ("fa", "fb", "fb"),
        ((), (), ()),
        rounds_of(times),
        (1, 1, 1),
        0,
        "g",
        1.1,
    )
    (prog,) = [p for p in v.programs if p.names == ("scan_namedtuple", "scan_pytree")]
    by = {s.strategy: s for s in v.strategies}
    assert (prog.ratio, prog.low, prog.high) == (by["scan_pytree"].ratio, by["scan_pytree"].low, by["scan_pytree"].high)
    assert by["scan_pytree"].rounds == 9 and prog.verdict == "slower"


def test_judge_with_too_few_clean_rounds_decides_nothing_and_says_so():
    times = [[1.0, 3.0]] * 5
    v = G.judge(
        ("scan", "eager"), ("f", ""), (("a",), ("b",)), rounds_of(times, ["", "", "x", "x", ""]), (1, 1), 0, "g", 1.1
    )
    assert v.strategies[1].verdict == "unresolved" and v.rounds == 3 and v.dropped == 2
    assert v.note == "too few clean rounds: 3 kept of 5 (an interval needs 6): nothing decided"
    assert "too few clean rounds" in v.headline()


@pytest.mark.slow
def test_a_sweep_times_its_group_in_rounds_and_every_reader_sees_one_verdict(plnexp_main, outputs, tmp_path):
    """A real sweep of five strategies on oaks x1: no control job (the rounds replace it); the
    parent's verdict.json, each run's metrics and tags and the report's headline say the same; eager
    (dispatch-bound at this size, many times scan's time per iteration) is slower, scan the reference;
    the experiment's study view shows this sweep's runs only, by paired ratio. scan_namedtuple and
    scan_pytree compile to one program: timed once, they share its figures."""
    ran = plnexp_main(
        "sweep",
        "sweep=null",
        "strategy=scan,eager,fori_loop,scan_namedtuple,scan_pytree",
        *TINY,
        "experiment=groups",
        "report.rounds=9",
        "report.rounds_budget_s=5",
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stderr
    assert "[control]" not in ran.stdout
    assert "[rounds] 5 programs of oaks ... ready in" in ran.stdout
    cl = store_client(outputs)
    exp = cl.get_experiment_by_name("groups")
    (parent,) = [r for r in cl.search_runs([exp.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    path = cl.download_artifacts(parent.info.run_id, V.ARTIFACT, str(tmp_path))
    (group,) = V.loads(open(path).read())
    assert group.reference == "scan" and group.rounds + group.dropped <= 9
    by = {s.strategy: s for s in group.strategies}
    assert set(by) == {"scan", "eager", "fori_loop", "scan_namedtuple", "scan_pytree"}
    assert by["scan"].verdict == "reference" and by["eager"].verdict == "slower" and by["eager"].ratio > 2
    for s in group.strategies:
        (run_id,) = s.runs
        run = cl.get_run(run_id)
        assert run.data.tags["plnexp.verdict"] == s.verdict and run.data.tags["plnexp.reference"] == "scan"
        assert run.data.tags["mlflow.user"] == getpass.getuser()  # the UI's User column: who ran it
        assert run.data.metrics["paired_ratio"] == pytest.approx(s.ratio)
        # the rounds its ratio rests on: all the group's kept rounds, or fewer once its verdict stood
        # (it sat out the rest: plnexp.fitting.rounds)
        assert run.data.metrics["rounds_used"] == s.rounds <= group.rounds
        assert s.rounds == group.rounds or (s.verdict != "unresolved" and s.rounds >= 6)
        assert math.isfinite(run.data.metrics["round_cpu_ms_per_iter"]) and run.data.metrics["run_cpu_s"] > 0
    # names of one program: one fingerprint, one column of round times, the same figures to the last bit
    # (two timed instances never agree so)
    nt, pt = cl.get_run(by["scan_namedtuple"].runs[0]).data, cl.get_run(by["scan_pytree"].runs[0]).data
    assert nt.tags["hlo_fingerprint"] == pt.tags["hlo_fingerprint"]
    for key in ("round_ms_per_iter", "paired_ratio", "paired_ratio_lo", "paired_ratio_hi", "rounds_used"):
        assert nt.metrics[key] == pt.metrics[key], key
    cmp = plnexp_main("compare", by["scan"].runs[0], by["fori_loop"].runs[0])  # compare reads the same figures
    assert cmp.returncode == 0, cmp.stderr
    row = next(line for line in cmp.stdout.splitlines() if line.startswith("× scan (rounds)"))
    assert row.split()[3:5] == ["1.000", f"{by['fori_loop'].ratio:.3f}"]
    assert next(line for line in cmp.stdout.splitlines() if line.startswith("verdict")).split()[1:] == [
        "reference",
        by["fori_loop"].verdict,
    ]
    from plnexp.report import headline

    assert headline.lines(group, group.label)[0] in ran.stdout  # the report's plain headline leads
    check_printed_shapes(ran.stdout)  # and Getting started shows what a sweep prints now
    view = json.loads(exp.tags["mlflow.sharedViewState.plnexp-study"])
    state = json.loads(view["state"])
    assert parent.info.run_id in view["name"] and parent.info.run_id in state["searchFilter"]
    assert state["orderByKey"] == "metrics.`study_order`" and state["selectedColumns"][0] == "tags.`plnexp.verdict`"


# The lines a sweep prints, each kind as a pattern: what Getting started's "What a sweep prints" shows
# must have the same shapes as what a sweep prints now (test below): the page is regenerated from a
# real run when the format changes.
PRINTED = {
    "progress": r"^\[\d+/\d+\] \S+ \.\.\. done \d+\.\d s \(\+\d+\.\d s logging\)$",
    "rounds": r"^\[rounds\] \d+ programs of \S+ \.\.\. ready in \d+\.\d s, \d+ rounds(, \d+ dropped)? in \d+\.\d s$",
    "table": r"^job +status +iter +compile_s +ms/iter \(rounds\) +time ÷ ref +95% interval +rounds +final ELBO +wall_s$",
    "footer": r"^\d+/\d+ jobs, \d+ failed; \d+\.\d s in the sweep, \d+\.\d s in fits \(\d+% outside\); parent run \S+ FINISHED$",
    "verdict": r"^\S+ \(\d+×\d+\), float32, cpu: (fastest: .+|no compiled loop is measurably faster than scan|faster "
    r"than scan.+) \(\d+ rounds(, \d+ dropped)?, minimum effect 1\.10×\)$",
    "ranked": r"^\S+ \(\d+×\d+\), float32, cpu, fastest first \(the verdict's figures\):$",
    "finished": r"^\d+ of \d+ jobs finished$",
    "report": r"^report: \S+ \(report\.html, report\.md, report\.csv, elbo_curves\.png, timings\.png(, bytes\.png)?\), "
    r"also on parent run \S+$",
}


def getting_started_block() -> list[str]:
    """The lines of the first code block under "## What a sweep prints" in docs/getting-started.md."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "getting-started.md").read_text()
    section = text.split("## What a sweep prints", 1)[1]
    return section.split("```", 2)[1].strip("\n").splitlines()


def check_printed_shapes(printed: str) -> None:
    import re

    doc = getting_started_block()
    lines = printed.splitlines()
    for kind, pattern in PRINTED.items():
        assert any(re.match(pattern, line) for line in lines), f"a sweep no longer prints a {kind} line: {pattern}"
        assert any(re.match(pattern, line) for line in doc), (
            f"docs/getting-started.md's 'What a sweep prints' has no {kind} line as a sweep prints it now "
            f"({pattern}): regenerate it from a real run"
        )


@pytest.mark.parametrize(
    "override, message",
    [
        ("report.rounds=-1", "report.rounds=-1: allowed values are integers >= 0"),
        ("report.rounds=many", "report.rounds='many': allowed values are integers >= 0"),
        ("report.rounds_budget_s=0", "report.rounds_budget_s=0: allowed values are numbers of seconds in (0, 3600]"),
        ("report.rounds=5,10", "report.rounds=5,10: a sweep times its groups in one series of rounds"),
    ],
)
def test_bad_rounds_settings_are_one_line_and_exit_2(plnexp_main, outputs, tmp_path, override, message):
    ran = plnexp_main("sweep", "sweep=null", "strategy=scan,fori_loop", *TINY, override, cwd=tmp_path)
    assert ran.returncode == 2 and ran.stdout == ""
    assert ran.stderr.strip().splitlines() == [f"plnexp: error: {ran.stderr.strip().removeprefix('plnexp: error: ')}"]
    assert message in ran.stderr, ran.stderr
    assert not (outputs / "multirun").exists()
