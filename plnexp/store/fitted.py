"""A run's fitted model: written as the run's ``model/`` artifact in plnexp's fit format
(:mod:`plnexp.fitting.saved`), read back by ``plnexp.load_fit("runs:/RUN_ID")``.

Every run that fits (``run``, each job of a sweep, each replicate: a run each; ``processes=N``:
process 0's run, whose M and S are its own rows, ``names.first_row`` on) gets one. The folder is
saved next to the outputs when the run's record is made (:func:`keep`), so that a record kept
locally while the store fails (:mod:`plnexp.store.pending`) still has it, and removed once the
store has it (:func:`send`).

MLflow's Models convention (an ``MLmodel`` file and a pyfunc flavour) is not written: a pyfunc's
``predict`` on new counts would be a new fit of their latent positions with B and Sigma (or C) held,
which plnexp does not have yet; the fit format is read without MLflow (docs/how-to/use-a-fitted-model.md).
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from pathlib import Path

from ..fitting import saved
from ..fitting.result import FitResult, load_fit as load_folder
from ..jobs.config import outputs_dir
from .backend import client, store_exists, tracking_uri

ARTIFACT = "model"  # the run's artifact folder holding the fit
RUNS_PREFIX = "runs:/"
RUN_ID = re.compile(r"^[0-9a-f]{32}$")
MISSING = "MLFLOW_TRACKING_URI or PLNEXP_OUTPUTS selects another store"

log = logging.getLogger(__name__)


def keep(result: FitResult) -> str | None:
    """``result`` saved in a new folder under ``<outputs>/fits`` (its path), to be sent by :func:`send`.
    Where it cannot be written (a full disk), None and one warning line: the run's other results are
    still written (its model is the one thing missing)."""
    folder = None
    try:
        root = outputs_dir() / "fits"
        root.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="fit-", dir=root))
        result.save(folder)
    except OSError as e:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        log.warning("the fitted model could not be saved for the run's model/ artifact (%s: %s)", type(e).__name__, e)
        return None
    return str(folder)


def send(cl, run_id: str, folder: str | None) -> None:
    """Log the saved fit ``folder`` as run ``run_id``'s ``model/`` artifact, then remove it (a
    folder no longer there, a record's sent before: nothing)."""
    if not folder or not Path(folder, saved.DESCRIPTION).is_file():
        return
    cl.log_artifacts(run_id, folder, ARTIFACT)
    shutil.rmtree(folder, ignore_errors=True)


def load_fit(source) -> FitResult:
    """A fit: ``runs:/RUN_ID`` (the ``model/`` artifact of that run, in the store of
    ``$MLFLOW_TRACKING_URI``, else plnexp's local store under the outputs folder), or the folder a
    :meth:`FitResult.save` wrote. One :class:`~plnexp.fitting.saved.FitFileError` line for a run or
    folder that holds no plnexp fit."""
    text = str(source)
    if not text.startswith(RUNS_PREFIX):
        return load_folder(source)
    run_id, _, sub = text[len(RUNS_PREFIX) :].strip("/").partition("/")
    if not RUN_ID.match(run_id):
        raise saved.FitFileError(
            f"{text}: malformed run id {run_id!r}; allowed are runs:/ and 32 hexadecimal characters"
        )
    uri = tracking_uri()
    if not store_exists(uri):
        raise saved.FitFileError(f"{text}: the store {uri} does not exist yet ({MISSING})")
    from mlflow.exceptions import MlflowException

    cl = client(uri)
    try:
        cl.get_run(run_id)
    except MlflowException:
        raise saved.FitFileError(f"{text}: no such run in the store {uri} ({MISSING})") from None
    with tempfile.TemporaryDirectory(prefix="plnexp-load-") as tmp:
        try:
            local = cl.download_artifacts(run_id, sub or ARTIFACT, tmp)
        except (MlflowException, OSError):
            local = None
        if local is None or not Path(local, saved.DESCRIPTION).is_file():
            raise saved.FitFileError(
                f"{text}: the run has no fitted model (no {ARTIFACT}/{saved.DESCRIPTION}: a sweep's parent run, a "
                "failed fit, or a run logged before plnexp kept its models); allowed are the runs of finished fits"
            )
        return load_folder(local)
