"""Where things are: the repository, its ``conf/`` folder, and where outputs go. A leaf module."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONF_DIR = REPO / "conf"


def outputs_dir() -> Path:
    """Where every output goes: ``$PLNEXP_OUTPUTS`` or ``<repo>/outputs`` (absolute)."""
    return Path(os.environ.get("PLNEXP_OUTPUTS") or REPO / "outputs").resolve()
