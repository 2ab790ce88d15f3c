"""plnexp as a user who installs it has it: an sdist and a wheel, installed into a fresh venv, run
from another folder.

``uv build`` makes the sdist from a copy of this checkout's sources (nothing is built inside the
checkout) and the wheel from the sdist, as ``python -m build`` does (so a file the sdist forgets
fails here), the kernel left out (``CC=CXX=false``: its build and portability are tested apart,
tests/test_fused.py). The wheel goes into a fresh venv with its dependencies (uv, from its cache:
the versions of this environment, given as constraints). From an empty folder elsewhere,
``python -m plnexp sweep`` (with its report) and the ``plnexp`` console script's ``ui``
(the dashboard) must find their configs inside the package, write their outputs under that folder's
``outputs/`` and nothing into the venv.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import end, run_process, spawn, store_client
from daemons import free_port

from plnexp.system.paths import REPO

UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
# the tests of the installed wheel on one xdist worker: `installed` (a build and an install, ~30 s) is
# made once, not once per worker that draws one of them
ONE_WORKER = pytest.mark.xdist_group("package")


def test_outputs_go_to_the_current_folder_unless_told(tmp_path, monkeypatch):
    from plnexp.system import paths

    monkeypatch.delenv("PLNEXP_OUTPUTS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert paths.outputs_dir() == tmp_path / "outputs"
    monkeypatch.setenv("PLNEXP_OUTPUTS", "elsewhere")
    assert paths.outputs_dir() == tmp_path / "elsewhere"  # absolute, from where it was said
    # in this checkout (an editable install) the configs are the repository's own conf/
    assert paths.CONF_DIR == REPO / "conf" and paths.CHECKOUT == REPO


def _find_links() -> list[str]:
    """pip's find-links folders of this machine (PyTorch's CPU wheel lies in one), for uv."""
    out = run_process([sys.executable, "-m", "pip", "config", "list"], cwd=REPO)
    folders = [line.split("=", 1)[1].strip("'") for line in out.stdout.splitlines() if "find-links=" in line]
    return [a for d in dict.fromkeys(folders) if Path(d).is_dir() for a in ("--find-links", d)]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Iterator[tuple[Path, Path, Path]]:
    """(the wheel, the sdist, the fresh venv it is installed in); the venv and the copied sources are
    removed when the module's tests are done: the session's temporary folders may be in memory
    (conftest: /dev/shm), where pytest keeps its last few sessions' folders."""
    if UV is None:
        pytest.skip("uv is not installed (.ci/run installs it into .venv): no fresh venv to install the wheel into")
    base = tmp_path_factory.mktemp("package")
    src = base / "src"  # the sources only: no venv, outputs, build folders or the editable install's kernel
    junk = (".venv", ".git", "outputs", "build", "dist", "site", "*.so", "__pycache__", "*.egg-info", ".*_cache")
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(*junk))
    # no kernel: its compile fails, and the build skips it (an optional extension)
    env = {**os.environ, "CC": "false", "CXX": "false", "PYTHONDONTWRITEBYTECODE": "1"}
    built = run_process([UV, "build", "-q", "--out-dir", str(base / "dist"), str(src)], cwd=base, env=env)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (base / "dist").glob("plnexp-*.whl")
    (sdist,) = (base / "dist").glob("plnexp-*.tar.gz")
    venv = base / "venv"
    made = run_process([UV, "venv", "-q", "--python", sys.executable, str(venv)], cwd=base, env=env)
    assert made.returncode == 0, made.stderr[-3000:]
    frozen = run_process([UV, "pip", "freeze", "--python", sys.executable], cwd=base, env=env)
    pins = [line for line in frozen.stdout.splitlines() if "==" in line and not line.startswith("plnexp")]
    (base / "constraints.txt").write_text("\n".join(pins) + "\n")
    done = run_process(
        [UV, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *_find_links()]
        + ["--constraint", str(base / "constraints.txt"), str(wheel)],
        cwd=base,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    yield wheel, sdist, venv
    for folder in (venv, src):
        shutil.rmtree(folder, ignore_errors=True)


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.mark.slow
@ONE_WORKER
def test_the_wheel_carries_configs_data_and_licence_and_no_outputs(installed):
    wheel, sdist, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    confs = {str(p.relative_to(REPO)) for p in (REPO / "conf").rglob("*.yaml")}
    assert {f"plnexp/{c}" for c in confs} <= names, "every yaml of conf/ inside the package"
    assert "plnexp/datasets/oaks/LICENSE" in names
    assert not any(n.endswith(".so") for n in names), "CXX=false: no kernel built, none copied from the checkout"
    assert any(n.startswith("plnexp/datasets/oaks/") and n.endswith(".csv") for n in names)
    assert not any(n.startswith(("outputs/", "tests/", "conf/")) for n in names), "nothing outside the package"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "plnexp = plnexp.__main__:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    assert sdist.stat().st_size > 0  # the wheel above was built from it (uv build), so it holds the sources


@pytest.mark.slow
@ONE_WORKER
def test_run_a_sweep_and_the_dashboard_from_another_folder_write_there_only(installed, tmp_path):
    _, _, venv = installed
    before = _files(venv)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PLNEXP_OUTPUTS", "MLFLOW_TRACKING_URI", "PYTHONPATH")}
    # bytecode cached outside the venv (PYTHONPYCACHEPREFIX), so the processes below share it and the
    # venv's file list shows only what plnexp wrote
    env.update(PYTHONPYCACHEPREFIX=str(tmp_path / "pycache"), PYTHONDONTWRITEBYTECODE="")
    python, plnexp = str(venv / "bin" / "python"), str(venv / "bin" / "plnexp")

    where = run_process(
        [python, "-c", "import plnexp.system.paths as p; print(p.CONF_DIR, p.CHECKOUT)"], cwd=work, env=env
    )
    assert where.returncode == 0, where.stderr
    conf, checkout = where.stdout.split()
    assert Path(conf).parent.parent.name == "site-packages" and checkout == "None", "the installed package's configs"

    # the README's main command (python -m plnexp sweep) on a small grid; the console script runs
    # the dashboard below (one process each: a separate `run` added ~8 s of CPU and no new path)
    # report.rounds=0: the interleaved rounds (tests/test_groups.py): ~3 s here, and no new path
    grid = ["strategy=scan,fori_loop", "dataset.replication=1", "n_iter=3", "repeats=1", "report.rounds=0"]
    sweep = run_process([python, "-m", "plnexp", "sweep", *grid], cwd=work, env=env)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert "2 of 2 jobs finished" in sweep.stdout, sweep.stdout

    outputs = work / "outputs"
    cl = store_client(outputs)
    runs = [r for e in cl.search_experiments() for r in cl.search_runs([e.experiment_id])]
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 3  # the sweep's parent and its 2 jobs
    assert {r.data.tags.get("git_commit") for r in runs} == {"unknown"}, "no checkout: no commit to log"
    assert list((outputs / "reports").rglob("report.md")), "the sweep's report, under this folder"

    port = free_port()  # the dashboard on this store: its REST API lists the runs just made
    ui = spawn([plnexp, "ui", "--port", str(port), "--workers", "1"], cwd=work, env=env)
    try:
        url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=10"
        for _ in range(300):
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    listed = r.read().decode()
                break
            except OSError:
                assert ui.poll() is None, "plnexp ui exited"
                __import__("time").sleep(0.2)
        else:
            pytest.fail("plnexp ui did not answer within 60 s")
    finally:
        end(ui)
    names = {e["name"] for e in json.loads(listed)["experiments"]}
    assert {r.info.experiment_id for r in runs} and "strategies" in names, names
    assert _files(venv) == before, "nothing written into the venv (the installed package included)"


@pytest.mark.parametrize("args", [["run", "--help"], ["sweep"], ["run", "n_iter=3"], ["rerun", "latest"]])
def test_an_install_without_its_configs_says_so_in_one_line(monkeypatch, capsys, args, tmp_path):
    from plnexp.jobs import config
    from plnexp.system import paths
    from plnexp.__main__ import main

    for where in (config, paths):  # as a wheel built without conf/ had it
        monkeypatch.setattr(where, "CONF_DIR", tmp_path / "conf")
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("plnexp: error: configs not found: ") and str(tmp_path / "conf" / "config.yaml") in err[0]
    assert "allowed values are \n" not in err[0] and "pip install" in err[0]


def test_a_group_without_options_never_lists_nothing(monkeypatch, tmp_path):
    from plnexp.jobs import config

    (tmp_path / "conf" / "sweep").mkdir(parents=True)
    monkeypatch.setattr(config, "CONF_DIR", tmp_path / "conf")
    text = config.allowed_options("sweep")
    assert text.startswith("none found: no .yaml files in ") and str(tmp_path / "conf" / "sweep") in text
