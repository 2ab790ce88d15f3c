"""A run read back as a :class:`plnexp.store.records.RunRecord`: the mapping checked both ways on runs
written by the real write path (a sweep of one tiny fit and its control job, in the test's sqlite
store), and the in-memory store (:mod:`plnexp.store.memory`) checked to read those very runs back as
the same records through the same queries (:class:`plnexp.store.records.Store`), so that the unit
tests' store cannot drift from the real one."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from plnexp import store as tracking
from plnexp.experiment import plan as cli
from plnexp.experiment import job_task, runner, sweep
from plnexp.jobs import provenance
from plnexp.jobs.spec import JobSpec, Kind
from plnexp.jobs.provenance import RESUMES_TAG
from plnexp.jobs.tags import CONTROL_OF_TAG, CONTROL_TAG, PARENT_TAG, PEER_TAG, SWEEP_TAG
from plnexp.store import memory, owners
from plnexp.store.records import FIELDS, RunRecord

TINY = [
    *("dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3", "strategy=scan", "experiment=rec"),
    *("repeats=1", "warmup=0", "time_budget_s=0"),  # one timed run: the record reads what it logs
]


@pytest.fixture(scope="module")
def swept(tmp_path_factory, migrated_store):
    """A closed sweep ``rec`` of the real write path: job 0 (a tiny fit) and, as the sweep's control
    job repeats it, job 1 tagged as its control, in a store of their own (the tests of this module
    only read it). Returns (store URI, sweep record, the job)."""
    out = tmp_path_factory.mktemp("records") / "outputs"
    out.mkdir()
    shutil.copy(migrated_store, out / "mlflow.db")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLNEXP_OUTPUTS", str(out))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        (job,) = cli.plan(TINY, multirun=False)
        uri = tracking.check_store()
        record = sweep.open_sweep(out.parent / "sw", "rec", "rec", uri, 1, {"command": "sweep rec"})
        for num, tags in ((0, {}), (1, {CONTROL_TAG: "true", CONTROL_OF_TAG: "0"})):
            done = job_task.run_job(JobSpec(job.config, job.name, num, job.overrides, tags=tags), parent=record.parent)
            assert done.status == "FINISHED", done.reason
        sweep.close_sweep(record, "FINISHED")
        yield uri, record, job


def _as_written(field: str, value) -> str | None:
    """A field's value as its tag holds it (None: the tag is absent)."""
    if field in ("overrides", "resumes"):
        return (" " if field == "overrides" else ",").join(value) if value else None
    if value is None or value == "":
        return None
    return str(value)


def _check_fields_are_their_tags(rec: RunRecord) -> None:
    """Every field of :data:`FIELDS` reads its tag: written, the field is the tag's value; absent, the
    field is its empty value."""
    for field, tag in FIELDS.items():
        written = rec.tags.get(tag)
        shown = _as_written(field, getattr(rec, field))
        if field == "replicate" and written is None:
            assert rec.replicate == 0  # runs logged before replicates were tagged
        elif field == "overrides" and written == "":
            assert rec.overrides == ()
        else:
            assert shown == (written or None), (field, tag, written, getattr(rec, field))


def test_a_job_run_reads_back_as_its_record(swept):
    uri, record, job = swept
    db = tracking.open(uri)
    (run, control) = db.sweep(record.parent_id)
    assert run == db.run(run.run_id)
    assert (run.name, run.status, run.status_reason, run.deleted) == (job.name, "FINISHED", "", False)
    assert (run.experiment_id, run.parent_id) == (record.experiment_id, record.parent_id)
    assert (run.job, run.kind, run.replicate, run.control_of, run.peer) == (0, Kind.JOB, 0, None, None)
    assert run.config_hash == provenance.config_hash(job.config) and run.key == (run.config_hash, 0)
    assert run.overrides == tuple(job.overrides) and run.rerun_of == ""
    assert run.owner == owners.current()
    assert (run.dataset, run.data_shape, run.platform) == (job.config.dataset.label, (30, 5), "cpu")
    assert (run.provenance, run.version) == (provenance.PROVENANCE_VERSION, provenance.package_version())
    assert run.data_digest == runner.load_data(job.config.dataset).digest()
    assert run.params["strategy.name"] == "scan" and run.metrics["ms_per_iter"] > 0
    assert run.start_time is not None and run.end_time is not None and run.start_time <= run.end_time
    assert (run.verdict, run.reference, run.group) == ("", "", "")  # no rounds: a group of one strategy
    # the control job: the same config, told apart by its tags
    assert (control.job, control.kind, control.control_of, control.control) == (1, Kind.CONTROL, 0, True)
    assert control.control_tags == {CONTROL_TAG: "true", CONTROL_OF_TAG: "0"}
    assert control.config_hash == run.config_hash
    for rec in (run, control):
        _check_fields_are_their_tags(rec)


def test_a_sweeps_parent_reads_back_as_its_record(swept):
    uri, record, _ = swept
    db = tracking.open(uri)
    parent = db.run(record.parent_id)
    assert parent.is_parent and parent.parent_id == "" and parent.job is None
    assert (parent.sweep, parent.jobs, parent.command, parent.resumes) == ("rec", 1, "sweep rec", ())
    _check_fields_are_their_tags(parent)
    assert not db.run(db.sweep(parent)[0].run_id).is_parent
    assert db.run("0" * 32) is None
    assert db.latest_parent() == db.latest_parent("rec") == parent and db.latest_parent("no-such") is None


@pytest.mark.slow
def test_finished_answers_the_job_runs_of_config_hashes(swept):
    uri, record, job = swept
    db = tracking.open(uri)
    h = provenance.config_hash(job.config)
    found = db.finished("rec", [h, "f" * 16])
    assert list(found) == [h]  # an unknown hash is left out
    (run,) = found[h]  # the control job repeats the config but answers no job
    assert (run.job, run.kind) == (0, Kind.JOB)
    assert db.finished_runs("rec") == found[h]
    assert db.finished("no-such-experiment", [h]) == {}


def _copy_to_memory(db: tracking.Store, runs: list[RunRecord]) -> str:
    """The runs, as plain dicts, with their ELBO curves and config artifacts, in a new in-memory store
    (one experiment, ``rec``)."""
    mem = memory.new()
    st = memory.store(mem)
    for r in runs:
        st.add(
            "rec",
            r.name,
            r.status,
            params=r.params,
            metrics=r.metrics,
            tags=r.tags,
            start_time=r.start_time,
            end_time=r.end_time,
            run_id=r.run_id,
            histories={"elbo": db.curve(r.run_id)},
            artifacts={"config.yaml": db.artifact(r.run_id, "config.yaml")},
        )
    return mem


def test_the_in_memory_store_reads_back_the_real_runs_as_the_same_records(swept):
    uri, record, job = swept
    db = tracking.open(uri)
    parent = db.run(record.parent_id)
    real = db.sweep(parent)
    mem = tracking.open(_copy_to_memory(db, [parent, *real]))
    assert isinstance(mem, memory.MemoryStore)

    def alike(a: list[RunRecord], b: list[RunRecord]) -> bool:  # the experiment's id is the store's own
        return [replace(r, experiment_id="") for r in a] == [replace(r, experiment_id="") for r in b]

    assert alike([mem.run(parent.run_id)], [parent])
    assert alike(mem.sweep(parent.run_id), real)
    assert alike(mem.children(mem.run(parent.run_id)), db.children(parent))
    h = provenance.config_hash(job.config)
    assert alike(mem.finished("rec", [h])[h], db.finished("rec", [h])[h])
    assert alike([mem.latest_parent("rec")], [db.latest_parent("rec")])
    assert alike(mem.search(None, tags={SWEEP_TAG: None}), db.search(None, tags={SWEEP_TAG: None}))
    assert mem.run("0" * 32) is None
    run = real[0]
    assert (mem.curve(run.run_id) == db.curve(run.run_id)).all() and len(db.curve(run.run_id)) == 3
    assert mem.artifact(run.run_id, "config.yaml") == db.artifact(run.run_id, "config.yaml")


# ---------------------------------------------------------------- a sweep's runs, on the in-memory store
def _job(st: memory.MemoryStore, parent: str, num: int, h: str, status: str = "FINISHED", **tags) -> str:
    return st.add(
        "exp",
        f"job{num}",
        status,
        tags={PARENT_TAG: parent, tracking.JOB_TAG: str(num), provenance.HASH_TAG: h, **tags},
        start_time=num,
    )


def test_a_resumed_sweeps_runs_are_its_own_and_the_earlier_finished_ones_it_reused():
    st = memory.store(memory.new())
    first = st.add("exp", "first", tags={SWEEP_TAG: "s"})
    _job(st, first, 0, "a")
    failed = _job(st, first, 1, "b", status="FAILED")
    reused = _job(st, first, 2, "c")
    hidden = _job(st, first, 3, "a", **{CONTROL_TAG: "true", CONTROL_OF_TAG: "0"})  # the earlier control
    second = st.add("exp", "second", tags={SWEEP_TAG: "s", RESUMES_TAG: first})
    again = _job(st, second, 0, "a")
    retried = _job(st, second, 1, "b")
    control = _job(st, second, 3, "c", **{CONTROL_TAG: "true", CONTROL_OF_TAG: "2"})  # its control: c again
    got = [r.run_id for r in st.sweep(second)]
    # its own runs; of the earlier sweep's, the FINISHED run of c (its own control answers no job),
    # never the earlier control nor the FAILED run; in job order
    assert got == [again, retried, reused, control]
    assert hidden not in got and failed not in got
    assert [r.run_id for r in st.children(st.run(second))] == [again, retried, control]
    assert st.sweep(again) == []  # a job's run is no sweep's parent
    assert st.latest_parent().run_id == second and st.latest_parent("exp").run_id == second


def test_the_in_memory_store_searches_as_the_queries_ask():
    st = memory.store(memory.new())
    a = st.add("exp", "a", tags={PEER_TAG: "pyplnmodels", provenance.HASH_TAG: "h"}, metrics={"x": 2.0})
    b = st.add("exp", "b", "FAILED", tags={provenance.HASH_TAG: "h"})
    gone = st.add("exp", "c", tags={provenance.HASH_TAG: "h"}, deleted=True)
    assert [r.run_id for r in st.finished_runs("exp")] == [a]  # FINISHED, with a config hash, not deleted
    assert st.run(a).kind is Kind.PEER and st.run(a).peer == "pyplnmodels" and st.run(a).metrics == {"x": 2.0}
    assert [r.run_id for r in st.search(["1"], "FINISHED", {PEER_TAG: "pyplnmodels"})] == [a]
    assert [r.run_id for r in st.search(["1"], "FAILED")] == [b]
    assert [r.run_id for r in st.search(None, tags={provenance.HASH_TAG: None})] == [a, b]  # any value
    assert st.search(["1"], tags={PEER_TAG: "pypln"}) == [] and st.search(["2"]) == []  # one experiment
    assert st.run(gone).deleted  # a deleted run is read by its id, and found by no search
