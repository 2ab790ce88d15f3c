"""A tracking server that authenticates, for real: MLflow's basic-auth app (``mlflow server
--app-name basic-auth``, the ``mlflow[auth]`` extra) on a sqlite store, started once for the module
(tests/daemons.py) on 127.0.0.1 and stopped by PID; its admin creates the users, as the docs'
recipe does (docs/how-to/tracking-server.md).

A client without credentials is refused in one line before any run exists; with an account's
``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` a sweep logs; ``doctor`` tells which (and
an account without permission on an experiment, HTTP 403). Skips, saying why, where ``mlflow[auth]``
is missing or the server cannot start.
"""

from __future__ import annotations

import base64
import os
import json
import secrets
import shutil
import urllib.request
from contextlib import contextmanager

import pytest

import daemons
from conftest import session_env
from plnexp.cli import doctor
from plnexp.cli.doctor import store_server

# one xdist worker runs them all: the module's server is started once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("auth"), pytest.mark.timeout(300)]

ADMIN_PASSWORD = secrets.token_hex(8)  # 16 characters: the basic-auth app wants 12 at least
USERS = {"alice": secrets.token_hex(8), "bob": secrets.token_hex(8)}
TINY = ("dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3", "repeats=1", "warmup=0", "time_budget_s=0")
ACCOUNT = "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"


def _create_user(uri: str, admin: tuple[str, str], username: str, password: str) -> None:
    """The admin creates a user through the REST API (the docs' curl command)."""
    request = urllib.request.Request(
        f"{uri}/api/2.0/mlflow/users/create",
        data=json.dumps({"username": username, "password": password}).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": "Basic " + base64.b64encode(":".join(admin).encode()).decode(),
        },
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200


@pytest.fixture(scope="module")
def server(tmp_path_factory, migrated_store):
    """The basic-auth server (users get READ on what they did not create, MLflow's default), its
    tracking store a copy of the session's migrated one; alice created through the REST API, bob
    through MLflow's ``AuthServiceClient``, both by the admin."""
    folder = tmp_path_factory.mktemp("auth_server")
    shutil.copy(migrated_store, folder / "server.db")
    try:
        with daemons.mlflow_server(
            f"sqlite:///{folder}/server.db", folder, workers=1, auth_admin_password=ADMIN_PASSWORD
        ) as s:
            assert s.admin is not None
            _create_user(s.uri, s.admin, "alice", USERS["alice"])
            from mlflow.server.auth.client import AuthServiceClient

            with _as_admin(s):
                assert AuthServiceClient(s.uri).create_user("bob", USERS["bob"]).username == "bob"
            print(f"basic-auth MLflow server up in {s.up_s:.1f} s")
            yield s
    except daemons.Unavailable as e:
        pytest.skip(f"no basic-auth MLflow server here: {e}")


@pytest.fixture
def as_user(monkeypatch, tmp_path):
    """``as_user(name, password)``: this process's MLflow credentials; None: none. No
    ~/.mlflow/credentials file (MLflow's other source) speaks for the test."""
    import mlflow.utils.credentials

    monkeypatch.setattr(mlflow.utils.credentials, "_get_credentials_path", lambda: str(tmp_path / "no-credentials"))

    def use(name: str | None, password: str | None = None) -> None:
        for var, value in (("MLFLOW_TRACKING_USERNAME", name), ("MLFLOW_TRACKING_PASSWORD", password)):
            if value is None:
                monkeypatch.delenv(var, raising=False)
            else:
                monkeypatch.setenv(var, value)

    return use


@contextmanager
def _as_admin(server):
    """This process's MLflow credentials the admin's, for the block."""
    with (
        session_env("MLFLOW_TRACKING_USERNAME", server.admin[0]),
        session_env("MLFLOW_TRACKING_PASSWORD", server.admin[1]),
    ):
        yield


def _experiment(server, name: str):
    from mlflow import MlflowClient

    with _as_admin(server):
        return MlflowClient(server.uri).get_experiment_by_name(name)


def _runs(server, experiment_id: str) -> list:
    from mlflow import MlflowClient

    with _as_admin(server):
        return MlflowClient(server.uri).search_runs([experiment_id], max_results=100)


def test_without_credentials_run_is_refused_in_one_line(server, outputs, tmp_path, plnexp_main, as_user):
    """No credentials, then a wrong password: exit 2, one line naming the variables, no run."""
    as_user(None)
    out = plnexp_main("run", *TINY, "experiment=refused", f"tracking_uri={server.uri}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr == (
        f"plnexp: store error: tracking_uri={server.uri}: the server requires authentication and no credentials "
        f"are set (HTTP 401): set {ACCOUNT} to an account that the server's admin created\n"
    )
    assert out.stdout == ""

    as_user("alice", "not-" + USERS["alice"])
    out = plnexp_main("run", *TINY, "experiment=refused", f"tracking_uri={server.uri}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "not-" not in out.stderr  # the password is never shown
    assert out.stderr.endswith(
        "the server refused the credentials of alice (HTTP 401: unknown user or wrong password): "
        f"check {ACCOUNT}, or ask the server's admin to create the account or reset its password\n"
    ), out.stderr

    as_user("alice")  # a username, no password
    out = plnexp_main("run", *TINY, "experiment=refused", f"tracking_uri={server.uri}", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.endswith(
        "MLFLOW_TRACKING_USERNAME=alice is set but no password (HTTP 401): set MLFLOW_TRACKING_PASSWORD too\n"
    ), out.stderr
    assert _experiment(server, "refused") is None  # refused before any run existed


def test_with_credentials_a_sweep_logs(server, outputs, tmp_path, plnexp_main, as_user):
    """alice's credentials in the environment: a 2-job sweep logs into the server, as with no auth."""
    as_user("alice", USERS["alice"])
    out = plnexp_main(
        "sweep",
        "sweep=null",
        *TINY,
        "seed=0,1",
        "experiment=authed",
        f"tracking_uri={server.uri}",
        "report=false",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "2/2 jobs, 0 failed" in out.stdout, out.stdout
    assert USERS["alice"] not in out.stdout + out.stderr
    exp = _experiment(server, "authed")
    runs = _runs(server, exp.experiment_id)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2, runs
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert all(r.info.artifact_uri.startswith("mlflow-artifacts:") for r in runs)  # uploaded through the server


def test_doctor_says_whether_the_server_accepts_the_credentials(server, as_user):
    """None: the 401 line, the writes not tried; alice: accepted, her run written and deleted; bob
    on the experiment plnexp-doctor that alice created (READ for him): the 403 line."""
    uri = server.uri
    as_user(None)
    found = {c.name: c for c in doctor.store(uri)}
    assert [(k, found[k].ok) for k in ("store_reachable", "store_writable", "store_artifacts", "store_auth")] == [
        ("store_reachable", True),
        ("store_writable", None),
        ("store_artifacts", None),
        ("store_auth", False),
    ], found
    assert found["store_auth"].detail == (
        f"{uri}: the server requires authentication and no credentials are set (HTTP 401): set {ACCOUNT} "
        "to an account that the server's admin created"
    )
    assert "see store_auth" in found["store_writable"].detail

    as_user("bob", "wrong-" + USERS["bob"])
    found = {c.name: c for c in doctor.store(uri)}
    assert found["store_auth"].ok is False and "refused the credentials of bob (HTTP 401" in found["store_auth"].detail

    as_user("alice", USERS["alice"])
    found = {c.name: c for c in doctor.store(uri)}
    assert found["store_auth"].ok is True and found["store_auth"].detail == (
        f"{uri}: authentication required; credentials of alice accepted"
    )
    assert found["store_writable"].ok is True and found["store_artifacts"].ok is True, found
    assert "created and deleted a run" in found["store_writable"].detail

    as_user("bob", USERS["bob"])
    found = {c.name: c for c in doctor.store(uri)}
    assert found["store_auth"].ok is True and found["store_auth"].detail.endswith("credentials of bob accepted")
    assert found["store_writable"].ok is False, found
    assert found["store_writable"].detail == (
        f"{uri}: the server accepted the credentials of bob but refused to let it create a run in experiment "
        f"{store_server.DOCTOR_EXPERIMENT} and log to it (HTTP 403: permission denied): ask the server's admin to "
        f"grant bob that permission, or set {ACCOUNT} to an account that has it"
    )
    assert all(p not in c.detail for c in found.values() for p in (*USERS.values(), ADMIN_PASSWORD))


def _files_holding(root, secret: str) -> list[str]:
    """The files under ``root`` whose bytes hold ``secret`` (links not followed)."""
    return [str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink() and secret.encode() in p.read_bytes()]


@pytest.mark.parametrize("way", ["uri", "credentials_file"])
def test_credentials_from_the_uri_or_the_credentials_file_log_and_are_written_nowhere(
    server, outputs, tmp_path, plnexp_main, as_user, monkeypatch, way
):
    """alice's password refused in ``tracking_uri=`` (exit 2, no run); then given as userinfo in
    MLFLOW_TRACKING_URI (split off into MLFLOW_TRACKING_USERNAME/PASSWORD at start) or in
    ~/.mlflow/credentials: the run logs, and her password is in nothing printed, no file under the
    outputs folder, and no file of the server (its tracking and its auth database)."""
    import mlflow.utils.credentials

    password = USERS["alice"]
    with_userinfo = server.uri.replace("http://", f"http://alice:{password}@")
    as_user(None)
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(var, "x")  # recorded, so that what the command sets is undone after the test
        monkeypatch.delenv(var)
    refused = plnexp_main("run", *TINY, f"experiment=via-{way}", f"tracking_uri={with_userinfo}", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD or ~/.mlflow/credentials" in refused.stderr
    assert _experiment(server, f"via-{way}") is None
    if way == "uri":
        monkeypatch.setenv("MLFLOW_TRACKING_URI", with_userinfo)
        args = ()
    else:
        filed = tmp_path / "credentials"
        filed.write_text(f"[mlflow]\nmlflow_tracking_username = alice\nmlflow_tracking_password = {password}\n")
        monkeypatch.setattr(mlflow.utils.credentials, "_get_credentials_path", lambda: str(filed))
        args = (f"tracking_uri={server.uri}",)
    out = plnexp_main("run", *TINY, f"experiment=via-{way}", *args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (refused.stdout + refused.stderr + out.stdout + out.stderr).count(password) == 0
    if way == "uri":
        assert os.environ["MLFLOW_TRACKING_URI"] == server.uri and os.environ["MLFLOW_TRACKING_USERNAME"] == "alice"
    exp = _experiment(server, f"via-{way}")
    (run,) = _runs(server, exp.experiment_id)
    assert run.info.status == "FINISHED"
    assert (
        _files_holding(outputs, password) == [] and _files_holding(server.log.parent, password) == []
    )  # server.db, auth.db, its log, artifacts
