"""Shared fixtures and the suite's rules.

- Markers say what a test needs, and a test whose need is missing here skips saying why
  (:func:`pytest_collection_modifyitems`): ``slow``, ``multidevice`` (two JAX CPU devices),
  ``native`` (the scan_fused kernel built), ``browser`` (Chromium, chromedriver, selenium),
  ``cluster`` (root, SLURM, munge, PostgreSQL 15, the cluster extra).
- Signals as a terminal gives them (:func:`pytest_configure`), whoever started pytest.
- Every process a test starts through :func:`spawn` is ended by its pid when the test ends, pass
  or fail (:func:`reap`); the command line runs in this process (:func:`plnexp_main`) where a
  process is not the point.
- Stores: a migrated MLflow sqlite store made once per session, copied per test (``outputs``); one
  real sweep made once per session, copied per test (``swept``).
"""

from __future__ import annotations

import logging
import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
PLUGINS = TESTS / "plugins"  # the blocking strategy, as an installed plugin would be (plnexp_test_strategies.py)
sys.path.insert(0, str(TESTS))  # tests/reference_np.py: independent float64 numpy maths

# XLA's CPU code generation set for compile speed in the suite (and the processes it starts, which
# inherit XLA_FLAGS), :data:`TEST_XLA_FLAGS`; compiling is most of the suite's CPU:
# - LLVM at -O0: ~2.7x faster compiles (measured 2026-11-26, 32 fits of 4 strategies x 2 models x 2
#   precisions on oaks and simulated data: 13.8 s of backend compile against 37-44 s); the whole
#   suite took 484 s against 612-682 s;
# - XLA's classic elemental emitters for the fused kernels instead of its MLIR fusion emitters: on
#   top of -O0, another ~3x (measured 2026-11-26 with a jax.monitoring counter over 401 tests of the
#   15 compile-heaviest files: 225 s of backend compile in 1,867 programs against 70 s in 1,795, the
#   fit's own program 0.52 s against 0.15 s on average; the files' CPU 533 s against 372 s).
# XLA's HLO passes (fusion, layout: where jaxlib 0.10.2's miscompile lives, see plnexp.system.runtime) run
# as for users; what differs is how the fused kernels become machine code, so float rounding differs
# within the per-dtype tolerances. The users' own setting is covered by tests/test_users_xla.py, in
# a process without these flags, and by every fit's own check of its compiled ELBO against the
# float64 host reference. PLNEXP_TEST_XLA_OPT=default runs the whole suite at the users' setting; a
# flag of one of these names already in XLA_FLAGS is kept.
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
if os.environ.get("PLNEXP_TEST_XLA_OPT", "") != "default":
    _present = {f.split("=", 1)[0] for f in os.environ.get("XLA_FLAGS", "").split()}
    _added = [f for f in TEST_XLA_FLAGS if f.split("=", 1)[0] not in _present]
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *_added]).strip()

# The session's temporary folders (tmp_path, the stores, the caches, the daemons' data) on a tmpfs
# where the machine has one (/dev/shm): the suite's MLflow sqlite stores commit every write with an
# fsync, which on a disk waits for the device at each commit (and PostgreSQL's likewise); in memory
# it returns at once. The stores, their files and what the tests read back are the same. A temporary
# root chosen by the caller (PYTEST_DEBUG_TEMPROOT, or --basetemp) is kept.
_SHM = Path("/dev/shm")
if "PYTEST_DEBUG_TEMPROOT" not in os.environ and _SHM.is_dir() and os.access(_SHM, os.W_OK | os.X_OK):
    os.environ["PYTEST_DEBUG_TEMPROOT"] = str(_SHM)

import plnexp  # noqa: E402 - first of plnexp's imports (changes nothing in the process)

# the suite runs as plnexp's command line does: its process settings (XLA flags, LAPACK threads)
# applied before any test touches jax, and in every xdist worker (each imports this file first)
plnexp.runtime.configure()

# after plnexp's registry has loaded its plugins (imported here: ``import plnexp`` imports it lazily):
# the test process's registry holds the blocking strategy only inside the tests that ask for it
# (fixture ``blocking``)
import plnexp.strategies  # noqa: E402 - the registry, loaded before PLUGINS is on the path

sys.path.append(str(PLUGINS))


def pytest_configure(config):
    """A shell starts a background job (``cmd &``, ``nohup cmd &``) with SIGINT ignored, and an ignored
    signal stays ignored across fork and exec: the tests of Ctrl-C would then see nothing. The suite
    relies on the dispositions a terminal gives, so it sets them here, in pytest's process and each
    xdist worker's; the processes tests start inherit them (a Python handler becomes the default
    action across exec, which a child Python turns into KeyboardInterrupt again)."""
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _missing_needs() -> dict[str, str | None]:
    """marker -> why its tests cannot run here (None: they can)."""
    from browser import find as find_browser

    import daemons
    from plnexp.strategies import fused

    needs: dict[str, str | None] = {}
    try:
        fused.check("scan_fused")
        needs["native"] = None
    except ValueError as e:
        needs["native"] = str(e)
    try:
        import selenium  # noqa: F401 - is the test extra's browser driver installed?

        needs["browser"] = None if find_browser() else "Debian's chromium and chromium-driver are not installed"
    except ImportError:
        needs["browser"] = "selenium is not installed: pip install -e '.[test]'"
    try:
        import hydra_plugins.hydra_submitit_launcher  # noqa: F401 - is the cluster extra installed?
        import psycopg  # noqa: F401 - is the cluster extra installed?

        needs["cluster"] = daemons.missing()
    except ImportError as e:
        needs["cluster"] = f"plnexp's cluster extra is not installed ({e}): pip install -e '.[cluster]'"
    return needs


def _longest_first(item) -> int:
    """The order tests are handed to xdist's workers: the long chains that one worker runs (every
    ``xdist_group``: cluster, browser, torch_compile) first, then the single tests that say they
    run for minutes (a ``timeout`` marker above pytest's configured default: test_users_xla's
    process, test_store_outage's sweeps; alone, no module fixture to share), the rest in file order
    (a module's tests together, for its fixtures), where they fill the gaps: a chain or a test of
    minutes started last would keep one core busy while the other idles."""
    if item.get_closest_marker("xdist_group"):
        return 0
    mark = item.get_closest_marker("timeout")
    default = float(item.config.getini("timeout") or 0)
    return 1 if mark is not None and mark.args and float(mark.args[0]) > default > 0 else 2


def pytest_collection_modifyitems(config, items):
    """Each marked test skips, saying why, where what its marker names is missing. ``multidevice``:
    two JAX CPU devices, which must be asked for before JAX starts: ``.ci/run`` runs the whole suite
    with ``JAX_NUM_CPU_DEVICES=2``; a plain ``python -m pytest`` (one device) skips them saying so."""
    items.sort(key=_longest_first)
    marked = {m: [i for i in items if i.get_closest_marker(m)] for m in ("native", "browser", "cluster", "multidevice")}
    if not any(marked.values()):
        return
    needs = _missing_needs() if any(marked[m] for m in ("native", "browser", "cluster")) else {}
    if marked["multidevice"]:
        import jax

        n = len(jax.devices("cpu"))
        needs["multidevice"] = (
            None
            if n >= 2
            else f"{n} JAX CPU device here; run them with JAX_NUM_CPU_DEVICES=2 python -m pytest -m multidevice"
        )
    for marker, tests in marked.items():
        if needs.get(marker):
            skip = pytest.mark.skip(reason=f"{marker}: {needs[marker]}")
            for item in tests:
                item.add_marker(skip)


# ---------------------------------------------------------------- processes
_started: list[subprocess.Popen] = []
_leaders: set[int] = set()  # the pids of those started in a session of their own


def spawn(cmd, *, env=None, new_session: bool = True, by_test: bool = True, **kw) -> subprocess.Popen:
    """``subprocess.Popen(cmd)`` in a session of its own (so that its children can be ended with it),
    ended by :func:`reap` when the test ends whatever happened. ``env``: the test's environment
    (``os.environ`` as the test set it) by default. ``by_test=False``: for a fixture of a wider scope,
    which ends it itself (:func:`end`, in a ``finally``)."""
    proc = subprocess.Popen(cmd, env=dict(os.environ) if env is None else env, start_new_session=new_session, **kw)
    if new_session:
        _leaders.add(proc.pid)
    if by_test:
        _started.append(proc)
    return proc


def end(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """End ``proc`` and, where it leads a session of its own (:func:`spawn`'s default), its whole process
    group: SIGTERM, then SIGKILL. The group is signalled only while it exists: Linux does not reuse
    a pid that is still some live process's group id, so the signal cannot reach a stranger."""
    group = proc.pid in _leaders
    if proc.poll() is None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(grace_s)
                break
            except subprocess.TimeoutExpired:
                continue
    if group:  # what it started and left behind in its group (joblib's workers)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _leaders.discard(proc.pid)
    for stream in (proc.stdout, proc.stderr, proc.stdin):
        if stream is not None:
            stream.close()


@pytest.fixture(autouse=True)
def reap():
    """Every process the test started with :func:`spawn` is ended by its pid, pass or fail."""
    n = len(_started)
    yield
    while len(_started) > n:
        end(_started.pop())


def plugin_env(**extra: str) -> dict[str, str]:
    """The test's environment with the test plugins (the ``blocking`` strategy) importable, for a process."""
    path = os.pathsep.join(p for p in (str(PLUGINS), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


@pytest.fixture
def release(tmp_path, monkeypatch) -> Path:
    """The file whose creation releases a ``blocking`` job (``$PLNEXP_TEST_RELEASE``, for this process and
    those it starts); ``waiting(release)`` lists the pids of the jobs blocked on it."""
    path = tmp_path / "release"
    monkeypatch.setenv("PLNEXP_TEST_RELEASE", str(path))
    return path


def waiting(release: Path) -> list[int]:
    """The pids of the processes whose ``blocking`` fit has waited on ``release``."""
    return sorted(int(p.name.rsplit(".", 1)[1]) for p in release.parent.glob(f"{release.name}.waiting.*"))


@pytest.fixture
def blocking(release, monkeypatch):
    """The ``blocking`` strategy in this process's registry, for this test."""
    from plnexp_test_strategies import BLOCKING

    from plnexp.strategies import STRATEGIES

    monkeypatch.setitem(STRATEGIES, "blocking", BLOCKING)
    return release


# ---------------------------------------------------------------- the command line in this process
@dataclass
class Ran:
    """What ``python -m plnexp ARGS`` gave: as ``subprocess.CompletedProcess`` has it."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def plnexp_main(capsys, monkeypatch):
    """``python -m plnexp ARGS`` in this process (``plnexp.__main__.main``), its output captured, its
    log lines on stderr as the command line writes them; ``cwd``: the working directory meanwhile."""
    from plnexp import __main__ as entry

    def call(*args: str, cwd: Path | None = None) -> Ran:
        if cwd is not None:
            monkeypatch.chdir(cwd)
        capsys.readouterr()
        logger = logging.getLogger("plnexp")
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(entry._OneLine())
        saved = logger.level, logger.propagate
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        try:
            code = entry.main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        finally:
            logger.removeHandler(handler)
            logger.level, logger.propagate = saved
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    return call


@contextmanager
def session_env(name: str, value: str):
    """``os.environ[name] = value`` for the block (this process and those it starts), then as it was:
    for the session's fixtures (monkeypatch is per test)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@pytest.fixture(scope="session", autouse=True)
def floor_cache(tmp_path_factory):
    """The floor's per-machine cache (plnexp.measure.floor) and the best known ELBOs beside it (plnexp.fitting.optimum)
    in a folder of this session, shared by the xdist workers (their basetemps' common parent; both
    files are replaced atomically), for every test and the processes they start: the suite never
    writes to ~/.cache, measures each shape once and computes each data set's optimum once."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "floor_cache"
    folder.mkdir(exist_ok=True)
    with session_env("PLNEXP_FLOOR_CACHE", str(folder)):
        yield folder


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory) -> Path:
    """One persistent compilation cache for the session, shared by the xdist workers (their basetemps'
    common parent): the ``<outputs>/jax_cache`` of every test's outputs links to it, so that a program
    compiled once is read back by later tests (plnexp.fit and ``run`` use ``<outputs>/jax_cache`` by
    default). A test that asserts what a fresh cache does is marked ``own_compile_cache``."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jax_cache"
    folder.mkdir(exist_ok=True)
    return folder


def _link_compile_cache(out: Path, request, cache: Path) -> None:
    if request.node.get_closest_marker("own_compile_cache") is None:
        (out / "jax_cache").symlink_to(cache, target_is_directory=True)


@pytest.fixture(autouse=True)
def jax_caches_kept(request, monkeypatch):
    """``jax.clear_caches`` a no-op in this process, but for tests marked ``clears_caches``. A sweep job
    clears JAX's in-memory caches before each cold compile, so that every job of a sweep starts from
    the same empty caches in a process that plnexp owns; here the jobs run inside pytest's worker,
    where that emptied every other test's compiled functions too (measured 2026-11-25: 8% of the CPU
    of the sweep-running test files). The fit's own program is still traced and compiled cold (a
    fresh Program: plnexp.measure.timing); what clearing does is tested where asserted (test_timing,
    test_strategies count the calls; test_compile_cache clears for real)."""
    if request.node.get_closest_marker("clears_caches") is None:
        import jax

        monkeypatch.setattr(jax, "clear_caches", lambda: None)


@pytest.fixture(scope="session", autouse=True)
def inductor_cache(compile_cache):
    """torch.compile's caches (TORCHINDUCTOR_CACHE_DIR) in a folder of this session, shared by the xdist
    workers like JAX's: each session starts cold, as CI does, and leaves nothing in /tmp/torchinductor_*."""
    folder = compile_cache.parent / "torchinductor"
    folder.mkdir(exist_ok=True)
    with session_env("TORCHINDUCTOR_CACHE_DIR", str(folder)):
        yield folder


@pytest.fixture(scope="session", autouse=True)
def outputs_outside_the_repo(tmp_path_factory, compile_cache):
    """No test writes into the repository's outputs/: PLNEXP_OUTPUTS is a temporary folder for the
    whole session (plnexp.fit's compile cache goes to <outputs>/jax_cache by default: the session's
    shared one); tests that need a store of their own use ``outputs``."""
    out = tmp_path_factory.mktemp("session_outputs")
    (out / "jax_cache").symlink_to(compile_cache, target_is_directory=True)
    with session_env("PLNEXP_OUTPUTS", str(out)):
        yield


@pytest.fixture(scope="session")
def oaks():
    """The shipped oaks data, n=116, p=114, intercept only."""
    return plnexp.load_oaks()


@contextmanager
def made_once(tmp_path_factory, name: str):
    """``with made_once(f, NAME) as (folder, make):`` a folder made once for the whole session, the
    xdist workers included (their basetemps' common parent holds it, under a lock): ``make`` is true
    for the one process that must fill ``folder``; the others wait for it, then get ``make`` false.
    A failed fill leaves no folder behind, so the next process tries again."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also on an error
        make = not done.exists()
        if make:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
        try:
            yield folder, make
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        if make:
            done.touch()


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory) -> Path:
    """An empty MLflow sqlite store with its migrations run (the ~5 s paid once for the session,
    whichever xdist worker asks first)."""
    from mlflow import MlflowClient

    with made_once(tmp_path_factory, "migrated_store") as (folder, make):
        db = folder / "mlflow.db"
        if make:
            MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def outputs(tmp_path, migrated_store, monkeypatch, request, compile_cache) -> Path:
    """A fresh outputs dir (PLNEXP_OUTPUTS) holding a copy of the migrated store, its ``jax_cache`` the
    session's (unless the test is marked ``own_compile_cache``)."""
    out = tmp_path / "outputs"
    out.mkdir()
    shutil.copy(migrated_store, out / "mlflow.db")
    _link_compile_cache(out, request, compile_cache)
    monkeypatch.setenv("PLNEXP_OUTPUTS", str(out))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return out


def store_client(outputs: Path):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{outputs / 'mlflow.db'}")


def run_process(cmd, *, cwd: Path, timeout: float = 300, env=None) -> subprocess.CompletedProcess:
    """``cmd`` to its end through :func:`spawn` (so ended by its pid whatever happens), its output
    captured as text; ``env``: the test's environment by default."""
    proc = spawn(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def plnexp_cli(*args: str, cwd: Path, timeout: float = 300, env=None) -> subprocess.CompletedProcess:
    """``python -m plnexp ARGS`` in a subprocess (environment inherited, e.g. PLNEXP_OUTPUTS), for the
    tests where a process is the point (exit codes of a real interpreter, imports, signals); ended by
    its pid if it outlives ``timeout``."""
    return run_process([sys.executable, "-m", "plnexp", *args], cwd=cwd, timeout=timeout, env=env)


@pytest.fixture
def tiny_config(outputs):
    """A valid config of a tiny synthetic fit (3 iterations), with a fresh store."""
    from plnexp.experiment import plan as cli

    (job,) = cli.plan(["dataset=synthetic", "dataset.n=30", "dataset.p=5", "n_iter=3"], multirun=False)
    return job.config


@pytest.fixture
def exited_pid() -> int:
    """The PID of a process of this host that has exited (and been reaped)."""
    proc = spawn([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ---------------------------------------------------------------- one real sweep, made once
SWEEP = ("sweep", "strategy=scan,fori_loop", "dataset.replication=1", "n_iter=20", "warmup=0")


@dataclass(frozen=True)
class Swept:
    """A copy of the session's real sweep (:data:`SWEEP`: scan and fori_loop on oaks, 20 iterations,
    its report made), in ``outputs``, which is this test's ``PLNEXP_OUTPUTS``."""

    outputs: Path
    parent_id: str
    experiment: str = "strategies"

    @property
    def uri(self) -> str:
        return f"sqlite:///{self.outputs / 'mlflow.db'}"


def copy_outputs(src: Path, dst: Path) -> None:
    """Copy an outputs folder (its sqlite store, artifacts, reports) so that the copy stands alone: the
    store's absolute artifact locations are moved to the copy's folder."""
    shutil.copytree(src, dst, symlinks=True)
    old, new = src.resolve().as_uri(), dst.resolve().as_uri()
    with sqlite3.connect(dst / "mlflow.db") as db:
        db.execute("UPDATE experiments SET artifact_location = replace(artifact_location, ?, ?)", (old, new))
        db.execute("UPDATE runs SET artifact_uri = replace(artifact_uri, ?, ?)", (old, new))
    db.close()


@pytest.fixture(scope="session")
def swept_once(tmp_path_factory, migrated_store) -> Swept:
    """The session's real sweep, fitted once for the session, whichever xdist worker asks first
    (tests copy it: :func:`swept`)."""
    from mlflow import MlflowClient

    from plnexp.__main__ import main

    with made_once(tmp_path_factory, "swept") as (folder, make):
        out = folder / "outputs"
        if make:
            out.mkdir()
            shutil.copy(migrated_store, out / "mlflow.db")
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("PLNEXP_OUTPUTS", str(out))
                mp.delenv("MLFLOW_TRACKING_URI", raising=False)
                assert main(list(SWEEP)) == 0
    cl = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    exp = cl.get_experiment_by_name("strategies")
    (parent,) = [r for r in cl.search_runs([exp.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    return Swept(out, parent.info.run_id)


@pytest.fixture
def swept(swept_once, tmp_path, monkeypatch) -> Swept:
    """A fresh copy of the session's real sweep, as this test's outputs (``PLNEXP_OUTPUTS``)."""
    out = tmp_path / "outputs"
    copy_outputs(swept_once.outputs, out)
    monkeypatch.setenv("PLNEXP_OUTPUTS", str(out))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return Swept(out, swept_once.parent_id)


@contextlib.contextmanager
def scoped_environ(unset, **values: str):
    """``os.environ`` with the variables ``unset`` removed and ``values`` set for the block, then
    exactly as it was (a command may split MLFLOW_TRACKING_URI into this process's environment)."""
    before = dict(os.environ)
    for var in unset:
        os.environ.pop(var, None)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


# ---------------------------------------------------------------- the cluster group's team store
@dataclass(frozen=True)
class TeamStore:
    """A PostgreSQL 15 database and an MLflow server backed by it (tests/daemons.py)."""

    db: object  # daemons.Database: uri, data, port (daemons.halt and daemons.restart take it)
    server: object  # daemons.Server: uri, artifacts, log, pid


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory):
    """One PostgreSQL-backed MLflow server (one worker process) for the session, started at the first
    test that asks (the ``cluster`` group's: one xdist worker runs them all, so it starts once), stopped
    by PID at the end: test_cluster's sweeps and writers, test_store_outage's database stopped under
    it (then started again). Skipped, saying why, where the cluster extra or PostgreSQL is missing."""
    import daemons

    pytest.importorskip("psycopg", reason="needs plnexp's cluster extra: pip install -e '.[cluster]'")
    try:
        folder = tmp_path_factory.mktemp("pg_server")
        with daemons.postgres() as db, daemons.mlflow_server(db.uri, folder, workers=1) as server:
            yield TeamStore(db, server)
    except daemons.Unavailable as e:
        pytest.skip(f"no PostgreSQL-backed MLflow server here: {e}")


class Counter:
    """Counts the calls of a function it stands in for (and still calls it)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)
