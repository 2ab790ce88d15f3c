"""A PostgreSQL store that cannot be used fails before any fit in one line, within seconds, naming
what failed (authentication, connection, database) and never its password: plnexp's one direct
connection with psycopg (``plnexp.store.backend._reach_postgres``), not MLflow's minutes of retries
and their dozens of warnings.

A closed port on 127.0.0.1 needs no server; the wrong password and the missing database are tried
on a real PostgreSQL 15 (tests/daemons.py: run as user postgres on 127.0.0.1, skipped where it cannot
run), with the markers of the cluster tests.
"""

from __future__ import annotations

import sys
import time

import pytest

import daemons
from plnexp import store as tracking
from plnexp.store import backend

SECRET = "hunter2-not-printed"
WITHIN_S = 15.0
ALLOWED = ("http(s) URL", "postgresql://", "sqlite:///")


def _fails_in_one_line(uri: str, capfd) -> str:
    """check_store's one-line error for ``uri``, raised within :data:`WITHIN_S` with nothing printed
    (no MLflow retry warnings); the password of ``uri`` appears nowhere."""
    capfd.readouterr()
    t0 = time.monotonic()
    with pytest.raises(tracking.StoreError) as raised:
        tracking.check_store(uri)
    elapsed = time.monotonic() - t0
    out, err = capfd.readouterr()
    line = str(raised.value)
    assert elapsed < WITHIN_S, (elapsed, line)
    assert (out, err) == ("", ""), (out, err)
    assert "\n" not in line and SECRET not in line, line
    assert all(form in line for form in ALLOWED), line
    return line


@pytest.mark.parametrize("scheme", ["postgresql", "postgresql+psycopg"])
def test_a_closed_port_is_a_connection_failure_in_one_line(capfd, scheme):
    pytest.importorskip("psycopg", reason="needs plnexp's cluster extra")
    port = daemons.free_port()  # bound then closed: nobody listens there
    line = _fails_in_one_line(f"{scheme}://plnexp:{SECRET}@127.0.0.1:{port}/mlflow", capfd)
    assert line.startswith(f"tracking_uri={scheme}://plnexp:***@127.0.0.1:{port}/mlflow: PostgreSQL connection failed")
    assert "Connection refused" in line and f"127.0.0.1:{port}" in line


def test_without_psycopg_the_line_says_how_to_install_it(monkeypatch, capfd):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg raises ImportError
    line = _fails_in_one_line(f"postgresql://plnexp:{SECRET}@127.0.0.1:1/mlflow", capfd)
    assert "psycopg is not installed" in line and "[cluster]" in line and "pip install" in line


@pytest.mark.parametrize(
    "message, what",
    [
        (
            'connection to server at "h", port 5432 failed: FATAL:  password authentication failed for user "u"',
            "authentication",
        ),
        (
            'connection to server at "h", port 5432 failed: FATAL:  no pg_hba.conf entry for host "10.0.0.2"',
            "authentication",
        ),
        ('connection to server at "h", port 5432 failed: FATAL:  role "u" does not exist', "authentication"),
        ('connection to server at "h", port 5432 failed: fe_sendauth: no password supplied', "authentication"),
        ('connection to server at "h", port 5432 failed: FATAL:  database "d" does not exist', "database"),
        ('connection to server at "h", port 1 failed: Connection refused\n\tIs the server running?', "connection"),
        ("connection timeout expired", "connection"),
        ('failed to resolve host "nowhere": Name or service not known', "connection"),
    ],
)
def test_libpq_messages_map_to_what_failed(message, what):
    got, reason = backend._postgres_failure(message)
    assert got == what and reason and "\n" not in reason


# the tests below start PostgreSQL: the cluster tests' markers (tests/test_cluster.py), one xdist worker
@pytest.fixture(scope="module")
def database():
    """A PostgreSQL 15 server of this module's (tests/daemons.py), stopped by PID when the module ends."""
    with daemons.postgres_or_skip() as db:
        yield db


def _with(uri: str, **parts) -> str:
    from sqlalchemy.engine import make_url

    return make_url(uri).set(**parts).render_as_string(hide_password=False)


@pytest.mark.cluster
@pytest.mark.xdist_group("cluster")
def test_the_right_uri_passes_the_direct_connection(database):
    backend._reach_postgres(database.uri, "tracking_uri", "allowed")  # raises nothing


@pytest.mark.cluster
@pytest.mark.xdist_group("cluster")
def test_a_wrong_password_is_an_authentication_failure_in_one_line(database, capfd):
    line = _fails_in_one_line(_with(database.uri, password=SECRET), capfd)
    assert "PostgreSQL authentication failed" in line and "wrong user or password" in line
    assert "plnexp:***@127.0.0.1" in line


@pytest.mark.cluster
@pytest.mark.xdist_group("cluster")
def test_a_missing_database_is_named_in_one_line(database, capfd):
    line = _fails_in_one_line(_with(database.uri, database="nodb"), capfd)
    assert "PostgreSQL database missing" in line and "no database nodb" in line
    assert database.uri.split(":")[2].split("@")[0] not in line  # the server's real password neither
