"""Hydra's own answers to its help and inspection flags (``--help``, ``--hydra-help``, ``--cfg job``,
``--info``, ``--resolve``, ``--package``), given in a process of their own: Hydra's command line
(``hydra.main``, its public entry point) reads the arguments this process was started with, so
nothing patches ``sys.argv``. No job runs here: with these flags Hydra prints and returns.

``python -m plnexp run --cfg job ...`` starts it (:func:`answer`) and prints its answer with
credentials masked.
"""

from __future__ import annotations

import subprocess
import sys

import hydra

from ..jobs import config as C


def _nothing(cfg) -> None:
    """The task function: never called with a help or inspection flag."""


def answer(args: list[str]) -> tuple[int, str, str]:
    """Hydra's answer to ``args``: (exit code, what it printed, what it said on stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", __name__, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    return done.returncode, done.stdout, done.stderr


def main() -> None:
    sys.argv[0] = "plnexp"  # the program's name in Hydra's usage and errors (its arguments are as given)
    hydra.main(config_path=str(C.CONF_DIR), config_name="config", version_base="1.3")(_nothing)()


if __name__ == "__main__":
    main()
