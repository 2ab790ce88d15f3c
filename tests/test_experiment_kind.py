"""What MLflow's UI shows of plnexp's store (issue #32): every experiment plnexp writes into is tagged
a model-training one (``mlflow.experimentKind``), holds the saved view "plnexp study" of its runs
table and a description linking to it; every job's run has its data set as an MLflow dataset input
(the runs table's Dataset column), also when its result was kept locally and sent later. In one
process, on the fixtures' fresh store; the browser's side is tests/test_dashboard.py."""

from __future__ import annotations

import json
import time

import pytest
from types import SimpleNamespace

from conftest import store_client

from plnexp import store as tracking
from plnexp.store import experiment_view
from plnexp.store import writes

TINY = ("dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3")


def assert_dressed(exp) -> None:
    """The experiment opens on the study: its kind, the saved view, the description's link."""
    assert exp.tags[experiment_view.EXPERIMENT_KIND_TAG] == "custom_model_development"
    view = json.loads(exp.tags[experiment_view.STUDY_VIEW_TAG])
    assert view["name"] == "plnexp study" and isinstance(view["createdAt"], int)
    state = json.loads(view["state"])
    assert state["selectedColumns"][:4] == [
        f"metrics.`{k}`" for k in ("ms_per_iter", "run_s_iqr", "compile_s", "final_elbo")
    ]
    assert state["orderByKey"] == "metrics.`ms_per_iter`" and state["orderByAsc"] is True
    link = f"#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning&viewStateShareKey=plnexp-study"
    assert tracking.study_link(exp.experiment_id) == link
    assert f"]({link})" in exp.tags[experiment_view.NOTE_TAG]


@pytest.mark.slow
def test_a_run_tags_its_experiment_and_logs_its_data_set(outputs, plnexp_main):
    ran = plnexp_main("run", *TINY)
    assert ran.returncode == 0, ran.stderr
    cl = store_client(outputs)
    exp = cl.get_experiment_by_name("run")
    assert_dressed(exp)
    (run,) = cl.search_runs([exp.experiment_id])
    (given,) = run.inputs.dataset_inputs
    data = given.dataset
    assert data.name == "synthetic_n30_p5_d2_s0 30×5"
    assert data.digest == run.data.tags["data_digest"][:8] and len(data.digest) == 8
    assert json.loads(data.profile) == {"n": 30, "p": 5}
    assert data.source_type == "code"
    assert json.loads(data.source)["tags"]["dataset.seed"] == "0"
    assert [(t.key, t.value) for t in given.tags] == [("mlflow.data.context", "training")]


def test_an_existing_experiment_gets_the_missing_tags_once_and_keeps_its_description(outputs):
    cl = store_client(outputs)
    exp_id = cl.create_experiment("theirs", tags={experiment_view.NOTE_TAG: "our own words"})
    calls = []

    class Counting:
        """The client, counting the experiment tags set."""

        def __getattr__(self, name):
            return getattr(cl, name)

        def set_experiment_tag(self, *args):
            calls.append(args[1])
            return cl.set_experiment_tag(*args)

    assert writes.experiment_id(Counting(), "theirs") == exp_id
    assert sorted(calls) == sorted([experiment_view.EXPERIMENT_KIND_TAG, experiment_view.STUDY_VIEW_TAG])
    exp = cl.get_experiment(exp_id)
    assert exp.tags[experiment_view.NOTE_TAG] == "our own words"  # the user's description stays
    assert exp.tags[experiment_view.EXPERIMENT_KIND_TAG] == "custom_model_development"
    calls.clear()
    assert writes.experiment_id(Counting(), "theirs") == exp_id
    assert calls == []  # once there, never written again (a view the user changed stays too)
    new_id = writes.experiment_id(Counting(), "fresh")  # created: every tag
    assert_dressed(cl.get_experiment(new_id))


def test_tags_the_store_refuses_never_fail_the_fit(outputs):
    cl = store_client(outputs)

    class Refusing:
        def __getattr__(self, name):
            return getattr(cl, name)

        def set_experiment_tag(self, *args):
            raise PermissionError("HTTP 403: no permission to update the experiment")

    exp_id = writes.experiment_id(Refusing(), "refused")
    assert experiment_view.EXPERIMENT_KIND_TAG not in cl.get_experiment(exp_id).tags


def test_a_result_kept_locally_sends_its_data_set_later(outputs, tiny_config):
    """A kept record is JSON (tracking.pending): the input goes through it; an older record, kept
    before records held inputs, is written without one."""
    cl = store_client(outputs)
    exp_id = writes.experiment_id(cl, "kept")
    job = SimpleNamespace(config=tiny_config, data_digest="ab" * 32, data_shape=(30, 5), replicate=0)
    base = {"params": {}, "tags": {}, "metrics": [], "artifacts": {}, "plot_title": "", "status": "FINISHED"}
    record = json.loads(json.dumps({**base, "inputs": writes.dataset_inputs(job), "end_time": int(time.time() * 1000)}))
    run_id = cl.create_run(exp_id).info.run_id
    writes.write_record(cl, run_id, record)
    writes.write_record(cl, run_id, record)  # sent twice (a retry): still one input
    (given,) = cl.get_run(run_id).inputs.dataset_inputs
    assert (given.dataset.name, given.dataset.digest) == ("synthetic_n30_p5_d2_s0 30×5", "abababab")
    old = cl.create_run(exp_id).info.run_id
    writes.write_record(cl, old, {**base, "end_time": int(time.time() * 1000)})
    assert cl.get_run(old).inputs.dataset_inputs == [] and cl.get_run(old).info.status == "FINISHED"
    assert writes.dataset_inputs(SimpleNamespace(config=tiny_config, data_digest="", data_shape=None)) == []
