"""``python -m plnexp doctor``: can this machine be trusted to run plnexp, and give right numbers?

One line per check (``ok``, ``FAIL`` or ``info``, the check's name, what it found; an ``info`` whose
finding starts with ``warning:`` deserves a look but fails nothing), then a summary line; exit
status 0 when nothing failed, 1 otherwise. ``--json`` prints the checks as a JSON list.

The checks: package versions; JAX's devices per platform; float64 (x64) availability; the XLA
flags and whether plnexp set any (only for a jaxlib it has checked, see :mod:`plnexp.system.runtime`);
SciPy's OpenBLAS threads; the MLflow store, resolved as the commands resolve it (a local store:
reachable and writable without creating anything in it, and for sqlite the filesystem, with a
warning on NFS, Lustre, GPFS...; a tracking server: ``/health`` answers, a run created and deleted
in the experiment ``plnexp-doctor``, an artifact uploaded to it and read back, whether the
artifacts go through the server or straight to a path every node must see, and whether it requires
authentication and accepts ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``); SLURM (the client
and a controller that answers, for ``hydra/launcher=slurm``); and the numerics: on every JAX
device, for each model (full, profiled, and pca at rank 2) and precision, the jitted partial ELBO
(``model.state_elbo`` and the value of ``model.value_and_grad``) at a seeded random point on the
shipped oaks data against the float64 host reference (:mod:`plnexp.core.reference`) at the precision's tolerance
(:meth:`plnexp.core.precision.Precision.check_tolerance`), plus the reduction that jaxlib 0.10.2's CPU
backend is known to miscompile without plnexp's XLA flag.
"""

from __future__ import annotations

import http.client
import json
import os
import platform
import re
import tempfile
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from collections.abc import Callable, Iterable

import numpy as np

from ..core import reference
from ..system import runtime
from ..core.precision import PRECISIONS
from ..core.model import MODELS, PCA_NAME, Arrays, Model, PLNState, pca_model
from ..system.commandline import Parser, UsageError, fail
from ..system.credentials import address, split_uri
from ..system.paths import install_command
from ..system.redact import redact, redact_text

PACKAGES = ("jax", "jaxlib", "optax", "numpy", "scipy", "mlflow", "hydra-core", "plnexp")
HTTP_TIMEOUT_S = 3.0
# jaxlib 0.10.2 returns 1113766.9 instead of 1285968.25 for this sum on x86 CPUs (plnexp/system/runtime.py);
# float32 rounding alone stays below 1e-6 (tests/test_model.py uses the same 2e-5).
PROBE_RTOL = 2e-5
SEED = 0
PCA_RANK = 2  # the rank of the PLN-PCA whose ELBO is checked (oaks: p = 114)


@dataclass(frozen=True)
class Check:
    """One finding: ``ok`` is True (passed), False (failed) or None (information, or skipped)."""

    name: str
    ok: bool | None
    detail: str

    @property
    def label(self) -> str:
        return {True: "ok", False: "FAIL", None: "info"}[self.ok]


# ------------------------------------------------------------------------------------- environment
def versions() -> list[Check]:
    found = [f"python {platform.python_version()}"]
    for name in PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    return [Check("versions", None, ", ".join(found))]


def all_devices() -> list:
    """Every device of every JAX backend this process initialised (the default one and the others)."""
    import jax
    from jax.extend.backend import backends

    jax.devices()  # initialises the backends
    return [d for client in backends().values() for d in client.devices()]


def device_label(device) -> str:
    return f"{device.platform}:{device.id}"


def devices() -> list[Check]:
    import jax

    by_platform: dict[str, list[str]] = {}
    for d in all_devices():
        by_platform.setdefault(d.platform, []).append(f"{device_label(d)} {d.device_kind}")
    detail = "; ".join(f"{p}: {len(ds)} ({', '.join(ds)})" for p, ds in by_platform.items())
    return [
        Check(
            "devices",
            True if by_platform else False,
            f"{detail}; default backend {jax.default_backend()}" if by_platform else "JAX found no device",
        )
    ]


def x64_works() -> bool:
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(True):
        out = jax.jit(lambda a: a * 2.0)(jnp.arange(3, dtype=jnp.float64))
        return out.dtype == jnp.float64


def x64() -> list[Check]:
    if x64_works():
        return [Check("x64", True, "float64 computations available under jax.enable_x64(True)")]
    return [Check("x64", False, "jax.enable_x64(True) still computes in float32: precision=float64 is unavailable")]


def xla_flags(environ=os.environ, version: str | None = None) -> list[Check]:
    """XLA_FLAGS now, and the flags plnexp adds for this jaxlib (none for an unchecked one)."""
    version = version or runtime.jaxlib_version()
    current = environ.get("XLA_FLAGS", "")
    shown = f"XLA_FLAGS={current!r}"
    if version not in runtime.CHECKED_JAXLIB:
        return [
            Check(
                "xla_flags",
                None,
                f"plnexp added no XLA flags (jaxlib {version} is not among the checked "
                f"versions {', '.join(runtime.CHECKED_JAXLIB)}); {shown}",
            )
        ]
    added = runtime.plnexp_flags(environ, version)
    present = dict((f.split("=", 1) + [""])[:2] for f in current.split())
    missing = [f for f in added if f.split("=", 1)[0] not in present]
    if missing:
        return [
            Check(
                "xla_flags",
                False,
                f"jaxlib {version} is checked but XLA_FLAGS lacks {' '.join(missing)} "
                f"(was plnexp.runtime.configure() called before JAX started?); {shown}",
            )
        ]
    for flag in runtime.SAFETY_FLAGS:  # a user's own value for a safety flag's name is kept: does it keep the safety?
        name, value = flag.split("=", 1)
        if not set(value.split(",")) <= set(present[name].split(",")):
            return [
                Check(
                    "xla_flags",
                    False,
                    f"XLA_FLAGS sets {name}={present[name]}, without plnexp's safety "
                    f"setting {value} (see plnexp/system/runtime.py); {shown}",
                )
            ]
    return [Check("xla_flags", True, f"jaxlib {version} is checked; plnexp's flags: {' '.join(added)}; {shown}")]


def lapack() -> list[Check]:
    threads = runtime.lapack_threads()
    if not threads:
        return [
            Check("lapack_threads", None, "SciPy's OpenBLAS not found in this process (not Linux, or another BLAS)")
        ]
    return [
        Check(
            "lapack_threads",
            None,
            f"SciPy's OpenBLAS (jaxlib's CPU LAPACK) runs {','.join(map(str, threads))} thread(s)",
        )
    ]


# ------------------------------------------------------------------------------------------- store
def _sqlite_path(uri: str) -> Path | None:
    """The database file of a sqlite URI (``sqlite:///rel`` or ``sqlite:////abs``); None for in-memory."""
    rest = uri[len("sqlite://") :].split("?", 1)[0]
    if rest in ("", "/", "/:memory:"):
        return None
    return Path(rest[1:]).resolve() if rest.startswith("/") else Path(rest).resolve()


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
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".plnexp-doctor-"):
            pass
    except OSError as e:
        return [
            reach,
            Check("store_writable", False, f"{where}: cannot create a file in {existing}: {e.strerror or e}"),
        ]
    return [reach, Check("store_writable", True, f"{where}: created and removed a file in {existing}")]


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
    from ..store.backend import HOST_REFUSED, INVALID_HOST, auth_refusal, credentials

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
    from ..store.backend import plain_client

    with _environ(**_http_limits(timeout)):
        try:
            plain_client(uri).search_experiments(max_results=1)
        except Exception as e:  # noqa: BLE001 - the finding is the error, in one line
            refused = auth_refusal(e)
            if refused:
                return Check("store_auth", False, f"{uri}: {refused}")
            return Check(
                "store_auth", None, f"{uri}: authentication required; credentials not checked: {_first_line(e)}"
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
    from ..store.backend import auth_refusal, plain_client

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
                    else f"{uri}: cannot create a run in experiment {DOCTOR_EXPERIMENT} and log to it: {_first_line(e)}",
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
        return _first_line(e)
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
        return Check("store_artifacts", False, f"{uri}: artifact upload or read-back failed: {_first_line(e)}")
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


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


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


def _filesystem_check(uri: str, db: Path) -> list[Check]:
    """``store_filesystem``: the filesystem of the folder holding a sqlite store; a warning (information,
    not a failure: one writer at a time is fine) when it is a network filesystem."""
    found = filesystem_of(db.parent, _mounts_text())
    if found is None:
        return [Check("store_filesystem", None, f"{uri}: filesystem of {db.parent} not known (no /proc/self/mounts)")]
    fstype, point = found
    if fstype in NETWORK_FILESYSTEMS:
        return [
            Check(
                "store_filesystem",
                None,
                f"warning: sqlite store on {fstype} ({point}): sqlite locking is "
                "unsafe on network filesystems; several jobs writing at once can corrupt it or fail with "
                f"'database is locked' ({db}). Use a tracking server: README 'A shared tracking server'",
            )
        ]
    return [Check("store_filesystem", True, f"sqlite store on {fstype} ({point})")]


def _postgres_checks(uri: str) -> list[Check]:
    """``store_reachable`` for a PostgreSQL store: one direct connection, as a command's check makes it
    (the password from ``PGPASSWORD`` or ``~/.pgpass``); what failed in one line (authentication, the
    connection, or a missing database: ``PostgreSQL database missing``)."""
    from ..store.backend import StoreError, _reach_postgres

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
        from ..store import tracking_uri

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
        db = _sqlite_path(uri)
        if db is None:
            return [Check("store_reachable", None, f"{uri}: in-memory sqlite store, nothing persists")]
        found = _dir_checks(uri, db.parent, db)
        return found + (_filesystem_check(uri, db) if found[0].ok else [])
    if scheme in ("http", "https"):
        return _http_checks(uri, timeout)
    if scheme in ("postgresql", "postgresql+psycopg"):
        return _postgres_checks(uri)
    if scheme in ("", "file"):  # MLflow's file store: a directory
        return _dir_checks(uri, Path(uri[len("file://") :] if scheme else uri).resolve(), None)
    return [Check("store_reachable", None, f"{uri}: scheme {scheme!r} not checked by plnexp doctor")]


# ---------------------------------------------------------------------------------------- numerics
def jitted_state_elbo(model: Model, state: PLNState, arrays: Arrays):
    import jax

    return jax.jit(model.state_elbo)(state, arrays)


def jitted_value_and_grad(model: Model, state: PLNState, arrays: Arrays):
    import jax

    return jax.jit(model.value_and_grad)(model.free(state), state, arrays)[0]


# (label, function(model, complete state, arrays) -> partial ELBO): what every fit compiles
JITTED: tuple[tuple[str, Callable], ...] = (
    ("state_elbo", jitted_state_elbo),
    ("value_and_grad", jitted_value_and_grad),
)


def checked_models() -> tuple[Model, ...]:
    """The models whose ELBO the doctor checks: every one of :data:`MODELS`, and PLN-PCA at rank
    :data:`PCA_RANK`."""
    return (*MODELS.values(), pca_model(PCA_RANK))


def random_params(model: Model, data, seed: int = SEED) -> dict:
    """A seeded point near a plausible fit (the ``data`` init plus noise), as float64 numpy arrays.
    PLN-PCA: C and M from the top ``model.rank`` singular vectors of the residual of Z on X (as its
    ``data`` init), plus noise, and a rotation R that is not 0 (the ELBO sees C Q and M Q)."""
    rng = np.random.default_rng(seed)
    n, p = data.Y.shape
    Z = np.log1p(data.Y) - data.O - 0.3 + 0.3 * rng.normal(size=(n, p))
    S = rng.uniform(0.2, 1.0, size=(n, p))
    if model.name == "profiled":
        return {"M": Z, "S": S}
    B = np.linalg.lstsq(data.X, Z, rcond=None)[0] + 0.2 * rng.normal(size=(data.X.shape[1], p))
    if model.name == PCA_NAME:
        q = model.rank
        U, s, Vt = np.linalg.svd(Z - data.X @ B, full_matrices=False)
        return {
            "B": B,
            "C": Vt[:q].T * (s[:q] / np.sqrt(n)) + 0.05 * rng.normal(size=(p, q)),
            "M": U[:, :q] * np.sqrt(n) + 0.3 * rng.normal(size=(n, q)),
            "S": S[:, :q],
            "R": 0.3 * rng.normal(size=(q, q)),
        }
    return {"B": B, "M": Z - data.X @ B, "S": S}


def elbo_check(
    model: Model,
    device,
    precision: str,
    data=None,
    functions: Iterable[tuple[str, Callable]] = JITTED,
    seed: int = SEED,
) -> Check:
    """Each jitted ELBO of ``functions`` at a random complete state vs the float64 host reference
    (:func:`plnexp.core.reference.elbo`; PLN-PCA: :func:`plnexp.core.reference.pca_elbo` at the C and M
    the ELBO sees, rotated by the state's R on the host in float64)."""
    import jax

    from .. import load_oaks

    data = load_oaks() if data is None else data
    prec = PRECISIONS[precision]
    dtype = prec.dtype
    name = f"elbo[{model.name},{precision},{device_label(device)}]"
    rank = f" (rank {model.rank})" if model.name == PCA_NAME else ""
    where = f"model {model.name}{rank} on {device_label(device)} in {precision}"
    with jax.enable_x64(dtype == np.float64):
        arrays = data.to_device(dtype, device)
        params = {k: jax.device_put(np.asarray(v, dtype), device) for k, v in random_params(model, data, seed).items()}
        state = jax.jit(model.complete)(params, arrays)
        centred: jax.Array | np.ndarray = model.centred_m(state, arrays)
        jitted = [(label, float(fn(model, state, arrays))) for label, fn in functions]
        host_state = PLNState._make(np.asarray(a, np.float64) for a in state)  # float64 copies on the host
        centred = np.asarray(centred, np.float64)
    log_fact = reference.log_factorial_sum(data.Y)
    if model.name == PCA_NAME:
        seen = model.params(host_state, data)  # B, C Q, M Q, S: Q the rotation of R, by NumPy in float64
        host = reference.pca_elbo(data.Y, data.O, data.X, seen["B"], seen["C"], seen["M"], seen["S"])
    else:
        host = reference.elbo(data.Y, data.O, data.X, host_state.B, centred, host_state.S, host_state.Sigma)
    rtol = prec.check_rtol
    tol = prec.check_tolerance(host, data.Y.size)
    for label, value in jitted:
        value -= log_fact
        rel = abs(value - host) / abs(host) if np.isfinite(value) and np.isfinite(host) else float("nan")
        if not abs(value - host) <= tol:  # NaN fails too
            return Check(
                name,
                False,
                f"jitted {label} gives {value:.6f} but the float64 host reference gives "
                f"{host:.6f} (relative error {rel:.2e}, beyond {rtol:g} relative and the "
                f"absolute floor of {data.Y.size} entries) for {where}",
            )
    worst = max(abs(v - log_fact - host) / abs(host) for _, v in jitted) if jitted else 0.0
    return Check(
        name,
        True,
        f"{', '.join(label for label, _ in jitted)} = {host:.4f} within {worst:.1e} "
        f"(<= {rtol:g}) of the float64 host reference",
    )


def stirling_probe(device, data=None, jitted: Callable | None = None) -> Check:
    """The jitted Stirling sum over oaks counts (float32) that jaxlib 0.10.2 miscompiles, vs numpy float64."""
    import jax
    import jax.numpy as jnp

    from .. import load_oaks

    data = load_oaks() if data is None else data
    k = np.where(data.Y == 0, 1.0, data.Y)
    want = float(np.sum(np.log(np.sqrt(2 * np.pi * k)) + k * np.log(k / np.e)))
    if jitted is None:
        jitted = jax.jit(lambda k: jnp.sum(jnp.log(jnp.sqrt(2 * jnp.pi * k)) + k * jnp.log(k / jnp.e)))
    got = float(jitted(jax.device_put(k.astype(np.float32), device)))
    rel = abs(got - want) / abs(want)
    name = f"miscompile_probe[{device_label(device)}]"
    if not rel <= PROBE_RTOL:
        return Check(
            name,
            False,
            f"jitted Stirling sum over oaks counts gives {got:.1f} but numpy float64 gives "
            f"{want:.1f} (relative error {rel:.2e} > {PROBE_RTOL:g}): this XLA miscompiles "
            f"a fused reduction on {device_label(device)}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}",
        )
    return Check(name, True, f"jitted Stirling sum {got:.1f} within {rel:.1e} of numpy float64 {want:.1f}")


def numerics() -> list[Check]:
    from .. import load_oaks

    data = load_oaks()
    precisions = ["float32"] + (["float64"] if x64_works() else [])
    out = []
    for device in all_devices():
        out.append(stirling_probe(device, data))
        out += [elbo_check(model, device, precision, data) for model in checked_models() for precision in precisions]
    return out


# ------------------------------------------------------------------------------------------ driver
def slurm(run=None) -> list[Check]:
    """Whether ``hydra/launcher=slurm`` can submit from here: the cluster extra, the SLURM client
    (sbatch, squeue, scancel) and a controller that answers (``sinfo``: its partitions)."""
    import importlib.util
    import shutil
    import subprocess

    run = run or subprocess.run
    missing = [tool for tool in ("sbatch", "squeue", "scancel") if shutil.which(tool) is None]
    if missing:
        return [
            Check(
                "slurm",
                None,
                f"no SLURM client here ({', '.join(missing)} not on PATH): sweeps run on this "
                "machine (hydra/launcher=slurm needs a login node)",
            )
        ]
    if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
        # plnexp's own sweeps still run here: the cluster is an option this install does not use
        return [
            Check(
                "slurm",
                None,
                "SLURM client found but plnexp's cluster extra is not installed (hydra/launcher=slurm "
                f"needs it: {install_command('cluster')}); sweeps run on this machine",
            )
        ]
    try:
        out = run(["sinfo", "-h", "-o", "%P %a %D %t"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        return [Check("slurm", False, f"sinfo failed: {e}")]
    if out.returncode != 0:  # a client with no cluster configured: nothing this machine must do
        first = (out.stderr or out.stdout).strip().splitlines()
        return [
            Check(
                "slurm",
                None,
                f"warning: SLURM client found but no controller answers "
                f"({first[0] if first else out.returncode}): hydra/launcher=slurm cannot submit "
                "from here",
            )
        ]
    parts = sorted({line.split()[0] for line in out.stdout.splitlines() if line.strip()})
    return [
        Check(
            "slurm",
            True,
            f"controller answers; partitions: {', '.join(parts) or '(none)'} "
            "(hydra/launcher=slurm hydra.launcher.partition=NAME)",
        )
    ]


CHECKS: tuple[Callable[[], list[Check]], ...] = (versions, devices, x64, xla_flags, lapack, store, slurm, numerics)


def _guarded(fn: Callable[[], list[Check]]) -> list[Check]:
    """A check that raises is reported as a failure of that check, never a crash of the doctor."""
    try:
        return list(fn())
    except Exception as e:  # noqa: BLE001 - a check that raises fails that check, never the doctor
        first = (str(e).splitlines() or [""])[0]
        return [Check(fn.__name__, False, redact_text(f"raised {type(e).__name__}: {first}"))]


def checks() -> list[Check]:
    return [c for fn in CHECKS for c in _guarded(fn)]


def summary(found: list[Check]) -> str:
    """One line: the failed checks by name, the counts, and the information lines that are warnings
    (a detail starting ``warning:``: not a failure, the exit status stays 0) by name."""
    failed = [c.name for c in found if c.ok is False]
    passed = sum(c.ok is True for c in found)
    info = sum(c.ok is None for c in found)
    warned = [c.name for c in found if c.ok is None and c.detail.startswith("warning:")]
    warnings = f"; warnings: {', '.join(warned)}" if warned else ""
    if failed:
        return f"doctor: {len(failed)} FAILED ({', '.join(failed)}), {passed} ok, {info} info{warnings}"
    return f"doctor: all {passed} checks passed ({info} info{warnings})"


def main(args: list[str]) -> int:
    """``python -m plnexp doctor [--json]``: 0 if every check passed, 1 if any failed, 2 on a bad option."""
    p = Parser("python -m plnexp doctor [--json]", __doc__.split("\n\n")[1])
    p.add_argument("--json", action="store_true", help="the checks as a JSON list")
    try:
        ns = p.parse(args)
    except UsageError as e:
        return fail(e)
    if ns is None:  # --help: printed
        return 0
    found = checks()
    # masked where printed: a check's detail names the store's URI, and the report is pasted into issues
    if ns.json:
        print(json.dumps([redact(asdict(c)) for c in found], indent=1))
    else:
        width = max(len(c.name) for c in found)
        for c in found:
            print(f"{c.label:<4}  {c.name:<{width}}  {redact_text(c.detail)}")
        print(redact_text(summary(found)))
    return 1 if any(c.ok is False for c in found) else 0
