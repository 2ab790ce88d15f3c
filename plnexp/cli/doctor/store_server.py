"""The doctor's checks of an MLflow tracking server (``http(s)://``): ``/health`` answers
(``store_reachable``), a run created and deleted in the experiment ``plnexp-doctor``
(``store_writable``), an artifact uploaded to it and read back (``store_artifacts``: through the
server, or straight to a path every node must see), and whether the server requires authentication
and accepts ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` (``store_auth``). Each call
bounded by a timeout of seconds."""

from __future__ import annotations

import http.client
import os
import tempfile
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from ...system.credentials import address
from ...system.commandline import first_line
from .check import Check

SEARCH_PATH = "/api/2.0/mlflow/experiments/search?max_results=1"


def _http_checks(uri: str, timeout: float) -> list[Check]:
    """``store_reachable`` (``/health``, else the REST API, answers within ``timeout``); then, only
    when it answers, the writes of :func:`_server_writes` (skipped when the server refuses this
    client's credentials) and ``store_auth`` (:func:`_auth_check`), last."""
    base = address(uri).rstrip("/")  # urllib never sees a userinfo (its errors would quote it)
    answered = None
    for path in ("/health", SEARCH_PATH):
        try:
            with urllib.request.urlopen(base + path, timeout=timeout) as resp:
                answered = f"GET {path} answered {resp.status}"
                break
        except urllib.error.HTTPError as e:  # the server is there; try the API endpoint next
            answered = f"GET {path} answered {e.code}"
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
            # (ValueError, InvalidURL: an address urllib cannot read, a port that is not a number)
            reason = getattr(e, "reason", e)
            return [
                Check("store_reachable", False, f"{uri}: no answer ({reason}; timeout {timeout:g} s)"),
                Check("store_writable", None, f"{uri}: not checked: server unreachable"),
                Check("store_artifacts", None, f"{uri}: not checked: server unreachable"),
            ]
    reach = Check("store_reachable", True, f"{uri}: {answered}")
    auth = _auth_check(uri, timeout)
    if auth.ok is False:  # refused: every write would be refused the same way; store_auth says why, once
        skipped = f"{uri}: not checked: the server refused this client's credentials (see store_auth)"
        return [reach, Check("store_writable", None, skipped), Check("store_artifacts", None, skipped), auth]
    return [reach, *_server_writes(uri, timeout), auth]


def _http_limits(timeout: float) -> dict[str, str]:
    """MLflow's HTTP timeout and retries for the doctor's calls: seconds, not minutes, when a server
    stops answering (3 * ``timeout`` a call, retried at most once)."""
    return {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, round(3 * timeout))), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}


def _body(e: urllib.error.HTTPError) -> str:
    """The start of an HTTP error's body ('' where it cannot be read)."""
    try:
        return e.read(1000).decode("utf-8", "replace")
    except OSError:
        return ""


def _auth_check(uri: str, timeout: float) -> Check:
    """``store_auth``: whether the server requires authentication (its REST API refuses a request
    without credentials, as MLflow's ``--app-name basic-auth`` does while ``/health`` stays open)
    and, when it does, whether MLflow's client gets in with this environment's credentials
    (``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``). Fails only when the server
    refuses them (HTTP 401 or 403, or 403 for a host name it does not serve); a server open to
    anyone is a warning."""
    from ...store.backend import HOST_REFUSED, INVALID_HOST, auth_refusal, credentials

    try:
        with urllib.request.urlopen(address(uri).rstrip("/") + SEARCH_PATH, timeout=timeout) as resp:  # no credentials
            status = resp.status
    except urllib.error.HTTPError as e:
        status = e.code
        if status == 403 and INVALID_HOST in _body(e):
            return Check("store_auth", False, f"{uri}: {HOST_REFUSED}")
    except (urllib.error.URLError, OSError) as e:
        return Check("store_auth", None, f"{uri}: not checked: GET {SEARCH_PATH} ({getattr(e, 'reason', e)})")
    if status == 200:
        return Check(
            "store_auth",
            None,
            f"warning: {uri} requires no authentication: anyone who reaches it can read, change or "
            "delete every run (run it with mlflow server --app-name basic-auth: docs/how-to/tracking-server.md)",
        )
    if status not in (401, 403):
        return Check("store_auth", None, f"{uri}: not known: GET {SEARCH_PATH} without credentials answered {status}")
    from ...store.backend import plain_client

    with _environ(**_http_limits(timeout)):
        try:
            plain_client(uri).search_experiments(max_results=1)
        except Exception as e:  # noqa: BLE001 - the finding is the error, in one line
            refused = auth_refusal(e)
            if refused:
                return Check("store_auth", False, f"{uri}: {refused}")
            return Check(
                "store_auth", None, f"{uri}: authentication required; credentials not checked: {first_line(e)}"
            )
    user, _ = credentials()
    who = f"credentials of {user}" if user else "this client's credentials"
    return Check("store_auth", True, f"{uri}: authentication required; {who} accepted")


DOCTOR_EXPERIMENT = "plnexp-doctor"


@contextmanager
def _environ(**values: str):
    """``os.environ`` with ``values`` set for the block, restored (or unset) afterwards."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _doctor_experiment(cl) -> str:
    """The id of the experiment ``plnexp-doctor``: created if missing, restored if someone deleted it
    (a deleted experiment keeps its name, and takes no runs)."""
    exp = cl.get_experiment_by_name(DOCTOR_EXPERIMENT)
    if exp is None:
        return cl.create_experiment(DOCTOR_EXPERIMENT)
    if exp.lifecycle_stage == "deleted":
        cl.restore_experiment(exp.experiment_id)
    return exp.experiment_id


def _server_writes(uri: str, timeout: float) -> list[Check]:
    """A run created in the experiment ``plnexp-doctor`` (a param, a metric), an artifact uploaded and
    read back (:func:`_artifact_check`), the run deleted: ``store_writable`` and ``store_artifacts``.
    Each call is bounded by MLflow's HTTP timeout, set to 3 * ``timeout`` for the while and retried
    at most once, so a server that stops answering holds the doctor for seconds, not minutes."""
    from ...store.backend import auth_refusal, plain_client

    with _environ(**_http_limits(timeout)):
        cl = plain_client(uri)
        run_id = None
        try:
            run_id = cl.create_run(_doctor_experiment(cl), run_name="doctor").info.run_id
            cl.log_param(run_id, "doctor", "1")
            cl.log_metric(run_id, "doctor", 1.0)
        except Exception as e:  # noqa: BLE001 - the finding is the error, in one line
            if run_id is not None:
                _delete_run(cl, run_id)
            refused = auth_refusal(e, f"create a run in experiment {DOCTOR_EXPERIMENT} and log to it")
            return [
                Check(
                    "store_writable",
                    False,
                    f"{uri}: {refused}"
                    if refused
                    else f"{uri}: cannot create a run in experiment {DOCTOR_EXPERIMENT} and log to it: {first_line(e)}",
                ),
                Check("store_artifacts", None, f"{uri}: not checked (no run to upload to)"),
            ]
        artifacts = _artifact_check(cl, uri, run_id)  # before the run is deleted
        failed = _delete_run(cl, run_id)
    if failed:  # plnexp itself never deletes runs: what it needs worked (a server may let only managers delete)
        return [
            Check(
                "store_writable",
                True,
                f"{uri}: created a run in experiment {DOCTOR_EXPERIMENT} (a param, a "
                f"metric) but could not delete it (run {run_id} stays): {failed}",
            ),
            artifacts,
        ]
    return [
        Check(
            "store_writable",
            True,
            f"{uri}: created and deleted a run in experiment {DOCTOR_EXPERIMENT} (a param, a metric)",
        ),
        artifacts,
    ]


def _delete_run(cl, run_id: str) -> str:
    """Deletes the run; the error in one line if that failed, else ''."""
    try:
        cl.delete_run(run_id)
    except Exception as e:  # noqa: BLE001 - any store failure is the finding, in one line
        return first_line(e)
    return ""


def _artifact_check(cl, uri: str, run_id: str) -> Check:
    """``doctor.txt`` uploaded to the run and read back. The run's artifact_uri tells who writes the
    artifacts: the server (``mlflow-artifacts:``, proxied) or this client, straight to the location."""
    text = f"plnexp doctor {run_id}"
    try:
        cl.log_text(run_id, text, "doctor.txt")
        with tempfile.TemporaryDirectory(prefix="plnexp-doctor-") as tmp:
            back = Path(cl.download_artifacts(run_id, "doctor.txt", tmp)).read_text()
        location = cl.get_run(run_id).info.artifact_uri
    except Exception as e:  # noqa: BLE001 - any artifact store failure is the finding, in one line
        return Check("store_artifacts", False, f"{uri}: artifact upload or read-back failed: {first_line(e)}")
    if back != text:
        return Check(
            "store_artifacts",
            False,
            f"{uri}: the artifact read back differs from the one uploaded (artifact_uri {location})",
        )
    if location.startswith("mlflow-artifacts:"):
        return Check(
            "store_artifacts",
            True,
            f"{uri}: artifact uploaded and read back through the server (artifact_uri {location})",
        )
    scheme = location.split(":", 1)[0] if "://" in location else "file"
    must = (
        "see that path (a shared filesystem)"
        if scheme == "file"
        else f"reach that location with its own {scheme} credentials"
    )
    return Check(
        "store_artifacts",
        True,
        f"{uri}: artifact uploaded and read back (artifact_uri {location}); "
        f"artifacts bypass the server, this client writes them there directly, so "
        f"every machine that logs, cluster nodes included, must {must}",
    )
