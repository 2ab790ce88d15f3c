"""Writing runs: the experiment (got or created), a sweep's parent run, a job's run (created
RUNNING when the job starts, tagged with its :mod:`owner <plnexp.store.owners>`, and written in a
few short calls after the fit: params, metrics and the ELBO curve in ``log_batch`` calls, artifacts,
then its status), a report attached to a parent, tags added later.

Every param, tag, note and text written here passes through :mod:`plnexp.system.redact` first (a store is
read by more people, for longer, than the process that writes to it): a password in a
``tracking_uri``, an override or a command line is logged as ``***``.
"""

from __future__ import annotations

import gzip
import json
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..jobs.config import Config, flatten, outputs_dir
from ..jobs.provenance import DATA_TAG, environment_tags
from ..jobs.tags import JOB_TAG as JOB_TAG
from ..jobs.tags import DATA_N_TAG, DATA_P_TAG, DATASET_TAG, OVERRIDES_TAG, PARENT_TAG, REASON_TAG, STATUS_REASON_TAG
from ..system.redact import redact, redact_text
from . import fitted, owners
from .backend import client, credentials
from .experiment_view import NOTE_TAG, STUDY_VIEW_NAME, STUDY_VIEW_TAG, dress_experiment, saved_view, study_note

CURVE_KEY = "elbo"  # the ELBO per iteration (step metric)
GAP_KEY = "gap_rel_log10"  # log10 of the relative gap to the best known ELBO: what reads on MLflow's linear chart
FINGERPRINT_TAG = "hlo_fingerprint"  # of the compiled program (plnexp.measure.fingerprint): same value, same program
CONVERGED_TAG = "plnexp.converged"  # true/false: the fit's ELBO had stopped rising (FitResult.converged)
BELOW_BEST_TAG = "plnexp.below_best"  # set only where its last ELBO is below its best beyond rounding: by how much
HLO_ARTIFACT = "program.hlo.txt"  # the optimized HLO of a compiled run (several functions: a header line each)
GZIP_OVER = 1 << 20  # bytes: a larger text artifact is written as NAME.gz


def safe(values: dict) -> dict[str, str]:
    """``values`` as MLflow holds them (strings), credentials masked (:func:`plnexp.system.redact.redact`)."""
    return redact({k: str(v) for k, v in values.items()})


class Parent(NamedTuple):
    """Where a sweep's children go: the store, the experiment and the parent run."""

    uri: str
    experiment_id: str
    run_id: str


def experiment_id(cl, name: str) -> str:
    """Get or create the experiment: in a local store (sqlite, a folder) with its artifacts under
    ``<outputs>/artifacts/<name>``; on a tracking server where the server puts them (with
    ``--serve-artifacts``: uploaded through it, so the cluster's nodes need no access to them).
    Either way tagged to open on the study in MLflow's UI, where it is not yet
    (:func:`~plnexp.store.experiment_view.dress_experiment`)."""
    exp = cl.get_experiment_by_name(name)
    if exp is not None:
        dress_experiment(cl, exp.experiment_id, getattr(exp, "tags", None))
        return exp.experiment_id
    server = str(cl.tracking_uri).startswith(("http://", "https://"))
    location = None if server else (outputs_dir() / "artifacts" / name).as_uri()
    try:
        exp_id = cl.create_experiment(name, artifact_location=location)
    except Exception:  # created meanwhile by another process
        exp = cl.get_experiment_by_name(name)
        if exp is None:
            raise
        exp_id = exp.experiment_id
    dress_experiment(cl, exp_id)
    return exp_id


USER_TAG = "mlflow.user"  # who ran it: MLflow's UI shows it in its runs table's "User" column


def user() -> str:
    """Who runs this process, as a team's store shows it: the MLflow user the client authenticates
    as on a server with authentication (``MLFLOW_TRACKING_USERNAME``, ``~/.mlflow/credentials``),
    else the operating system's user; "" where neither is known."""
    import getpass

    name, _ = credentials()
    if name:
        return name
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in this environment (a container without one)
        return ""


def process_tags() -> dict[str, str]:
    """Who owns a RUNNING run (:func:`plnexp.store.owners.current`): lets
    :func:`~plnexp.store.running.sweep_up_orphans` find the runs of dead owners; and who ran it
    (:data:`USER_TAG`)."""
    who = user()
    return {**owners.current().tags(), **({USER_TAG: who} if who else {})}


def open_parent(uri: str, experiment: str, name: str, tags: dict) -> Parent:
    """Get or create the experiment and create a sweep's RUNNING parent run in it."""
    cl = client(uri)
    exp_id = experiment_id(cl, experiment)
    run = cl.create_run(exp_id, run_name=redact_text(name), tags=safe({**process_tags(), **tags}))
    return Parent(uri, exp_id, run.info.run_id)


def close_parent(parent: Parent, status: str, tags: dict, summary: str | None = None) -> None:
    """Log the summary table (``summary.txt``) and the tags, then end the parent run."""
    cl = client(parent.uri)
    if summary:
        cl.log_text(parent.run_id, redact_text(summary), "summary.txt")
    if tags:
        set_tags(parent.uri, parent.run_id, tags)
    cl.set_terminated(parent.run_id, status)


def start_job(cl, exp_id: str, job, parent_id: str | None = None, tags: dict | None = None) -> str:
    """Create the RUNNING run of a job that starts now, its ``config.yaml`` logged (what ``rerun``
    reads); returns its id.

    ``job`` is a :class:`plnexp.experiment.runner.Outcome` (its name, overrides, config, start time).
    """
    cfg: Config = job.config
    all_tags = {PARENT_TAG: parent_id} if parent_id else {}
    all_tags.update(environment_tags(cfg))
    all_tags.update(process_tags())
    all_tags.update({OVERRIDES_TAG: " ".join(job.overrides), DATASET_TAG: cfg.dataset.label, **(tags or {})})
    if job.output_dir:
        all_tags["hydra_output_dir"] = job.output_dir
    run = cl.create_run(exp_id, start_time=int(job.started * 1000), run_name=redact_text(job.name), tags=safe(all_tags))
    # its config from the start: a run whose process is killed (SIGKILL, a fit across processes) can be rerun
    cl.log_text(run.info.run_id, job.config_yaml(), "config.yaml")  # credentials masked (Outcome.config_yaml)
    return run.info.run_id


DATA_CONTEXT = "training"  # the dataset input's mlflow.data.context tag (what MLflow shows beside its name)


def dataset_inputs(job) -> list[dict]:
    """The data a job fitted as its run's MLflow dataset input (the runs table's Dataset column,
    and the drawer it opens), plain JSON-able values for :func:`job_record`: the name (the data set's
    label and n×p), the digest (``data_digest``'s first 8 hex digits, MLflow's length; the tag keeps
    it whole), the source (the config of the data set: plnexp's loader makes it) and the profile
    (``n``, ``p``). None before the data loaded (a job that failed first): its digest is not known
    until then, after the run is created, so the input is written with the job's result."""
    if not job.data_digest or not job.data_shape:
        return []
    cfg: Config = job.config
    specs = cfg.replicate_datasets()  # a synthetic data set per replicate, with its own seed
    spec = specs[job.replicate] if 0 <= job.replicate < len(specs) else cfg.dataset
    n, p = job.data_shape
    source = {"dataset": spec.name}
    for f in fields(spec):
        value = getattr(spec, f.name)
        source[f"dataset.{f.name}"] = ",".join(value) if isinstance(value, tuple) else value
    return [
        {
            "name": redact_text(f"{spec.label} {n}×{p}"),
            "digest": job.data_digest[:8],
            "source_type": "code",
            "source": json.dumps({"tags": safe(source)}),
            "profile": json.dumps({"n": n, "p": p}),
            "context": DATA_CONTEXT,
        }
    ]


def log_dataset_inputs(cl, run_id: str, inputs: list[dict]) -> None:
    """Log :func:`dataset_inputs` to the run (one call; none when empty). Sent again, the same input
    is not doubled: MLflow keeps one per data set's name and digest."""
    if not inputs:
        return
    from mlflow.entities import Dataset, DatasetInput, InputTag

    datasets = [
        DatasetInput(
            Dataset(d["name"], d["digest"], d["source_type"], d["source"], profile=d.get("profile")),
            [InputTag("mlflow.data.context", d["context"])],
        )
        for d in inputs
    ]
    cl.log_inputs(run_id, datasets=datasets)


def job_record(job) -> dict:
    """Everything :func:`write_record` writes for ``job`` (a :class:`plnexp.experiment.runner.Outcome`), as plain
    JSON-able values, credentials masked: params, tags, metrics (``[key, value, step, ts]``), the
    text artifacts (the optimized HLO as ``program.hlo.txt``, compressed when written: see
    :func:`write_record`), the fitted model (the folder :func:`plnexp.store.fitted.keep` saved it
    in, logged as ``model/``), the data set (:func:`dataset_inputs`), the ELBO plot's title, the status
    and end time. What a result kept locally (:mod:`plnexp.store.pending`) holds."""
    cfg: Config = job.config
    tags = {STATUS_REASON_TAG: job.reason or "", "mlflow.note.content": job.note()}
    if job.status == "KILLED":
        tags[REASON_TAG] = "interrupted"
    if job.result is not None:
        tags["device"] = job.result.device
        tags[FINGERPRINT_TAG] = job.result.timing.fingerprint  # "": no XLA program (eager, torch)
        if job.result.converged is not None:  # how the fit ended (plnexp.measure.convergence.ending)
            tags[CONVERGED_TAG] = str(bool(job.result.converged)).lower()
            if not job.result.at_best:  # its last ELBO below its best by more than its precision's rounding
                tags[BELOW_BEST_TAG] = f"{job.result.gap_to_best:.6g} nats"
    if job.data_digest:
        tags[DATA_TAG] = job.data_digest
    if job.data_shape:
        tags[DATA_N_TAG], tags[DATA_P_TAG] = job.data_shape
    if getattr(job, "optimum", None) is not None:
        tags.update(job.optimum.tags())
    now = int(time.time() * 1000)
    metrics = [[k, float(v), 0, now] for k, v in job.metrics().items() if v is not None and np.isfinite(v)]
    metrics += [[CURVE_KEY, float(v), i, now] for i, v in enumerate(job.curve())]
    metrics += [[GAP_KEY, float(v), i, now] for i, v in enumerate(job.gap_curve())]
    artifacts = {"config.yaml": job.config_yaml()}  # credentials masked (Outcome.config_yaml)
    if job.result is not None:
        analysis = {
            "cost_analysis": job.result.timing.cost_analysis,
            "memory_analysis": job.result.timing.memory_analysis,
            "runs_s": list(job.result.timing.runs_s),
        }
        artifacts["analysis.json"] = json.dumps(redact(analysis), indent=1, default=str)
        if job.result.timing.program.hlo:  # the optimized HLO (plnexp.measure.xla_stats reads it: plnexp compare)
            artifacts[HLO_ARTIFACT] = redact_text(job.result.timing.program.hlo)
    # the fitted model (plnexp.store.fitted): a folder until the store has it, named in the record
    model = fitted.keep(job.result) if job.result is not None else None
    return {
        "model": model,
        "params": safe(flatten(cfg.as_dict())),
        "tags": safe(tags),
        "metrics": metrics,
        "artifacts": artifacts,
        "inputs": dataset_inputs(job),  # the data set (log_dataset_inputs)
        "plot_title": f"{job.name}  ({job.status})",
        "status": job.status,
        "end_time": int((job.ended or time.time()) * 1000),
    }


def write_record(cl, run_id: str, record: dict) -> None:
    """Write a :func:`job_record` to the run ``run_id``, then end it with the record's status. Every
    param is logged (MLflow's client splits a large batch), metrics 1000 to a call; a text artifact
    over :data:`GZIP_OVER` bytes is written gzip-compressed, its name ending ``.gz``."""
    from mlflow.entities import Metric, Param, RunTag

    params = [Param(k, v) for k, v in record["params"].items()]
    metrics = [Metric(k, v, ts, step) for k, v, step, ts in record["metrics"]]
    cl.log_batch(run_id, metrics=metrics[:1000], params=params, tags=[RunTag(k, v) for k, v in record["tags"].items()])
    for start in range(1000, len(metrics), 1000):
        cl.log_batch(run_id, metrics=metrics[start : start + 1000])
    log_dataset_inputs(cl, run_id, record.get("inputs", []))  # a record kept before inputs were: none
    curve = [m.value for m in sorted((m for m in metrics if m.key == CURVE_KEY), key=lambda m: m.step)]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for name, text in record["artifacts"].items():
            data = text.encode()
            if len(data) > GZIP_OVER:
                (tmp / f"{name}.gz").write_bytes(gzip.compress(data, mtime=0))
            else:
                (tmp / name).write_bytes(data)
        if curve:
            from ..measure.plots import elbo_png

            elbo_png(np.asarray(curve), record["plot_title"], tmp / "elbo.png")
        cl.log_artifacts(run_id, str(tmp))
    fitted.send(cl, run_id, record.get("model"))  # the run's model/ (a record kept before models were: none)
    cl.set_terminated(run_id, record["status"], end_time=record["end_time"])


def log_report(uri: str, run_id: str, folder: Path, metrics: dict, tags: dict) -> None:
    """Attach a report to a sweep's parent run: the files of ``folder`` under ``report/``, its
    summary metrics and tags (a run can take them after it ended; a later report replaces them)."""
    add_results(uri, run_id, metrics, tags)
    client(uri).log_artifacts(run_id, str(folder), "report")


def set_tags(uri: str, run_id: str, tags: dict) -> None:
    """Add tags to a run (e.g. a rerun's verdict, once it is known), in one call."""
    add_results(uri, run_id, {}, tags)


def add_results(uri: str, run_id: str, metrics: dict, tags: dict) -> None:
    """Metrics and tags measured after the run ended (its group's timed rounds, a report's summary), in one call."""
    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    client(uri).log_batch(
        run_id,
        metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items() if np.isfinite(v)],
        tags=[RunTag(k, v) for k, v in safe(tags).items()],
    )


def log_text(uri: str, run_id: str, text: str, path: str) -> None:
    """A text artifact (``path`` under the run's artifacts), credentials masked."""
    client(uri).log_text(run_id, redact_text(text), path)


# the columns of a sweep's view (show_sweep): the verdict of its rounds first (plnexp.jobs.verdicts)
SWEEP_COLUMNS = (
    "tags.`plnexp.verdict`",
    "tags.`plnexp.ratio`",  # the paired ratio and its interval, rounded as read (plnexp.jobs.verdicts.ratio_text)
    "metrics.`paired_ratio`",  # (its interval in the tag beside it; paired_ratio_lo/_hi stay on the run)
    "metrics.`round_ms_per_iter`",
    "metrics.`rounds_used`",
    "metrics.`rounds_dropped`",
    "metrics.`compile_s`",
    "metrics.`final_elbo`",
    "attributes.`Dataset`",
)


def sweep_view(parent_id: str, title: str, created_ms: int) -> str:
    """The study view (:data:`~plnexp.store.experiment_view.STUDY_VIEW_TAG`'s value) of one sweep: its
    child runs only (never a ranking across sweeps), its parent named in the view's name, the
    reference first, then the others by their paired ratio to it; the verdict, the ratio, its
    interval, the rounds' ms/iter and the rounds used and dropped as its first columns."""
    search, order_by = f"tags.mlflow.parentRunId = '{parent_id}'", "metrics.`study_order`"  # (StrategyResult.metrics)
    widths = {SWEEP_COLUMNS[1]: 170}
    return saved_view(f"{STUDY_VIEW_NAME}: {title}", SWEEP_COLUMNS, widths, search, order_by, created_ms)


def _show(uri: str, experiment_id: str, tag: str, ours, value) -> bool:
    """Set the experiment's ``tag`` to ``value`` unless the user made it their own (``ours`` of
    its value is False); True when set. Never raises: the UI's presentation never fails a sweep or a
    report."""
    try:
        cl = client(uri)
        have = cl.get_experiment(experiment_id).tags.get(tag)
        if have is not None and not ours(have):
            return False
        cl.set_experiment_tag(experiment_id, tag, value)
        return True
    except Exception:  # noqa: BLE001 - the UI's presentation never fails a sweep or a report
        return False


def show_sweep(uri: str, experiment_id: str, parent_id: str, title: str) -> bool:
    """Point the experiment's study view at this sweep (:func:`sweep_view`), unless the user made the
    view their own (a name plnexp did not write); True when set. Never raises."""
    ours = lambda have: str(json.loads(have).get("name", "")).startswith(STUDY_VIEW_NAME)
    return _show(uri, experiment_id, STUDY_VIEW_TAG, ours, sweep_view(parent_id, title, int(time.time() * 1000)))


HEADLINE_MARK = "**Latest sweep**"  # where the experiment's description gives the newest report's headline


def show_headline(uri: str, experiment_id: str, lines: list[str]) -> bool:
    """The experiment's description (what MLflow's UI shows above its runs) with the newest sweep's
    plain headline under the study's link, when the description is plnexp's own (its link to the
    study: :func:`~plnexp.store.experiment_view.study_note`); a description of the user's own is left as it
    is. True when set. Never raises."""
    note = study_note(experiment_id)
    text = note + f"\n\n{HEADLINE_MARK}:\n\n" + "\n".join(f"- {line}" for line in lines)
    return _show(uri, experiment_id, NOTE_TAG, lambda have: have.startswith(note[:40]), redact_text(text))
