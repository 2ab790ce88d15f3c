"""Hydra's own copies of a job's config, without credentials (``hydra.callbacks`` in conf/config.yaml).

Hydra saves every job's config, its own config and the overrides (``<job dir>/.hydra/config.yaml``,
``hydra.yaml``, ``overrides.yaml``) before the job starts, and a sweep's config (``<sweep
dir>/multirun.yaml``) before its first job: a ``tracking_uri=postgresql://user:PASSWORD@host/db``
override lands in all of them. :class:`RedactSavedConfigs` rewrites them with the credentials
masked (:mod:`plnexp.system.redact`) as each job starts, before it runs, and ``multirun.yaml`` again when
the sweep ends. The files stay: nothing of plnexp reads them back (``rerun`` reads the run's
``config.yaml`` artifact, ``resume`` the store), but people do.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode, TaskFunction
from omegaconf import DictConfig, OmegaConf

from ..system.redact import redact

SAVED = ("config.yaml", "hydra.yaml", "overrides.yaml")  # what Hydra writes into a job's output_subdir
MULTIRUN_FILE = "multirun.yaml"  # what Hydra's sweeper writes into the sweep's folder


def redact_file(path: Path) -> bool:
    """Rewrite the YAML file ``path`` with its credentials masked, whole or not at all (a temporary
    file renamed over it: two jobs may rewrite one ``multirun.yaml`` at once). Returns whether it
    changed; a file without credentials, or missing, is left as it is. Read and written by OmegaConf,
    as Hydra wrote it: interpolations (``${now:...}``) and types survive."""
    try:
        node = OmegaConf.load(path)
    except FileNotFoundError:
        return False
    data = OmegaConf.to_container(node, resolve=False)
    clean = redact(data)
    if clean == data:
        return False
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            OmegaConf.save(OmegaConf.create(clean), f, resolve=False)
        os.chmod(tmp, path.stat().st_mode & 0o777)  # Hydra's mode, not mkstemp's private one
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


class RedactSavedConfigs(Callback):
    """Masks the credentials of Hydra's saved configs (see the module's doc)."""

    def on_job_start(self, config: DictConfig, *, task_function: TaskFunction, **kwargs: Any) -> None:
        hc = config.hydra
        if hc.output_subdir is not None:  # hydra.output_subdir=null: Hydra saved nothing
            folder = Path(hc.runtime.output_dir) / str(hc.output_subdir)
            for name in SAVED:
                redact_file(folder / name)
        if hc.mode == RunMode.MULTIRUN:  # saved before the first job: masked by the first job to start
            redact_file(Path(hc.sweep.dir) / MULTIRUN_FILE)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        redact_file(Path(config.hydra.sweep.dir) / MULTIRUN_FILE)
