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

PACKAGE = Path(__file__).resolve().parent.parent
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


def write_atomic(path: Path, text: str | bytes, mode: int | None = None) -> None:
    """Write ``text`` (or bytes) to ``path`` whole or not at all: a temporary file in the same folder (created
    with it), flushed to disk, then renamed into place; ``mode``: its permissions (default: mkstemp's
    private 0o600). Parallel writers never leave a half-written file; the last rename wins."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def probe_writes(folder: Path) -> None:
    """Write a byte into ``folder`` through to its disk (a temporary file, fsynced, removed): OSError
    where it cannot be written, a full disk included (an empty file is made even then)."""
    import tempfile

    with tempfile.TemporaryFile(dir=folder) as probe:
        probe.write(b"\0")
        probe.flush()
        os.fsync(probe.fileno())
