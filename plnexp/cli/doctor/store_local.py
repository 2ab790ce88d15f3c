"""The doctor's check of the MLflow store the commands would use (:func:`store`), resolved as they
resolve it: a local store (sqlite, a file store) reachable and writable without creating anything
in it, and for sqlite its filesystem, with a warning on NFS, Lustre, GPFS...; a PostgreSQL store
by one connection; a tracking server by :mod:`plnexp.cli.doctor.store_server`."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ...system.credentials import split_uri
from ...system.paths import probe_writes
from .check import Check, finding
from .store_server import _environ, _http_checks

HTTP_TIMEOUT_S = 3.0


def _dir_checks(where: str, folder: Path, db: Path | None) -> list[Check]:
    """``folder`` (or, not created yet, its nearest existing ancestor) is a directory this user can
    create files in; ``db``, if there, is readable and writable. Creates nothing that stays."""
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return [Check("store_reachable", False, f"{where}: {existing} is not a directory, so {folder} cannot exist")]
    if existing == folder:
        found = f"directory {folder} exists" + (
            "" if db is None else f", {db.name} {'exists' if db.exists() else 'not created yet'}"
        )
    else:
        found = f"directory {folder} not created yet (the first run creates it in {existing})"
    reach = Check("store_reachable", True, f"{where}: {found}")
    if db is not None and db.exists() and not (db.is_file() and os.access(db, os.R_OK | os.W_OK)):
        return [reach, Check("store_writable", False, f"{where}: {db} is not a file this user can read and write")]
    try:
        probe_writes(existing)
    except OSError as e:
        return [
            reach,
            Check("store_writable", False, f"{where}: cannot create a file in {existing}: {e.strerror or e}"),
        ]
    return [reach, Check("store_writable", True, f"{where}: created and removed a file in {existing}")]


# Filesystems on which sqlite's locking cannot be trusted (several writers: corruption, "database is locked")
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "beegfs",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "glusterfs",
        "fuse.glusterfs",
        "fuse.sshfs",
        "fuse.cephfs",
        "panfs",
        "afs",
    }
)


def _mounts_text() -> str:
    """``/proc/self/mounts`` ('' where there is none: not Linux)."""
    try:
        return Path("/proc/self/mounts").read_text()
    except OSError:
        return ""


def _unescape_mount(field: str) -> str:
    r"""A field of ``/proc/self/mounts`` as it is: the kernel writes space, tab, newline and backslash
    as octal escapes (``\040``, ``\011``, ``\012``, ``\134``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def filesystem_of(path: Path, mounts_text: str) -> tuple[str, str] | None:
    """(type, mount point) of the filesystem holding ``path`` (resolved by the caller): the longest
    mount point of ``mounts_text`` (``/proc/self/mounts``) that contains it, the last one mounted
    there when several are; None when nothing is known."""
    best = None
    target = str(path)
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = _unescape_mount(parts[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[1])):
            best = (parts[2], point)
    return best


@finding
def store_filesystem(uri: str, db: Path) -> tuple[bool | None, str]:
    """The filesystem of the folder holding a sqlite store; a warning (information,
    not a failure: one writer at a time is fine) when it is a network filesystem."""
    found = filesystem_of(db.parent, _mounts_text())
    if found is None:
        return None, f"{uri}: filesystem of {db.parent} not known (no /proc/self/mounts)"
    fstype, point = found
    if fstype in NETWORK_FILESYSTEMS:
        return None, (
            f"warning: sqlite store on {fstype} ({point}): sqlite locking is "
            "unsafe on network filesystems; several jobs writing at once can corrupt it or fail with "
            f"'database is locked' ({db}). Use a tracking server: README 'A shared tracking server'"
        )
    return True, f"sqlite store on {fstype} ({point})"


def _postgres_checks(uri: str) -> list[Check]:
    """``store_reachable`` for a PostgreSQL store: one direct connection, as a command's check makes it
    (the password from ``PGPASSWORD`` or ``~/.pgpass``); what failed in one line (authentication, the
    connection, or a missing database: ``PostgreSQL database missing``)."""
    from ...store.backend import StoreError, _reach_postgres

    try:
        _reach_postgres(uri, uri, "")
    except StoreError as e:
        return [Check("store_reachable", False, str(e).removesuffix("; "))]
    return [Check("store_reachable", True, f"{uri}: connected to the database")]


def store(uri: str | None = None, timeout: float = HTTP_TIMEOUT_S) -> list[Check]:
    """The MLflow store the commands would use: reachable, and writable; a local store without creating
    anything in it, a tracking server by creating (then deleting) a run and uploading an artifact
    (``store_artifacts``), and whether it requires authentication and accepts this client's
    credentials (``store_auth``); a sqlite store's filesystem (``store_filesystem``), warned about
    when it is a network one."""
    if uri is None:
        from ...store import tracking_uri

        try:
            uri = tracking_uri(None)
        except OSError as e:  # a tracking_uri that prepares the outputs folder, and cannot
            return [
                Check(
                    "store_reachable",
                    False,
                    f"the outputs folder {e.filename or ''} cannot be created: "
                    f"{e.strerror or e} (set PLNEXP_OUTPUTS or MLFLOW_TRACKING_URI)",
                )
            ]
    uri, secret = split_uri(uri)  # a credential in the URI (a caller in Python): to its client's variables
    if secret:
        with _environ(**secret):
            return store(uri, timeout)
    scheme = uri.split(":", 1)[0].lower() if "://" in uri else ""
    if scheme == "sqlite":
        from ...store.backend import _sqlite_path

        db = _sqlite_path(uri)
        if db is None:
            return [Check("store_reachable", None, f"{uri}: in-memory sqlite store, nothing persists")]
        db = db.resolve()
        found = _dir_checks(uri, db.parent, db)
        return found + (store_filesystem(uri, db) if found[0].ok else [])
    if scheme in ("http", "https"):
        return _http_checks(uri, timeout)
    if scheme in ("postgresql", "postgresql+psycopg"):
        return _postgres_checks(uri)
    if scheme in ("", "file"):  # MLflow's file store: a directory
        return _dir_checks(uri, Path(uri[len("file://") :] if scheme else uri).resolve(), None)
    return [Check("store_reachable", None, f"{uri}: scheme {scheme!r} not checked by plnexp doctor")]
