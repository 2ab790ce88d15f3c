"""MLflow: the store, one experiment per sweep name, a parent run per sweep, a child run per job.

The only package that imports mlflow (lazily: ``python -m plnexp run`` pays for it only when it
logs). Everything goes through :class:`mlflow.MlflowClient` (no fluent "active run" state), wrapped
so that a call that meets ``database is locked`` (several processes writing one sqlite store) is
retried. A job's run is created RUNNING when the job starts (tagged with its owner: the host and PID
of the process, and inside a SLURM job the job's id and cluster) and written in a few short calls
after the fit: params, metrics and the ELBO curve in ``log_batch`` calls, artifacts, then its status.
:func:`sweep_up_orphans` marks FAILED the runs that an owner now gone left RUNNING (a dead process of
this host, a SLURM job that ended), with that owner's reason.

One module per responsibility; the names the other layers use are re-exported here (``store.X``):

- :mod:`.backend`: the URI, the (retrying) client, the check and creation of a store, the tags that
  make an experiment open on the study in MLflow's UI
- :mod:`.writes`: experiments, parent runs, a job's run (with its data set as a dataset input),
  reports and tags
- :mod:`.owners`: who owns a RUNNING run (:class:`Owner`, :class:`LocalProcess`, :class:`SlurmJob`), and
  whether it is alive
- :mod:`.pending`: a fit's result that the store did not take, kept locally and sent later
- :mod:`.running`: the runs left RUNNING, ended only by their owner or once it is gone
- :mod:`.records`: a run read back as a typed :class:`RunRecord` (one versioned mapping), and the
  :class:`Store` protocol whose queries answer records: a run, a sweep's runs, the finished runs of
  config hashes, curves, artifacts, experiments
- :mod:`.queries`: the MLflow store read as records (:class:`~.queries.MlflowStore`), and
  :func:`open`: the store of a URI
- :mod:`.memory`: an in-memory store (``memory:NAME``, the unit tests') holding records, read through
  the same queries
"""

from __future__ import annotations

from . import memory
from . import owners
from . import pending
from .records import Store, record
from . import backend
from . import writes
from .owners import HOST_TAG, PID_TAG, LocalProcess, SlurmJob
from .queries import open
from .running import (
    end_children,
    end_process_runs,
    end_runs_of_processes,
    process_runs,
    sweep_up_orphans,
)
from .backend import (
    StoreError,
    Retrying,
    check_store,
    client,
    check_existing_store,
    set_timeout,
    store_exists,
    tracking_uri,
)
from .experiment_view import study_link
from .writes import (
    JOB_TAG,
    Parent,
    close_parent,
    experiment_id,
    log_report,
    open_parent,
    process_tags,
    set_tags,
    add_results,
    log_text,
    show_headline,
    show_sweep,
    start_job,
)

__all__ = [
    "HOST_TAG",
    "JOB_TAG",
    "PID_TAG",
    "LocalProcess",
    "Parent",
    "SlurmJob",
    "StoreError",
    "set_timeout",
    "check_store",
    "client",
    "close_parent",
    "end_children",
    "end_process_runs",
    "end_runs_of_processes",
    "experiment_id",
    "log_report",
    "memory",
    "open_parent",
    "owners",
    "pending",
    "process_runs",
    "process_tags",
    "record",
    "open",
    "Store",
    "set_tags",
    "add_results",
    "log_text",
    "show_headline",
    "show_sweep",
    "start_job",
    "backend",
    "check_existing_store",
    "store_exists",
    "study_link",
    "sweep_up_orphans",
    "tracking_uri",
    "writes",
    "Retrying",  # (tests wrap a fake client in it)
]
