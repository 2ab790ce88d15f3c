"""The MLflow UI as the dashboard, checked in a real browser: a copy of the session's small real sweep
(conftest's ``swept_once``: scan and fori_loop on oaks, 20 iterations, its report made) is served by
``python -m plnexp ui`` on a free port of 127.0.0.1, once for the module, and headless Chromium
(Debian's ``chromium`` and ``chromium-driver``, which .ci/run installs), driven by selenium, opens the
experiment's runs page. Screenshots are saved in the test's temporary folder."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from browser import FLAGS, find, free_port
from conftest import copy_outputs, end, spawn, store_client
from test_report import png_size

try:  # selenium (the test extra) drives the browser; the chrome fixture skips saying so without it
    from selenium import webdriver
    from selenium.common.exceptions import ElementClickInterceptedException, TimeoutException, WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    pass

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.xdist_group("browser")]
CLOSE_ASSISTANT = 'button[data-component-id="mlflow.assistant.chat_panel.close"]'  # opens by default in 3.17
EXPAND = 'button[data-component-id$="runnamecellrenderer.tsx_46"]'  # the "+" before a parent run's name
CHROMIUM = find()


def wait_health(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"python -m plnexp ui exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url}/health did not answer in {timeout:.0f} s")


@pytest.fixture(scope="module")
def ui_stdout(tmp_path_factory) -> Path:
    """Where the module's ``python -m plnexp ui`` writes what it prints (the study's address)."""
    return tmp_path_factory.mktemp("dashboard-ui") / "ui.out"


@pytest.fixture(scope="module")
def served_sweep(swept_once, tmp_path_factory, ui_stdout):
    """A copy of the session's real 2-job sweep (and its control job), and the UI serving it, started
    once for the module and ended (its whole process group) whatever happens; yields (url, experiment
    id, parent run). What ``ui`` prints goes to ``ui_stdout``."""
    folder = tmp_path_factory.mktemp("dashboard")
    outputs = folder / "outputs"
    copy_outputs(swept_once.outputs, outputs)
    cl = store_client(outputs)
    exp = cl.get_experiment_by_name(swept_once.experiment)
    parent = cl.get_run(swept_once.parent_id)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    log = folder / "ui.log"  # a file, not a pipe that nobody reads while the server runs
    with log.open("w") as err, ui_stdout.open("w") as printed:
        proc = spawn(
            [sys.executable, "-m", "plnexp", "ui", "--port", str(port), "--workers", "1"],
            cwd=folder,
            env={**env, "PLNEXP_OUTPUTS": str(outputs), "PLNEXP_NO_BROWSER": "1"},
            stdout=printed,
            stderr=err,
            by_test=False,  # the module's: ended below
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url, proc, log)
        yield url, exp.experiment_id, parent
    finally:
        end(proc)  # the server and its workers: the whole process group


def test_rest_search_sees_the_sweep(served_sweep):
    url, exp_id, parent = served_sweep
    req = urllib.request.Request(
        f"{url}/api/2.0/mlflow/runs/search",
        method="POST",
        data=json.dumps({"experiment_ids": [exp_id]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        runs = json.loads(r.read())["runs"]
    children = [
        r
        for r in runs
        if any(t["key"] == "mlflow.parentRunId" and t["value"] == parent.info.run_id for t in r["data"].get("tags", []))
    ]
    # the parent and its two jobs (judged in the sweep's interleaved rounds: no control job)
    assert len(runs) == 3 and len(children) == 2
    assert all(any(t["key"] == "plnexp.verdict" for t in c["data"]["tags"]) for c in children)
    assert all({"ms_per_iter", "paired_ratio"} <= {m["key"] for m in c["data"]["metrics"]} for c in children)


@pytest.fixture(scope="module")
def chrome():
    """Headless Chromium under Debian's chromedriver, named explicitly so that selenium never looks
    for (or downloads) a driver itself; one browser for a module's tests (each opens its own page of
    its own server; a start costs seconds of CPU), quit whatever happens in them."""
    if CHROMIUM is None:
        pytest.skip(
            "Chromium and chromedriver are not installed (apt-get install chromium chromium-driver; .ci/run does it)"
        )
    pytest.importorskip("selenium", reason="selenium is not installed (pip install -e '.[test]')")
    chromium, chromedriver = CHROMIUM
    with tempfile.TemporaryDirectory(prefix="plnexp-chromium-", ignore_cleanup_errors=True) as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        try:
            driver = webdriver.Chrome(service=Service(chromedriver), options=options)
        except (OSError, WebDriverException) as e:
            pytest.skip(f"Chromium does not start here: {e}")
        try:
            yield driver
        finally:
            driver.quit()


def wait_text(driver, *wanted: str, timeout: float = 60) -> None:
    """Wait until the page shows every one of ``wanted``; fail with what it shows otherwise."""
    body = (By.TAG_NAME, "body")
    try:
        WebDriverWait(driver, timeout, poll_frequency=0.5).until(
            ec.all_of(*(ec.text_to_be_present_in_element(body, w) for w in wanted))
        )
    except TimeoutException:
        pytest.fail(
            f"not all of {wanted} on the page in {timeout:.0f} s; it shows:\n{driver.find_element(*body).text[:3000]}"
        )


SCROLL_DOWN = """
let moved = false;
for (const el of document.querySelectorAll('*')) {
  if (el.scrollHeight > el.clientHeight + 10 && ['auto', 'scroll'].includes(getComputedStyle(el).overflowY)) {
    const before = el.scrollTop; el.scrollTop = before + 400; moved = moved || el.scrollTop !== before;
  }
}
return moved;
"""


def seen_while_scrolling(driver, *wanted: str, timeout: float = 60) -> None:
    """Wait until each of ``wanted`` has been on the page, scrolling the scrollable panes down step by
    step: MLflow's chart view draws a chart only once it is scrolled into view (22 metrics a run)."""
    seen: set[str] = set()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        text = driver.find_element(By.TAG_NAME, "body").text
        seen |= {w for w in wanted if w in text}
        if seen == set(wanted):
            return
        if not driver.execute_script(SCROLL_DOWN):
            time.sleep(0.5)
    pytest.fail(f"not all of {wanted} on the page in {timeout:.0f} s of scrolling; seen: {sorted(seen)}")


def test_runs_page_shows_the_sweep_children_and_metrics(chrome, served_sweep, tmp_path):
    url, exp_id, parent = served_sweep
    children = ["scan-oaks-f32-cpu-n_iter20", "fori_loop-oaks-f32-cpu-n_iter20"]
    chrome.get(f"{url}/#/experiments/{exp_id}/runs")  # the runs table (#/experiments/<id> is a GenAI overview)
    wait_text(chrome, parent.info.run_name, timeout=90)
    for close in chrome.find_elements(By.CSS_SELECTOR, CLOSE_ASSISTANT):
        close.click()
    chrome.save_screenshot(tmp_path / "runs_collapsed.png")
    # the children are nested under the parent (sorted by start time, the default): expand it
    expand = WebDriverWait(chrome, 30).until(ec.element_to_be_clickable((By.CSS_SELECTOR, EXPAND)))
    assert len(chrome.find_elements(By.CSS_SELECTOR, EXPAND)) == 1  # one parent run
    expand.click()
    wait_text(chrome, *children, timeout=30)
    chrome.save_screenshot(tmp_path / "runs_expanded.png")
    # the chart view: plnexp's metrics, the parent's summary and the log-scale ELBO curve metric
    chart = chrome.find_element(By.CSS_SELECTOR, "input[name=runs-view-mode][value=CHART]")
    chart.find_element(By.XPATH, "./ancestor::label").click()  # the radio itself is hidden; its label is not
    # (the parent's: the verdict's counts; best_* only where the verdict names a fastest strategy)
    seen_while_scrolling(chrome, "ms_per_iter", "compile_s", "gap_rel_log10", "n_unresolved", "run_s_iqr")
    time.sleep(2)  # let the charts draw before the picture
    shot = tmp_path / "runs_charts.png"
    assert chrome.save_screenshot(shot)
    w, h = png_size(shot)
    assert w >= 1000 and h >= 600
    # the parent run's page: its description and its report's files
    chrome.get(f"{url}/#/experiments/{exp_id}/runs/{parent.info.run_id}")
    wait_text(chrome, "n_faster", "Sweep")
    chrome.save_screenshot(tmp_path / "parent_run.png")
    chrome.get(f"{url}/#/experiments/{exp_id}/runs/{parent.info.run_id}/artifacts")
    wait_text(chrome, "report", "summary.txt")


# ---------------------------------------------------------------- the study, from the landing page (issue #32)
# the study view of the sweep (plnexp.store.writes.sweep_view): its verdict's columns first
STUDY_COLUMNS = ("plnexp.verdict", "plnexp.ratio", "paired_ratio")  # the ratio's interval: in plnexp.ratio
MORE_COLUMNS = ("rounds_dropped", "rounds_used")  # in view once the assistant's panel is closed


def rest(url: str, path: str, body: dict | None = None) -> dict:
    """An MLflow REST call: GET without ``body``, POST with it."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"{url}/api/2.0/mlflow/{path}", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_rest_sees_the_experiment_kind_the_study_view_and_the_data_sets(served_sweep):
    url, exp_id, parent = served_sweep
    tags = {t["key"]: t["value"] for t in rest(url, f"experiments/get?experiment_id={exp_id}")["experiment"]["tags"]}
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(tags["mlflow.sharedViewState.plnexp-study"])
    assert view["name"] == f"plnexp study: sweep default, parent run {parent.info.run_id}"  # one sweep's
    assert json.loads(view["state"])["searchFilter"] == f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    assert "viewStateShareKey=plnexp-study" in tags["mlflow.note.content"]
    runs = rest(url, "runs/search", {"experiment_ids": [exp_id]})["runs"]
    jobs = [r for r in runs if r["info"]["run_id"] != parent.info.run_id]
    for r in jobs:
        (given,) = r["inputs"]["dataset_inputs"]
        digest = next(t["value"] for t in r["data"]["tags"] if t["key"] == "data_digest")
        assert given["dataset"]["name"] == "oaks 116×114" and given["dataset"]["digest"] == digest[:8]


def click_through(driver, by, what: str, timeout: float = 60) -> int:
    """Click ``what`` as a user does; a popover that holds the page's clicks (MLflow's GenAI overview
    shows one, "Detect Issues", on a browser's first visit) is dismissed first, one more click.
    Returns the clicks made."""
    target = WebDriverWait(driver, timeout).until(ec.element_to_be_clickable((by, what)))
    time.sleep(1)  # the popover opens a moment after the page
    try:
        target.click()
        return 1
    except ElementClickInterceptedException:
        driver.find_element(By.XPATH, "//button[normalize-space()='Got it']").click()
        WebDriverWait(driver, 10).until(ec.element_to_be_clickable((by, what))).click()
        return 2


def test_the_study_is_three_clicks_from_the_landing_page(chrome, served_sweep, tmp_path):
    """A new user's path (a fresh browser profile, MLflow's GenAI view the default): the home page,
    the experiment, the link of its description; the study opens in the Model training view on the
    newest sweep alone (its parent run named in the view): its jobs by paired ratio to scan, with
    the interval, the verdict and the rounds used and dropped, then the data set."""
    url, exp_id, parent = served_sweep
    chrome.get(f"{url}/")
    clicks = click_through(chrome, By.LINK_TEXT, "strategies")  # Recent Experiments
    chrome.save_screenshot(tmp_path / "experiment.png")
    clicks += click_through(chrome, By.PARTIAL_LINK_TEXT, "Open the study")  # the experiment's description
    assert clicks <= 3
    WebDriverWait(chrome, 10).until(lambda d: len(d.window_handles) > 1)  # MLflow opens links in a new tab
    chrome.switch_to.window(chrome.window_handles[-1])
    wait_text(
        chrome,
        f"plnexp study: sweep default, parent run {parent.info.run_id}",
        *STUDY_COLUMNS,
        "scan-oaks-f32-cpu-n_iter20",
        "fori_loop-oaks-f32-cpu-n_iter20",
        "reference",  # scan's verdict cell
    )
    assert "workflowType=machine_learning" in chrome.current_url
    for close in chrome.find_elements(By.CSS_SELECTOR, CLOSE_ASSISTANT):
        close.click()  # room for the rounds and Dataset columns (the table draws only the columns in view)
    wait_text(chrome, *MORE_COLUMNS, timeout=30)  # dropped rounds visible
    search = rest(url, "runs/search", {"experiment_ids": [exp_id], "filter": "tags.plnexp.job = '0'"})
    digest = next(t["value"] for t in search["runs"][0]["data"]["tags"] if t["key"] == "data_digest")[:8]
    wait_text(chrome, f"oaks 116×114 ({digest})", timeout=30)  # the Dataset column: name, n×p, digest
    body = chrome.find_element(By.TAG_NAME, "body").text
    assert parent.info.run_name not in body  # the jobs only, no sweep's parent to expand
    chrome.save_screenshot(tmp_path / "study.png")


# ---------------------------------------------------------------- the study at the address ui prints (issue #64)
DOCS_IMG = Path(__file__).resolve().parent.parent / "docs" / "img"  # the docs' screenshots, made here


def screenshots_dir(tmp_path: Path) -> Path:
    """Where the study's screenshots go: the docs' folder when PLNEXP_DOCS_SCREENSHOTS=1 (to renew
    them: docs/development.md), else the test's own folder. A test run never writes into the
    checkout by default: a tracked file changed mid-suite makes the checkout dirty, and the suite's
    resume tests (which match runs by plnexp's commit and its clean state) then see other code."""
    return DOCS_IMG if os.environ.get("PLNEXP_DOCS_SCREENSHOTS") == "1" else tmp_path


def test_ui_prints_the_study_and_a_browser_there_sees_it(chrome, served_sweep, ui_stdout, tmp_path):
    """``python -m plnexp ui`` prints the address of the latest sweep's study (MLflow's Model training
    view, which no server setting chooses: the link names it); headless Chromium at that address
    sees the sweep's jobs, the reference first, the verdict and ratio columns first, in a 1,400 px
    window with MLflow's assistant panel open; the paired ratio and the rounds' figures with it closed. The screenshots are the docs'."""
    url, exp_id, parent = served_sweep
    found = re.search(r"^open (http://\S+)$", ui_stdout.read_text(), re.MULTILINE)
    assert found is not None, ui_stdout.read_text()
    address = found.group(1)
    assert address == f"{url}/#/experiments/{exp_id}/runs?workflowType=machine_learning&viewStateShareKey=plnexp-study"
    chrome.set_window_size(1400, 900)
    chrome.get(address)
    jobs = ["scan-oaks-f32-cpu-n_iter20", "fori_loop-oaks-f32-cpu-n_iter20"]
    wait_text(chrome, f"plnexp study: sweep default, parent run {parent.info.run_id}", "plnexp.verdict", *jobs)
    # scan's verdict cell and its ratio as read, in view beside the assistant's panel
    wait_text(chrome, "reference", "plnexp.ratio", "1 (the reference)", timeout=30)
    body = chrome.find_element(By.TAG_NAME, "body").text
    assert body.index(jobs[0]) < body.index(jobs[1])  # the reference first
    assert "workflowType=machine_learning" in chrome.current_url
    shots = screenshots_dir(tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    assert chrome.save_screenshot(shots / "dashboard-study.png")
    for close in chrome.find_elements(By.CSS_SELECTOR, CLOSE_ASSISTANT):
        close.click()
    # the paired ratio and the rounds' figures too, the panel closed (a fresh browser opens with it
    # open, which leaves the metrics' columns out of a 1,400 px view)
    wait_text(chrome, "paired_ratio", "round_ms_per_iter", "rounds_used", timeout=30)
    time.sleep(1)
    assert chrome.save_screenshot(shots / "dashboard-after.png")
    assert png_size(shots / "dashboard-after.png")[0] >= 1000


def test_the_artifact_viewer_shows_the_html_report(chrome, served_sweep):
    """report.html on the parent run, as MLflow's artifact viewer shows it (in a frame): the verdict
    first, then the table of the strategies fastest first."""
    url, exp_id, parent = served_sweep
    chrome.get(f"{url}/#/experiments/{exp_id}/runs/{parent.info.run_id}/artifacts/report/report.html")
    frame = WebDriverWait(chrome, 60).until(ec.presence_of_element_located((By.TAG_NAME, "iframe")))
    chrome.switch_to.frame(frame)
    try:
        wait_text(chrome, "Verdict", "Strategies, fastest first", "time ÷ scan", "reference")
        body = chrome.find_element(By.TAG_NAME, "body").text
        assert body.index("Verdict") < body.index("Strategies, fastest first") < body.index("Figures")
        assert chrome.find_elements(By.CSS_SELECTOR, "img[src^='data:image/png;base64,']")  # the figures, inline
    finally:
        chrome.switch_to.default_content()
