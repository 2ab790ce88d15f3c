"""docs/how-to/use-a-fitted-model.md runs as written: its Python blocks in order, in one namespace,
in a temporary folder, and its ``python -m plnexp`` command through the command line in this
process (its run's id put where the page says RUN_ID). A block starting ``# needs scanpy`` runs
where scanpy is installed."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "use-a-fitted-model.md"
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```", re.M | re.S)


def test_the_page_has_the_blocks_it_needs():
    kinds = [kind for kind, _ in BLOCK.findall(PAGE.read_text())]
    assert kinds.count("bash") == 1 and kinds.count("python") >= 5
    assert "runs:/RUN_ID" in PAGE.read_text()


@pytest.mark.slow
def test_the_pages_code_runs(outputs, tmp_path, monkeypatch, plnexp_main):
    pytest.importorskip("anndata")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    run_id = None
    for kind, code in BLOCK.findall(PAGE.read_text()):
        if kind == "bash":
            args = shlex.split(code.strip())
            assert args[:3] == ["python", "-m", "plnexp"]
            ran = plnexp_main(*args[3:], "dataset.optimum=false")  # no best known ELBO computed: not the page's point
            assert ran.returncode == 0, ran.stderr
            run_id = re.search(r"\(run ([0-9a-f]{32})", ran.stdout + ran.stderr).group(1)
            continue
        if code.startswith("# needs scanpy") and importlib.util.find_spec("scanpy") is None:
            continue
        if "RUN_ID" in code:
            assert run_id is not None, "the page loads runs:/RUN_ID before its command ran"
            code = code.replace("RUN_ID", run_id)
        exec(compile(code, str(PAGE), "exec"), namespace)
    assert run_id is not None and "pln_pca" in namespace["adata"].uns
