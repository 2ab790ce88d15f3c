"""MLflow's private APIs that the store uses, each behind one shim (docs/development.md, "Private
APIs"). Written for mlflow 3.17.2; each shim's version gate (:func:`plnexp.system.versions.gate`)
says what it does on another release (pyproject asks for mlflow>=3.1).
"""

from __future__ import annotations

import os

from ..system.versions import gate

MLFLOW = "3.17.2"  # the mlflow release every shim here was written for (and checked against)


def sqlalchemy_store(db_uri: str, artifact_uri: str):
    """MLflow's SQL tracking store on ``db_uri`` (its tables created or migrated), with
    ``artifact_uri`` as the default experiment's artifact root; the caller disposes of its engine.

    Wraps ``mlflow.store.tracking.sqlalchemy_store.SqlAlchemyStore`` (mlflow 3.17.2, internal): MLflow's
    public client creates a store only with a default artifact root of ``./mlruns`` under the
    working directory. Gate: on another mlflow, warns, then uses it anyway (an ImportError or
    TypeError names what the release changed)."""
    gate("mlflow", MLFLOW, "mlflow_compat.sqlalchemy_store", "using mlflow's SqlAlchemyStore anyway")
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    return SqlAlchemyStore(db_uri, artifact_uri)


def credentials() -> tuple[str | None, str | None]:
    """The username and password MLflow's client sends (``$MLFLOW_TRACKING_USERNAME`` and
    ``$MLFLOW_TRACKING_PASSWORD``, else ``~/.mlflow/credentials``); None for each it lacks.

    Wraps ``mlflow.utils.credentials.read_mlflow_creds`` (mlflow 3.17.2, undocumented): no public API
    reads the credentials file. Gate: on another mlflow, warns and falls back to the public path, the
    two environment variables (which MLflow reads first); so does an mlflow without the helper."""
    if gate("mlflow", MLFLOW, "mlflow_compat.credentials", "reading $MLFLOW_TRACKING_USERNAME/PASSWORD only"):
        try:
            from mlflow.utils.credentials import read_mlflow_creds

            creds = read_mlflow_creds()
            return creds.username, creds.password
        except (ImportError, AttributeError):
            pass
    return os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
