"""Strategy entries own their options: validation, config hash, run names and the fit follow from
the entry. A toy strategy with a new option, added in this test by its entry and its yaml only,
goes through the whole pipeline; today's entries hash as plnexp always hashed them."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import numpy as np
import pytest

import plnexp
from plnexp.experiment import plan as cli
from plnexp.fitting import engine as fitting
from plnexp.jobs import provenance
from plnexp import strategies
from plnexp.jobs import config as C
from plnexp.strategies import STRATEGIES, Strategy, StrategySpec, option
from plnexp.strategies.scans import scan_program


# ---------------------------------------------------------------- the toy strategy: an entry and a yaml
@dataclass(frozen=True)
class Chunked:
    chunk: int = option(5, "integers >= 1", lambda v: isinstance(v, int) and v >= 1, doc="steps per scan body")


TOY = Strategy("toy_chunked", Chunked, lambda pb, n, o: scan_program(pb, n, "dict", unroll=o.chunk))
TOY_YAML = "name: toy_chunked\nchunk: 5\n"


@pytest.fixture
def toy(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    shutil.copytree(C.CONF_DIR, conf)
    (conf / "strategy" / "toy_chunked.yaml").write_text(TOY_YAML)
    monkeypatch.setattr(C, "CONF_DIR", conf)
    monkeypatch.setitem(STRATEGIES, TOY.name, TOY)
    return TOY


@pytest.mark.slow  # ~2-3 s: in CI; the fast subset stays under 2 minutes
def test_a_new_strategy_with_a_new_option_needs_only_its_entry_and_yaml(toy):
    (job,) = cli.plan(
        ["strategy=toy_chunked", "strategy.chunk=3", "dataset=synthetic", "dataset.n=40", "dataset.p=4", "n_iter=7"],
        multirun=False,
    )
    assert job.config.strategy == StrategySpec("toy_chunked", Chunked(3))
    assert job.name == "toy_chunked-synthetic_n40_p4_d2_s0-f32-cpu-chunk3-n_iter7"
    assert C.flatten(job.config.as_dict())["strategy.chunk"] == 3
    (default,) = cli.plan(["strategy=toy_chunked"], multirun=False)
    assert default.name == "toy_chunked-oaks-f32-cpu"  # an option at its default is not named
    assert provenance.config_hash(job.config) != provenance.config_hash(
        cli.plan(
            [
                "strategy=toy_chunked",
                "strategy.chunk=4",
                "dataset=synthetic",
                "dataset.n=40",
                "dataset.p=4",
                "n_iter=7",
            ],
            multirun=False,
        )[0].config
    )
    with pytest.raises(C.ConfigError, match=r"^strategy.chunk=0: allowed values are integers >= 1$"):
        cli.plan(["strategy=toy_chunked", "strategy.chunk=0"], multirun=False)
    with pytest.raises(C.ConfigError, match=r"^strategy.chunk: unknown key; allowed keys under strategy are name$"):
        cli.plan(["strategy=scan", "strategy.chunk=2"], multirun=False)
    # the fit: the toy's scan with 3 steps per body runs the same maths as scan
    data = plnexp.simulate(40, 4, 2, seed=1)
    toy_fit = fitting.run(data, job.config.fit_spec(), timed=False)
    scan_fit = plnexp.fit(data, n_iter=7, strategy="scan", timed=False)  # run's defaults are plnexp.fit's
    np.testing.assert_allclose(toy_fit.elbo, scan_fit.elbo, rtol=1e-5)  # float32: fusion rounding
    assert plnexp.fit(data, n_iter=4, strategy="toy_chunked", chunk=2, timed=False).n_iter == 4


def test_options_of_other_strategies_are_ignored_by_fit_and_unknown_ones_refused():
    data = plnexp.simulate(30, 3, 1, seed=0)
    a = plnexp.fit(data, n_iter=3, strategy="scan", unroll=4, tol=0.5, timed=False)  # one call for every strategy
    b = plnexp.fit(data, n_iter=3, strategy="scan", timed=False)
    np.testing.assert_array_equal(a.elbo, b.elbo)
    with pytest.raises(TypeError, match="unexpected keyword argument 'unrol'"):
        plnexp.fit(data, n_iter=3, strategy="scan", unrol=4, timed=False)
    with pytest.raises(ValueError, match=r"^strategy.patience=0: allowed values are integers >= 1$"):
        plnexp.fit(data, n_iter=3, strategy="while_loop", patience=0, timed=False)


# The hashes plnexp logged for these configs before strategy entries owned their options (commit
# 441b843, when every strategy carried unroll, tol, patience and mode): resume=true and rerun still
# match the runs logged then.
FORMAT1_HASHES = {
    ("strategy=scan",): "d5f9d49f0bb4c4edb567c534a53f39aaef92957fa3c1993f832e6088d39df208",
    ("strategy=while_loop", "strategy.tol=0.001"): "0150fe7753d529eed6d9be546de4b0b3d67ae6a5f45b593e8baa980be9e0afb6",
    ("strategy=while_loop",): "f4b554001330619f4bf69b50b5461fc128d2857f8737b64741d40da5b370baf5",
    (
        "strategy=scan_unrolled",
        "strategy.unroll=4",
        "n_iter=7",
    ): "7c8d445d44e9532a14a5bb3d222e4bf2bad61e24ba923cadf850a50a9cdf94a8",
    (
        "strategy=eager",
        "dataset=synthetic",
        "precision=float64",
    ): "17474d2f2c34b18ddbcf054af782c8359ca3621a80cd022424e965d6b4399110",
    (
        "strategy=fori_loop",
        "dataset.replication=100",
    ): "1c520afdafb40bee1e995add3a09318e379ae48fa9d9524ecb85e44addf051c0",
}


# The run defaults of then (the tutorial's workload), which #63 replaced by converging ones: named
# here, so that the configs are those the hashes were logged for.
THEN = ["model=full", "optimizer=radam_clip", "init=seed", "n_iter=1000"]


@pytest.mark.parametrize("overrides", list(FORMAT1_HASHES))
def test_config_hashes_of_earlier_runs_are_kept(overrides):
    (job,) = cli.plan(THEN + list(overrides), multirun=False)
    assert provenance.config_hash(job.config) == FORMAT1_HASHES[overrides]


def test_a_format1_config_artifact_loads_with_the_options_its_strategy_has():
    node = {"strategy": {"name": "scan", "unroll": 8, "tol": 1e-6, "patience": 10, "mode": "default"}, "n_iter": 5}
    assert provenance.migrate_node(node)["strategy"] == {"name": "scan"}
    node["strategy"]["name"] = "while_loop"
    assert provenance.migrate_node(node)["strategy"] == {"name": "while_loop", "tol": 1e-6, "patience": 10}


def test_every_yaml_holds_its_entry_options_at_their_defaults():
    import yaml

    for name in STRATEGIES:
        node = yaml.safe_load((C.CONF_DIR / "strategy" / f"{name}.yaml").read_text())
        assert node == StrategySpec(name).as_dict(), name
    assert strategies.TORCH_STRATEGIES == ("torch_eager", "torch_compile")
