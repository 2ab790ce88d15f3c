"""Hydra's own answers to its help and inspection flags (``--help``, ``--hydra-help``, ``--cfg job``,
``--info``, ``--resolve``, ``--package``), in this process: Hydra's command line (``hydra.main``, its
public entry point) reads ``sys.argv``, which :func:`answer` sets for the call and restores. No job
runs here: with these flags Hydra prints and exits.

``python -m plnexp run --cfg job ...`` asks it (:func:`answer`) and prints its answer with
credentials masked. :func:`check_configs`: the configs are where plnexp reads them, checked before
Hydra (whose own error there is a 35-line traceback), without importing the configs' schema (JAX).
"""

from __future__ import annotations

import io
import sys
from contextlib import redirect_stderr, redirect_stdout

from ..jobs.schema import ConfigError
from ..system import paths


def check_configs() -> None:
    """The configs are where plnexp reads them (``plnexp.system.paths.CONF_DIR``): one line if not."""
    if not (paths.CONF_DIR / "config.yaml").is_file():
        raise ConfigError(
            f"configs not found: {paths.CONF_DIR / 'config.yaml'} does not exist (an install without plnexp's conf/); "
            f"reinstall plnexp ({paths.install_command()})"
        )


def _nothing(cfg) -> None:
    """The task function: never called with a help or inspection flag."""


def answer(args: list[str]) -> tuple[int, str, str]:
    """Hydra's answer to ``args``: (exit code, what it printed, what it said on stderr)."""
    import hydra
    from hydra.core.global_hydra import GlobalHydra

    out, err, argv = io.StringIO(), io.StringIO(), sys.argv
    code: int = 0
    # "plnexp": the program's name in Hydra's usage and errors (its arguments are as given)
    sys.argv = ["plnexp", *args]
    try:
        with redirect_stdout(out), redirect_stderr(err):
            hydra.main(config_path=str(paths.CONF_DIR), config_name="config", version_base="1.3")(_nothing)()
    except SystemExit as e:  # how Hydra ends after its answer, or on a bad flag (argparse: 2)
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    finally:
        sys.argv = argv
        GlobalHydra.instance().clear()  # the next compose (plnexp.experiment.plan) starts afresh
    return code, out.getvalue(), err.getvalue()
