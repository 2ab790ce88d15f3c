"""The shims over other libraries' private APIs (``plnexp/*/*_compat.py``; docs/development.md,
"Private APIs"): each returns what the private API it wraps returns on the installed release, and
its version gate does what its docstring says (falls back, warns or refuses) when the release it
was written for is set to another one. In-process, no fit."""

from __future__ import annotations

import importlib.util
import inspect
import warnings
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest
from conftest import Counter

from plnexp.experiment import hydra_compat
from plnexp.store import mlflow_compat
from plnexp.system import executor_compat, jax_compat, versions
from plnexp.system.versions import CompatWarning

OTHER = "0.0.1"  # a release no shim was written for


@pytest.fixture(autouse=True)
def fresh_gate(monkeypatch):
    """Each test sees each gate's first warning (they warn once per process)."""
    monkeypatch.setattr(versions, "_warned", set())


def _no_warning(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompatWarning)
        return fn(*args)


# ---------------------------------------------------------------- the gate
def test_installed_drops_the_local_part_and_none_when_missing():
    assert versions.installed("jax") == jax.__version__
    assert versions.installed("plnexp-no-such-distribution") is None
    if importlib.util.find_spec("torch") is not None:
        assert "+" not in (versions.installed("torch") or "")


def test_gate_warns_once_in_one_line(monkeypatch):
    assert versions.gate("jax", jax.__version__, "a shim", "x")
    with pytest.warns(CompatWarning) as got:
        assert not versions.gate("jax", OTHER, "a shim", "doing this instead")
        assert not versions.gate("jax", OTHER, "a shim", "doing this instead")
    assert len(got) == 1
    text = str(got[0].message)
    assert (
        "\n" not in text
        and f"jax {OTHER}" in text
        and f"jax {jax.__version__}" in text
        and "doing this instead" in text
    )


def test_every_shim_names_its_private_api_and_release():
    modules = (jax_compat, executor_compat, mlflow_compat, hydra_compat)
    shims = [f for m in modules for n, f in vars(m).items() if inspect.isfunction(f) and f.__module__ == m.__name__]
    assert len(shims) >= 9
    for f in shims:
        doc = inspect.getdoc(f) or ""
        assert "Wraps" in doc and "Gate:" in doc, f.__qualname__


# ---------------------------------------------------------------- jax
def test_backends_initialized_is_jaxs_own_answer(monkeypatch):
    from jax._src import xla_bridge

    jax.devices()
    assert _no_warning(jax_compat.backends_initialized) is xla_bridge.backends_are_initialized() is True
    monkeypatch.setattr(jax_compat, "JAX", OTHER)
    with pytest.warns(CompatWarning, match="backends_initialized"):
        assert jax_compat.backends_initialized() is True
    monkeypatch.delattr(xla_bridge, "backends_are_initialized")  # the fallback's fallback: the registry
    assert jax_compat.backends_initialized() is bool(xla_bridge._backends)


def test_backends_initialized_false_before_jax_is_imported(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "jax._src.xla_bridge")
    assert jax_compat.backends_initialized() is False


def test_reset_compilation_cache_calls_jaxs(monkeypatch):
    from jax.experimental.compilation_cache import compilation_cache

    calls = []
    monkeypatch.setattr(compilation_cache, "reset_cache", lambda: calls.append(1))
    _no_warning(jax_compat.reset_compilation_cache)
    monkeypatch.setattr(jax_compat, "JAX", OTHER)
    with pytest.warns(CompatWarning, match="reset_compilation_cache"):
        jax_compat.reset_compilation_cache()
    assert calls == [1, 1]


def test_cache_hit_event_is_the_one_jax_records(monkeypatch):
    from jax._src import compiler

    name = _no_warning(jax_compat.cache_hit_event)
    assert f'"{name}"' in inspect.getsource(compiler) or f"'{name}'" in inspect.getsource(compiler)
    monkeypatch.setattr(jax_compat, "JAX", OTHER)
    with pytest.warns(CompatWarning, match="cache_hit_event"):
        assert jax_compat.cache_hit_event() == name


def test_hlo_module_cost_is_jaxlibs(monkeypatch):
    from jaxlib import _hlo, _jax  # type: ignore[attr-defined]

    text = jax.jit(lambda x: x * 2.0 + 1.0).lower(jnp.ones(8)).compiler_ir("hlo").as_hlo_text()
    client = jax.devices()[0].client
    want = dict(_jax.hlo_module_cost_analysis(client, _hlo.hlo_module_from_text(text)))
    assert dict(_no_warning(jax_compat.hlo_module_cost, text, client)) == want
    assert want.get("flops", 0) > 0
    monkeypatch.setattr(jax_compat, "JAXLIB", OTHER)
    with pytest.warns(CompatWarning, match="hlo_module_cost"):
        assert dict(jax_compat.hlo_module_cost(text, client)) == want


def test_setup_finds_the_ffi_headers_by_the_public_path():
    import jaxlib
    from pathlib import Path

    include = Path(jax.ffi.include_dir())
    assert (include / "xla" / "ffi" / "api" / "ffi.h").is_file()
    assert include.resolve() == (Path(jaxlib.__file__).resolve().parent / "include").resolve()  # the old path


# ---------------------------------------------------------------- submitit, loky
def test_result_file_is_submitits_result_pickle(tmp_path, monkeypatch):
    paths_module = pytest.importorskip("submitit.core.utils")
    paths = paths_module.JobPaths(tmp_path, job_id="12_3")
    job = SimpleNamespace(paths=paths)
    assert _no_warning(executor_compat.result_file, job) == paths.result_pickle
    monkeypatch.setattr(executor_compat, "SUBMITIT", OTHER)
    with pytest.warns(CompatWarning, match="result_file"):
        assert executor_compat.result_file(job) == paths.result_pickle


def test_loky_executor_running_reads_lokys_executor(monkeypatch):
    from joblib.externals.loky import reusable_executor

    monkeypatch.setattr(reusable_executor, "_executor", None)
    assert _no_warning(executor_compat.loky_executor_running) is False
    monkeypatch.setattr(reusable_executor, "_executor", object())
    assert _no_warning(executor_compat.loky_executor_running) is True
    monkeypatch.setattr(executor_compat, "JOBLIB", OTHER)
    with pytest.warns(CompatWarning, match="loky_executor_running"):
        assert executor_compat.loky_executor_running() is True
    monkeypatch.delattr(reusable_executor, "_executor")
    assert executor_compat.loky_executor_running() is False


# ---------------------------------------------------------------- torch
@pytest.mark.slow
def test_error_on_recompile_sets_dynamos_flag_in_the_block_only(monkeypatch):
    torch = pytest.importorskip("torch")
    from plnexp.strategies import torch_compat

    before = torch._dynamo.config.error_on_recompile
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompatWarning)
        with torch_compat.error_on_recompile() as error:
            assert error is torch._dynamo.exc.RecompileError
            assert torch._dynamo.config.error_on_recompile is True
    assert torch._dynamo.config.error_on_recompile == before
    monkeypatch.setattr(torch_compat, "TORCH", OTHER)
    with pytest.warns(CompatWarning, match="error_on_recompile"), torch_compat.error_on_recompile() as error:
        assert error is torch._dynamo.exc.RecompileError


@pytest.mark.slow
def test_inductors_cache_switch_is_an_alias_of_the_public_one():
    torch = pytest.importorskip("torch")
    import torch._inductor.config as inductor

    with torch.compiler.config.patch(force_disable_caches=True):
        assert inductor.force_disable_caches is True
    assert inductor.force_disable_caches is torch.compiler.config.force_disable_caches


# ---------------------------------------------------------------- mlflow
def test_sqlalchemy_store_is_mlflows(tmp_path, monkeypatch):
    from mlflow.store.tracking import sqlalchemy_store

    store = _no_warning(mlflow_compat.sqlalchemy_store, f"sqlite:///{tmp_path / 'a.db'}", tmp_path.as_uri())
    try:
        assert isinstance(store, sqlalchemy_store.SqlAlchemyStore)
        assert store.get_experiment("0").artifact_location.startswith(tmp_path.as_uri())
    finally:
        store.engine.dispose()
    made = []
    monkeypatch.setattr(sqlalchemy_store, "SqlAlchemyStore", lambda *a: made.append(a) or "store")
    monkeypatch.setattr(mlflow_compat, "MLFLOW", OTHER)
    with pytest.warns(CompatWarning, match="sqlalchemy_store"):
        assert mlflow_compat.sqlalchemy_store("sqlite:///x", "file:///y") == "store"
    assert made == [("sqlite:///x", "file:///y")]


def test_credentials_are_mlflows_then_the_variables(tmp_path, monkeypatch):
    import mlflow.utils.credentials as creds

    monkeypatch.setattr(creds, "_get_credentials_path", lambda: str(tmp_path / "credentials"))
    (tmp_path / "credentials").write_text("[mlflow]\nmlflow_tracking_username = filed\nmlflow_tracking_password = pw\n")
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    want = creds.read_mlflow_creds()
    assert _no_warning(mlflow_compat.credentials) == (want.username, want.password) == ("filed", "pw")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "env")
    monkeypatch.setattr(mlflow_compat, "MLFLOW", OTHER)
    with pytest.warns(CompatWarning, match="credentials"):
        assert mlflow_compat.credentials() == ("env", None)  # the public path: the variables only


# ---------------------------------------------------------------- hydra
def test_parse_overrides_is_hydras_parser(monkeypatch):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    given = ["a=1", "model=pca,full", "+b.c=x", "~d"]
    want = OverridesParser.create().parse_overrides(given)
    assert _no_warning(hydra_compat.parse_overrides, given) == want
    with pytest.raises(HydraException):
        hydra_compat.parse_overrides(["a=["])
    monkeypatch.setattr(hydra_compat, "HYDRA", OTHER)
    with pytest.warns(CompatWarning, match="parse_overrides"):
        assert hydra_compat.parse_overrides(given) == want


def test_cached_config_sources_compose_what_hydra_composes_and_reread_an_edited_file(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    from plnexp.jobs.config import CONF_DIR

    user = tmp_path / "conf" / "dataset"
    user.mkdir(parents=True)
    (user / "mine.yaml").write_text("defaults:\n  - synthetic\n  - _self_\nn: 7\n")
    jobs = [
        ["model=pca", "dataset=synthetic_pca", "n_iter=3"],
        ["strategy=fori_loop", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "dataset=mine"],
    ]
    loads = Counter(OmegaConf.load)
    monkeypatch.setattr(hydra_compat, "_SOURCE_CACHE", {})  # cold: each file parsed by Hydra itself first
    assert _no_warning(hydra_compat.cache_config_sources) is True
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="plnexp"):
        cold = [compose("config", overrides=job, return_hydra_config=True) for job in jobs]
        want = [(OmegaConf.to_yaml(c), _flags(c)) for c in cold]
        with open_dict(cold[0]):
            cold[0].model.rank = 99  # a composition's nodes are its own: the next one never sees this
        monkeypatch.setattr(OmegaConf, "load", loads)
        warm = [compose("config", overrides=job, return_hydra_config=True) for job in jobs]
        assert loads.calls == 0  # every file of both defaults trees came from the cache
        assert [(OmegaConf.to_yaml(w), _flags(w)) for w in warm] == want
        assert warm[0].model.rank != 99 and warm[1].dataset.n == 7
        (user / "mine.yaml").write_text("defaults:\n  - synthetic\n  - _self_\nn: 8\n")  # same size, new bytes
        assert compose("config", overrides=jobs[1]).dataset.n == 8 and loads.calls == 1
    from hydra._internal.sources_registry import SourcesRegistry

    for scheme in ("file", "pkg", "structured"):  # as in a process not cached yet (the marks back after the test)
        monkeypatch.delattr(SourcesRegistry.instance().types[scheme], hydra_compat._MARK)
    monkeypatch.setattr(hydra_compat, "HYDRA", OTHER)
    with pytest.warns(CompatWarning, match="cache_config_sources"):
        assert hydra_compat.cache_config_sources() is False


def _flags(cfg) -> dict:
    """Each node's struct and read-only flags, by its path (what a YAML dump does not show)."""
    from omegaconf import DictConfig, OmegaConf

    out = {}

    def walk(node, path):
        out[path] = (OmegaConf.is_struct(node), OmegaConf.is_readonly(node))
        if isinstance(node, DictConfig):
            for key in node.keys():
                child = node._get_node(key)
                if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
                    walk(child, f"{path}.{key}")

    walk(cfg, "")
    return out
