"""What a sweep preset (``conf/sweep/<name>.yaml``) says of itself before it runs: how long it takes.

Each preset states it in one comment line, ``# Takes: <how long> (<measured when, or an
estimate>)``, which the sweep prints at its start (:func:`takes_line`), so that nobody waits six
minutes unwarned. The figure is the preset's own words (measured ones are dated, with the
measurement in docs/results.md): never computed here, never a figure in code.
"""

from __future__ import annotations

from pathlib import Path

MARK = "# Takes:"


def takes(name: str, conf_dir: Path) -> str:
    """The preset ``name``'s stated duration (the text after :data:`MARK`), or "" where it states none
    (a preset of the user's own, a file that cannot be read)."""
    path = Path(conf_dir) / "sweep" / f"{name}.yaml"
    try:
        text = path.read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith(MARK):
            return line[len(MARK) :].strip()
    return ""


def takes_line(name: str, conf_dir: Path) -> str:
    """``sweep=default takes about 90 s on an idle 2-core CPU (…)``, or "" (see :func:`takes`)."""
    said = takes(name, conf_dir)
    return f"sweep={name} takes {said}" if said else ""
