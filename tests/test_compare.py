"""``python -m plnexp compare RUN_A RUN_B``: two logged runs' programs side by side, read back from the
store (the HLO artifact and the metrics), and what a compiled run logs for it."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from plnexp.measure import xla_stats
from plnexp.measure.metrics import PROGRAM
from plnexp.store import writes

# five tiny real runs made once for the module (~12 s): the full suite's; the fast subset keeps the
# HLO counting and costing of tests/test_xla_stats.py. One xdist worker runs the module: the runs are
# made once for the session under a lock, and a second worker asking for them meanwhile would only
# wait for the first
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("compare")]

# the session's compile cache on (a run's default): scan_pytree reads scan_namedtuple's program back
TINY = ("dataset=synthetic", "dataset.n=30", "dataset.p=5", "repeats=1", "time_budget_s=0")
STRATEGIES = ("scan_namedtuple", "scan_pytree", "scan_unrolled", "jit_per_function", "eager")
N_ITER = 16  # scan_unrolled (unroll 8): a loop of 2 trips, its body 8 steps
RUN_ID = re.compile(r"\(run ([0-9a-f]{32})")


def _run(strategy: str) -> str:
    """``python -m plnexp run`` of ``strategy`` on tiny data, in this process (for a fixture of the
    module: ``plnexp_main`` is the test's); the run's id."""
    from plnexp.__main__ import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        n_iter = 1 if strategy == "eager" else N_ITER  # eager compiles each primitive it meets: seconds
        assert main(["run", *TINY, f"n_iter={n_iter}", f"strategy={strategy}"]) == 0
    (run_id,) = RUN_ID.findall(out.getvalue())
    return run_id


@pytest.fixture(scope="module")
def runs(tmp_path_factory, migrated_store) -> tuple[Path, dict[str, str]]:
    """One tiny run of each strategy in one store, made once for the session (whichever xdist worker
    asks first; the tests only read it): (outputs, run id by strategy)."""
    from conftest import made_once

    with made_once(tmp_path_factory, "compare_runs") as (folder, make):
        out = folder / "outputs"
        if make:
            out.mkdir()
            shutil.copy(migrated_store, out / "mlflow.db")
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("PLNEXP_OUTPUTS", str(out))
                mp.delenv("MLFLOW_TRACKING_URI", raising=False)
                ids = {s: _run(s) for s in STRATEGIES}
            (folder / "ids.json").write_text(json.dumps(ids))
    return out, json.loads((folder / "ids.json").read_text())


@pytest.fixture
def store(runs, monkeypatch) -> dict[str, str]:
    out, ids = runs
    monkeypatch.setenv("PLNEXP_OUTPUTS", str(out))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return ids


def _row(text: str, label: str) -> list[str]:
    """The cells after ``label`` on its line of the table."""
    (line,) = [line for line in text.splitlines() if re.match(rf"\s*{re.escape(label)}\s{{2,}}", line)]
    return re.split(r"\s{2,}", line[len(label) :].strip())


def test_a_compiled_run_logs_every_metric_and_its_program(runs, tmp_path):
    from conftest import store_client

    out, ids = runs
    cl = store_client(out)
    run = cl.get_run(ids["jit_per_function"])
    m = run.data.metrics
    keys = [metric.key for metric in PROGRAM]
    assert set(keys) <= set(m) and all(math.isfinite(m[k]) and m[k] > 0 for k in keys)
    assert m["trace_s"] + m["lower_s"] + m["xla_compile_s"] == pytest.approx(m["compile_s"], rel=0.1)
    names = {f.path for f in cl.list_artifacts(run.info.run_id)}
    assert {"analysis.json", "config.yaml", writes.HLO_ARTIFACT} <= names
    text = Path(cl.download_artifacts(run.info.run_id, writes.HLO_ARTIFACT, str(tmp_path))).read_text()
    functions = xla_stats.split_functions(text)
    assert list(functions) == ["loss_and_grad", "update", "complete"]
    assert sum(xla_stats.stats(t).instructions for t in functions.values()) == m["xla_instructions"]
    eager = cl.get_run(ids["eager"])
    assert not set(keys) & set(eager.data.metrics) and "compile_s" in eager.data.metrics
    assert writes.HLO_ARTIFACT not in {f.path for f in cl.list_artifacts(ids["eager"])}


def test_compare_shows_the_unrolled_body(store, plnexp_main):
    r = plnexp_main("compare", store["scan_namedtuple"], store["scan_unrolled"])
    assert r.returncode == 0, r.stderr
    a, b, ratio = _row(r.stdout, "HLO instructions")
    assert int(b) > int(a) and float(ratio) > 1.5  # 8 steps in the unrolled body
    assert int(_row(r.stdout, "fusions")[1]) > int(_row(r.stdout, "fusions")[0])
    loops = _row(r.stdout, "loops")
    assert loops[0].startswith(f"{N_ITER} trips") and loops[1].startswith(f"{N_ITER // 8} trips")
    assert "opcodes whose counts differ" in r.stdout and re.search(r"^\s+fusion\s", r.stdout, re.M)
    assert "two programs: hlo_fingerprint" in r.stdout
    flops = [float(x) for x in _row(r.stdout, "flops/iter")[:2]]  # per iteration: the same maths
    assert flops[1] == pytest.approx(flops[0], rel=0.2)
    assert len(_row(r.stdout, "  XLA compile s")) == 3


def test_compare_of_two_containers_shows_one_program(store, plnexp_main):
    r = plnexp_main("compare", store["scan_namedtuple"], store["scan_pytree"])
    assert r.returncode == 0, r.stderr
    assert "opcodes: the same counts" in r.stdout and "differ (" not in r.stdout
    a, b, ratio = _row(r.stdout, "HLO instructions")
    assert a == b and ratio == "1.00"
    assert "one program: the same optimized HLO" in r.stdout


def test_compare_names_the_functions_of_jit_per_function(store, plnexp_main):
    r = plnexp_main("compare", store["scan_pytree"], store["jit_per_function"])
    assert r.returncode == 0, r.stderr
    assert _row(r.stdout, "functions") == ["1", "loss_and_grad, update, complete"]
    assert _row(r.stdout, "loops")[1] == "none"


@pytest.mark.parametrize(
    "args, message",
    [
        (("nothex",), "run id 'nothex': malformed"),
        (("0" * 32,), f"run {'0' * 32}: not found in the store"),
        (("eager",), "has no program.hlo.txt artifact"),
        ((), "1 run id(s) given, 2 needed"),
    ],
)
def test_a_bad_run_is_one_line_and_exit_2(store, plnexp_main, args, message):
    second = [store.get(a, a) for a in args]
    r = plnexp_main("compare", store["scan_namedtuple"], *second)
    assert r.returncode == 2
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("plnexp: error: ") and message in r.stderr
    if args == ("eager",):
        assert store["eager"] in r.stderr


@pytest.mark.slow  # a run of its own (3 s)
def test_a_large_program_is_logged_compressed_and_compared(outputs, plnexp_main, monkeypatch):
    monkeypatch.setattr(writes, "GZIP_OVER", 1000)  # bytes: every HLO is larger
    r = plnexp_main("run", *TINY, "n_iter=4", "strategy=scan")
    assert r.returncode == 0, r.stderr
    (run_id,) = RUN_ID.findall(r.stdout)
    from conftest import store_client

    cl = store_client(outputs)
    names = {f.path for f in cl.list_artifacts(run_id)}
    assert f"{writes.HLO_ARTIFACT}.gz" in names and writes.HLO_ARTIFACT not in names
    data = Path(cl.download_artifacts(run_id, f"{writes.HLO_ARTIFACT}.gz", str(outputs))).read_bytes()
    assert (
        xla_stats.stats(gzip.decompress(data).decode()).instructions
        == cl.get_run(run_id).data.metrics["xla_instructions"]
    )
    same = plnexp_main("compare", run_id, run_id)
    assert same.returncode == 0 and "opcodes: the same counts" in same.stdout
