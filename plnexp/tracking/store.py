"""The MLflow store: its URI (and where that came from), a client whose calls are retried while
sqlite says ``database is locked``, and the quick check (and whole-or-nothing creation) of a store
before any fit.

The only place mlflow's client is made (lazily: ``python -m plnexp run`` pays for the import only
when it logs).
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from ..config import outputs_dir

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 3.0  # an http(s) store that does not answer in this long is unreachable
SCHEMES = ("", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc")
LOCKED = ("database is locked", "database table is locked")
RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0, 2.0)


class StoreError(RuntimeError):
    """The MLflow store cannot be reached or written; one line naming its URI and where it came from."""


def tracking_uri(explicit: str | None = None) -> str:
    """The config key, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<outputs>/mlflow.db`` (absolute)."""
    if explicit:
        return explicit
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{outputs_dir() / 'mlflow.db'}"


def _uri_source(explicit: str | None) -> str:
    if explicit:
        return f"tracking_uri={explicit}"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return f"MLFLOW_TRACKING_URI={os.environ['MLFLOW_TRACKING_URI']}"
    return f"the store {tracking_uri()}"


def _quiet() -> None:
    for name in ("mlflow", "alembic", "sqlalchemy", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # a tracking server: MLflow prints two "View run ... at" lines on stdout per run it ends, between
    # plnexp's own lines (the parent run's address is in the sweep's header line already)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    # where tqdm is installed (pyPLNmodels brings it), MLflow draws an artifact-upload progress bar on
    # stderr for every run: noise around plnexp's one-line errors and summaries
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def _is_locked(e: BaseException | None) -> bool:
    while e is not None:
        if any(text in str(e) for text in LOCKED):
            return True
        e = e.__cause__ or e.__context__
    return False


class _Retrying:
    """An MlflowClient whose calls are retried (with backoff) when sqlite says the database is locked."""

    def __init__(self, cl):
        self._cl = cl

    def __getattr__(self, name):
        attr = getattr(self._cl, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args, **kwargs):
            for delay in RETRY_DELAYS_S:
                try:
                    return attr(*args, **kwargs)
                except Exception as e:  # only a locked database is retried
                    if not _is_locked(e):
                        raise
                    log.info("%s: database is locked, retrying in %.2f s", name, delay)
                    time.sleep(delay)
            return attr(*args, **kwargs)

        return call


@lru_cache(maxsize=4)
def client(uri: str):
    """An MlflowClient on ``uri`` (cached: the sqlite engine and its migrations are paid once)."""
    from mlflow import MlflowClient

    _quiet()  # after the import: mlflow sets its own logger levels when imported
    return _Retrying(MlflowClient(tracking_uri=uri))


def _sqlite_path(uri: str) -> Path | None:
    """The database file of ``sqlite:///relative/path`` or ``sqlite:////absolute/path``."""
    rest = uri[len("sqlite://") :].split("?", 1)[0]
    if not rest.startswith("/") or rest in ("/", "/:memory:"):
        return None
    return Path(rest[1:])


@contextmanager
def _dir_lock(folder: Path):
    """An exclusive lock on a directory: two processes creating one sqlite store take turns."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _create_sqlite_store(path: Path) -> None:
    """Create a sqlite store whole or not at all: MLflow's migrations (seconds) run on a temporary
    file that is then linked into place, so an interrupt cannot leave a half-migrated store."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    _quiet()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".creating", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o644)  # what sqlite would give a new file (mkstemp makes it private)
    try:
        store = SqlAlchemyStore(f"sqlite:///{tmp}", (outputs_dir() / "artifacts").as_uri())
        store.engine.dispose()
        os.link(tmp, path)  # fails if a store appeared meanwhile: then that one is used
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def store_exists(uri: str) -> bool:
    """False for a sqlite store whose file does not exist yet (a server or other database: True)."""
    path = _sqlite_path(uri) if uri.lower().startswith("sqlite:") else None
    return path is None or path.exists()


def check_store(explicit: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> str:
    """Reach the store before any fit, in seconds; returns its URI or raises :class:`StoreError`.

    An http(s) server gets a quick probe (MLflow's own client retries for minutes); a sqlite
    store's folder must be writable, and the store is created there if it does not exist yet
    (one process at a time, whole or not at all: see :func:`_create_sqlite_store`).
    """
    uri = tracking_uri(explicit)
    where = _uri_source(explicit)
    allowed = "allowed values are a running MLflow server's http(s) URL or sqlite:///PATH in a writable folder"
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if scheme not in SCHEMES:
        raise StoreError(f"{where}: unsupported scheme {scheme!r}; {allowed}")
    if scheme in ("http", "https"):
        try:
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout).close()
        except urllib.error.HTTPError:
            pass  # something answered: MLflow's own calls below tell whether it is a tracking server
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise StoreError(f"{where}: cannot reach the MLflow server ({reason}); {allowed}") from None
    path = _sqlite_path(uri) if scheme == "sqlite" else None
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
                raise PermissionError("not writable")
        except OSError as e:
            raise StoreError(f"{where}: cannot write {path} ({e.strerror or e}); {allowed}") from None
    try:
        if path is not None:
            with _dir_lock(path.parent):
                if not path.exists():
                    _create_sqlite_store(path)
        client(uri).search_experiments(max_results=1)
    except Exception as e:  # noqa: BLE001 - any failure here is one line
        client.cache_clear()
        raise StoreError(f"{where}: {_first_line(e)}; {allowed}") from None
    return uri
