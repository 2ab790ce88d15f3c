"""The config's schema (plnexp.jobs.schema): each field declares its allowed values once; a config
loaded from a composed node and one built in code are held to the same rules, with the same line."""

from __future__ import annotations

import dataclasses

import pytest

from plnexp.jobs import config as C
from plnexp.jobs import config_load
from plnexp.jobs import schema

# field -> (a bad value, the line it must give), written out here, not read from the schema
BAD = {
    "n_iter": (0, "n_iter=0: allowed values are integers >= 1"),
    "repeats": (True, "repeats=True: allowed values are integers >= 1"),
    "warmup": (-1, "warmup=-1: allowed values are integers >= 0"),
    "time_budget_s": (float("inf"), "time_budget_s=inf: allowed values are numbers >= 0 (seconds)"),
    "first_call": ("yes", "first_call='yes': allowed values are true, false"),
    "init": ("zeros", "init='zeros': allowed values are seed, data, random"),
    "gradient": ("numeric", "gradient='numeric': allowed values are analytic, autodiff"),
    "seed": (1.5, "seed=1.5: allowed values are integers >= 0"),
    "replicates": (0, "replicates=0: allowed values are integers >= 1"),
    "processes": (0, "processes=0: allowed values are integers >= 1"),
    "experiment": ("", "experiment='': allowed values are non-empty strings"),
    "tracking_uri": (3, "tracking_uri=3: allowed values are null or an MLflow tracking URI string"),
    "store_timeout_s": (0.5, "store_timeout_s=0.5: allowed values are numbers from 1 to 3600 (seconds)"),
    "device": ("tpu9", "device='tpu9': allowed values are cpu, gpu, auto"),
}


@pytest.fixture
def node(tiny_config):
    return config_load.loadable(tiny_config)


@pytest.mark.parametrize("key", sorted(BAD))
def test_a_bad_top_level_value_is_one_line_from_the_node_and_from_code(node, tiny_config, key):
    value, line = BAD[key]
    with pytest.raises(C.ConfigError) as loaded:
        config_load.load({**node, key: value}, check_device=False)
    assert str(loaded.value) == line
    field = "n_iter_requested" if key == "n_iter" else key
    with pytest.raises(C.ConfigError) as built:
        dataclasses.replace(tiny_config, **{field: value})
    assert str(built.value) == line.replace("n_iter=", "n_iter_requested=", 1)


def test_every_checked_field_of_config_is_in_the_table_above():
    assert set(schema.allowed_values(C.Config)) == {("n_iter_requested" if k == "n_iter" else k) for k in BAD} | {
        "n_iter"
    }


@pytest.mark.parametrize(
    ("cls", "key", "value", "line"),
    [
        (C.SyntheticData, "n", 1, "dataset.n=1: allowed values are integers >= 2"),
        (C.SyntheticData, "replication", 0, "dataset.replication=0: allowed values are integers >= 1"),
        (C.SyntheticPcaData, "q", 0, "dataset.q=0: allowed values are integers >= 1"),
        (C.ReportSpec, "rounds", -1, "report.rounds=-1: allowed values are integers >= 0"),
        (C.ReportSpec, "control", 1, "report.control=1: allowed values are true, false"),
        (
            C.ReportSpec,
            "rounds_budget_s",
            0,
            "report.rounds_budget_s=0: allowed values are numbers of seconds in (0, 3600]",
        ),
    ],
)
def test_the_nested_specs_check_their_fields_with_their_key_path(cls, key, value, line):
    with pytest.raises(C.ConfigError) as e:
        cls(**{key: value})
    assert str(e.value) == line


def test_values_are_held_converted_and_a_missing_key_takes_its_default(node):
    node = {**node, "time_budget_s": 2, "init": "data"}
    del node["processes"]  # a config logged before the key existed
    config = config_load.load(node, check_device=False)
    assert config.time_budget_s == 2.0 and isinstance(config.time_budget_s, float)
    assert config.init is C.Init("data") and config.processes == 1
