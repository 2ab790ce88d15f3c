"""Credentials never enter a config: where a password may come from, and the one boundary that keeps
it from leaving the process.

A spec (a command line, an override, a config file) never holds a secret: :func:`refusal` is the
one line that refuses one, naming the ways a credential is given instead, the ones the store's
own client reads (:data:`WAYS`): ``PGPASSWORD`` or ``~/.pgpass`` (libpq: a PostgreSQL store),
``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD`` or ``~/.mlflow/credentials`` (MLflow's
client: a tracking server), or ``user:password@`` in the ``MLFLOW_TRACKING_URI`` environment variable.

That last one is split at the start of every process (:func:`split_store_uri`): the URI keeps the
store's address (what plnexp logs, prints and ships to its workers; a PostgreSQL URI keeps its user),
and the credential goes to the client's own variables, in this process's environment, which the
workers it starts inherit (a joblib worker, a SLURM job: sbatch exports the environment). Never
through arguments, pickles or files.

:func:`boundary` (a block) and :func:`install` (a whole process: the driver's ``python -m plnexp``, a
joblib worker, a SLURM task) put one filter on ``sys.stdout``, ``sys.stderr`` and every log record
(its message, traceback and stack), so a traceback (``HYDRA_FULL_ERROR=1``) or a failed job's
reason printed anywhere is masked: the patterns of :mod:`plnexp.system.redact`, and the literal
values of the credentials this process was given (:func:`known_secrets`).

No module-level state: what is installed holds its own secrets.
"""

from __future__ import annotations

import configparser
import contextlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import parse_qsl, quote, unquote, urlencode

from .redact import MASK, is_redacted, redact_text, secret_name

URI_VAR = "MLFLOW_TRACKING_URI"
HTTP_USER_VAR, HTTP_PASSWORD_VAR = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
PG_USER_VAR, PG_PASSWORD_VAR, PG_PASSFILE_VAR = "PGUSER", "PGPASSWORD", "PGPASSFILE"
HTTP_SCHEMES = ("http", "https")
POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2")
WAYS = (
    "PGPASSWORD or ~/.pgpass (a PostgreSQL store), MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD or "
    "~/.mlflow/credentials (a tracking server), or user:password@ in the MLFLOW_TRACKING_URI environment variable"
)
MIN_SECRET = 4  # a literal credential shorter than this is masked by the patterns only (not in every word)


# ------------------------------------------------------------------------------ a spec holds none
def holds_secret(text: object) -> bool:
    """Whether ``text`` (an argument, a config value) holds a credential that is not masked already:
    the patterns of :mod:`plnexp.system.redact` find one (a value copied from plnexp's logs, ``***``
    where its password was, is not one)."""
    return isinstance(text, str) and redact_text(text) != text


def refusal(what: str) -> str:
    """The one line that refuses ``what`` (an argument or ``key=value``, shown masked) for holding a credential."""
    return (
        f"{redact_text(what)} holds a credential, which a command line or config never does (plnexp logs, "
        f"saves and ships its settings, and every local user reads a command line); give it through {WAYS}"
    )


def secret_argument(args: Iterable[str]) -> str | None:
    """The first of ``args`` (a command line) that holds a credential (:func:`holds_secret`); None if none."""
    return next((a for a in args if holds_secret(a)), None)


def secret_value(node: Any, prefix: str = "") -> str | None:
    """The first ``key=value`` of a config (nested mappings and lists) that holds a credential: a string
    value with one (:func:`holds_secret`), or any value of a key whose name looks secret
    (:func:`~plnexp.system.redact.secret_name`) other than nothing or ``***``; None if none."""
    if isinstance(node, Mapping):
        items: Iterable[tuple[Any, Any]] = node.items()
    elif isinstance(node, (list, tuple)):
        items = enumerate(node)
    else:
        return None
    for key, value in items:
        name = f"{prefix}.{key}" if prefix else str(key)
        if secret_name(key) and value not in (None, "", MASK) and not isinstance(value, (Mapping, list, tuple)):
            return f"{name}={value}"
        if holds_secret(value):
            return f"{name}={value}"
        found = secret_value(value, name)
        if found is not None:
            return found
    return None


# ----------------------------------------------------------------------- a URI's userinfo, split off
def _parts(uri: str, urllib_reading: bool | None = None) -> tuple[str, str, str | None, str] | None:
    """(scheme, user, password, the rest after the '@') of a URI with userinfo; None without. For
    http(s) (or ``urllib_reading``) urllib's reading: the authority runs to the first '/', '?' or
    '#', the userinfo to its last '@'. Else SQLAlchemy's (MLflow's database stores): the password
    runs to the first '@' (it may hold a raw '/'), and on over further '@'s with no '/', '?' or '#'
    between them. Any other character, quotes and spaces included, is the password's."""
    m = re.match(r"([A-Za-z][A-Za-z0-9+.\-]*)://", uri)
    if not m:
        return None
    rest = uri[m.end() :]
    if urllib_reading is None:
        urllib_reading = m.group(1).lower() in HTTP_SCHEMES
    if urllib_reading:
        authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
        at = authority.rfind("@")
    else:
        at = rest.find("@")
        while at >= 0:
            following = rest.find("@", at + 1)
            if following < 0 or any(c in rest[at + 1 : following] for c in "/?#"):
                break
            at = following
    if at < 0:
        return None
    user, colon, password = rest[:at].partition(":")
    if any(c in user for c in "/?#"):  # the '@' is in a path or a query: no userinfo
        return None
    return m.group(1), user, password if colon else None, rest[at + 1 :]


def address(uri: str) -> str:
    """``uri`` without its userinfo (``https://alice:pw@h/x`` -> ``https://h/x``): what a network
    library is handed (urllib), which never sees a credential."""
    parts = _parts(uri, urllib_reading=True)
    return uri if parts is None else f"{parts[0]}://{parts[3]}"


def split_uri(uri: str) -> tuple[str, dict[str, str]]:
    """``uri`` split into the store's address and the environment variables that give its client the
    credential: ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` for a tracking server
    (http, https: the userinfo leaves the URI); ``PGPASSWORD`` for PostgreSQL (the user stays in the
    URI, its password and a ``?password=`` of the query leave it). Percent-escapes of the userinfo
    are decoded, as the clients decode them. Another scheme, a URI without a password, or one whose
    password is ``***`` (copied from plnexp's logs: the store's check says so) comes back as it is."""
    parts = _parts(uri)
    scheme = uri.split(":", 1)[0].lower()
    if scheme in POSTGRES_SCHEMES:
        env: dict[str, str] = {}
        base, question, query = uri.partition("?")
        if question:
            pairs = parse_qsl(query, keep_blank_values=True)
            kept = [(k, v) for k, v in pairs if k != "password"]
            given = [v for k, v in pairs if k == "password"]
            if given and not is_redacted(given[-1]):
                env[PG_PASSWORD_VAR] = given[-1]
                query = urlencode(kept)
                question = "?" if query else ""
        parts = _parts(base)
        if parts is not None and parts[2] is not None and not is_redacted(parts[2]):
            env[PG_PASSWORD_VAR] = unquote(parts[2])
            base = f"{parts[0]}://{parts[1]}@{parts[3]}" if parts[1] else f"{parts[0]}://{parts[3]}"
        return base + question + query, env
    if scheme in HTTP_SCHEMES and parts is not None and not is_redacted(parts[2] or ""):
        env = {HTTP_USER_VAR: unquote(parts[1])} if parts[1] else {}
        if parts[2] is not None:
            env[HTTP_PASSWORD_VAR] = unquote(parts[2])
        return f"{parts[0]}://{parts[3]}", env
    return uri, {}


def split_store_uri(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Split ``MLFLOW_TRACKING_URI``'s credential off (:func:`split_uri`) in ``environ`` (the process's
    environment, which its workers inherit): the variable keeps the address, the client's variables
    get the credential (the URI's own wins over one set before). Returns the variables set; idempotent."""
    uri = environ.get(URI_VAR)
    if not uri:
        return {}
    kept, env = split_uri(uri)
    if kept != uri:
        environ[URI_VAR] = kept
    environ.update(env)
    return env


# ------------------------------------------------------------------------------- what is masked
def _pgpass_passwords(environ: Mapping[str, str], home: Path) -> list[str]:
    """The passwords of libpq's password file (``PGPASSFILE``, else ``~/.pgpass``):
    ``host:port:database:user:password`` lines, ``\\:`` and ``\\\\`` escaped."""
    path = Path(environ.get(PG_PASSFILE_VAR) or home / ".pgpass")
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    found = []
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = re.split(r"(?<!\\):", line, maxsplit=4)
        if len(fields) == 5:
            found.append(fields[4].replace("\\:", ":").replace("\\\\", "\\"))
    return found


def _mlflow_credentials_password(home: Path) -> list[str]:
    """The password of MLflow's credentials file (``~/.mlflow/credentials``, section ``[mlflow]``)."""
    parser = configparser.ConfigParser()
    try:
        parser.read(home / ".mlflow" / "credentials")
        return [parser.get("mlflow", "mlflow_tracking_password", fallback="")]
    except (configparser.Error, OSError, UnicodeDecodeError):
        return []


def known_secrets(environ: Mapping[str, str] = os.environ, home: Path | None = None) -> list[str]:
    """The credentials this process was given, literally: the values of its environment variables
    whose names look secret (``PGPASSWORD``, ``MLFLOW_TRACKING_PASSWORD``, ``*_TOKEN``...), the
    passwords of ``~/.pgpass`` and ``~/.mlflow/credentials``, and the password still in
    ``MLFLOW_TRACKING_URI`` (a scheme :func:`split_uri` leaves whole); each also percent-encoded.
    Values shorter than :data:`MIN_SECRET` are left to the patterns."""
    home = Path.home() if home is None else home
    values = [v for k, v in environ.items() if secret_name(k)]
    values += _pgpass_passwords(environ, home) + _mlflow_credentials_password(home)
    parts = _parts(environ.get(URI_VAR, ""))
    if parts is not None and parts[2]:
        values += [parts[2], unquote(parts[2])]
    found = {v for v in values if len(v) >= MIN_SECRET and v != MASK}
    found |= {quote(v, safe="") for v in found}
    return sorted(found, key=len, reverse=True)  # the longest first: one that contains another


class Masker:
    """``text`` with every credential masked: the literal ``secrets``, then the patterns
    (:func:`~plnexp.system.redact.redact_text`)."""

    def __init__(self, secrets: Iterable[str] = ()):
        self.secrets = tuple(secrets)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return redact_text(text)


class MaskedStream:
    """A text stream whose writes are masked (:class:`Masker`) before they reach ``raw``; everything
    else (``fileno``, ``isatty``, ``encoding``, ``buffer``...) is ``raw``'s."""

    def __init__(self, raw: TextIO, mask: Masker):
        self.raw, self.mask = raw, mask

    def write(self, text: str) -> int:
        self.raw.write(self.mask(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def _masking_factory(make: Callable[..., logging.LogRecord], mask: Masker) -> Callable[..., logging.LogRecord]:
    """A log record factory: ``make``'s records, their message, traceback and stack masked (so that a
    file handler, which no masked stream sits under, writes them masked too)."""

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a message that does not format: logging says so itself
            return record
        masked = mask(message)
        if masked != message:
            record.msg, record.args = masked, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = mask(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = mask(record.stack_info)
        return record

    factory.plnexp_inner = make  # type: ignore[attr-defined]
    return factory


def installed() -> bool:
    """Whether this process's stdout and stderr are masked already."""
    return isinstance(sys.stdout, MaskedStream) and isinstance(sys.stderr, MaskedStream)


def install(environ: MutableMapping[str, str] = os.environ, home: Path | None = None) -> Masker:
    """What :func:`boundary` does, for the rest of the process (its last traceback included, which
    the interpreter writes to ``sys.stderr``): at the start of each process role (``python -m
    plnexp``, a joblib worker, a SLURM task). Splits ``MLFLOW_TRACKING_URI``'s credential off, then
    masks stdout, stderr and every log record."""
    split_store_uri(environ)
    mask = Masker(known_secrets(environ, home))
    if sys.stdout is not None:
        sys.stdout = MaskedStream(_unwrapped(sys.stdout), mask)
    if sys.stderr is not None:
        sys.stderr = MaskedStream(_unwrapped(sys.stderr), mask)
    logging.setLogRecordFactory(_masking_factory(_unmasked_factory(logging.getLogRecordFactory()), mask))
    return mask


@contextlib.contextmanager
def boundary(environ: MutableMapping[str, str] = os.environ, home: Path | None = None) -> Iterator[Masker]:
    """For the block: ``MLFLOW_TRACKING_URI``'s credential split off (:func:`split_store_uri`), and
    stdout, stderr and every log record masked (:class:`Masker` of :func:`known_secrets`); then the
    streams and the log record factory as they were (the environment keeps the split: the process's
    workers need it). Nested, the inner block masks with what it knows (read again: a superset)."""
    streams = sys.stdout, sys.stderr
    make = logging.getLogRecordFactory()
    try:
        yield install(environ, home)
    finally:
        sys.stdout, sys.stderr = streams
        logging.setLogRecordFactory(make)


def _unwrapped(stream: TextIO) -> TextIO:
    while isinstance(stream, MaskedStream):
        stream = stream.raw
    return stream


def _unmasked_factory(make: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    """The factory under plnexp's masking ones (an installed boundary replaced by a newer one)."""
    while hasattr(make, "plnexp_inner"):
        make = make.plnexp_inner
    return make
