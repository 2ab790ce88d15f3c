"""plnexp's fit format: a :class:`~plnexp.fitting.result.FitResult` kept on disk, portable, no code.

A saved fit is a folder of two files (docs/how-to/use-a-fitted-model.md):

- ``plnexp-fit.json``: ``"format": "plnexp-fit"``, ``"format_version"`` (:data:`FORMAT_VERSION`),
  the versions that wrote it (plnexp, jax, numpy), the model, strategy, optimizer, precision,
  device, iterations run, replicate, the final ELBO (``loglik``), the ELBO curve (``elbo``, one
  value per iteration asked for, ``null`` past the iterations run), the fit's spec (``spec``), the
  data's names (``names``: variables, covariates, rows, n), the timing's figures, the result's
  other fields (``fields``: e.g. its convergence) and each array's shape and dtype (``arrays``).
  A number that is not finite is written ``{"float": "nan"}`` (``"inf"``, ``"-inf"``): strict JSON.
- ``arrays.npz``: the parameters (``B``, ``M``, ``S``, ``Sigma``; PLN-PCA: ``B``, ``C``, ``M``,
  ``S``) as float64 arrays (NumPy's ``.npz``, read with ``allow_pickle=False``): bit for bit.

The JSON is written last (each file whole, renamed into place), so a folder with it is complete.
A format version this plnexp does not read, or a folder that is not a plnexp fit, is one line
(:class:`FitFileError`).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..measure import timing as timing_module
from ..system.paths import write_atomic

if TYPE_CHECKING:
    from .result import DataNames, FitResult

FORMAT = "plnexp-fit"
FORMAT_VERSION = 1
DESCRIPTION = "plnexp-fit.json"
ARRAYS = "arrays.npz"
# FitResult's fields written under their own keys; any other field (added later: convergence) goes
# under "fields" when its value is a plain number, string, boolean or None
_TEXT = ("model", "strategy", "optimizer", "precision", "device")  # written and read as they are
_OWN = (*_TEXT, "elbo", "loglik", "params", "n_iter", "timing", "extra", "replicate", "names")


class FitFileError(ValueError):
    """A path that is not a plnexp fit this plnexp reads: one line naming it and what is allowed."""


def describe(spec) -> dict:
    """The JSON-able description of a :class:`~plnexp.fitting.spec.FitSpec`: what was fitted, and how."""
    options = spec.strategy.options
    return {
        "model": spec.model.name,
        "rank": spec.model.rank if spec.model.name == "pca" else None,
        "block_rows": getattr(spec.model, "block_rows", None),
        "optimizer": spec.optimizer.name,
        "lr": spec.optimizer.lr,
        "strategy": spec.strategy.name,
        "strategy_options": _plain(vars(options)) if dataclasses.is_dataclass(options) else {},
        "precision": spec.precision.name,
        "device": spec.device,
        "n_iter": spec.n_iter,
        "init": spec.init,
        "gradient": spec.gradient,
        "seed": spec.seed,
        "replicates": spec.replicates,
    }


def _number(x):
    x = float(x)
    return x if math.isfinite(x) else {"float": repr(x)}


def _plain(value):
    """``value`` as strict JSON values (numpy scalars as Python's, non-finite floats tagged), or
    ``None`` where it has none (then left out by the caller)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return _number(value)
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return items if all(i is not _SKIP for i in items) else _SKIP
    if isinstance(value, dict):
        out = {str(k): _plain(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not _SKIP}
    return _SKIP


_SKIP = object()


def _unplain(value):
    if isinstance(value, dict):
        if set(value) == {"float"}:
            return float(value["float"])
        return {k: _unplain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unplain(v) for v in value]
    return value


def _versions() -> dict:
    import jax

    from ..system.version import VERSION

    return {"plnexp": VERSION, "jax": jax.__version__, "numpy": np.__version__}


def description(res: FitResult) -> dict:
    """The JSON document of ``res`` (module docstring)."""
    elbo = np.asarray(res.elbo, dtype=np.float64)
    fields = {}
    for f in dataclasses.fields(res):
        if f.name not in _OWN:
            value = _plain(getattr(res, f.name))
            if value is not _SKIP:
                fields[f.name] = value
    t = res.timing
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "versions": _versions(),
        **{k: getattr(res, k) for k in _TEXT},
        "n_iter": int(res.n_iter),
        "replicate": int(res.replicate),
        "loglik": _number(res.loglik),
        "elbo": [float(v) if math.isfinite(v) else None for v in elbo.tolist()],
        "spec": _plain(res.extra.get("spec", {})),
        "names": _plain(dataclasses.asdict(res.names)) if res.names is not None else None,
        "extra": _plain({k: v for k, v in res.extra.items() if k != "spec"}),
        "timing": _plain({**t.as_metrics(), "fingerprint": t.fingerprint, "runs_s": list(t.runs_s)}),
        "fields": fields,
        "arrays": {k: {"shape": list(np.shape(v)), "dtype": "float64"} for k, v in res.params.items()},
    }


def save(res: FitResult, path) -> Path:
    """Write ``res`` to the folder ``path`` (created; a plnexp fit there is replaced); returns it.
    A file, or a folder holding other things, is refused in one line."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise FitFileError(f"{folder}: a file; allowed is a folder path (new, or a plnexp fit's) to save the fit in")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / DESCRIPTION).is_file():
        raise FitFileError(f"{folder}: a folder holding other files; allowed is a new folder or a plnexp fit's")
    folder.mkdir(parents=True, exist_ok=True)
    doc = description(res)
    arrays: dict[str, Any] = {k: np.asarray(v, dtype=np.float64) for k, v in res.params.items()}

    buffer = io.BytesIO()  # np.savez seeks: written whole, then copied
    np.savez(buffer, **arrays)
    write_atomic(folder / ARRAYS, buffer.getvalue())
    write_atomic(folder / DESCRIPTION, json.dumps(doc, indent=1, allow_nan=False))
    return folder


def load(path, result_type: type[FitResult], names_type: type[DataNames]) -> FitResult:
    """The :class:`FitResult` saved in the folder ``path`` (:func:`save`), made with ``result_type``
    and ``names_type`` (:func:`plnexp.fitting.result.load_fit` passes them: this module imports neither)."""
    folder = Path(path)
    allowed = f"allowed are folders written by FitResult.save (holding {DESCRIPTION}) or runs:/RUN_ID"
    if not folder.exists():
        raise FitFileError(f"{folder}: not found; {allowed}")
    if not (folder / DESCRIPTION).is_file():
        raise FitFileError(f"{folder}: not a plnexp fit (no {DESCRIPTION}); {allowed}")
    try:
        doc = json.loads((folder / DESCRIPTION).read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise FitFileError(f"{folder / DESCRIPTION}: not JSON ({e}); {allowed}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise FitFileError(
            f"{folder / DESCRIPTION}: not a plnexp fit (format {doc.get('format') if isinstance(doc, dict) else None!r}); {allowed}"
        )
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        wrote = doc.get("versions", {}).get("plnexp", "?")
        raise FitFileError(
            f"{folder}: plnexp fit format version {version!r} (written by plnexp {wrote}); this plnexp reads "
            f"format version {FORMAT_VERSION}: load it with the plnexp that wrote it"
        )
    try:
        with np.load(folder / ARRAYS, allow_pickle=False) as npz:
            params = {k: npz[k] for k in doc["arrays"]}
    except (OSError, KeyError, ValueError) as e:
        raise FitFileError(f"{folder / ARRAYS}: unreadable or incomplete ({e}); {allowed}") from None
    t = _unplain(doc.get("timing", {}))
    timing = timing_module.Timing(
        **{k: t[k] for k in ("compile_s", "first_call_s", "run_s", "ms_per_iter") if k in t},
        runs_s=tuple(t.get("runs_s", ())),
        fingerprint=t.get("fingerprint", ""),
    )
    names = doc.get("names")
    extra = _unplain(doc.get("extra", {}))
    extra["spec"] = _unplain(doc.get("spec", {}))
    known = {f.name for f in dataclasses.fields(result_type)}
    others = {k: v for k, v in _unplain(doc.get("fields", {})).items() if k in known and k not in _OWN}
    return result_type(
        elbo=np.array([np.nan if v is None else v for v in doc["elbo"]], dtype=np.float64),
        loglik=float(_unplain(doc["loglik"])),
        params=params,
        n_iter=int(doc["n_iter"]),
        timing=timing,
        extra=extra,
        replicate=int(doc.get("replicate", 0)),
        names=None if names is None else _names(names, names_type),
        **{k: doc[k] for k in _TEXT},
        **others,
    )


def _names(d: dict, names_type: type[DataNames]) -> DataNames:
    """The names as written (``dataclasses.asdict``), their lists as tuples (first_row and data: later, defaulted)."""
    tup = lambda v: None if v is None else tuple(v)
    return names_type(
        **{
            **d,
            "variables": tup(d.get("variables")),
            "rows": tup(d.get("rows")),
            "covariates": tuple(d.get("covariates", ())),
        }
    )
