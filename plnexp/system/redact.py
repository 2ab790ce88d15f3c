"""No secret leaves the process: the one place that says what a credential looks like and hides it.

Everything plnexp writes (MLflow params, tags, notes and artifacts; Hydra's saved configs; the
sweep's record; printed lines and one-line errors) passes through here first. A credential is
replaced by :data:`MASK`, and only the credential: what is around it (a URI's user, host and
database; the other keys of a DSN) stays readable, so that a logged value still says which store it
was. Three forms are recognised, in any text:

- the password of a URI's userinfo: ``scheme://user:PASSWORD@host`` -> ``scheme://user:***@host``
- a ``NAME=value`` whose name looks secret (:data:`SECRET_WORDS`, any case): libpq's
  ``password=x`` (key/value DSN or ``?password=x`` in a URI's query), ``PGPASSWORD=x`` in an
  environment dump, ``--token=x`` on a command line, ``+db.password=x`` in Hydra overrides
- a YAML line ``name: value`` whose name looks secret (what ``--cfg job`` prints)
- an option ``--name value`` (or ``-name value``) whose name looks secret, and netrc's
  ``password value`` (the last word of its line, or before netrc's next keyword)
- Azure's ``AccountKey=``, ``SharedAccessKey=`` (connection strings) and ``sig=`` (a SAS token's
  signature), which :data:`SECRET_WORDS` and :data:`SECRET_KEYS` name

and in structures (:func:`redact`: dicts, lists and tuples, recursively) the value of any key whose
name looks secret, whatever it is, besides the text rules on every string.

Pure functions: no I/O, no state. A redacted value is never a usable credential, and never used as
one (:func:`unredacted` finds the real value among those the process was given).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
SECRET_WORDS = ("PASSWORD", "PASSWD", "TOKEN", "SECRET", "ACCOUNTKEY", "ACCESSKEY")
SECRET_KEYS = ("sig",)  # names that are secret whole only (a SAS token's signature; "signal" is not)

# a name (of a key, a variable, an option) that contains a secret word, taken whole
_NAME = r"[A-Za-z0-9_.\-]*(?:" + "|".join(SECRET_WORDS) + r")[A-Za-z0-9_.\-]*"
_KEY = r"(?:" + _NAME + "|" + "|".join(SECRET_KEYS) + r")(?![A-Za-z0-9_.\-])"
# a value: quoted, or a word (not starting with a quote; a quote inside it is the value's)
_QUOTED = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""

# scheme://user:PASSWORD@ - the password runs to the first '@' (SQLAlchemy's reading, which MLflow's
# database stores use: it may hold a raw '/'), and on over further '@'s that come before the host
# (urllib's reading: the last '@' of the authority), never past a '/', '?' or '#' after an '@'. The
# scheme may start inside a word: a run name joins a key to its value (``tracking_uripostgresql://``).
# Hydra escapes ':', '=' and the like with a backslash in a sweep job's overrides
# (``postgresql\://u\:pw@h``): an escaped character counts as the character, an escaped space as a space.
_ESCAPED = r"\\[^\s]"
_URI = re.compile(
    r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*\\?://(?:" + _ESCAPED + r"|[^:/?#@\s'\"\\])*\\?:)"
    r"(?P<secret>(?:" + _ESCAPED + r"|[^@\s\\])*(?:@(?:" + _ESCAPED + r"|[^@/?#\s\\])*(?=@))*)"
    r"(?=@)"
)
# NAME=value, spaces allowed around '=' (libpq's key/value form); the value quoted, or up to a
# space, a quote or '&' (the next key of a query string)
_ASSIGN = re.compile(
    r"(?P<head>(?<![A-Za-z0-9_.\-])" + _KEY + r"\s*\\?=\s*)"
    r"(?P<secret>" + _QUOTED + "|(?:" + _ESCAPED + r"|[^\s&'\"\\])(?:" + _ESCAPED + r"|[^\s&\\])*)",
    re.IGNORECASE,
)
# --name value (-name value): an option whose name looks secret, its value the next word
_OPTION = re.compile(
    r"(?P<head>(?<![A-Za-z0-9_.\-])--?" + _NAME + r"[ \t]+)(?P<secret>" + _QUOTED + r"|(?!-)[^\s'\"]\S*)",
    re.IGNORECASE,
)
# netrc's `password value`: the value the line's last word, or followed by netrc's next keyword
_NETRC = re.compile(
    r"(?P<head>(?<![A-Za-z0-9_.\-])(?:password|passwd)[ \t]+)(?P<secret>" + _QUOTED + r"|[^\s'\"]\S*)"
    r"(?=[ \t]*$|[ \t]+(?:machine|login|account|default|macdef)\b)",
    re.IGNORECASE | re.MULTILINE,
)
# a YAML line `name: value` (or `- name: value`): the rest of the line is the value
_YAML = re.compile(
    r"(?P<head>^[ \t]*(?:-[ \t]+)?[\"']?" + _NAME + r"[\"']?:[ \t]+)(?P<secret>\S.*?)(?=[ \t]*$)",
    re.IGNORECASE | re.MULTILINE,
)


def _masked(m: re.Match) -> str:
    return m["head"] + MASK


def redact_text(text: str) -> str:
    """``text`` with every credential replaced by :data:`MASK` (the forms of the module's doc).
    Idempotent: a redacted text comes back unchanged."""
    for pattern in (_URI, _ASSIGN, _OPTION, _NETRC, _YAML):
        text = pattern.sub(_masked, text)
    return text


def secret_name(name: object) -> bool:
    """Whether a key or variable named ``name`` holds a secret: its name contains a
    :data:`SECRET_WORDS` word, in any case (``PGPASSWORD``, ``mlflow_tracking_token``, ``client_secret``)."""
    return isinstance(name, str) and any(word in name.upper() for word in SECRET_WORDS)


def redact(value: Any) -> Any:
    """``value`` with its credentials replaced by :data:`MASK`: in a mapping, the value of a key
    whose name looks secret (:func:`secret_name`; an absent value, None or "", stays: nothing to
    hide, and a config keeps its shape), and every string anywhere (:func:`redact_text`); mappings
    come back as dicts, lists and tuples as their type, anything else unchanged."""
    if isinstance(value, Mapping):
        return {k: MASK if secret_name(k) and v not in (None, "") else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [redact(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # a namedtuple: by field
    if isinstance(value, str):
        return redact_text(value)
    return value


def is_redacted(text: str | None) -> bool:
    """Whether ``text`` holds a redacted credential: then it is not the value it stands for."""
    return text is not None and MASK in text


def unredacted(logged: str, candidates: Iterable[str | None]) -> str | None:
    """The value that ``logged`` (a redacted value read back from a file or a store) stands for:
    ``logged`` itself if nothing was redacted, else the first of ``candidates`` (values this process
    was given: a command-line override, an environment variable) that redacts to ``logged``; None if
    none does. A redacted candidate is never the answer."""
    if not is_redacted(logged):
        return logged
    return next((c for c in candidates if c and not is_redacted(c) and redact_text(c) == logged), None)
