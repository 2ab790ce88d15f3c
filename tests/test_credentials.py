"""Credentials through the environment, masked at one boundary (plnexp.system.credentials): the
store URI's userinfo split off into the client's own variables, the secrets a process knows, the
filter on stdout, stderr and logging (tracebacks included), ``doctor`` and ``ui`` with a password
in MLFLOW_TRACKING_URI, and a traceback under HYDRA_FULL_ERROR=1. In-process where they can be; the
slow ones start ``python -m plnexp`` to read what it prints and its children's /proc/PID/cmdline.

End to end, a team's server as docs/how-to/tracking-server.md builds it (PostgreSQL 15 holding both
databases, its password in ~/.pgpass; ``mlflow server --app-name basic-auth`` with an admin
password; tests/daemons.py, on 127.0.0.1, stopped by PID): sweeps under the joblib and SLURM
launchers, each password counted in everything printed, every file written, every table and the
workers' /proc/PID/cmdline; and the MLflow UI's "User" column, in Chromium. They skip, saying why,
where a daemon, Chromium or the cluster extra is missing.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import io
import logging
import os
import re
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import scoped_environ

from plnexp.cli import doctor
from plnexp.system import credentials
from plnexp.system.credentials import Masker, MaskedStream, known_secrets, split_store_uri, split_uri
from plnexp.system.redact import MASK
from test_dashboard import CLOSE_ASSISTANT, chrome, wait_text  # noqa: F401 - chrome: headless Chromium, a fixture

try:  # selenium (the test extra) drives the browser; the chrome fixture skips saying so without it
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    pass

PASSWORD = "Pa5s-w0rd-91"
TINY = ("dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3", "repeats=1", "warmup=0", "time_budget_s=0")
VARS = (
    "MLFLOW_TRACKING_URI",
    "PGPASSWORD",
    "PGUSER",
    "PGPASSFILE",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
)


@pytest.fixture
def environ(monkeypatch, tmp_path):
    """os.environ without credentials (HOME an empty folder: no ~/.pgpass, no ~/.mlflow/credentials),
    every variable a command may set restored after the test."""
    for var in VARS:
        monkeypatch.setenv(var, "x")  # recorded: restored (or unset) after the test
        monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return os.environ


# ---------------------------------------------------------------- the split
@pytest.mark.parametrize(
    ("uri", "address", "env"),
    [
        (
            "https://alice:PASSWORD@localhost",
            "https://localhost",
            {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": "PASSWORD"},
        ),
        (
            "http://a%40b:p%2Fw@h:5000/x",  # percent-escapes decoded, as the client decodes them
            "http://h:5000/x",
            {"MLFLOW_TRACKING_USERNAME": "a@b", "MLFLOW_TRACKING_PASSWORD": "p/w"},
        ),
        ("http://alice@h", "http://h", {"MLFLOW_TRACKING_USERNAME": "alice"}),
        (
            "https://u:pa'ss wo\"rd@h/x",
            "https://h/x",
            {"MLFLOW_TRACKING_USERNAME": "u", "MLFLOW_TRACKING_PASSWORD": "pa'ss wo\"rd"},
        ),
        (
            "http://u:p@ss@h:5000/x",
            "http://h:5000/x",
            {"MLFLOW_TRACKING_USERNAME": "u", "MLFLOW_TRACKING_PASSWORD": "p@ss"},
        ),
        # PostgreSQL: the user stays (libpq has no other place for it in the URI), the password leaves
        ("postgresql://bars:s3c/r@127.0.0.1:5432/db", "postgresql://bars@127.0.0.1:5432/db", {"PGPASSWORD": "s3c/r"}),
        ("postgresql+psycopg://:pw@h/db", "postgresql+psycopg://h/db", {"PGPASSWORD": "pw"}),
        (
            "postgresql://u@h/db?sslmode=require&password=x",
            "postgresql://u@h/db?sslmode=require",
            {"PGPASSWORD": "x"},
        ),
        # nothing to split: no password, a redacted one (the store's check says so), no userinfo
        ("postgresql://u@h/db", "postgresql://u@h/db", {}),
        ("postgresql://u:***@h/db", "postgresql://u:***@h/db", {}),
        ("sqlite:////tmp/a:b@c.db", "sqlite:////tmp/a:b@c.db", {}),
        ("http://127.0.0.1:5000/a@b", "http://127.0.0.1:5000/a@b", {}),
        ("mysql://u:pw@h/db", "mysql://u:pw@h/db", {}),  # no variable of its client: left (and masked)
    ],
)
def test_split_uri_keeps_the_address_and_gives_the_credential_to_the_client(uri, address, env):
    assert split_uri(uri) == (address, env)
    assert split_uri(address) == (address, {})  # idempotent
    assert credentials.address(uri).count("@") <= address.count("@")


def test_split_store_uri_rewrites_the_environment():
    environ = {"MLFLOW_TRACKING_URI": f"postgresql://bars:{PASSWORD}@h/db", "PGPASSWORD": "older"}
    assert split_store_uri(environ) == {"PGPASSWORD": PASSWORD}
    assert environ == {"MLFLOW_TRACKING_URI": "postgresql://bars@h/db", "PGPASSWORD": PASSWORD}  # the URI's wins
    assert split_store_uri(environ) == {} and environ["PGPASSWORD"] == PASSWORD
    assert split_store_uri({}) == {}


def test_known_secrets_read_the_environment_and_the_password_files(tmp_path):
    home = tmp_path / "home"
    (home / ".mlflow").mkdir(parents=True)
    (home / ".mlflow" / "credentials").write_text(
        "[mlflow]\nmlflow_tracking_username = ann\nmlflow_tracking_password = fromfile1\n"
    )
    pgpass = tmp_path / "pgpass"
    pgpass.write_text("# a comment\nh:5432:db:u:pg\\:pass1\n*:*:*:*:short\n")
    environ = {
        "PGPASSWORD": "env-pass",
        "MLFLOW_TRACKING_TOKEN": "a token",
        "PGPASSFILE": str(pgpass),
        "MLFLOW_TRACKING_URI": "mysql://u:my%2Fpw@h/db",
        "XLA_FLAGS": "--not-a-secret",
        "PGPASSWORD_OLD": "abc",  # shorter than MIN_SECRET: left to the patterns
    }
    found = known_secrets(environ, home)
    assert {"env-pass", "a token", "a%20token", "pg:pass1", "fromfile1", "my%2Fpw", "my/pw", "short"} <= set(found)
    assert "--not-a-secret" not in found and "abc" not in found
    assert found == sorted(found, key=len, reverse=True)


# ---------------------------------------------------------------- the boundary
def test_masker_masks_known_values_and_patterns():
    mask = Masker(["hunter22"])
    assert mask("raised InvalidURL: nonnumeric port: 'hunter22@localhost'") == (
        "raised InvalidURL: nonnumeric port: '***@localhost'"
    )
    assert mask("a --password x and postgresql://u:pw@h/db") == "a --password *** and postgresql://u:***@h/db"


def test_the_boundary_masks_stdout_stderr_logging_and_tracebacks(environ, tmp_path, capsys):
    """Inside the block: print, a log line (a stream handler made before, and a file handler), a logged
    traceback and a stack, all masked, by the password's value alone too; after it, the streams and
    the log record factory as they were, and the environment split."""
    environ["MLFLOW_TRACKING_URI"] = f"https://alice:{PASSWORD}@localhost"
    logger = logging.getLogger("plnexp.test_credentials")
    logger.propagate = False
    log_file = tmp_path / "job.log"
    file_handler = logging.FileHandler(log_file)
    logger.addHandler(file_handler)
    streams, factory = (sys.stdout, sys.stderr), logging.getLogRecordFactory()
    try:
        with credentials.boundary() as mask:
            assert environ["MLFLOW_TRACKING_URI"] == "https://localhost"
            assert environ["MLFLOW_TRACKING_PASSWORD"] == PASSWORD and PASSWORD in mask.secrets
            assert isinstance(sys.stdout, MaskedStream) and credentials.installed()
            print(f"the reason: {PASSWORD} failed")
            print(f"nonnumeric port: '{PASSWORD}@localhost'", file=sys.stderr)
            logger.addHandler(stream := logging.StreamHandler(sys.stderr))
            logger.warning("store %s refused", PASSWORD)
            try:
                raise RuntimeError(f"cannot reach https://alice:{PASSWORD}@localhost")
            except RuntimeError:
                logger.exception("failed")
            logger.warning("where", stack_info=True, extra={"x": PASSWORD})
            logger.removeHandler(stream)
    finally:
        logger.removeHandler(file_handler)
        file_handler.close()
    assert (sys.stdout, sys.stderr) == streams and logging.getLogRecordFactory() is factory
    out, err = capsys.readouterr()
    written = log_file.read_text()
    assert (out + err + written).count(PASSWORD) == 0
    assert out == f"the reason: {MASK} failed\n"
    assert f"store {MASK} refused" in err and f"store {MASK} refused" in written
    assert "Traceback (most recent call last)" in written and f"https://alice:{MASK}@localhost" in written


def test_a_masked_stream_passes_on_what_is_not_a_write():
    raw = io.StringIO()
    stream = MaskedStream(raw, Masker(["hunter22"]))
    stream.writelines(["a hunter22\n", "b\n"])
    stream.flush()
    assert raw.getvalue() == f"a {MASK}\nb\n" and stream.getvalue() == raw.getvalue()
    assert not stream.isatty()


def test_a_config_value_with_a_credential_is_found():
    assert credentials.secret_value({"a": {"password": "x", "b": ["postgresql://u:pw@h/d"]}}) == "a.password=x"
    assert credentials.secret_value({"a": [{"uri": "https://u:pw@h"}]}) == "a.0.uri=https://u:pw@h"
    assert credentials.secret_value({"a": {"password": MASK, "token": None, "b": ["postgresql://u:***@h/d"]}}) is None
    assert credentials.secret_argument(["n_iter=3", "tracking_uri=https://h", "+x.token=t0k"]) == "+x.token=t0k"


# ---------------------------------------------------------------- doctor and ui
@pytest.mark.parametrize(
    "uri",
    [
        f"https://alice:{PASSWORD}@localhost",  # the issue's: urllib was handed the userinfo
        f"https://alice:{PASSWORD}@127.0.0.1:1",
        f"https://alice:{PASSWORD}@localhost:notaport",  # a URI urllib cannot parse
        f"https://alice:{PASSWORD}'x y@127.0.0.1:1",  # a quote and a space in the password
    ],
)
def test_doctor_with_a_password_in_mlflow_tracking_uri_prints_none(environ, plnexp_main, monkeypatch, uri):
    monkeypatch.setattr(doctor, "CHECKS", (doctor.store,))
    environ["MLFLOW_TRACKING_URI"] = uri
    ran = plnexp_main("doctor")
    assert ran.returncode == 1, ran.stdout  # the store cannot be reached: FAIL
    assert "store_reachable" in ran.stdout
    assert (ran.stdout + ran.stderr).count(PASSWORD) == 0, ran.stdout
    ran = plnexp_main("doctor", "--json")
    assert (ran.stdout + ran.stderr).count(PASSWORD) == 0, ran.stdout


def test_doctor_store_given_a_password_in_python_shows_none(environ):
    found = doctor.store(f"https://alice:{PASSWORD}@localhost:notaport", timeout=1)
    assert found and all(PASSWORD not in c.detail for c in found), found
    assert "MLFLOW_TRACKING_PASSWORD" not in os.environ  # given to the client for the checks only


def test_ui_gives_mlflow_the_store_through_its_environment(environ, outputs, monkeypatch, capsys):
    """mlflow ui's argv holds neither the store nor its password: MLFLOW_BACKEND_STORE_URI holds the
    address, PGPASSWORD the password (libpq reads it)."""
    from plnexp.__main__ import main

    from daemons import free_port

    started = []
    real = subprocess.Popen

    def record(cmd, **kwargs):
        started.append((cmd, kwargs.get("env")))
        return real([sys.executable, "-c", "pass"])

    monkeypatch.setattr(subprocess, "Popen", record)
    environ["MLFLOW_TRACKING_URI"] = f"postgresql://bars:{PASSWORD}@127.0.0.1:1/db"
    assert main(["ui", "--port", str(free_port())]) == 0
    ((cmd, env),) = started
    assert cmd[1:4] == ["-m", "mlflow", "ui"] and not any("postgresql" in a or PASSWORD in a for a in cmd)
    assert env["MLFLOW_BACKEND_STORE_URI"] == "postgresql://bars@127.0.0.1:1/db" and env["PGPASSWORD"] == PASSWORD
    assert env["MLFLOW_ARTIFACTS_DESTINATION"] == (outputs / "mlartifacts").as_uri()
    assert capsys.readouterr().out.count(PASSWORD) == 0


def _descendants(pid: int) -> list[int]:
    """The processes under ``pid`` now (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _plnexp(*args: str, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "plnexp", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_no_process_plnexp_ui_starts_has_the_password_in_its_cmdline(outputs, tmp_path):
    """``plnexp ui`` with the password in MLFLOW_TRACKING_URI: /proc/PID/cmdline of plnexp and of every
    process under it, read while they run, holds no password (mlflow ui seen among them); nor does
    what they print."""
    from daemons import free_port

    env = {k: v for k, v in os.environ.items() if k not in VARS}
    env["MLFLOW_TRACKING_URI"] = f"postgresql://bars:{PASSWORD}@127.0.0.1:1/db"  # no server: mlflow ui fails
    proc = _plnexp("ui", "--port", str(free_port()), env=env, cwd=tmp_path)
    cmdlines: dict[int, bytes] = {}
    deadline, seen = time.monotonic() + 150, None
    while proc.poll() is None and time.monotonic() < min(deadline, (seen or deadline) + 3):
        for pid in [proc.pid, *_descendants(proc.pid)]:
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                cmdlines[pid] = cmdline or cmdlines.get(pid, b"")  # (empty: a zombie's)
                if seen is None and b"mlflow\0ui" in cmdline:
                    seen = time.monotonic()  # a few more reads, then stopped
        time.sleep(0.05)
    if proc.poll() is None:
        proc.terminate()
    out, err = proc.communicate(timeout=30)
    assert any(b"mlflow\0ui" in c for c in cmdlines.values()), (cmdlines, proc.returncode, out, err)
    assert sum(c.count(PASSWORD.encode()) for c in cmdlines.values()) == 0, cmdlines
    assert (out + err).count(PASSWORD) == 0, out + err


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("given", ["override", "environment"])
def test_a_full_traceback_never_shows_the_password(outputs, tmp_path, given):
    """``HYDRA_FULL_ERROR=1``, which every error line advertises: the traceback is printed, and the
    password is nowhere in it: refused in an override, or a store that cannot be reached given in
    MLFLOW_TRACKING_URI."""
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    env["HYDRA_FULL_ERROR"] = "1"
    uri = f"https://alice:{PASSWORD}@127.0.0.1:1"
    args = ["run", *TINY]
    if given == "override":
        args.append(f"tracking_uri={uri}")
    else:
        env["MLFLOW_TRACKING_URI"] = uri
    proc = _plnexp(*args, env=env, cwd=tmp_path)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err
    assert (
        "Traceback (most recent call last)" in err and ("ConfigError" if given == "override" else "StoreError") in err
    )
    assert (out + err).count(PASSWORD) == 0, err
    assert not list(outputs.glob("runs/*"))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_installed_process_masks_its_last_traceback(tmp_path):
    """A process role's start (:func:`credentials.install`): the interpreter's own traceback of an
    uncaught error, written after everything else, is masked by value and by pattern."""
    code = (
        "from plnexp.system import credentials\n"
        "credentials.install()\n"
        "import os\n"
        "raise RuntimeError('reason: ' + os.environ['MLFLOW_TRACKING_PASSWORD'] + ' --password abc123')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    env["MLFLOW_TRACKING_URI"] = f"https://alice:{PASSWORD}@h"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 1 and "RuntimeError: reason: *** --password ***" in proc.stderr, proc.stderr
    assert proc.stderr.count(PASSWORD) == 0 and "abc123" not in proc.stderr


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_doctor_names_a_missing_postgres_database_and_prints_no_password(environ, plnexp_main, monkeypatch):
    """A real PostgreSQL 15 (tests/daemons.py): the password in MLFLOW_TRACKING_URI, in PGPASSWORD or in
    a password file; doctor connects, or names the missing database in one line; never the password."""
    import daemons

    pytest.importorskip("psycopg", reason="plnexp's cluster extra is not installed")
    monkeypatch.setattr(doctor, "CHECKS", (doctor.store,))
    try:
        with daemons.postgres(user="doc", name="mlflow") as db:
            from urllib.parse import urlsplit

            parts = urlsplit(db.uri)
            address = f"postgresql://doc@127.0.0.1:{parts.port}"
            pgpass = Path(os.environ["HOME"]) / ".pgpass"
            pgpass.write_text(f"127.0.0.1:{parts.port}:*:doc:{parts.password}\n")
            pgpass.chmod(0o600)
            for given in ({"MLFLOW_TRACKING_URI": db.uri}, {"PGPASSWORD": parts.password}, {}):
                for var in VARS:
                    monkeypatch.delenv(var, raising=False)
                for k, v in {"MLFLOW_TRACKING_URI": f"{address}/mlflow", **given}.items():
                    monkeypatch.setenv(k, v)
                ran = plnexp_main("doctor")
                assert ran.returncode == 0 and f"{address}/mlflow: connected to the database" in ran.stdout, ran
                assert (ran.stdout + ran.stderr).count(parts.password) == 0
            monkeypatch.setenv("MLFLOW_TRACKING_URI", f"{address}/mlflow_auth")
            ran = plnexp_main("doctor")
            (line,) = [x for x in ran.stdout.splitlines() if x.startswith("FAIL")]
            assert ran.returncode == 1 and line.startswith("FAIL") and "PostgreSQL database missing" in line, line
            assert "has no database mlflow_auth: create it or fix the URI" in line
            assert (ran.stdout + ran.stderr).count(parts.password) == 0
    except daemons.Unavailable as e:
        pytest.skip(f"no PostgreSQL here: {e}")


def test_runs_carry_who_ran_them_the_mlflow_user_else_the_os_user(monkeypatch, tmp_path):
    """``mlflow.user`` (the UI's "User" column): the user the client authenticates as, else the OS's."""
    import getpass

    from plnexp.store import writes

    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.mlflow/credentials of the machine's
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    assert writes.process_tags()["mlflow.user"] == getpass.getuser()
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    assert writes.process_tags()["mlflow.user"] == "alice"


# ---------------------------------------------------------------- a team's server, end to end
# docs/how-to/tracking-server.md's recipe, for real: PostgreSQL 15 (tests/daemons.py) holding both
# databases (the runs, ``mlflow``; users and permissions, ``mlflow_auth``), its password in the
# server's ~/.pgpass only; ``mlflow server --app-name basic-auth`` on them with an admin password;
# accounts the admin created. Sweeps under the joblib and SLURM launchers log into it, the account's
# password given in MLFLOW_TRACKING_URI; then each password (the database's, the admin's, the
# accounts') is counted everywhere it could have gone.
TEAM_DB_USER = "team"
ADMIN_PASSWORD = "adm-" + secrets.token_hex(8)  # 20 characters: the basic-auth app wants 12 at least
ACCOUNTS = {"alice": "ali-" + secrets.token_hex(8), "bob": "bob-" + secrets.token_hex(8)}
SWEEP = (
    "sweep",
    *TINY,
    "dataset.optimum=false",  # no convergence metrics: each worker would fit the data's optimum first
    "strategy=scan",  # one job: one worker (a loky worker, a SLURM task) gets the credential as any other would
    "n_iter=5",
    "dataset.replication=1",
    "report.rounds=0",
    "report.control=false",
)
STRATEGY_OF = {"alice": "scan", "bob": "fori_loop"}  # their runs' names differ
LAUNCHERS = {
    "joblib": ("hydra/launcher=joblib", "hydra.launcher.n_jobs=2"),
    "slurm": ("hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=1"),
}


@dataclass(frozen=True)
class Team:
    """The team's server and what only its host knows."""

    server: Any  # daemons.Server: uri, admin, log, pid
    database: str  # postgresql://team:PASSWORD@127.0.0.1:PORT (no database named): for the counts only
    database_password: str
    folder: Path  # the server's files: its log, the artifacts it serves, its ~/.pgpass

    def passwords(self) -> dict[str, str]:
        return {"database": self.database_password, "admin": ADMIN_PASSWORD, **ACCOUNTS}


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """The recipe's server, once for the module: ``createdb`` of the second database and the server
    itself read the database password from ``~/.pgpass`` (the server's HOME), never from a URI; the
    admin creates alice and bob through the REST API (test_auth's helper, the docs' curl)."""
    import daemons
    from test_auth import _create_user

    pytest.importorskip("psycopg", reason="plnexp's cluster extra is not installed: pip install -e '.[cluster]'")
    folder = tmp_path_factory.mktemp("team")
    home = folder / "home"
    home.mkdir()
    try:
        with daemons.postgres(user=TEAM_DB_USER, name="mlflow") as db:
            from urllib.parse import urlsplit

            parts = urlsplit(db.uri)
            pgpass = home / ".pgpass"
            pgpass.write_text(f"127.0.0.1:{parts.port}:*:{TEAM_DB_USER}:{parts.password}\n")
            pgpass.chmod(0o600)  # libpq ignores a password file that others may read
            address = f"postgresql://{TEAM_DB_USER}@127.0.0.1:{parts.port}"
            env = {k: v for k, v in os.environ.items() if k not in VARS} | {"HOME": str(home)}
            made = subprocess.run(
                ["createdb", "-h", "127.0.0.1", "-p", str(parts.port), "-U", TEAM_DB_USER, "mlflow_auth"],
                env=env,
                capture_output=True,
                text=True,
            )
            assert made.returncode == 0, made.stderr  # libpq found the password in ~/.pgpass
            with daemons.mlflow_server(
                f"{address}/mlflow",
                folder / "server",
                workers=1,
                auth_admin_password=ADMIN_PASSWORD,
                default_permission="EDIT",  # the recipe's: the team logs into shared experiments
                auth_database_uri=f"{address}/mlflow_auth",
                env={"HOME": str(home)},
            ) as server:
                assert server.admin is not None
                for name, password in ACCOUNTS.items():
                    _create_user(server.uri, server.admin, name, password)
                yield Team(
                    server,
                    f"postgresql://{TEAM_DB_USER}:{parts.password}@127.0.0.1:{parts.port}",
                    parts.password,
                    folder,
                )
    except daemons.Unavailable as e:
        pytest.skip(f"no PostgreSQL-backed basic-auth MLflow server here: {e}")


@pytest.fixture(scope="module")
def slurm():
    """A single-node SLURM cluster (tests/daemons.py), once for the module."""
    import daemons

    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="plnexp's cluster extra is not installed")
    try:
        with daemons.slurm_cluster(kill_wait=10) as cluster:
            yield cluster
    except daemons.Unavailable as e:
        pytest.skip(f"no SLURM cluster here: {e}")


def _database_text(uri: str) -> str:
    """Every row of every table of the database at ``uri``, as text: what the server wrote, read past it."""
    import psycopg

    with psycopg.connect(uri) as conn:
        tables = [
            t for (t,) in conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema='public'")
        ]
        assert tables, uri
        return "\n".join(str(row) for t in tables for row in conn.execute(f'SELECT * FROM "{t}"'))


def _files_holding(root: Path, secret: str) -> dict[str, int]:
    """Occurrences of ``secret`` in every file under ``root`` (bytes; links not followed), by path."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            if not path.is_symlink():
                n = path.read_bytes().count(secret.encode())
                if n:
                    found[str(path.relative_to(root))] = n
    return found


@dataclass
class Seen:
    """What the processes of one command showed while they ran: each one's last non-empty cmdline and
    last environment read (/proc/PID/environ: what it was started with), by pid."""

    cmdlines: dict[int, bytes]
    environs: dict[int, dict[bytes, bytes]]
    started: dict[int, bytes]  # /proc/PID/stat's start time: a pid taken again is another process
    every_cmdline: set[bytes]  # every cmdline read, of every process (one before and after its exec)


def _watch(proc: subprocess.Popen, marker: str, timeout: float) -> Seen:
    """Sample /proc until ``proc`` ends: every process whose environment holds ``marker`` (the test's
    own outputs folder, which every process of the command inherits: ``proc``, joblib's workers,
    ``sbatch`` and the SLURM tasks that slurmd starts, which are not ``proc``'s descendants)."""
    seen = Seen({}, {}, {}, set())
    needle = marker.encode()
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, f"the command still runs after {timeout:.0f} s"
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                environ = (entry / "environ").read_bytes()
                if needle not in environ:
                    continue
                cmdline = (entry / "cmdline").read_bytes()
                started = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[19]
            except (OSError, IndexError):  # gone meanwhile
                continue
            if seen.started.get(pid, started) != started:  # the pid of an ended process, taken again
                seen.cmdlines.pop(pid, None)
            seen.started[pid] = started
            # the latest: between fork and exec, a child shows its parent's (the driver's first one)
            seen.environs[pid] = dict(v.partition(b"=")[::2] for v in environ.split(b"\0") if v)
            if cmdline:  # (empty: a zombie's)
                seen.cmdlines[pid] = cmdline
                seen.every_cmdline.add(cmdline)
        time.sleep(0.05)
    return seen


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.xdist_group("cluster")
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("launcher", "user", "way"),
    [
        ("joblib", "admin", "uri"),
        ("slurm", "alice", "uri"),
        ("slurm", "bob", "credentials_file"),
        ("joblib", "alice", "env_vars"),  # MLFLOW_TRACKING_USERNAME / _PASSWORD given as they are
        ("joblib", "db", "pgpassword"),  # the PostgreSQL store itself, its password in PGPASSWORD
        ("slurm", "db", "pgpass"),  # ... or in ~/.pgpass
    ],
)
def test_a_sweep_under_joblib_and_slurm_into_the_team_server_leaks_no_password(
    team, tmp_path, request, launcher, user, way
):
    """A one-job sweep (``python -m plnexp sweep hydra/launcher=...``) into the recipe's server, the
    account's password in MLFLOW_TRACKING_URI's userinfo (HYDRA_FULL_ERROR=1 set) or in
    ~/.mlflow/credentials: every run
    FINISHED, carrying its MLflow user (the UI's "User" column); then each password (the database's,
    the admin's, alice's, bob's) counted: 0 in what the command printed, in every file under its
    folder (the outputs: the sweep's folder, ``.submitit/``, reports; the working folder), in every
    table of both databases, in every file of the server (its log, the artifacts it stores) and in
    /proc/PID/cmdline of every process of the command, sampled while it ran (the driver, ``sbatch``,
    joblib's workers, the SLURM tasks). From the URI, the workers get the credential through their
    environment (MLFLOW_TRACKING_PASSWORD; the URI an address), so SLURM keeps it where it keeps each
    job's environment (its state folder) and nowhere else of its own (the job's script included);
    from the credentials file, nowhere (what docs/how-to/tracking-server.md says of it)."""
    password = {"admin": ADMIN_PASSWORD, "db": team.database_password, **ACCOUNTS}[user]
    work, home = tmp_path / "work", tmp_path / "home"
    outputs = work / "outputs"
    outputs.mkdir(parents=True)
    home.mkdir()  # no ~/.pgpass; ~/.mlflow/credentials only where it is the way
    experiment = f"team-{launcher}-{way}"
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    env |= {"PLNEXP_OUTPUTS": str(outputs), "HOME": str(home), "MLFLOW_TRACKING_URI": team.server.uri}
    store = team.server.uri  # where the runs go, as every worker reaches it (no credential in it)
    if way in ("pgpassword", "pgpass"):  # the database straight, as libpq's users give its password
        store = team.database.replace(f":{team.database_password}@", "@") + "/mlflow"
        env["MLFLOW_TRACKING_URI"] = store
    if way == "uri":  # and with every traceback shown in full, as each error line advertises
        env["HYDRA_FULL_ERROR"] = "1"
        env["MLFLOW_TRACKING_URI"] = team.server.uri.replace("http://", f"http://{user}:{password}@")
    elif way == "env_vars":
        env |= {"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password}
    elif way == "pgpassword":
        env["PGPASSWORD"] = password
    elif way == "pgpass":
        parts = urlsplit(store)
        (home / ".pgpass").write_text(f"{parts.hostname}:{parts.port}:*:{parts.username}:{password}\n")
        (home / ".pgpass").chmod(0o600)
    else:
        (home / ".mlflow").mkdir()
        filed = home / ".mlflow" / "credentials"
        filed.write_text(f"[mlflow]\nmlflow_tracking_username = {user}\nmlflow_tracking_password = {password}\n")
        filed.chmod(0o600)
    if launcher == "slurm":
        env |= request.getfixturevalue("slurm").env
    from conftest import spawn

    t0 = time.monotonic()
    with (work / "stdout").open("w") as out, (work / "stderr").open("w") as err:
        proc = spawn(
            [sys.executable, "-m", "plnexp", *SWEEP, *LAUNCHERS[launcher], f"experiment={experiment}"],
            env=env,
            cwd=work,
            stdout=out,
            stderr=err,
        )
        seen = _watch(proc, str(outputs), timeout=500)
    took = time.monotonic() - t0
    printed = (work / "stdout").read_text() + (work / "stderr").read_text()
    assert proc.returncode == 0, printed[-3000:]

    # the sweep logged, as its user, through workers that got the credential as it was given
    from mlflow import MlflowClient

    with _env(MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD=ADMIN_PASSWORD):
        cl = MlflowClient(team.server.uri)
        runs = cl.search_runs([cl.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}, runs  # the parent and its job
    # an MLflow account's name; the OS user's where the store is the database itself
    assert {r.data.tags["mlflow.user"] for r in runs} == {getpass.getuser() if user == "db" else user}
    jobs = {r.data.tags["plnexp.pid"] for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert str(proc.pid) not in jobs, "the jobs ran in worker processes"
    workers = {pid: seen.environs.get(pid) for pid in map(int, jobs)}
    assert all(workers.values()), f"a worker not seen while it ran: {sorted(workers)} vs {sorted(seen.environs)}"
    for pid, environ in workers.items():  # how the worker's client got the credential
        assert environ[b"MLFLOW_TRACKING_URI"] == store.encode(), (pid, seen.cmdlines.get(pid))
        given = (environ.get(b"MLFLOW_TRACKING_USERNAME"), environ.get(b"MLFLOW_TRACKING_PASSWORD"))
        as_account = way in ("uri", "env_vars")
        assert given == ((user.encode(), password.encode()) if as_account else (None, None)), pid
        assert environ.get(b"PGPASSWORD") == (password.encode() if way == "pgpassword" else None), pid
    roles = b"submitit" if launcher == "slurm" else b"loky"
    assert any(roles in c for c in seen.cmdlines.values()), seen.cmdlines
    if launcher == "slurm":
        assert list(outputs.rglob(".submitit/*")), "submitit's files are under the outputs folder: counted"
        # SLURM itself keeps it where it keeps every job's environment, and nowhere else (its job script
        # included): docs/how-to/tracking-server.md says so, and how a credentials file avoids it
        kept = _files_holding(request.getfixturevalue("slurm").conf.parent, password)
        if way in ("uri", "env_vars", "pgpassword"):  # in the environment the job was submitted with
            assert kept and all(re.fullmatch(r"state/hash\.\d/job\.\d+/environment", f) for f in kept), kept
        else:
            assert kept == {}

    counts = {}
    databases = _database_text(f"{team.database}/mlflow") + _database_text(f"{team.database}/mlflow_auth")
    for name, secret in team.passwords().items():
        counts[name] = {
            "printed": printed.count(secret),
            "files": _files_holding(work, secret),
            "databases": databases.count(secret),
            "server": _files_holding(team.folder / "server", secret),
            "cmdlines": {
                cmdline[:80]: cmdline.count(secret.encode())
                for cmdline in seen.every_cmdline
                if secret.encode() in cmdline
            },
        }
    print(f"{launcher} sweep as {user} ({way}): {took:.1f} s, {len(seen.cmdlines)} processes seen; counts {counts}")
    assert counts == {
        name: {"printed": 0, "files": {}, "databases": 0, "server": {}, "cmdlines": {}} for name in counts
    }
    # what was searched holds what plnexp wrote: the address, the runs
    assert _files_holding(outputs, store), "the sweep's record holds the store's address"
    assert all(r.info.run_id in databases for r in runs)


def _env(**values: str):
    """``os.environ`` with :data:`VARS` unset and ``values`` set for the block, then as it was."""
    return scoped_environ(VARS, **values)


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.browser
@pytest.mark.xdist_group("cluster")  # the module's team server: one worker runs its tests
@pytest.mark.timeout(600)
def test_the_mlflow_ui_shows_who_ran_each_run_in_its_user_column(team, environ, plnexp_main, tmp_path, request):
    """alice and bob each run into one experiment of the team server (the password in
    MLFLOW_TRACKING_URI's userinfo); the server's own UI, opened in Chromium as alice (basic auth
    sent by the browser, as after its login prompt), shows each run's MLflow user in the runs
    table's "User" column: alice's run alice, bob's bob (not the OS user, here root)."""
    driver = request.getfixturevalue("chrome")  # test_dashboard's: skips, saying why, without Chromium
    for name, password in ACCOUNTS.items():
        for var in VARS:
            environ.pop(var, None)
        environ["MLFLOW_TRACKING_URI"] = team.server.uri.replace("http://", f"http://{name}:{password}@")
        done = plnexp_main("run", *TINY, "experiment=who-ran", f"strategy={STRATEGY_OF[name]}", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert (done.stdout + done.stderr).count(password) == 0
    with _env(MLFLOW_TRACKING_USERNAME="alice", MLFLOW_TRACKING_PASSWORD=ACCOUNTS["alice"]):
        from mlflow import MlflowClient

        cl = MlflowClient(team.server.uri)
        exp = cl.get_experiment_by_name("who-ran")
        found = cl.search_runs([exp.experiment_id])
    runs = {r.data.tags["mlflow.user"]: r for r in found}
    assert sorted(runs) == sorted(ACCOUNTS), [r.data.tags for r in found]
    # the browser as alice: her credentials sent with every request (what it does once she has
    # answered its login prompt); never on Chromium's command line
    token = base64.b64encode(f"alice:{ACCOUNTS['alice']}".encode()).decode()
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}})
    driver.get(f"{team.server.uri}/#/experiments/{exp.experiment_id}/runs")
    wait_text(driver, *(r.info.run_name for r in runs.values()), timeout=90)
    for close in driver.find_elements(By.CSS_SELECTOR, CLOSE_ASSISTANT):
        close.click()
    # "User" is one of the attributes the runs table hides by default: shown as a user does it
    driver.find_element(By.XPATH, "//button[normalize-space()='Columns']").click()
    picker = WebDriverWait(driver, 30).until(
        ec.element_to_be_clickable((By.XPATH, "//div[@role='dialog']//span[normalize-space()='User']"))
    )
    picker.click()
    driver.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
    header = WebDriverWait(driver, 30).until(
        ec.presence_of_element_located((By.XPATH, "//*[@role='columnheader'][normalize-space()='User']"))
    )
    column = header.get_attribute("col-id")
    shown = {}
    for user, run in runs.items():
        cell = WebDriverWait(driver, 30).until(
            ec.presence_of_element_located(
                (By.CSS_SELECTOR, f"[row-id='{run.info.run_id}'] [role=gridcell][col-id='{column}']")
            )
        )
        shown[user] = cell.text.strip()
    driver.save_screenshot(tmp_path / "user_column.png")
    assert shown == {"alice": "alice", "bob": "bob"}, shown
