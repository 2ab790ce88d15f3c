"""The private state of the process executors that Hydra's launchers drive, each read by one shim
(docs/development.md, "Private APIs"): submitit's (``hydra/launcher=slurm``) and loky's, joblib's
process pool (``hydra/launcher=joblib``). Neither library is Hydra or MLflow, so they sit in the
lowest layer: :mod:`plnexp.system.slurm` needs submitit's. Imports neither library.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .versions import gate

SUBMITIT = "1.5.4"  # the submitit release result_file was written for
JOBLIB = "1.6.0"  # the joblib release (which vendors loky) loky_executor_running was written for


def result_file(job) -> Path:
    """The file where a submitit job writes its result (or its error) when it ends.

    Wraps ``job.paths.result_pickle`` (submitit 1.5.4's ``JobPaths``, undocumented): submitit's public
    ``job.done()`` asks ``sacct``, which many clusters lack. Gate: on another submitit, warns, then
    reads the same attribute (an AttributeError names it where the release lacks it)."""
    gate("submitit", SUBMITIT, "executor_compat.result_file", "reading job.paths.result_pickle anyway")
    return job.paths.result_pickle


def loky_executor_running() -> bool:
    """Whether joblib's reusable loky executor (its process pool) exists in this process; False
    where joblib's loky is not even imported.

    Wraps ``joblib.externals.loky.reusable_executor._executor`` (joblib 1.6.0): loky's public
    ``get_reusable_executor()`` creates one. Gate: on another joblib, warns, then reads the same
    module variable (False where the release lacks it)."""
    loky = sys.modules.get("joblib.externals.loky.reusable_executor")
    if loky is None:
        return False
    if gate("joblib", JOBLIB, "executor_compat.loky_executor_running", "reading its _executor anyway"):
        return loky._executor is not None
    return getattr(loky, "_executor", None) is not None
