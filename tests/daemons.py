"""Real daemons for the cluster tests, started on 127.0.0.1 and stopped by their PID.

- :func:`slurm_cluster`: a single-node SLURM cluster (Debian's ``slurm-wlm`` and ``munge``), run as
  root without systemd: ``munged`` as user munge, ``slurmctld`` and ``slurmd`` in the foreground
  with a ``slurm.conf`` of their own in a temporary folder (clients find it through ``SLURM_CONF``).
- :func:`postgres`: a PostgreSQL 15 server in a temporary folder, run as user postgres (``initdb``
  and the server refuse root), listening on 127.0.0.1 only, password authentication.
- :func:`mlflow_server`: ``mlflow server`` backed by a PostgreSQL database (or sqlite), serving
  artifacts; with ``auth_admin_password``, MLflow's basic-auth app (``--app-name basic-auth``, the
  ``mlflow[auth]`` extra), its users in a database of their own (sqlite, or a PostgreSQL one as
  docs/how-to/tracking-server.md's recipe has it), its admin ``admin``.

Each is a context manager that yields what a client needs and stops every process it started, by
its PID (its process group), even when the block raises. :class:`Unavailable` says in one line why
a daemon cannot run here (not root, package missing): the tests skip with that line.

Run as a script to try the README's cluster commands by hand::

    python tests/daemons.py        # starts all three, prints the environment to export, waits for Ctrl-C
"""

from __future__ import annotations

import os
import platform
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

PG_BIN = Path("/usr/lib/postgresql/15/bin")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_SOCKET_DIR = Path("/run/munge")


class Unavailable(RuntimeError):
    """A daemon cannot be started here; the message says why, in one line."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, ready, timeout: float, procs=()) -> float:
    """Poll ``ready()`` until it is true; returns the seconds it took. Raises :class:`Unavailable`
    when a process of ``procs`` exits first or ``timeout`` passes."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        for p in procs:
            if p.poll() is not None:
                raise Unavailable(f"{what} exited with code {p.returncode} before it was ready")
        try:
            if ready():
                return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.2)
    raise Unavailable(f"{what} not ready after {timeout:g} s")


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """Stop a process started with ``start_new_session=True`` and its children, by its PID: SIGTERM
    to its process group, SIGKILL if it is still there after ``timeout``."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _spawn(cmd, log: Path, **kw) -> subprocess.Popen:
    f = open(log, "ab")
    try:
        return subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, **kw
        )
    finally:
        f.close()


def _as_user(name: str) -> dict:
    """``Popen`` arguments that run the command as user ``name`` (the PID stays the command's)."""
    entry = pwd.getpwnam(name)
    return {
        "user": entry.pw_uid,
        "group": entry.pw_gid,
        "extra_groups": [],
        "env": {**os.environ, "HOME": entry.pw_dir, "USER": name},
    }


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise Unavailable(f"{what} needs root to start its daemons (this user is uid {os.geteuid()})")


def missing() -> str | None:
    """Why the cluster tests cannot start their daemons here, in one line (None: they can). Checked at
    collection (``cluster`` marker); each daemon checks again as it starts."""
    if os.geteuid() != 0:
        return f"the cluster's daemons need root (this user is uid {os.geteuid()})"
    absent = [tool for tool in ("slurmctld", "slurmd", "munged", "sinfo") if shutil.which(tool) is None]
    if absent:
        return f"{', '.join(absent)} not found: apt-get install slurm-wlm munge (as .ci/run does)"
    if not (PG_BIN / "initdb").exists():
        return f"PostgreSQL 15 not found in {PG_BIN}"
    return None


# -------------------------------------------------------------------------------------------- SLURM
SLURM_CONF = """\
ClusterName=plnexp-test
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
KillWait={kill_wait}
MinJobAge=300
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
NodeName={host} CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


# SchedulerParameters: a batch job (an array's task) is started at the scheduler's next pass, not
# after slurmctld's default delay of batch scheduling, which is for sites submitting thousands of
# jobs a second; the tests' arrays of one or two tasks would otherwise wait on it at every sweep


@dataclass
class Cluster:
    conf: Path
    partition: str
    up_s: float
    env: dict = field(default_factory=dict)  # what a client process needs (SLURM_CONF)


def _munged(tmp: Path) -> subprocess.Popen | None:
    """``munged`` as user munge in the foreground (None when one already answers)."""
    if (MUNGE_SOCKET_DIR / "munge.socket.2").exists() and subprocess.run(
        ["munge", "-n"], capture_output=True
    ).returncode == 0:
        return None
    MUNGE_SOCKET_DIR.mkdir(parents=True, exist_ok=True)
    shutil.chown(MUNGE_SOCKET_DIR, "munge", "munge")
    os.chmod(MUNGE_SOCKET_DIR, 0o755)
    if not MUNGE_KEY.exists():
        raise Unavailable(f"no munge key at {MUNGE_KEY} (Debian's munge package creates it)")
    proc = _spawn(["munged", "--foreground", "--force"], tmp / "munged.log", **_as_user("munge"))
    _wait("munged", lambda: subprocess.run(["munge", "-n"], capture_output=True).returncode == 0, 20, [proc])
    return proc


def _memory_mb() -> int:
    with open("/proc/meminfo") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal"))
    return max(512, kb // 1024 - 1024)  # leave 1 GiB to the system


@contextmanager
def slurm_cluster(kill_wait: int = 5):
    """A single-node SLURM cluster, partition ``debug``; yields a :class:`Cluster`."""
    _need_root("a SLURM cluster")
    for tool in ("munged", "slurmctld", "slurmd", "sbatch", "squeue"):
        if shutil.which(tool) is None:
            raise Unavailable(
                f"{tool} not found: install Debian's slurm-wlm and munge (apt-get install slurm-wlm munge)"
            )
    tmp = Path(tempfile.mkdtemp(prefix="plnexp-slurm-"))
    procs: list[subprocess.Popen] = []
    t0 = time.monotonic()
    try:
        for d in ("state", "spool"):
            (tmp / d).mkdir()
        host = platform.node().split(".")[0]
        conf = tmp / "slurm.conf"
        conf.write_text(
            SLURM_CONF.format(
                host=host,
                dir=tmp,
                cpus=os.cpu_count() or 1,
                mem_mb=_memory_mb(),
                ctld_port=free_port(),
                d_port=free_port(),
                kill_wait=kill_wait,
            )
        )
        env = {**os.environ, "SLURM_CONF": str(conf)}
        munged = _munged(tmp)
        if munged is not None:
            procs.append(munged)
        ctld = _spawn(["slurmctld", "-D", "-i", "-f", str(conf)], tmp / "slurmctld.out", env=env)
        procs.append(ctld)
        _wait(
            "slurmctld",
            lambda: (
                subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True).stdout.count("UP") > 0
            ),
            30,
            [ctld],
        )
        slurmd = _spawn(["slurmd", "-D", "-f", str(conf)], tmp / "slurmd.out", env=env)
        procs.append(slurmd)
        idle = lambda: (
            "idle"
            in subprocess.run(
                ["sinfo", "-h", "-o", "%t"],
                env=env,
                capture_output=True,
                text=True,
            ).stdout
        )
        _wait("slurmd (node idle)", idle, 60, [ctld, slurmd])
        yield Cluster(conf, "debug", time.monotonic() - t0, {"SLURM_CONF": str(conf)})
    finally:
        if procs:
            subprocess.run(
                ["scancel", "--user", pwd.getpwuid(os.geteuid()).pw_name],
                env={**os.environ, "SLURM_CONF": str(tmp / "slurm.conf")},
                capture_output=True,
            )
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------------------- Postgres
@dataclass
class Database:
    uri: str  # postgresql://user:password@127.0.0.1:port/name
    up_s: float
    data: Path | None = None  # the cluster's data folder (owned by user postgres)
    port: int = 0
    procs: list = field(default_factory=list)  # the server's processes started, the running one last


def _pg_server(data: Path, port: int, log: Path) -> subprocess.Popen:
    """The PostgreSQL server of cluster ``data`` as user postgres, on 127.0.0.1:``port`` only (its
    Unix socket in ``data``'s folder), fsync off; returns once it accepts connections."""
    proc = _spawn(
        [
            str(PG_BIN / "postgres"),
            "-D",
            str(data),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-k",
            str(data.parent),
            "-c",
            "fsync=off",
        ],
        log,
        **_as_user("postgres"),
    )
    _wait(
        "postgres",
        lambda: subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", str(port)], capture_output=True).returncode == 0,
        30,
        [proc],
    )
    return proc


def halt(db: Database) -> None:
    """Stop the server at once, as a crash would (``pg_ctl stop -m immediate``, as user postgres):
    its connections are cut, its port closed; :func:`restart` starts it again."""
    assert db.data is not None
    subprocess.run(
        [str(PG_BIN / "pg_ctl"), "stop", "-D", str(db.data), "-m", "immediate", "-w", "-t", "30"],
        capture_output=True,
        check=True,
        **_as_user("postgres"),
    )
    for proc in db.procs:
        stop(proc)  # reaped (already gone: nothing sent)


def restart(db: Database) -> None:
    """Start the halted server again, on the same port, with the same data (:func:`halt`)."""
    assert db.data is not None
    db.procs.append(_pg_server(db.data, db.port, db.data.parent / "postgres.log"))


@contextmanager
def postgres(user: str = "plnexp", name: str = "mlflow"):
    """A PostgreSQL 15 server as user postgres on 127.0.0.1; yields a :class:`Database`."""
    _need_root("PostgreSQL (run as user postgres)")
    if not (PG_BIN / "initdb").exists():
        raise Unavailable(f"PostgreSQL 15 not found in {PG_BIN}")
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise Unavailable("no user postgres on this machine") from None
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="plnexp-pg-"))
    shutil.chown(tmp, "postgres", "postgres")
    os.chmod(tmp, 0o700)
    password = secrets.token_hex(12)
    pwfile = tmp / "pw"
    pwfile.write_text(password + "\n")
    shutil.chown(pwfile, "postgres", "postgres")
    as_pg = _as_user("postgres")
    db = Database("", 0.0, tmp / "data")
    try:
        out = subprocess.run(
            [
                str(PG_BIN / "initdb"),
                "-D",
                str(tmp / "data"),
                "-A",
                "md5",
                f"--pwfile={pwfile}",
                "-U",
                user,
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            **as_pg,
        )
        if out.returncode != 0:
            raise Unavailable(f"initdb failed: {(out.stderr or out.stdout).strip().splitlines()[-1]}")
        db.port = port = free_port()
        db.procs.append(_pg_server(tmp / "data", port, tmp / "postgres.log"))
        env = {**os.environ, "PGPASSWORD": password}
        made = subprocess.run(
            ["createdb", "-h", "127.0.0.1", "-p", str(port), "-U", user, name], env=env, capture_output=True, text=True
        )
        if made.returncode != 0:
            raise Unavailable(f"createdb failed: {made.stderr.strip()}")
        db.uri, db.up_s = f"postgresql://{user}:{password}@127.0.0.1:{port}/{name}", time.monotonic() - t0
        yield db
    finally:
        for proc in db.procs:
            _fast_shutdown(proc)
            stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def _fast_shutdown(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """PostgreSQL's fast shutdown (SIGINT): its clients' sessions are cut (SIGTERM, the smart one,
    waits for them: a test's pooled connections keep it up until :func:`stop`'s SIGKILL)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass


# ----------------------------------------------------------------------------------- MLflow server
@dataclass
class Server:
    uri: str  # http://127.0.0.1:port
    artifacts: Path
    up_s: float
    log: Path
    admin: tuple[str, str] | None = None  # (username, password) of the basic-auth app's admin; None: no auth
    pid: int = 0  # the server's process, leader of its process group (its workers): :func:`kill`


def kill(pid: int) -> None:
    """SIGKILL the process ``pid`` started in a session of its own and its whole process group (a
    server's workers), as a crash or the OOM killer would: nothing of theirs runs after."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


AUTH_ADMIN = "admin"
AUTH_INI = """\
[mlflow]
default_permission = {default_permission}
database_uri = {database_uri}
admin_username = {admin}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
auth_cache_ttl_seconds = 60
"""
# auth_cache_ttl_seconds: a user's password checked once a minute, not at every request (MLflow's
# option, off by default; one worker here, so no worker serves a changed password from its cache).
# A sweep's job makes dozens of requests, each a PBKDF2 check of tens of ms otherwise.


def _auth_env(
    folder: Path, admin_password: str, default_permission: str, database_uri: str | None = None
) -> dict[str, str]:
    """The environment of a basic-auth server: its config file (users in ``database_uri``, by default
    ``folder/auth.db``), a CSRF secret key, the admin's first password (read when the user database
    is created)."""
    try:
        import flask_wtf  # noqa: F401 - the mlflow[auth] extra: the basic-auth app will not start without it
    except ImportError:
        raise Unavailable("mlflow[auth] is not installed (Flask-WTF): pip install -e '.[cluster]'") from None
    ini = folder / "basic_auth.ini"
    database_uri = database_uri or f"sqlite:///{folder / 'auth.db'}"
    ini.write_text(AUTH_INI.format(default_permission=default_permission, database_uri=database_uri, admin=AUTH_ADMIN))
    return {
        "MLFLOW_AUTH_CONFIG_PATH": str(ini),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
        "MLFLOW_AUTH_ADMIN_PASSWORD": admin_password,
    }


def _health(uri: str) -> bool:
    with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
        return r.status == 200


def server_command(backend_uri: str, artifacts: Path, port: int, workers: int, auth=()) -> tuple[list[str], dict]:
    """``mlflow server``'s command line and the environment that gives it its store: the store's
    address in ``MLFLOW_BACKEND_STORE_URI`` and its password in the variable its client reads
    (``PGPASSWORD``: :func:`plnexp.system.credentials.split_uri`), never on the command line, which
    every local user reads (``ps -ef``, /proc/PID/cmdline), as docs/how-to/tracking-server.md asks."""
    from plnexp.system.credentials import split_uri

    address, secret = split_uri(backend_uri)
    cmd = [sys.executable, "-m", "mlflow", "server", "--artifacts-destination", str(artifacts), "--serve-artifacts"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--workers", str(workers), *auth]
    return cmd, {"MLFLOW_BACKEND_STORE_URI": address, **secret}


@contextmanager
def mlflow_server(
    backend_uri: str,
    folder: Path,
    timeout: float = 120.0,
    workers: int = 2,
    auth_admin_password: str | None = None,
    default_permission: str = "READ",
    port: int | None = None,
    auth_database_uri: str | None = None,
    env: dict[str, str] | None = None,
):
    """``mlflow server`` on ``backend_uri`` (e.g. a :func:`postgres` database), artifacts served from
    ``folder/artifacts``, by ``workers`` worker processes (each imports MLflow's server: seconds);
    yields a :class:`Server` once ``/health`` answers. ``auth_admin_password`` (12 characters at
    least): MLflow's basic-auth app, every request but ``/health`` authenticated, its admin
    :data:`AUTH_ADMIN` with that password, other users' rights on what they did not create
    ``default_permission``, its users in ``auth_database_uri`` (default: a sqlite file in ``folder``);
    raises :class:`Unavailable` where ``mlflow[auth]`` is missing. ``port``: that one (a server
    started again on the same store and address), else a free one. ``env``: set in the server's
    environment (``HOME`` holding the ``.pgpass`` that libpq reads its database password from)."""
    port = port or free_port()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    artifacts = folder / "artifacts"
    log = folder / "mlflow-server.log"
    auth = [] if auth_admin_password is None else ["--app-name", "basic-auth"]
    # a client's credentials are not the server's business
    environ = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    if auth_admin_password is not None:
        environ.update(_auth_env(folder, auth_admin_password, default_permission, auth_database_uri))
    environ.update(env or {})
    # MLflow 3's job runner (seven huey_consumer processes, each importing MLflow: ~20 s of CPU and
    # 1.7 GB at every start) serves its GenAI jobs, which a tracking server for plnexp never runs
    environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    cmd, store_env = server_command(backend_uri, artifacts, port, workers, auth)
    environ.update(store_env)
    t0 = time.monotonic()
    proc = _spawn(cmd, log, env=environ)
    try:
        uri = f"http://127.0.0.1:{port}"
        try:
            _wait("mlflow server", lambda: _health(uri), timeout, [proc])
        except Unavailable as e:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise Unavailable(f"{e}{': ' + tail[0] if tail else ''}") from None
        admin = None if auth_admin_password is None else (AUTH_ADMIN, auth_admin_password)
        yield Server(uri, artifacts, time.monotonic() - t0, log, admin, proc.pid)
    finally:
        stop(proc)


def main() -> int:
    """Start a cluster, a database and a tracking server; print what to export; wait for Ctrl-C."""
    folder = Path(tempfile.mkdtemp(prefix="plnexp-daemons-"))
    try:
        with slurm_cluster() as cluster, postgres() as db, mlflow_server(db.uri, folder) as server:
            print(
                f"# SLURM up in {cluster.up_s:.1f} s, PostgreSQL in {db.up_s:.1f} s, MLflow server in "
                f"{server.up_s:.1f} s. In another shell:",
                flush=True,
            )
            print(f"export SLURM_CONF={cluster.conf}\nexport MLFLOW_TRACKING_URI={server.uri}", flush=True)
            print("# Ctrl-C stops them all", flush=True)
            signal.signal(signal.SIGTERM, signal.default_int_handler)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                print("# stopping", flush=True)
    except Unavailable as e:
        print(f"daemons: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


@contextmanager
def postgres_or_skip():
    """:func:`postgres` for a fixture: the test is skipped, saying why, without psycopg (plnexp's
    cluster extra) or where PostgreSQL cannot be started here."""
    import pytest

    pytest.importorskip("psycopg", reason="needs plnexp's cluster extra")
    try:
        with postgres() as db:
            yield db
    except Unavailable as e:
        pytest.skip(f"no PostgreSQL here: {e}")
