"""The persistent compilation cache's default (``compile_cache``): null (auto) is on for one fit
(``plnexp.fit``, ``python -m plnexp run``: a second process reads the compiled fit back) and off in a
sweep (the timing study's compiles stay cold); true and false are kept wherever they are given."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings

import jax
import pytest
from conftest import spawn, store_client

import plnexp
from plnexp.experiment import plan as cli
from plnexp.jobs import provenance
from plnexp.measure import timing
from plnexp.jobs import config as C
from plnexp.fitting.spec import cache_choice
from plnexp.strategies import STRATEGIES, StrategySpec

# what a fresh cache does is the point here: each test's outputs get a jax_cache of their own (conftest)
pytestmark = pytest.mark.own_compile_cache
TINY = ["dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3", "repeats=1", "time_budget_s=0"]


@pytest.fixture(scope="module")
def tiny():
    return plnexp.simulate(n=30, p=5, d=1, seed=0)


def _entries(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _runs(outputs, experiment):
    cl = store_client(outputs)
    exp = cl.get_experiment_by_name(experiment)
    return cl.search_runs([exp.experiment_id]) if exp else []


# ---------------------------------------------------------------- plnexp.fit
def test_fit_default_writes_the_cache_under_outputs_and_reads_it_back(outputs, tiny):
    first = plnexp.fit(tiny, n_iter=4, strategy="fori_loop")
    written = _entries(outputs / "jax_cache")
    assert any(name.startswith("jit_fit") for name in written), written
    assert first.timing.compile_cache_hits == 0, "a fresh cache: the compile is a miss, and written"
    assert math.isnan(first.timing.compile_warm_s), "auto times one compile (no warm compile)"
    # the same fit again (measure compiles a program built anew, which JAX's in-memory caches
    # cannot serve): read from disk
    again = plnexp.fit(tiny, n_iter=4, strategy="fori_loop")
    assert again.timing.compile_cache_hits >= 1
    assert again.timing.fingerprint == first.timing.fingerprint
    assert {"compile_cache_hits"} <= set(
        again.timing.as_metrics()
    ) and "compile_warm_s" not in again.timing.as_metrics()


def test_after_a_fit_the_callers_compiles_go_to_the_callers_own_cache(outputs, tiny, tmp_path):
    """A caller with a persistent cache of their own: plnexp's fit uses its folder meanwhile, and the
    caller's next compile goes to the caller's folder again (JAX's settings and its cache object,
    built from them at first use, restored), never into plnexp's."""
    from jax.experimental.compilation_cache import compilation_cache

    mine = tmp_path / "mine"
    options = {
        "jax_compilation_cache_dir": str(mine),
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": -1,
    }
    saved = {name: jax.config.values[name] for name in options}
    x = jax.numpy.ones(5)
    try:
        for name, value in options.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()
        jax.jit(lambda x: x * 3.0 - 1.0)(x).block_until_ready()
        before = _entries(mine)
        assert before, "the caller's cache works"
        plnexp.fit(tiny, n_iter=4, strategy="fori_loop")
        ours = _entries(outputs / "jax_cache")
        assert ours and _entries(mine) == before, "the fit wrote into its own folder only"
        assert {name: jax.config.values[name] for name in options} == options
        jax.jit(lambda x: x * 5.0 + 2.0)(x).block_until_ready()
        assert len(_entries(mine)) == len(before) + 1 and _entries(outputs / "jax_cache") == ours
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


def test_fit_explicit_false_is_off(outputs, tiny):
    res = plnexp.fit(tiny, n_iter=4, strategy="fori_loop", compile_cache=False)
    assert _entries(outputs / "jax_cache") == []
    assert math.isnan(res.timing.compile_cache_hits) and "compile_cache_hits" not in res.timing.as_metrics()


@pytest.mark.slow  # two compiles (~1 s); test_timing covers the switch too
def test_fit_explicit_true_times_the_second_compile(outputs, tiny):
    res = plnexp.fit(tiny, n_iter=4, strategy="fori_loop", compile_cache=True)
    assert _entries(outputs / "jax_cache")
    assert res.timing.compile_cache_hits == 0 and res.timing.compile_warm_cache_hits >= 1
    assert math.isfinite(res.timing.compile_warm_s)


def test_untimed_fit_uses_the_cache_too(outputs, tiny):
    plnexp.fit(tiny, n_iter=4, strategy="scan", timed=False)
    assert any(name.startswith("jit_fit") for name in _entries(outputs / "jax_cache"))


@pytest.mark.parametrize("value", [1, "yes", "auto", 0.0])
def test_fit_bad_value_is_one_line(tiny, value):
    with pytest.raises(ValueError) as err:
        plnexp.fit(tiny, n_iter=2, compile_cache=value)
    assert str(err.value).startswith(f"compile_cache={value!r}: allowed values are True, False, None")
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_a_cache_that_cannot_be_written_is_one_warning_and_the_fit_runs(outputs, tiny):
    blocker = outputs / "a_file"
    blocker.write_text("")
    with pytest.warns(
        timing.CacheWarning,
        match=r"^compile_cache: cannot write the compilation cache .*a_file/jax_cache"
        r" \(.*\); this fit compiles without it$",
    ) as caught:
        res = plnexp.fit(tiny, n_iter=3, strategy="fori_loop", compile_cache_dir=blocker / "jax_cache")
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert caught[0].filename == __file__, "the warning points at the caller's line"
    assert len(res.elbo) == 3 and math.isnan(res.timing.compile_cache_hits)
    with pytest.warns(timing.CacheWarning):  # the study's switch: no error either, no warm compile
        res = plnexp.fit(tiny, n_iter=3, strategy="fori_loop", compile_cache=True, compile_cache_dir=blocker / "c")
    assert math.isnan(res.timing.compile_warm_s)


@pytest.mark.clears_caches
def test_jax_thresholds_let_a_tiny_program_be_written(tmp_path):
    """JAX writes only programs that took >= 1 s to compile by default: the fit's cache has no minimum."""
    with timing.persistent_cache(tmp_path / "c"):
        assert jax.config.values["jax_persistent_cache_min_compile_time_secs"] == 0
        assert jax.config.values["jax_persistent_cache_min_entry_size_bytes"] == -1  # no minimum, no override
        jax.clear_caches()
        jax.jit(lambda x: x * 3.0 + 1.0).lower(1.0).compile()
    assert _entries(tmp_path / "c")


# Processes, as the point: the second one starts with JAX's in-memory caches empty, so that what it
# does not compile can only come from the first one's files.
@pytest.mark.slow  # two fresh processes (~4 s each): a new process is the point
def test_a_second_process_reads_the_compiled_fit_from_disk(tmp_path):
    code = (
        "import plnexp; r = plnexp.fit(plnexp.load_oaks(), model='profiled', optimizer='rprop', "
        "strategy='while_loop', tol=1e-9, n_iter=200); print(r.timing.compile_cache_hits, r.timing.compile_s)"
    )
    env = {**os.environ, "PLNEXP_OUTPUTS": str(tmp_path / "out")}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    got = []
    for _ in range(2):
        proc = spawn(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        out, err = proc.communicate(timeout=300)  # ended at teardown (conftest's reap) if it outlives this
        assert proc.returncode == 0, err[-2000:]
        hits, seconds = out.split()
        got.append((float(hits), float(seconds)))
    assert got[0][0] == 0 and got[1][0] >= 1, got
    assert got[1][1] < got[0][1], got
    assert _entries(tmp_path / "out" / "jax_cache")


# ---------------------------------------------------------------- strategies JAX does not compile
@pytest.mark.parametrize("name", [n for n, s in STRATEGIES.items() if not s.jax_cache])
def test_torch_strategies_run_with_the_auto_default(name):
    spec = StrategySpec.of(name)
    assert cache_choice(None, spec) == (None, False), "auto is off for them: the cache is JAX's"
    assert cache_choice(False, spec) == (None, False)


def test_jax_strategies_auto_is_the_cache_without_a_warm_compile(outputs):
    folder, warm = cache_choice(None, StrategySpec.of("scan"))
    assert folder == outputs.resolve() / "jax_cache" and warm is False
    assert cache_choice(True, StrategySpec.of("scan"), outputs / "x") == (outputs / "x", True)


# ---------------------------------------------------------------- the command line
def test_config_accepts_true_false_null(outputs):
    for value, expected in (("true", True), ("false", False), ("null", None)):
        (job,) = cli.plan([f"compile_cache={value}"], multirun=False)
        assert job.config.compile_cache is expected
    (job,) = cli.plan([], multirun=False)
    assert job.config.compile_cache is None, "the default is auto"
    t = job.config.fit_spec().timing
    assert t.compile_cache_dir == outputs.resolve() / "jax_cache" and t.warm_compile is False
    assert job.config.as_study().fit_spec().timing.compile_cache_dir is None, "a sweep's auto is off"
    (job,) = cli.plan(["compile_cache=true"], multirun=False)
    assert job.config.as_study() is job.config, "a value the user set is kept in a sweep"
    assert job.config.fit_spec().timing.warm_compile is True


@pytest.mark.parametrize("value", ["1", "auto", "yes"])
def test_config_bad_value_is_one_line(value):
    with pytest.raises(C.ConfigError) as err:
        cli.plan([f"compile_cache={value}"], multirun=False)
    text = str(err.value)
    assert text.startswith("compile_cache=") and "allowed values are true, false, null" in text and "\n" not in text


def test_config_hash_ignores_compile_cache(outputs):
    hashes = {
        provenance.config_hash(cli.plan(o, multirun=False)[0].config)
        for o in ([], ["compile_cache=true"], ["compile_cache=false"], ["compile_cache=null"])
    }
    assert len(hashes) == 1


@pytest.mark.parametrize("strategy", ["torch_eager", "torch_compile"])
def test_torch_strategies_pass_the_checks_with_the_default(outputs, strategy):
    from plnexp.strategies import torch_loops

    if not torch_loops.torch_available():
        pytest.skip("torch is not installed")
    (job,) = cli.plan([f"strategy={strategy}"], multirun=False)
    assert job.config.fit_spec().timing.compile_cache_dir is None


@pytest.mark.slow  # imports torch (~4 s)
def test_a_torch_fit_runs_with_the_default(outputs, tiny):
    from plnexp.strategies import torch_loops

    if not torch_loops.torch_available():
        pytest.skip("torch is not installed")
    res = plnexp.fit(tiny, n_iter=3, strategy="torch_eager")
    assert len(res.elbo) == 3 and math.isnan(res.timing.compile_cache_hits)
    assert _entries(outputs / "jax_cache") == []


@pytest.mark.slow  # ~2-3 s: in CI; the fast subset stays under 2 minutes
def test_run_uses_the_cache_and_sweep_keeps_it_off(outputs, capsys):
    from plnexp.__main__ import main

    assert main(["run", *TINY, "strategy=fori_loop", "experiment=one"]) == 0
    (run,) = _runs(outputs, "one")
    assert run.data.params["compile_cache"] == "None" and run.data.metrics["compile_cache_hits"] == 0
    assert "compile_warm_s" not in run.data.metrics
    written = _entries(outputs / "jax_cache")
    assert written

    # a sweep of the very same fit: cold, nothing read nor written, logged as off
    assert main(["sweep", "sweep=null", *TINY, "strategy=fori_loop", "experiment=study", "report=false"]) == 0
    (child,) = [r for r in _runs(outputs, "study") if "mlflow.parentRunId" in r.data.tags]
    assert child.data.params["compile_cache"] == "False"
    assert "compile_cache_hits" not in child.data.metrics and "compile_warm_s" not in child.data.metrics
    assert _entries(outputs / "jax_cache") == written
    capsys.readouterr()


@pytest.mark.slow  # two more in-process commands (~5 s)
def test_explicit_values_in_a_sweep_and_a_run(outputs, capsys):
    from plnexp.__main__ import main

    # the study's switch, given by the user: cold + warm compiles
    assert (
        main(
            [
                "sweep",
                "sweep=null",
                *TINY,
                "strategy=fori_loop",
                "compile_cache=true",
                "experiment=warm",
                "report=false",
            ]
        )
        == 0
    )
    (child,) = [r for r in _runs(outputs, "warm") if "mlflow.parentRunId" in r.data.tags]
    assert child.data.params["compile_cache"] == "True"
    assert child.data.metrics["compile_warm_cache_hits"] >= 1 and "compile_warm_s" in child.data.metrics

    # explicit false in a run: off
    assert main(["run", *TINY, "strategy=scan", "n_iter=5", "compile_cache=false", "experiment=off"]) == 0
    (run,) = _runs(outputs, "off")
    assert "compile_cache_hits" not in run.data.metrics
    capsys.readouterr()


@pytest.mark.slow  # a run in process (~1.5 s): plnexp.fit's warning is tested fast
def test_run_with_a_cache_that_cannot_be_written_warns_in_one_line(outputs, capsys):
    from plnexp.__main__ import main

    (outputs / "jax_cache").write_text("not a folder")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["run", *TINY, "strategy=fori_loop", "experiment=ro"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "compile_cache" in line]
    assert len(lines) == 1 and lines[0].startswith(
        "plnexp: warning: compile_cache: cannot write the compilation cache"
    ), err
    (run,) = _runs(outputs, "ro")
    assert run.info.status == "FINISHED" and "compile_cache_hits" not in run.data.metrics


@pytest.mark.slow  # a run and its rerun in process (~3 s)
def test_a_rerun_of_a_run_compiles_cold(outputs, capsys):
    """rerun compares timings with the original's: compile_cache auto is off there (as in a sweep)."""
    from plnexp.__main__ import main
    from plnexp.experiment.rerun import main as rerun

    assert main(["run", *TINY, "strategy=fori_loop", "experiment=orig"]) == 0
    (run,) = _runs(outputs, "orig")
    assert rerun([run.info.run_id]) == 0, capsys.readouterr()
    (again,) = [r for r in _runs(outputs, "orig") if r.info.run_id != run.info.run_id]
    assert again.data.params["compile_cache"] == "False" and "compile_cache_hits" not in again.data.metrics
    assert again.data.tags["config_hash"] == run.data.tags["config_hash"]
    capsys.readouterr()
