"""Where things are: plnexp's configs, its source checkout (if any), and where outputs go. A leaf module.

- The configs (``conf/``): inside the package (``plnexp/conf``, where a wheel puts them: setup.py
  copies the repository's top-level ``conf/`` there at build time), else the checkout's ``conf/``
  (an editable install, or the source tree on ``sys.path``): the same files either way.
- Outputs: ``$PLNEXP_OUTPUTS``, else ``./outputs`` of the current directory; never inside the
  installed package.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
REPO = PACKAGE.parent  # the source checkout, when plnexp runs from one (see CHECKOUT)
CHECKOUT: Path | None = REPO if (REPO / "pyproject.toml").is_file() and (REPO / "conf").is_dir() else None
"""The source checkout plnexp runs from (its git commit is logged), or None for an installed wheel."""
CONF_DIR = PACKAGE / "conf" if (PACKAGE / "conf" / "config.yaml").is_file() else REPO / "conf"


def outputs_dir() -> Path:
    """Where every output goes: ``$PLNEXP_OUTPUTS``, else ``./outputs`` of the current directory (absolute)."""
    return Path(os.environ.get("PLNEXP_OUTPUTS") or "outputs").resolve()


def install_command(extra: str | None = None) -> str:
    """How to install plnexp (with an optional extra) the way it is installed here: from its clone
    (an editable install) or from a package index (a wheel)."""
    if CHECKOUT is not None:
        return f"pip install -e '.[{extra}]'" if extra else "pip install -e ."
    return f"pip install 'plnexp[{extra}]'" if extra else "pip install --force-reinstall plnexp"
