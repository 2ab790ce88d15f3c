"""What a run was made of, in tags, so that it can be rebuilt, rerun and checked.

Every job's run is tagged when it starts (:func:`run_tags`): the hash of its resolved config
(``config_hash``, what ``sweep ... resume=true`` matches on), the package version, the git commit
and whether the tree was dirty, the command line, the seeds and, for a CSV data set, the sha256 of
each file. The environment tags (:func:`environment_tags`: versions, device, x64, XLA_FLAGS, git
commit and dirty flag, plnexp version; inside a SLURM job, its id, array task, node, partition and
cluster: :func:`slurm_tags`), the hash of the arrays actually fitted (``data_digest``,
after replication) and the resolved config artifact (``config.yaml``) are written by
:mod:`plnexp.store` when it creates the run. :func:`environment` gathers the fields
that ``rerun`` compares (how far two ELBO curves of one configuration may differ when they cannot
be bit for bit equal is each precision's ``curve_rtol``, :mod:`plnexp.core.precision`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

from .config import UNHASHED as UNHASHED, Config
from .tags import PARENT_TAG
from ..system.machine import cpu_model
from ..system.paths import CHECKOUT
from ..system.redact import redact
from ..strategies import NATIVE_STRATEGIES, TORCH_STRATEGIES
from ..strategies import fused

PROVENANCE_VERSION = "1"  # the format of these tags and of config.yaml; a rerun refuses others
VERSION_TAG, FORMAT_TAG = "plnexp.version", "plnexp.provenance"
HASH_TAG, RERUN_TAG, RESUMES_TAG = "config_hash", "rerun_of", "resumes"
REPLICATE_TAG = "replicate"  # a run's place in its program's batch (replicates=K: 0..K-1)
PLATFORM_TAG = "platform"  # the device's platform the run ran on (cpu, gpu): a rerun on CPU must be bit for bit


def replicate(tags: dict) -> int:
    """A run's place in its program's batch (runs logged before replicates were tagged: 0)."""
    return int(tags.get(REPLICATE_TAG, "0") or 0)


def batch_key(tags: dict) -> tuple:
    """What the runs of one job share (``replicates=K``: its K runs): config hash and parent run."""
    return tags.get(HASH_TAG), tags.get(PARENT_TAG, "")


DATA_TAG = "data_digest"
FILE_TAG = "data_sha256."  # + counts, offsets, covariates (CSV data sets)

# The fields compared by ``rerun``, in the order they are printed: (tag, what it is)
ENV_FIELDS = (
    ("jax_version", "jax version"),
    ("jaxlib_version", "jaxlib version"),
    ("optax_version", "optax version"),
    (PLATFORM_TAG, "platform"),
    ("device_kind", "device kind"),
    ("x64", "x64"),
    ("XLA_FLAGS", "XLA_FLAGS"),
    ("git_commit", "git commit"),
    ("git_dirty", "git tree dirty"),
    (DATA_TAG, "data hash"),
    (VERSION_TAG, "plnexp version"),
)


def package_version() -> str:
    from ..system.version import VERSION

    return VERSION


# Keys added to the config after provenance format 1, hashed only away from their default so that
# the configs of older runs keep their hash (resume=true and rerun still match them):
# (section, key) -> (default, the section's names it was added to; None: all)
ADDED_KEYS = {
    ("strategy", "mode"): ("default", None),
    ("dataset", "replication"): (1, ("synthetic", "csv")),
    ("dataset", "sparse"): (False, ("synthetic_pca", "anndata")),
}  # oaks always had it
# Provenance format 1 gave every strategy the union of all strategies' options (their defaults where
# the strategy had no use for them); a strategy entry now owns its options. The hash keeps format 1's
# form: the options a strategy does not have enter it at these values (mode: via ADDED_KEYS).
FORMAT1_STRATEGY_OPTIONS = {"unroll": 8, "tol": 1e-6, "patience": 10}
# Top-level keys added after format 1, hashed only away from their default likewise
ADDED_TOP_KEYS = {"replicates": 1, "processes": 1}


# Keys of the data set that change no fit, only how its runs are scored (dataset.optimum: the best
# known ELBO, plnexp.fitting.optimum): neither hashed nor compared.
UNHASHED_DATASET = ("optimum",)


def _fit_identity(config: Config) -> dict:
    d = {k: v for k, v in config.as_dict().items() if k not in UNHASHED}
    d["dataset"] = {k: v for k, v in d["dataset"].items() if k not in UNHASHED_DATASET}
    return d


def hashed(config: Config) -> dict:
    """The part of the resolved config (:meth:`Config.as_dict`) that identifies a fit's result, in
    provenance format 1's form: without the :data:`UNHASHED` fields, nor the :data:`ADDED_KEYS` at
    their default, with :data:`FORMAT1_STRATEGY_OPTIONS` where the strategy has no such option."""
    d = _fit_identity(config)
    d["strategy"] = {**FORMAT1_STRATEGY_OPTIONS, **d["strategy"]}
    for (section, key), (default, names) in ADDED_KEYS.items():
        part = d.get(section, {})
        if part.get(key, default) == default and (names is None or part.get("name") in names):
            d[section] = {k: v for k, v in part.items() if k != key}
    for key, default in ADDED_TOP_KEYS.items():
        if d.get(key, default) == default:
            d.pop(key, None)
    return d


def comparable(config: Config) -> dict[str, str]:
    """The config's fields that identify a fit's result, flat and as MLflow params hold them
    (``strategy.unroll`` only where the strategy has it): what ``resume=true`` compares with a run."""
    from .config import flatten

    return {k: str(v) for k, v in flatten(_fit_identity(config)).items()}


def migrate_node(node: dict) -> dict:
    """A logged config.yaml of format 1 (every strategy carrying every option) in today's form: the
    strategy section keeps only the options its entry has."""
    from ..strategies import STRATEGIES

    strat = node.get("strategy")
    if isinstance(strat, dict) and strat.get("name") in STRATEGIES:
        from dataclasses import fields

        own = {f.name for f in fields(STRATEGIES[strat["name"]].options)}
        node = {**node, "strategy": {k: v for k, v in strat.items() if k == "name" or k in own}}
    return node


def config_hash(config: Config) -> str:
    """sha256 of :func:`hashed` (what ``resume=true`` matches a job to a FINISHED run on)."""
    return hashlib.sha256(json.dumps(hashed(config), sort_keys=True, default=str).encode()).hexdigest()


def file_sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def data_files(config: Config) -> dict[str, str]:
    """The files of a CSV data set: ``{"counts": path, ...}`` (empty for generated data)."""
    ds = config.dataset
    if ds.name != "csv":
        return {}
    return {k: getattr(ds, k) for k in ("counts", "offsets", "covariates") if getattr(ds, k)}


def command_line(argv: list[str] | None = None) -> str:
    argv = list(sys.argv if argv is None else argv)
    if argv and Path(argv[0]).name == "__main__.py" and Path(argv[0]).parent.name == "plnexp":
        return " ".join(["python -m plnexp", *argv[1:]])
    return " ".join(argv)


def seeds(config: Config) -> str:
    out = [f"seed={config.seed}"]
    if hasattr(config.dataset, "seed"):
        out.append(f"dataset.seed={config.dataset.seed}")
    return " ".join(out)


@lru_cache(maxsize=1)
def git_commit() -> str:
    """The checkout's commit, with ``-dirty`` when tracked files differ from it; "unknown" for an
    installed wheel (its version is logged apart) or outside git."""
    if CHECKOUT is None:
        return "unknown"

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, timeout=5).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        dirty = git("status", "--porcelain", "--untracked-files=no").strip()
        return (commit + ("-dirty" if dirty else "")) if commit else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment_tags(config: Config) -> dict[str, str]:
    """What this process would run ``config`` with: versions, device, x64, XLA_FLAGS, git, plnexp, and
    where it runs (host, CPU, the SLURM job)."""
    import jax
    import jaxlib
    import optax

    from ..core.device import resolve_device

    dev = resolve_device(config.device.value)
    commit = git_commit()
    tags = {
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "optax_version": optax.__version__,
        PLATFORM_TAG: dev.platform,
        "device_kind": dev.device_kind,
        "x64": str(config.precision.x64),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        "git_commit": commit,
        "git_dirty": str(commit.endswith("-dirty")).lower(),
        VERSION_TAG: package_version(),
        "python": platform.python_version(),
        "host": platform.node(),
        "cpu_model": cpu_model(),
    }
    tags.update(slurm_tags())
    if config.strategy.name in TORCH_STRATEGIES:  # only these runs import torch
        import torch

        tags["torch_version"] = torch.__version__
    if config.strategy.name in NATIVE_STRATEGIES:  # the kernel's code path this process runs (PLNEXP_FUSED_ISA)
        try:
            tags["fused_isa"] = fused.isa()
        except ValueError:
            pass  # kernel missing or path refused: the run fails at its strategy's check, which says why
    return tags


# tag -> the variable SLURM sets in a job
SLURM_VARIABLES = {
    "slurm_job_id": "SLURM_JOB_ID",
    "slurm_array_job_id": "SLURM_ARRAY_JOB_ID",
    "slurm_array_task_id": "SLURM_ARRAY_TASK_ID",
    "slurm_node": "SLURMD_NODENAME",
    "slurm_partition": "SLURM_JOB_PARTITION",
    "slurm_cluster": "SLURM_CLUSTER_NAME",
}


def slurm_tags(environ=os.environ) -> dict[str, str]:
    """Where a run ran on a SLURM cluster (the variables SLURM set that are present); {} elsewhere."""
    if not environ.get("SLURM_JOB_ID"):
        return {}
    return {tag: environ[var] for tag, var in SLURM_VARIABLES.items() if environ.get(var)}


def run_tags(config: Config) -> dict[str, str]:
    """The provenance tags of a job's run besides :func:`environment_tags`, written when it is created."""
    tags = {
        FORMAT_TAG: PROVENANCE_VERSION,
        HASH_TAG: config_hash(config),
        REPLICATE_TAG: "0",
        "command": command_line(),
        "seeds": seeds(config),
    }
    for key, path in data_files(config).items():
        tags[FILE_TAG + key] = file_sha256(path)
    return tags


def environment(config: Config, data_digest: str) -> dict[str, str]:
    """The :data:`ENV_FIELDS` of this process for ``config`` (its device and precision), credentials
    masked as the recorded tags hold them (:mod:`plnexp.system.redact`): compared like with like, and printed."""
    env = {**environment_tags(config), DATA_TAG: data_digest}
    return redact({k: env.get(k, "") for k, _ in ENV_FIELDS})


def differences(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """One line per :data:`ENV_FIELDS` entry that differs (a field the original did not record too)."""
    lines = []
    for key, what in ENV_FIELDS:
        old, new = recorded.get(key), current.get(key, "")
        if key == "git_dirty" and old is None and "git_commit" in recorded:  # older runs: from the commit
            old = str(recorded["git_commit"].endswith("-dirty")).lower()
        if old != new:
            lines.append(f"{what} ({key}): {'(not recorded)' if old is None else repr(old)} -> {new!r}")
    return lines


def changed_files(recorded: dict[str, str], config: Config) -> list[str]:
    """One line per data file whose sha256 differs from the one recorded on the original run."""
    lines = []
    for key, path in data_files(config).items():
        old = recorded.get(FILE_TAG + key)
        if old is None:
            continue
        new = file_sha256(path)
        if new != old:
            lines.append(
                f"dataset.{key} file {path} changed since the original run (sha256 {old[:12]}... -> {new[:12]}...)"
            )
    return lines


def curve_difference(old: np.ndarray, new: np.ndarray) -> tuple[bool, float]:
    """(bit for bit equal, max relative difference over the common iterations; inf if lengths differ)."""
    old, new = np.asarray(old, dtype=np.float64), np.asarray(new, dtype=np.float64)
    if old.shape != new.shape:
        n = min(len(old), len(new))
        _, rel = curve_difference(old[:n], new[:n]) if n else (False, 0.0)
        return False, rel
    if np.array_equal(old, new):
        return True, 0.0
    scale = np.maximum(np.abs(old), np.finfo(np.float64).tiny)
    return False, float(np.max(np.abs(new - old) / scale))
