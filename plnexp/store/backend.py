"""The MLflow store: its URI (and where that came from), a client whose calls are retried while
sqlite says ``database is locked``, the quick check (and whole-or-nothing creation) of a store
before any fit, and the tags that make an experiment open on the study in MLflow's UI (its kind, a
saved view of the runs table, a description linking to it: :func:`dress_experiment`).

The only place mlflow's client is made (lazily: ``python -m plnexp run`` pays for the import only
when it logs).
"""

from __future__ import annotations

import fcntl
import functools
import logging
import math
import os
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import tenacity

from ..jobs.config import STORE_TIMEOUT_S, ConfigError, outputs_dir
from ..system.credentials import address
from ..system.paths import install_command
from ..system.redact import MASK, is_redacted, redact_text
from . import mlflow_compat

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 3.0  # an http(s) store that does not answer in this long is unreachable
# libpq's connect_timeout for a PostgreSQL store's one direct connection (:func:`_reach_postgres`):
# MLflow's own engine retries an unreachable database for minutes, printing a warning at each try
PG_CONNECT_TIMEOUT_S = 5
POSTGRES_SCHEMES = ("postgresql", "postgresql+psycopg")
SCHEMES = ("", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc")
LOCKED = ("database is locked", "database table is locked")
RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0, 2.0)
# after a fit, the waits between tries of a store call that failed (then the result is kept locally:
# plnexp.store.pending); tests shorten them
AFTER_FIT_DELAYS_S = (0.5, 1.0, 2.0)
# MLflow's HTTP client: its timeout per request, retries and backoff (environment variables read at
# every call). MLflow's defaults (120 s, 7 retries, factor 2) make one call to a dead server last
# minutes; plnexp sets them from store_timeout_s (:func:`set_timeout`) unless the user set them
HTTP_TIMEOUT_VAR = "MLFLOW_HTTP_REQUEST_TIMEOUT"
HTTP_RETRIES_VAR = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
HTTP_BACKOFF_VAR = "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"
HTTP_RETRIES = 2  # so 3 tries of a request, each given store_timeout_s / 3
HTTP_BACKOFF = 1  # urllib3's waits between them: 0 s, then 2 s (MLflow adds up to 1 s of jitter to each)
# MLflow's logger of the SQL store's failed queries (silenced: :func:`_quiet`)
SQL_ERRORS_LOGGER = "mlflow.store.db.utils"
# libpq's connect_timeout is whole seconds and at least 2 (a smaller value is raised to 2)
PG_MIN_CONNECT_TIMEOUT_S = 2
_OURS: dict[str, str] = {}  # the values plnexp set (a later set_timeout changes these, never the user's)
_TIMEOUT_S = [STORE_TIMEOUT_S]  # store_timeout_s as set_timeout last had it


class StoreError(RuntimeError):
    """The MLflow store cannot be reached or written; one line naming its URI and where it came from
    (its password masked: the line is printed, and may be logged)."""

    kind = "store error"  # its one line: plnexp: store error: ... (plnexp.system.commandline.fail)

    def __init__(self, message: str):
        super().__init__(redact_text(message))


def tracking_uri(explicit: str | None = None) -> str:
    """The config key, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<outputs>/mlflow.db`` (absolute)."""
    return _uri_and_source(explicit)[0]


def _uri_and_source(explicit: str | None) -> tuple[str, str]:
    """:func:`tracking_uri` and where it came from, as an error line names it."""
    if explicit:
        return explicit, f"tracking_uri={explicit}"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"], f"MLFLOW_TRACKING_URI={os.environ['MLFLOW_TRACKING_URI']}"
    uri = f"sqlite:///{outputs_dir() / 'mlflow.db'}"
    return uri, f"the store {uri}"


def _quiet() -> None:
    for name in ("mlflow", "alembic", "sqlalchemy", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # MLflow's SQL store logs every failed query with its whole traceback (about a hundred lines
    # each) before raising it; a database that went away mid-sweep made pages of them. The error
    # raised is the same: plnexp says it in one line (a kept result, a job FAILED, the close)
    logging.getLogger(SQL_ERRORS_LOGGER).setLevel(logging.CRITICAL)
    # a tracking server: MLflow prints two "View run ... at" lines on stdout per run it ends, between
    # plnexp's own lines (the parent run's address is in the sweep's header line already)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    # where tqdm is installed (pyPLNmodels brings it), MLflow draws an artifact-upload progress bar on
    # stderr for every run: noise around plnexp's one-line errors and summaries
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def _chain(e: BaseException | None):
    """``e`` and the errors it was raised from, or while handling."""
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


def _is_locked(e: BaseException | None) -> bool:
    return any(text in str(x) for x in _chain(e) for text in LOCKED)


def _is_transient(e: BaseException) -> bool:
    """Worth another try after a fit: any error but a tracking server's refusal of the request itself
    (HTTP 4xx: bad credentials, a bad value), which the same call meets again."""
    status = http_status(e)
    return status is None or not 400 <= status < 500


def set_timeout(seconds: float = STORE_TIMEOUT_S) -> None:
    """Bound each call of MLflow's HTTP client to about ``seconds`` (``store_timeout_s``), its
    retries included: ``MLFLOW_HTTP_REQUEST_TIMEOUT`` (a third of it a request, at least 1 s),
    ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` (:data:`HTTP_RETRIES`) and
    ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR`` (:data:`HTTP_BACKOFF`), for this process and those it
    starts. A variable the user set is left as it is."""
    want = {
        HTTP_TIMEOUT_VAR: str(max(1, math.ceil(seconds / (HTTP_RETRIES + 1)))),
        HTTP_RETRIES_VAR: str(HTTP_RETRIES),
        HTTP_BACKOFF_VAR: str(HTTP_BACKOFF),
    }
    _TIMEOUT_S[0] = float(seconds)
    for key, value in want.items():
        if key in os.environ and os.environ[key] != _OURS.get(key):
            continue  # the user's
        os.environ[key] = _OURS[key] = value


def engine_uri(uri: str) -> str:
    """The URI MLflow's SQL store connects with: a PostgreSQL one (``postgresql://``) given libpq's
    ``connect_timeout`` (a third of :func:`store_timeout`, as each HTTP try: :func:`set_timeout`),
    unless it names one; without it, a connection to a host that does not answer waits for the
    kernel's TCP timeout (minutes) at each of a call's tries. Any other URI as it is."""
    scheme = uri.split(":", 1)[0].lower()
    if scheme not in POSTGRES_SCHEMES or "connect_timeout=" in uri.split("?", 1)[-1]:
        return uri
    seconds = max(PG_MIN_CONNECT_TIMEOUT_S, math.ceil(store_timeout() / (HTTP_RETRIES + 1)))
    return f"{uri}{'&' if '?' in uri else '?'}connect_timeout={seconds}"


def store_timeout() -> float:
    """How long one store call may take (seconds), as :func:`set_timeout` last set it (else the
    default): how long a failing store is tried again after a fit (:func:`after_fit`)."""
    return _TIMEOUT_S[0]


class Retrying:
    """An MlflowClient whose calls are retried by tenacity, waiting ``delays`` in turn between tries, on
    the errors ``retry_on`` accepts: by default when sqlite says the database is locked (:func:`client`);
    after a fit, on any transient error (:func:`after_fit`). With ``deadline_s``, no try starts later
    than that many seconds after a call's first (a store that hangs costs a bounded time, whatever its
    timeouts)."""

    def __init__(self, cl, delays=None, retry_on=_is_locked, what: str = "database is locked", deadline_s=None):
        delays = RETRY_DELAYS_S if delays is None else delays
        stop = tenacity.stop_after_attempt(len(delays) + 1)
        self._cl, self._what = cl, what
        self._tries = tenacity.Retrying(
            stop=stop if deadline_s is None else stop | tenacity.stop_before_delay(deadline_s),
            wait=tenacity.wait_chain(*map(tenacity.wait_fixed, delays)),
            retry=tenacity.retry_if_exception(retry_on),
            sleep=lambda seconds: time.sleep(seconds),  # (looked up at each wait: tests patch it)
            reraise=True,  # the store's own error, not tenacity's RetryError
        )

    def __getattr__(self, name):
        attr = getattr(self._cl, name)
        if not callable(attr):
            return attr
        said = lambda state: log.info("%s: %s, retrying in %.2f s", name, self._what, state.upcoming_sleep)
        return functools.partial(self._tries.copy(before_sleep=said), attr)  # each call its own state


def after_fit(cl) -> Retrying:
    """``cl`` with its calls retried on any transient error, a few seconds in all
    (:data:`AFTER_FIT_DELAYS_S`): the writes of a fit's result, which a store's hiccup must not lose.
    No try starts later than :func:`store_timeout` after a call's first: a store that is down costs
    at most about twice that per call (then the result is kept locally)."""
    return Retrying(cl, AFTER_FIT_DELAYS_S, _is_transient, "the store failed", deadline_s=store_timeout())


def plain_client(uri: str):
    """An MlflowClient on ``uri`` as MLflow makes it, without plnexp's retries (:func:`client`): for
    checks whose every call must be bounded by MLflow's own HTTP timeout (``plnexp doctor``)."""
    from mlflow import MlflowClient

    _quiet()  # after the import: mlflow sets its own logger levels when imported
    return MlflowClient(engine_uri(uri))


@lru_cache(maxsize=4)
def client(uri: str):
    """An MlflowClient on ``uri`` (cached: the sqlite engine and its migrations are paid once).

    A PostgreSQL store is reached once first (:func:`_reach_postgres`, seconds): MLflow creates its
    SQL engine at the client's first call, retrying a database that does not answer for about two
    minutes whatever store_timeout_s says (a job's process started while the database is down);
    unreachable, it is a :class:`StoreError` line instead."""
    if not _OURS:  # no store_timeout_s given yet (a command's config sets it: set_timeout): the default
        set_timeout()
    if uri.split(":", 1)[0].lower() in POSTGRES_SCHEMES:
        _reach_postgres(uri, f"the store {uri}", "the next store call tries it again")
    return Retrying(plain_client(uri))


def _sqlite_path(uri: str) -> Path | None:
    """The database file of ``sqlite:///relative/path`` or ``sqlite:////absolute/path``; None for an
    in-memory sqlite store or another scheme."""
    rest = uri[len("sqlite://") :].split("?", 1)[0]
    if not uri.lower().startswith("sqlite:") or not rest.startswith("/") or rest in ("/", "/:memory:"):
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
    _quiet()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".creating", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o644)  # what sqlite would give a new file (mkstemp makes it private)
    try:
        store = mlflow_compat.sqlalchemy_store(f"sqlite:///{tmp}", (outputs_dir() / "artifacts").as_uri())
        store.engine.dispose()
        os.link(tmp, path)  # fails if a store appeared meanwhile: then that one is used
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


AUTH_VARIABLES = "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
# MLflow's answer (HTTP 403) to a request for a host name that its --allowed-hosts does not list
INVALID_HOST = "Invalid Host header"
HOST_REFUSED = (
    "the server refuses requests addressed to this host name (HTTP 403: Invalid Host header): its "
    "admin must list the name in mlflow server --allowed-hosts"
)


def http_status(e: BaseException | None) -> int | None:
    """The HTTP status of the first MLflow client error in ``e``'s chain (401, 403, ...); None if none."""
    from mlflow.exceptions import MlflowException

    return next((x.get_http_status_code() for x in _chain(e) if isinstance(x, MlflowException)), None)


def credentials() -> tuple[str | None, bool]:
    """The username MLflow's client sends (``$MLFLOW_TRACKING_USERNAME``, else ``~/.mlflow/credentials``)
    and whether it has a password to send with it; never the password itself."""
    username, password = mlflow_compat.credentials()
    return username or None, bool(password)


def auth_refusal(e: BaseException, action: str = "read the server's experiments") -> str | None:
    """What to do, in one line, when a tracking server refused the request with HTTP 401 (no or wrong
    credentials) or 403 (an account without permission to ``action``, or a host name that the
    server does not serve); None for any other error."""
    status = http_status(e)
    if status not in (401, 403):
        return None
    if status == 403 and INVALID_HOST in str(e):
        return HOST_REFUSED
    user, has_password = credentials()
    if status == 403:
        return (
            f"the server accepted the credentials of {user or 'this client'} but refused to let it {action} "
            f"(HTTP 403: permission denied): ask the server's admin to grant {user or 'the account'} that "
            f"permission, or set {AUTH_VARIABLES} to an account that has it"
        )
    if user is None:
        return (
            f"the server requires authentication and no credentials are set (HTTP 401): set {AUTH_VARIABLES} "
            "to an account that the server's admin created"
        )
    if not has_password:
        return (
            f"the server requires authentication; MLFLOW_TRACKING_USERNAME={user} is set but no password "
            "(HTTP 401): set MLFLOW_TRACKING_PASSWORD too"
        )
    return (
        f"the server refused the credentials of {user} (HTTP 401: unknown user or wrong password): check "
        f"{AUTH_VARIABLES}, or ask the server's admin to create the account or reset its password"
    )


def store_exists(uri: str) -> bool:
    """False for a sqlite store whose file does not exist yet (a server or other database: True)."""
    path = _sqlite_path(uri)
    return path is None or path.exists()


def check_existing_store(explicit: str | None, missing: str) -> str:
    """:func:`check_store` for a command that only reads runs (``report``, ``compare``): a sqlite store
    not created yet is one :class:`~plnexp.jobs.config.ConfigError` line, ``the store URI does not exist
    yet: MISSING``, and is not created."""
    uri = tracking_uri(explicit)
    if not store_exists(uri):
        raise ConfigError(f"the store {uri} does not exist yet: {missing}")
    return check_store(explicit)


def _postgres_failure(text: str) -> tuple[str, str]:
    """(what failed, libpq's reason) for a failed PostgreSQL connection, from libpq's message (its
    connection errors carry no SQLSTATE): ``authentication`` (a wrong user or password, or no
    pg_hba.conf line for this client), ``database`` (none of that name), else ``connection`` (the
    host or port refused, unreachable, or silent past the timeout)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    reason = (lines[0] if lines else text).rsplit(" failed: ", 1)[-1].removeprefix("FATAL:").strip()
    lowered = text.lower()
    if "authentication failed" in lowered or "pg_hba.conf" in lowered or "no password supplied" in lowered:
        return "authentication", reason
    if "role" in lowered and "does not exist" in lowered:
        return "authentication", reason
    if "database" in lowered and "does not exist" in lowered:
        return "database", reason
    return "connection", reason or "no answer"


def _reach_postgres(uri: str, where: str, allowed: str) -> None:
    """One direct connection to a ``postgresql://`` (or ``postgresql+psycopg://``) store with psycopg,
    given up after :data:`PG_CONNECT_TIMEOUT_S`: a :class:`StoreError` line naming what failed
    (authentication, connection or database) instead of MLflow's minutes of retries and warnings.
    The line names the URI as the user gave it, its password masked (:class:`StoreError`)."""
    try:
        import psycopg
    except ImportError:
        raise StoreError(
            f"{where}: cannot check the PostgreSQL store: psycopg is not installed (plnexp's cluster extra: "
            f"{install_command('cluster')}); {allowed}"
        ) from None
    from sqlalchemy.engine import make_url  # MLflow's reading of the URI (a raw '/' in a password, say)

    try:
        url = make_url(uri)
    except Exception as e:  # noqa: BLE001 - a URI SQLAlchemy cannot read: one line
        raise StoreError(f"{where}: not a PostgreSQL URI ({_first_line(e)}); {allowed}") from None
    known = {d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults()}  # libpq's own query keys
    args = {k: v for k, v in url.query.items() if k in known and isinstance(v, str)}
    for key, value in (
        ("host", url.host),
        ("port", url.port),
        ("user", url.username),
        ("password", url.password),
        ("dbname", url.database),
    ):
        if value is not None:
            args[key] = str(value)
    args["connect_timeout"] = str(PG_CONNECT_TIMEOUT_S)
    at = f"{url.host or 'the local socket'}" + (f":{url.port}" if url.port else "")
    try:
        psycopg.connect(psycopg.conninfo.make_conninfo(**args)).close()
    except psycopg.Error as e:
        what, reason = _postgres_failure(str(e))
        if what == "authentication":
            advice = f"the server at {at} refused user {url.username or '(default)'}: wrong user or password"
        elif what == "database":
            advice = f"the server at {at} has no database {url.database or '(default)'}: create it or fix the URI"
        else:
            advice = (
                f"cannot connect to {at} within {PG_CONNECT_TIMEOUT_S} s: wrong host or port, or no PostgreSQL "
                "server accepting TCP/IP connections there"
            )
        failed = "database missing" if what == "database" else f"{what} failed"
        raise StoreError(f"{where}: PostgreSQL {failed} ({reason}): {advice}; {allowed}") from None


def check_store(explicit: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> str:
    """Reach the store before any fit, in seconds; returns its URI or raises :class:`StoreError`.

    An http(s) server gets a quick probe (MLflow's own client retries for minutes), and a server
    that refuses the credentials (HTTP 401, or 403: :func:`auth_refusal`) one line naming the
    variables that set them, ``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``; a sqlite
    store's folder must be writable, and the store is created there if it does not exist yet
    (one process at a time, whole or not at all: see :func:`_create_sqlite_store`); a PostgreSQL
    database gets one direct connection first (:func:`_reach_postgres`: authentication, connection
    or a missing database in one line, within seconds).
    """
    uri, where = _uri_and_source(explicit)
    allowed = (
        "allowed values are a running MLflow server's http(s) URL, a reachable PostgreSQL database's "
        "postgresql://USER@HOST:PORT/DATABASE (with USER:PASSWORD@ for a password), or sqlite:///PATH in a writable folder"
    )
    if is_redacted(uri):  # copied from a run's params or a command tag: plnexp never logs a password
        raise StoreError(
            f"{where}: holds {MASK} where its password was (a value copied from plnexp's logs, which never "
            "hold one); allowed values are the store's full URI, given with tracking_uri= or MLFLOW_TRACKING_URI"
        )
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if scheme not in SCHEMES and scheme not in POSTGRES_SCHEMES:
        raise StoreError(f"{where}: unsupported scheme {scheme!r}; {allowed}")
    if scheme in POSTGRES_SCHEMES:
        _reach_postgres(uri, where, allowed)
    if scheme in ("http", "https"):
        try:
            # urllib gets the address only: a userinfo it cannot parse would be quoted in its error
            urllib.request.urlopen(f"{address(uri).rstrip('/')}/health", timeout=timeout).close()
        except urllib.error.HTTPError:
            pass  # something answered: MLflow's own calls below tell whether it is a tracking server
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise StoreError(f"{where}: cannot reach the MLflow server ({reason}); {allowed}") from None
    path = _sqlite_path(uri)
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
        refused = auth_refusal(e) if scheme in ("http", "https") else None
        if refused:  # the server is there and answers: what it wants is credentials, or other ones
            raise StoreError(f"{where}: {refused}") from None
        raise StoreError(f"{where}: {_first_line(e)}; {allowed}") from None
    return uri
