"""A headless Chromium driven through chromedriver's W3C WebDriver protocol (plain HTTP + JSON).

Just what the dashboard test needs (open a page, wait for text, click, run a script, screenshot),
with no dependency beyond the standard library: Debian's ``chromium`` and ``chromium-driver``
packages provide the browser and the driver.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--window-size=1600,1000")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find() -> tuple[str, str] | None:
    """(chromium, chromedriver) paths, or None when either is missing."""
    browser = next((shutil.which(b) for b in CHROMIUM if shutil.which(b)), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def stop_group(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Stop a process started with ``start_new_session=True`` and everything it started."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout)
    except ProcessLookupError:
        pass


class WebDriverError(RuntimeError):
    pass


class Browser:
    """A chromedriver process and one headless Chromium session (a context manager)."""

    def __init__(self, browser: str, driver: str, timeout: float = 60):
        self.port = free_port()
        self.profile = tempfile.mkdtemp(prefix="plnexp-chromium-")
        self.proc = subprocess.Popen([driver, f"--port={self.port}"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.base = f"http://127.0.0.1:{self.port}"
        self.session = None
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    break
            except (OSError, WebDriverError):
                pass
            if time.monotonic() > deadline:
                self.close()
                raise WebDriverError(f"chromedriver did not answer on port {self.port} in {timeout:.0f} s")
            time.sleep(0.2)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": browser, "args": [*FLAGS, f"--user-data-dir={self.profile}"]}}}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _call(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as e:
            value = json.loads(e.read() or b"{}").get("value", {})
            raise WebDriverError(f"{method} {path}: {value.get('error')}: {value.get('message', '')[:300]}") from None

    def _s(self, method: str, path: str, body: dict | None = None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url: str) -> None:
        self._s("POST", "/url", {"url": url})

    def script(self, source: str, *args):
        return self._s("POST", "/execute/sync", {"script": source, "args": list(args)})

    def text(self) -> str:
        return self.script("return document.body ? document.body.innerText : '';")

    def wait_for(self, predicate, timeout: float = 60, every: float = 0.5):
        """Poll ``predicate(self)`` until it returns something truthy; returns it (None on timeout)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate(self)
            if value:
                return value
            time.sleep(every)
        return None

    def screenshot(self, path: str | Path) -> Path:
        Path(path).write_bytes(base64.b64decode(self._s("GET", "/screenshot")))
        return Path(path)

    def close(self) -> None:
        if self.session is not None:
            try:
                self._s("DELETE", "")
            except (OSError, WebDriverError):
                pass
            self.session = None
        stop_group(self.proc)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
