"""plnexp as a user who installs it has it: a wheel, run from another folder.

The wheel is built from a copy of this checkout's sources (``pip wheel``; nothing is built inside the
checkout), the kernel left out (``CC=CXX=false``: its build and portability are tested apart,
tests/test_fused.py), and installed with ``pip install --target`` into a folder that
stands in for site-packages, ahead of the editable checkout on ``PYTHONPATH``; the dependencies are
this environment's. From an empty folder elsewhere, ``python -m plnexp run`` and the ``plnexp``
console script's sweep must find their configs inside the package, write their outputs under that
folder's ``outputs/`` and nothing into the installed package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import run_process, store_client

from plnexp.paths import REPO


def test_outputs_go_to_the_current_folder_unless_told(tmp_path, monkeypatch):
    from plnexp import paths

    monkeypatch.delenv("PLNEXP_OUTPUTS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert paths.outputs_dir() == tmp_path / "outputs"
    monkeypatch.setenv("PLNEXP_OUTPUTS", "elsewhere")
    assert paths.outputs_dir() == tmp_path / "elsewhere"  # absolute, from where it was said
    # in this checkout (an editable install) the configs are the repository's own conf/
    assert paths.CONF_DIR == REPO / "conf" and paths.CHECKOUT == REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the folder it is installed in)."""
    base = tmp_path_factory.mktemp("package")
    src = base / "src"  # the sources only: no venv, outputs, build folders or the editable install's kernel
    junk = (".venv", ".git", "outputs", "build", "dist", "*.so", "__pycache__", "*.egg-info", ".*_cache")
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(*junk))
    # no kernel: its compile fails, and the build skips it (an optional extension)
    env = {**os.environ, "CC": "false", "CXX": "false", "PYTHONDONTWRITEBYTECODE": "1"}
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(base / "dist"), str(src)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (base / "dist").glob("plnexp-*.whl")
    target = base / "site"
    done = subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return wheel, target


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.mark.slow
def test_the_wheel_carries_configs_data_and_licence_and_no_outputs(installed):
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    confs = {str(p.relative_to(REPO)) for p in (REPO / "conf").rglob("*.yaml")}
    assert {f"plnexp/{c}" for c in confs} <= names, "every yaml of conf/ inside the package"
    assert "plnexp/datasets/oaks/LICENSE" in names
    assert not any(n.endswith(".so") for n in names), "CXX=false: no kernel built, none copied from the checkout"
    assert any(n.startswith("plnexp/datasets/oaks/") and n.endswith(".csv") for n in names)
    assert not any(n.startswith(("outputs/", "tests/", "conf/")) for n in names), "nothing outside the package"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "plnexp = plnexp.__main__:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.slow
def test_run_and_a_sweep_from_another_folder_write_there_only(installed, tmp_path):
    _, site = installed
    before = _files(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PLNEXP_OUTPUTS", "MLFLOW_TRACKING_URI")}
    env.update(PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1")

    where = run_process(
        [sys.executable, "-c", "import plnexp.paths as p; print(p.CONF_DIR, p.CHECKOUT)"], cwd=work, env=env
    )
    assert where.returncode == 0, where.stderr
    assert where.stdout.split() == [str(site / "plnexp" / "conf"), "None"], "the installed package's configs"

    run = run_process([sys.executable, "-m", "plnexp", "run", "n_iter=3", "dataset.replication=1"], cwd=work, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    sweep = run_process(
        [
            str(site / "bin" / "plnexp"),
            "sweep",
            "strategy=scan,fori_loop",
            "dataset.replication=1",
            "n_iter=3",
            "repeats=1",
        ],
        cwd=work,
        env=env,
    )
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert "2 of 2 jobs finished" in sweep.stdout, sweep.stdout

    outputs = work / "outputs"
    cl = store_client(outputs)
    runs = [r for e in cl.search_experiments() for r in cl.search_runs([e.experiment_id])]
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 4  # the run; the sweep's parent and 2 jobs
    assert {r.data.tags.get("git_commit") for r in runs} == {"unknown"}, "no checkout: no commit to log"
    assert list((outputs / "reports").rglob("report.md")), "the sweep's report, under this folder"
    assert _files(site) == before, "nothing written into the installed package"


@pytest.mark.parametrize("args", [["--help"], ["sweep"], ["run", "n_iter=3"], ["rerun", "latest"]])
def test_an_install_without_its_configs_says_so_in_one_line(monkeypatch, capsys, args, tmp_path):
    from plnexp import config
    from plnexp.__main__ import main

    monkeypatch.setattr(config, "CONF_DIR", tmp_path / "conf")  # as a wheel built without conf/ had it
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("plnexp: error: configs not found: ") and str(tmp_path / "conf" / "config.yaml") in err[0]
    assert "allowed values are \n" not in err[0] and "pip install" in err[0]


def test_a_group_without_options_never_lists_nothing(monkeypatch, tmp_path):
    from plnexp import config

    (tmp_path / "conf" / "sweep").mkdir(parents=True)
    monkeypatch.setattr(config, "CONF_DIR", tmp_path / "conf")
    text = config.allowed_options("sweep")
    assert text.startswith("none found: no .yaml files in ") and str(tmp_path / "conf" / "sweep") in text
