"""How an experiment plnexp writes into opens in MLflow's UI: its kind (the "Model training" view), the
saved study view (:func:`study_view`: the runs table's columns, order and search, fastest first) and a
description linking to it (:func:`study_note`), set once per experiment by :func:`dress_experiment`
(:mod:`plnexp.store.writes` calls it; the sweep's own view and headline are
:func:`plnexp.store.writes.show_sweep` and :func:`plnexp.store.writes.show_headline`).
"""

from __future__ import annotations

import json
import time

from .backend import _first_line, log


# ---------------------------------------------------------------- the experiment in MLflow's UI
# the experiment's kind, which MLflow's UI reads to choose its view where the UI's GenAI / Model
# training switch is disabled (in 3.17 the switch is on and per browser: the study's link names the view)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"  # the "Model training" view (runs, metrics), not GenAI's
NOTE_TAG = "mlflow.note.content"  # an experiment's (or a run's) description, markdown
STUDY_VIEW = "plnexp-study"  # the saved view's id: the runs page's viewStateShareKey
STUDY_VIEW_TAG = f"mlflow.sharedViewState.{STUDY_VIEW}"  # where MLflow's UI keeps a saved view
STUDY_VIEW_NAME = "plnexp study"  # its name in the runs page's Views menu
# the study's columns, in this order after the run's name: ms/iter, its spread (the terminal's
# spread_s: interquartile range of the timed runs, s), compile time, final ELBO; then the data set
STUDY_METRICS = ("ms_per_iter", "run_s_iqr", "compile_s", "final_elbo")
STUDY_COLUMNS = (*(f"metrics.`{k}`" for k in STUDY_METRICS), "attributes.`Dataset`")


def study_link(experiment_id: str) -> str:
    """The study's view of an experiment's runs, relative to the UI's root (a link in the
    experiment's description): the "Model training" runs table, every job's run (a metric
    ``ms_per_iter``: no sweep's parent, no failed job), fastest first, in the columns of
    :data:`STUDY_COLUMNS`."""
    return f"#/experiments/{experiment_id}/runs?workflowType=machine_learning&viewStateShareKey={STUDY_VIEW}"


def study_view(created_ms: int) -> str:
    """The value of :data:`STUDY_VIEW_TAG`: a saved view as MLflow's UI (3.x) stores one (a name, a
    creation time, and the runs page's state as JSON: its columns, their order and widths, its
    search and sort). It opens from the experiment's description (:func:`study_link`) or the runs
    page's Views menu."""
    return saved_view(
        STUDY_VIEW_NAME, STUDY_COLUMNS, {}, "metrics.ms_per_iter > 0", "metrics.`ms_per_iter`", created_ms
    )


def saved_view(name: str, columns, widths: dict, search: str, order_by: str, created_ms: int) -> str:
    """A saved view of the runs table as MLflow's UI stores one: ``columns`` after the run's name (110
    pixels wide each but the last, unless ``widths`` says), the runs ``search`` keeps, in ascending
    ``order_by``."""
    state = {
        "selectedColumns": list(columns),
        "columnOrder": ["attributes.`Run Name`", *columns],
        "columnWidths": {"attributes.`Run Name`": 280, **{c: 110 for c in columns[:-1]}, **widths},
        "searchFilter": search,
        "orderByKey": order_by,
        "orderByAsc": True,
    }
    return json.dumps({"name": name, "createdAt": created_ms, "state": json.dumps(state)})


def study_note(experiment_id: str) -> str:
    """The experiment's description (what MLflow's UI shows above its runs, in either view): a link
    to the study's view."""
    return (
        f"PLN fits timed under JIT strategies (plnexp). **[Open the study]({study_link(experiment_id)})**: "
        "the latest sweep's jobs, the reference first, then by paired ratio to it (time ÷ the reference's, "
        "in interleaved rounds), with its interval and verdict. A sweep's report: its parent run's "
        "description and artifacts (report/report.html)."
    )


def dress_experiment(cl, experiment_id: str, have: dict[str, str] | None = None) -> None:
    """Set the tags that make ``experiment_id`` open on the study in MLflow's UI, those missing from
    ``have`` (its tags): the experiment kind, the saved study view and the description (one call a
    tag, only the first time). A tag already there is left as it is (a description of the user's
    own, a view the user changed). Never raises: an account that may write runs but not the
    experiment's tags, or a client without the call, leaves the experiment as it is."""
    want = {
        EXPERIMENT_KIND_TAG: EXPERIMENT_KIND,
        STUDY_VIEW_TAG: study_view(int(time.time() * 1000)),
        NOTE_TAG: study_note(experiment_id),
    }
    for key, value in want.items():
        if key in (have or {}):
            continue
        try:
            cl.set_experiment_tag(experiment_id, key, value)
        except Exception as e:  # noqa: BLE001 - the UI's presentation never fails a fit
            log.debug("experiment %s: tag %s not set (%s)", experiment_id, key, _first_line(e))
            return
