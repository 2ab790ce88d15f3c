"""The MLflow UI as the dashboard, checked in a real browser: a small real sweep fills a store,
``python -m plnexp ui`` serves it on a free port of 127.0.0.1, and headless Chromium (Debian's
``chromium`` and ``chromium-driver``, which .ci/run installs) opens the experiment's runs page.
Screenshots are saved in the test's temporary folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from browser import Browser, WebDriverError, find, free_port, stop_group
from conftest import store_client
from test_report import png_size

from plnexp.__main__ import main

pytestmark = pytest.mark.slow
CLOSE_ASSISTANT = 'button[data-component-id="mlflow.assistant.chat_panel.close"]'  # opens by default in 3.17
EXPAND = 'button[data-component-id$="runnamecellrenderer.tsx_46"]'  # the "+" before a parent run's name
CHROMIUM = find()


def wait_health(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"python -m plnexp ui exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url}/health did not answer in {timeout:.0f} s")


@pytest.fixture
def served_sweep(outputs, tmp_path):
    """A real 2-job sweep in the store, and the UI serving it; yields (url, experiment id, parent run)."""
    assert main(["sweep", "strategy=scan,fori_loop", "dataset.replication=1", "n_iter=20", "warmup=0"]) == 0
    cl = store_client(outputs)
    exp = cl.get_experiment_by_name("strategies")
    (parent,) = [r for r in cl.search_runs([exp.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "plnexp", "ui", "--port", str(port), "--workers", "1"],
                            cwd=tmp_path, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url, proc)
        yield url, exp.experiment_id, parent
    finally:
        stop_group(proc)  # the server and its workers: the whole process group


def test_rest_search_sees_the_sweep(served_sweep):
    url, exp_id, parent = served_sweep
    req = urllib.request.Request(f"{url}/api/2.0/mlflow/runs/search", method="POST",
                                 data=json.dumps({"experiment_ids": [exp_id]}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        runs = json.loads(r.read())["runs"]
    children = [r for r in runs if any(t["key"] == "mlflow.parentRunId" and t["value"] == parent.info.run_id
                                       for t in r["data"].get("tags", []))]
    assert len(runs) == 3 and len(children) == 2
    assert all(any(m["key"] == "ms_per_iter" for m in c["data"]["metrics"]) for c in children)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium and chromedriver are not installed "
                                             "(apt-get install chromium chromium-driver; .ci/run does it)")
def test_runs_page_shows_the_sweep_children_and_metrics(served_sweep, tmp_path):
    url, exp_id, parent = served_sweep
    children = ["scan-oaks-f32-cpu-n_iter20", "fori_loop-oaks-f32-cpu-n_iter20"]
    try:
        browser = Browser(*CHROMIUM)
    except (OSError, WebDriverError) as e:
        pytest.skip(f"Chromium does not start here: {e}")
    with browser as b:
        b.get(f"{url}/#/experiments/{exp_id}/runs")  # the runs table (#/experiments/<id> is a GenAI overview)
        assert b.wait_for(lambda b: parent.info.run_name in b.text(), 90), b.text()[:2000]
        b.script(f"const x = document.querySelector('{CLOSE_ASSISTANT}'); if (x) x.click();")
        b.screenshot(tmp_path / "runs_collapsed.png")
        # the children are nested under the parent (sorted by start time, the default): expand it
        assert b.script(f"const bs = [...document.querySelectorAll('{EXPAND}')]; bs.forEach(x => x.click()); "
                        "return bs.length;") == 1
        assert b.wait_for(lambda b: all(c in b.text() for c in children), 30), b.text()[:2000]
        b.screenshot(tmp_path / "runs_expanded.png")
        # the chart view: plnexp's metrics, the parent's summary and the log-scale ELBO curve metric
        b.script("document.querySelector('input[name=runs-view-mode][value=CHART]').click();")
        wanted = ("ms_per_iter", "compile_s", "elbo_gap_log10", "best_ms_per_iter")
        assert b.wait_for(lambda b: all(w in b.text() for w in wanted), 60), b.text()[:3000]
        time.sleep(2)  # let the charts draw before the picture
        shot = b.screenshot(tmp_path / "runs_charts.png")
        w, h = png_size(shot)
        assert w >= 1000 and h >= 600
        # the parent run's page: its description and its report's files
        b.get(f"{url}/#/experiments/{exp_id}/runs/{parent.info.run_id}")
        assert b.wait_for(lambda b: "best_ms_per_iter" in b.text() and "Sweep" in b.text(), 60), b.text()[:3000]
        b.screenshot(tmp_path / "parent_run.png")
        b.get(f"{url}/#/experiments/{exp_id}/runs/{parent.info.run_id}/artifacts")
        assert b.wait_for(lambda b: "report" in b.text() and "summary.txt" in b.text(), 60), b.text()[:3000]
