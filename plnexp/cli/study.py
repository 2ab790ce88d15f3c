"""Where ``python -m plnexp ui`` sends a person: the study, not MLflow's landing page.

MLflow's UI (3.x) chooses between its GenAI and "Model training" views per browser, from the page's
``workflowType`` URL parameter or, without one, from the browser's local storage, GenAI by default;
no server option or setting chooses it (its ``main`` bundle reads the parameter first, then the
stored value ``mlflow.workflowType``, initially ``genai``). So the landing page opens on GenAI's
welcome, and plnexp links past it: :func:`address` is the experiment's study view of the newest
sweep (:func:`plnexp.store.experiment_view.study_link`: ``workflowType=machine_learning``, the saved view
of its runs, reference first, verdict and ratio columns first), which ``ui`` prints and, where a
browser can be shown, opens once the server answers (:func:`open_when_up`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import urllib.request

from .. import store
from ..store.experiment_view import study_link

NO_BROWSER_VAR = "PLNEXP_NO_BROWSER"  # set (to anything but ""): ui opens no browser


def base(host: str, port: int) -> str:
    """The server's address as a browser on this machine reaches it (a server on every interface:
    127.0.0.1)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}"


def address(uri: str, host: str, port: int) -> tuple[str, str]:
    """(the address to open, what it is): the study of the newest sweep's experiment, or the
    server's root where the store holds no sweep yet (or cannot be read)."""
    root = base(host, port)
    try:
        latest = store.open(uri).latest_parent()
    except Exception:  # noqa: BLE001 - no store yet, or one that fails: the root, said so
        latest = None
    if latest is None:
        return f"{root}/", "the dashboard (no sweep in the store yet: python -m plnexp sweep)"
    return (
        f"{root}/{study_link(latest.experiment_id)}",
        f"the study of the latest sweep ({latest.name or latest.run_id}): its runs, the reference "
        "first, verdict and paired ratio first (MLflow's Model training view; its landing page opens on GenAI's)",
    )


def can_show() -> bool:
    """Whether a browser can be shown here: a desktop session (macOS, Windows, an X or Wayland
    display), and not turned off (:data:`NO_BROWSER_VAR`)."""
    if os.environ.get(NO_BROWSER_VAR):
        return False
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def open_when_up(url: str, health: str, timeout_s: float = 120.0) -> threading.Thread | None:
    """Open ``url`` in the desktop's browser once ``health`` answers (a daemon thread; None where no
    browser can be shown: :func:`can_show`)."""
    if not can_show():
        return None

    def wait_then_open() -> None:
        import webbrowser

        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(health, timeout=2) as r:
                    if r.status == 200:
                        webbrowser.open(url)
                        return
            except OSError:
                time.sleep(0.5)

    t = threading.Thread(target=wait_then_open, name="plnexp-open-browser", daemon=True)
    t.start()
    return t
