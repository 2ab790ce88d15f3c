"""Small helpers for the dashboard test (tests/test_dashboard.py): a free port, Debian's Chromium and
chromedriver (packages ``chromium`` and ``chromium-driver``), the flags headless Chromium runs with.
The browser itself is driven by selenium."""

from __future__ import annotations

import shutil
import socket

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1600,1000",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find() -> tuple[str, str] | None:
    """(chromium, chromedriver) paths, or None when either is missing."""
    browser = next((shutil.which(b) for b in CHROMIUM if shutil.which(b)), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None
