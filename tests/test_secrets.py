"""No secret leaves the process (plnexp.system.redact, plnexp.system.credentials): the redaction rules
on their own; a credential in a command line or config refused in one line, nothing written; then
what plnexp writes and prints with the password given the ways it may be (``MLFLOW_TRACKING_URI``,
``~/.pgpass``, ``PGPASSWORD``): MLflow params, tags, notes and artifacts, every row of the store's
database, Hydra's saved configs, the sweep's record, reports, one-line errors. The end-to-end tests
run into a real PostgreSQL 15 store (tests/daemons.py, started by them on 127.0.0.1 and stopped by
PID) and skip, saying why, where it cannot run; the others need nothing.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections import namedtuple
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import scoped_environ
import yaml

import daemons
from plnexp.experiment import sweep_record
from plnexp import store as tracking
from plnexp.jobs.config import ConfigError
from plnexp.system.redact import is_redacted, redact, redact_text, secret_name, unredacted

TINY = ("dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3", "repeats=1", "warmup=0", "time_budget_s=0")


# ---------------------------------------------------------------- the rules
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # a URI's userinfo password; the user, host, port and database stay
        ("postgresql://bars:secret@127.0.0.1:55433/secdb", "postgresql://bars:***@127.0.0.1:55433/secdb"),
        ("postgresql+psycopg://u:p4ss@db-host/mlflow", "postgresql+psycopg://u:***@db-host/mlflow"),
        ("https://alice:hunter2@mlflow.example.org:443", "https://alice:***@mlflow.example.org:443"),
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),  # no user: only a password
        ("http://u:p@ss@h:5000/x", "http://u:***@h:5000/x"),  # an unencoded '@' in the password (urllib's reading)
        ("postgresql://u:p/ss@h/db", "postgresql://u:***@h/db"),  # an unencoded '/' (SQLAlchemy's reading)
        ("http://u:pw@h/db?next=a@b", "http://u:***@h/db?next=a@b"),  # an '@' after the host is not the password's
        # in a line: the override, the next override untouched; two URIs; quoted in YAML
        ("tracking_uri=postgresql://u:pw@h:1/d n_iter=3", "tracking_uri=postgresql://u:***@h:1/d n_iter=3"),
        ("a=mysql://x:1@h b=https://y:2@k", "a=mysql://x:***@h b=https://y:***@k"),
        ("tracking_uri: 'postgresql://u:pw@h/d'", "tracking_uri: 'postgresql://u:***@h/d'"),
        ("scan-tracking_uripostgresql://u:pw@h/d", "scan-tracking_uripostgresql://u:***@h/d"),  # a run name
        # as Hydra escapes a sweep job's overrides (':' and '=' behind a backslash, spaces too)
        (
            r"tracking_uri=postgresql\://bars\:pw@127.0.0.1\:5432/db",
            r"tracking_uri=postgresql\://bars\:***@127.0.0.1\:5432/db",
        ),
        (r"db.dsn=host\=h\ password\=s3\:t\ dbname\=x", r"db.dsn=host\=h\ password\=***\ dbname\=x"),
        # libpq: key/value DSN (quoted, spaces around '='), a URI's query string
        ("host=h port=5432 password=s3cr=t dbname=x", "host=h port=5432 password=*** dbname=x"),
        ("password='a b c' user=u", "password=*** user=u"),
        ("host=h password = x dbname=y", "host=h password = *** dbname=y"),
        (
            "postgresql://u@h/db?sslmode=require&password=x&application_name=y",
            "postgresql://u@h/db?sslmode=require&password=***&application_name=y",
        ),
        # variables and options whose name looks secret, any case
        ("PGPASSWORD=abc", "PGPASSWORD=***"),
        (
            "MLFLOW_TRACKING_TOKEN=t0k MLFLOW_TRACKING_USERNAME=ann",
            "MLFLOW_TRACKING_TOKEN=*** MLFLOW_TRACKING_USERNAME=ann",
        ),
        ("export AWS_SECRET_ACCESS_KEY=xyz", "export AWS_SECRET_ACCESS_KEY=***"),
        ("+db.Password=x", "+db.Password=***"),
        (
            "--client_secret=abc --xla_cpu_multi_thread_eigen=false",
            "--client_secret=*** --xla_cpu_multi_thread_eigen=false",
        ),
        # YAML lines (what --cfg job prints)
        ("db:\n  password: hunter2 two\n  host: h", "db:\n  password: ***\n  host: h"),
        ("- api_token: abc", "- api_token: ***"),
        # options and netrc; Azure's keys and a SAS signature; quotes in a password
        ("mysql -u u --password hunter2 db", "mysql -u u --password *** db"),
        ("--db-token 'a b' -v", "--db-token *** -v"),
        ("password x", "password ***"),
        ("machine h login u password s3c account a", "machine h login u password *** account a"),
        (
            "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=abc+/==;EndpointSuffix=x",
            "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=***",
        ),
        (
            "https://a.blob.core.windows.net/c?sv=2020&sig=ab%2Fc&se=1",
            "https://a.blob.core.windows.net/c?sv=2020&sig=***&se=1",
        ),
        ("https://alice:pa'ss\"w@h/x", "https://alice:***@h/x"),
        ("PGPASSWORD=pa'ss rest", "PGPASSWORD=*** rest"),
        ('password="it\'s" x', "password=*** x"),
    ],
)
def test_redact_text_masks_the_credential_only(text, expected):
    assert redact_text(text) == expected
    assert redact_text(expected) == expected  # idempotent: a redacted text comes back unchanged


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://u@h/db",  # a user, no password
        "http://127.0.0.1:5000",  # a port is not a password
        "http://host:5000/path",
        "sqlite:////tmp/out/mlflow.db",
        "file:///data/a:b@c",  # no authority
        "XLA_FLAGS=--xla_force_host_platform_device_count=2",
        "password authentication failed for user bars",  # prose: no value given
        "signal=3 design=4 --token -v",  # 'sig' only whole; an option followed by another option
    ],
)
def test_redact_text_leaves_what_holds_no_credential(text):
    assert redact_text(text) == text


def test_secret_names():
    for name in ("PGPASSWORD", "password", "MLFLOW_TRACKING_TOKEN", "client_secret", "db.Passwd", "SecretKey"):
        assert secret_name(name), name
    for name in ("tracking_uri", "XLA_FLAGS", "user", "n_iter", "pass", 3, None):
        assert not secret_name(name), name


def test_redact_walks_mappings_lists_and_tuples():
    Entry = namedtuple("Entry", "uri count")
    value = {
        "tracking_uri": "postgresql://u:pw@h/d",
        "db": {"Password": "x", "token": None, "SECRET": "", "port": 5432, "pin_TOKEN": 1234},
        "env": ["PATH=/bin", "PGPASSWORD=z"],
        "pair": ("a", "mysql://r:s@t/u"),
        "entry": Entry("https://a:b@c", 2),
        "lr": 0.01,
        "on": True,
    }
    assert redact(value) == {
        "tracking_uri": "postgresql://u:***@h/d",
        "db": {"Password": "***", "token": None, "SECRET": "", "port": 5432, "pin_TOKEN": "***"},
        "env": ["PATH=/bin", "PGPASSWORD=***"],
        "pair": ("a", "mysql://r:***@t/u"),
        "entry": Entry("https://a:***@c", 2),
        "lr": 0.01,
        "on": True,
    }
    assert value["db"]["Password"] == "x"  # pure: the argument is left as it was
    assert redact(None) is None and redact(7) == 7


def test_unredacted_finds_the_value_a_logged_one_stands_for():
    logged = "postgresql://u:***@h:5432/db"
    assert is_redacted(logged) and not is_redacted("postgresql://u:pw@h:5432/db") and not is_redacted(None)
    assert unredacted(logged, [None, "postgresql://u:pw@other:5432/db", "postgresql://u:pw@h:5432/db"]) == (
        "postgresql://u:pw@h:5432/db"
    )
    assert unredacted(logged, [logged, "", None]) is None  # a redacted candidate is never the answer
    assert unredacted("sqlite:////x.db", []) == "sqlite:////x.db"  # nothing redacted: itself


# ---------------------------------------------------------------- where plnexp applies them
def test_a_store_error_never_holds_the_password():
    e = tracking.StoreError("tracking_uri=postgresql://u:hunter2@h/db: connection refused")
    assert str(e) == "tracking_uri=postgresql://u:***@h/db: connection refused"


def test_a_redacted_store_uri_is_refused_in_one_line(plnexp_main, outputs, monkeypatch):
    ran = plnexp_main("run", *TINY, "tracking_uri=postgresql://u:***@127.0.0.1:1/db")
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.count("\n") == 1 and ran.stderr.startswith(
        "plnexp: store error: tracking_uri=postgresql://u:***@"
    )
    assert "allowed values are the store's full URI, given with tracking_uri= or MLFLOW_TRACKING_URI" in ran.stderr
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://u:***@127.0.0.1:1/db")
    ran = plnexp_main("rerun", "0" * 32)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.startswith(
        "plnexp: store error: MLFLOW_TRACKING_URI=postgresql://u:***@127.0.0.1:1/db: holds ***"
    )
    assert not list(outputs.glob("runs/*")), "nothing may run"


WAYS = (
    "give it through PGPASSWORD or ~/.pgpass (a PostgreSQL store), MLFLOW_TRACKING_USERNAME and "
    "MLFLOW_TRACKING_PASSWORD or ~/.mlflow/credentials (a tracking server), or user:password@ in the "
    "MLFLOW_TRACKING_URI environment variable"
)


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (("run", *TINY, "tracking_uri=postgresql://u:hunter2@h:5432/db"), "tracking_uri=postgresql://u:***@h:5432/db"),
        (("run", "--cfg", "job", "+db.password=hunter2"), "+db.password=***"),
        (("sweep", *TINY, "seed=0,1", "tracking_uri=https://alice:hunter2@h"), "tracking_uri=https://alice:***@h"),
        (("run", *TINY, "+hydra.job.env_set.PLNEXP_TEST_TOKEN=hunter2"), "+hydra.job.env_set.PLNEXP_TEST_TOKEN=***"),
        (("rerun", "0" * 32, "tracking_uri=postgresql://u:hunter2@h/db"), "tracking_uri=postgresql://u:***@h/db"),
        (("sync", "tracking_uri=https://u:hunter2@h"), "tracking_uri=https://u:***@h"),
        (("ui", "--backend-store-uri", "postgresql://u:hunter2@h/db"), "postgresql://u:***@h/db"),
    ],
)
def test_a_credential_on_the_command_line_is_refused_in_one_line(plnexp_main, outputs, args, shown):
    """Any command, any override (a store's URI, a secret-named key, Hydra's env_set): exit 2, one
    line naming the argument masked and the ways to give a credential, nothing printed on stdout,
    nothing written under the outputs folder, no run."""
    before = sorted(p.name for p in outputs.iterdir())
    ran = plnexp_main(*args)
    assert ran.returncode == 2, ran.stderr
    assert ran.stdout == ""
    assert ran.stderr == (
        f"plnexp: error: {shown} holds a credential, which a command line or config never does (plnexp "
        f"logs, saves and ships its settings, and every local user reads a command line); {WAYS}\n"
    )
    assert _count(outputs, "hunter2") == {}
    assert sorted(p.name for p in outputs.iterdir()) == before, "nothing written"
    assert tracking.client(tracking.tracking_uri()).search_experiments(filter_string="name != 'Default'") == []


def test_a_credential_in_a_config_file_is_refused_in_one_line(plnexp_main, outputs, tmp_path):
    """A config folder's file (``--config-dir``) whose value holds a password: refused as an override is."""
    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    (tmp_path / "conf" / "store").mkdir()
    (tmp_path / "conf" / "store" / "team.yaml").write_text(
        "# @package _global_\ntracking_uri: postgresql://u:hunter2@h:5432/db\n"
    )
    ran = plnexp_main("run", *TINY, "--config-dir", str(tmp_path / "conf"), "+store=team")
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr == (
        "plnexp: error: tracking_uri=postgresql://u:***@h:5432/db holds a credential, which a command line or "
        "config never does (plnexp logs, saves and ships its settings, and every local user reads a command "
        f"line); {WAYS}\n"
    )
    assert _count(outputs, "hunter2") == {} and not list(outputs.glob("runs/*"))


def _record(uri: str) -> sweep_record.SweepRecord:
    return sweep_record.SweepRecord(uri, "1", "a" * 32, "s", 2, "host", 1, 0.0, 0.0, ())


def test_the_sweep_record_holds_the_store_masked(tmp_path, monkeypatch):
    real = "postgresql://u:hunter2@h:5432/db"
    driver_record = _record(real)  # what open_sweep returns: the record the driver hands its own jobs
    sweep_record.write_record(tmp_path, driver_record)
    text = (tmp_path / sweep_record.RECORD_NAME).read_text()
    assert text.count("hunter2") == 0 and text.count("postgresql://u:***@h:5432/db") == 1
    record = sweep_record.read_record(tmp_path)
    assert record is not None and record.uri == "postgresql://u:***@h:5432/db"
    # a job finds the real URI: the driver's own, the job's tracking_uri, MLFLOW_TRACKING_URI
    assert sweep_record.store_of(driver_record, None) == real  # a job in the driver's process: the record it wrote
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ConfigError):  # the record read back, nothing else given: the password is nowhere
        sweep_record.store_of(record, None)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert sweep_record.store_of(record, real) == real
    monkeypatch.setenv("MLFLOW_TRACKING_URI", real)
    assert sweep_record.store_of(record, record.uri) == real  # the job's own (a rerun's) redacted: from the environment
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://u:hunter2@elsewhere:5432/db")
    with pytest.raises(
        ConfigError, match=r"^the sweep's store postgresql://u:\*\*\*@h:5432/db: .* MLFLOW_TRACKING_URI$"
    ):
        sweep_record.store_of(record, "postgresql://u:***@h:5432/db")


def _count(root: Path, secret: str) -> dict[str, int]:
    """Occurrences of ``secret`` in every file under ``root`` (bytes; links not followed), by path."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            if path.is_symlink():
                continue
            n = path.read_bytes().count(secret.encode())
            if n:
                found[str(path.relative_to(root))] = n
    return found


def test_a_token_in_the_environment_is_never_written(plnexp_main, outputs, monkeypatch):
    """A secret-named variable in the job's environment (where a credential belongs): the run logs,
    and the token is in no file under the outputs folder (the store's among them) and nowhere printed."""
    monkeypatch.setenv("PLNEXP_TEST_TOKEN", "tok-5ecret-42")
    ran = plnexp_main("run", *TINY, "experiment=secrets")
    assert ran.returncode == 0, ran.stderr
    assert (ran.stdout + ran.stderr).count("tok-5ecret-42") == 0
    assert _count(outputs, "tok-5ecret-42") == {}
    (run,) = tracking.client(tracking.tracking_uri()).search_runs(
        [tracking.open(tracking.tracking_uri()).find_experiment("secrets")]
    )
    assert run.info.status == "FINISHED"


# ---------------------------------------------------------------- into a real PostgreSQL store
@dataclass(frozen=True)
class Logged:
    """A run and a 2-job sweep logged into PostgreSQL, the password given the ways it may be: the run's
    in ``MLFLOW_TRACKING_URI`` (split off at start), the sweep's in a password file (``PGPASSFILE``,
    libpq's ``~/.pgpass``) with the store's address in ``tracking_uri``; after the same URI with the
    password in ``tracking_uri=`` was refused."""

    uri: str  # postgresql://bars:PASSWORD@127.0.0.1:PORT/secdb
    password: str
    address: str  # postgresql://bars@127.0.0.1:PORT/secdb: what plnexp logs
    outputs: Path
    printed: str  # stdout and stderr of the commands
    run_id: str
    parent_id: str


CREDENTIAL_VARS = (
    "MLFLOW_TRACKING_URI",
    "PGPASSWORD",
    "PGPASSFILE",
    "PGUSER",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
)


def _environ(**values: str):
    """``os.environ`` with :data:`CREDENTIAL_VARS` unset and ``values`` set for the block, then as it was."""
    return scoped_environ(CREDENTIAL_VARS, **values)


def _main(*args: str) -> tuple[int, str]:
    from plnexp.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def database():
    try:
        import psycopg  # noqa: F401 - MLflow's postgresql:// driver (SQLAlchemy 2: psycopg 3)
    except ImportError as e:
        pytest.skip(f"plnexp's cluster extra is not installed ({e}): pip install -e '.[cluster]'")
    try:
        with daemons.postgres(user="bars", name="secdb") as db:
            yield db
            _disconnect(db.uri)
    except daemons.Unavailable as e:
        pytest.skip(f"no PostgreSQL here: {e}")


def _disconnect(uri: str) -> None:
    """End the sessions of this process's MLflow clients (their pools keep them open), so that the
    server stops at once: its SIGTERM waits for every client to leave (15 s, then SIGKILL)."""
    import psycopg

    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid()")


@pytest.fixture(scope="module")
def logged(database, tmp_path_factory, compile_cache) -> Logged:
    out = tmp_path_factory.mktemp("secrets") / "outputs"
    out.mkdir()
    (out / "jax_cache").symlink_to(compile_cache, target_is_directory=True)
    parts = urlsplit(database.uri)
    assert parts.password and parts.port
    address = f"postgresql://bars@127.0.0.1:{parts.port}/secdb"
    pgpass = out.parent / "pgpass"
    pgpass.write_text(f"127.0.0.1:{parts.port}:secdb:bars:{parts.password}\n")
    pgpass.chmod(0o600)  # libpq ignores a password file that others may read
    with _environ(PLNEXP_OUTPUTS=str(out)):
        code, refused = _main("run", *TINY, "experiment=secret-refused", f"tracking_uri={database.uri}")
        assert code == 2 and refused.count("\n") == 1 and "PGPASSWORD or ~/.pgpass" in refused, refused
        assert sorted(p.name for p in out.iterdir()) == ["jax_cache"], "a refused command writes nothing"
        os.environ["MLFLOW_TRACKING_URI"] = database.uri
        code, ran = _main("run", *TINY, "experiment=secret-run")
        assert code == 0, ran
        # split at start: the address stays, the password goes to libpq's variable
        assert os.environ["MLFLOW_TRACKING_URI"] == address and os.environ["PGPASSWORD"] == parts.password
    with _environ(PLNEXP_OUTPUTS=str(out), PGPASSFILE=str(pgpass)):
        code, swept = _main(
            "sweep",
            *TINY,
            "dataset.replication=1",  # (sweep=default's x100 otherwise)
            "strategy=scan,fori_loop",
            "experiment=secret-sweep",
            f"tracking_uri={address}",
        )
        assert code == 0, swept
    cl = tracking.client(database.uri)
    assert cl.get_experiment_by_name("secret-refused") is None
    (run,) = cl.search_runs([cl.get_experiment_by_name("secret-run").experiment_id])
    sweep_runs = cl.search_runs([cl.get_experiment_by_name("secret-sweep").experiment_id])
    (parent,) = [r for r in sweep_runs if "mlflow.parentRunId" not in r.data.tags]
    return Logged(
        database.uri, parts.password, address, out, refused + ran + swept, run.info.run_id, parent.info.run_id
    )


def _store_text(uri: str) -> str:
    """Every row of every table of the store's database, as text: what MLflow wrote, read past MLflow."""
    import psycopg

    with psycopg.connect(uri) as conn:
        tables = [
            t for (t,) in conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema='public'")
        ]
        assert {"runs", "params", "tags", "experiments"} <= set(tables)
        return "\n".join(str(row) for t in tables for row in conn.execute(f'SELECT * FROM "{t}"'))


def _artifacts(cl, run_id: str, path: str = "") -> list[str]:
    """Every artifact file of a run, its text read back through MLflow."""
    texts = []
    for f in cl.list_artifacts(run_id, path):
        if f.is_dir:
            texts += _artifacts(cl, run_id, f.path)
        else:
            local = cl.download_artifacts(run_id, f.path)
            texts.append(Path(local).read_bytes().decode(errors="replace"))
    return texts


def _no_password_anywhere(logged: Logged) -> None:
    cl = tracking.client(logged.uri)
    exps = [e.experiment_id for e in cl.search_experiments()]
    runs = cl.search_runs(exps, max_results=1000)
    values = [v for r in runs for v in (*r.data.params.values(), *r.data.tags.values(), r.info.run_name)]
    artifacts = [t for r in runs for t in _artifacts(cl, r.info.run_id)]
    secret, store = logged.password, _store_text(logged.uri)
    assert sum(v.count(secret) for v in values) == 0
    assert sum(t.count(secret) for t in artifacts) == 0
    assert store.count(secret) == 0
    assert _count(logged.outputs, secret) == {}
    assert logged.printed.count(secret) == 0
    # what was searched holds the store's address: the searches above read where it is written
    assert sum(v.count(logged.address) for v in values) > 0 and store.count(logged.address) > 0
    assert sum(t.count(logged.address) for t in artifacts) > 0 and _count(logged.outputs, logged.address)


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.xdist_group("cluster")
@pytest.mark.timeout(600)
def test_run_and_sweep_into_postgres_never_write_the_password(logged):
    """The password (given in ``MLFLOW_TRACKING_URI``, then in a password file; refused in
    ``tracking_uri=``): zero occurrences in the store (every param, tag, note and artifact, and every
    row of its database), in every file under the outputs folder (the jobs' saved configs, the sweep's
    record, the report) and in what was printed; the store's address is logged, the password nowhere."""
    _no_password_anywhere(logged)
    cl = tracking.client(logged.uri)
    run = cl.get_run(logged.run_id)
    assert run.info.status == "FINISHED"
    assert "tracking_uri=" not in run.data.tags["command"]  # the store came from the environment
    config = yaml.safe_load(Path(cl.download_artifacts(logged.run_id, "config.yaml")).read_text())
    assert config["tracking_uri"] is None
    parent = cl.get_run(logged.parent_id)
    assert f"tracking_uri={logged.address}" in parent.data.tags["command"]
    children = [r for r in cl.search_runs([parent.info.experiment_id]) if r.info.run_id != logged.parent_id]
    assert len(children) == 2 and {r.data.params["tracking_uri"] for r in children} == {logged.address}
    # the jobs' saved configs and the sweep's record hold the address
    (sweep_dir,) = [
        d
        for d in logged.outputs.glob("multirun/*")
        if getattr(sweep_record.read_record(d), "parent_id", "") == logged.parent_id
    ]
    assert [yaml.safe_load(p.read_text())["tracking_uri"] for p in sorted(sweep_dir.glob("*/config.yaml"))] == [
        logged.address
    ] * 2
    assert f'"uri": "{logged.address}"' in (sweep_dir / sweep_record.RECORD_NAME).read_text()
    assert list(logged.outputs.glob("reports/secret-sweep/*/report.md")), "the sweep's report was written"


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.xdist_group("cluster")
@pytest.mark.timeout(600)
def test_rerun_takes_the_store_from_the_environment_or_the_command(logged):
    """A rerun of the run, the store given by MLFLOW_TRACKING_URI with its password: it reproduces, in
    the same store; a rerun of the sweep, the store's address given by tracking_uri= and the password
    by PGPASSWORD; still no password written anywhere."""
    with _environ(PLNEXP_OUTPUTS=str(logged.outputs), MLFLOW_TRACKING_URI=logged.uri):
        code, single = _main("rerun", logged.run_id)
        assert code == 0, single
        assert "rerun ok: run " in single
    with _environ(PLNEXP_OUTPUTS=str(logged.outputs), PGPASSWORD=logged.password):
        code, swept = _main("rerun", logged.parent_id, f"tracking_uri={logged.address}")
        assert code == 0, swept
        assert "rerun ok: 2 of 2 jobs reproduced" in swept
    cl = tracking.client(logged.uri)
    runs = [r for e in cl.search_experiments() for r in cl.search_runs([e.experiment_id], max_results=1000)]
    (again,) = [r for r in runs if r.data.tags.get("rerun_of") == logged.run_id]
    (parent,) = [r for r in runs if r.data.tags.get("rerun_of") == logged.parent_id]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert again.info.status == "FINISHED" and len(children) == 2
    assert {r.data.params["tracking_uri"] for r in (again, *children)} == {logged.address}
    _no_password_anywhere(replace(logged, printed=single + swept))


def test_the_test_tracking_server_gets_its_database_password_through_its_environment(tmp_path):
    """#62: tests/daemons.py's ``mlflow server`` (which the docs point users to) never has the
    PostgreSQL password on its command line (``ps -ef``): the address in MLFLOW_BACKEND_STORE_URI,
    the password in PGPASSWORD."""
    import daemons

    password = "s3cret-Pa55word"
    cmd, env = daemons.server_command(f"postgresql://plnexp:{password}@127.0.0.1:5433/mlflow", tmp_path, 5000, 1)
    assert not [a for a in cmd if password in a] and "--backend-store-uri" not in cmd
    assert env == {"MLFLOW_BACKEND_STORE_URI": "postgresql://plnexp@127.0.0.1:5433/mlflow", "PGPASSWORD": password}
