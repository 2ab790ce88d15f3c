"""A data set's best known ELBO: the optimum every run's convergence is measured against.

A run's own best ELBO says nothing of a run that stalls far from the optimum; the best known ELBO
of its data does (:mod:`plnexp.measure.convergence` turns it into the run's gap metrics). Per data set and
model family (the full and profiled models share their optimum: the profiled one only holds B at
its closed form), in this order:

- **given**: ``dataset.optimum=VALUE`` (the ELBO with the exact log y!, of the data as fitted:
  replication included);
- **shipped**: the oaks data as the package ships it (intercept only): :data:`SHIPPED`, the float64
  fit below run to 20,000 iterations;
- **cached**: computed earlier on this machine, read from ``optima.json`` beside the floor's cache
  (:func:`plnexp.measure.floor.cache_dir`), keyed by the data's digest and the model family;
- **computed**: otherwise, once, by a tight float64 plnexp fit (:data:`FIT`; a one-line message
  says so while it runs), checked for stationarity (:func:`plnexp.core.reference.elbo_gradient_max`, the
  largest entry of the ELBO's gradient at its end, kept with the value), then cached atomically
  with the fit's settings.

PLN-PCA (``model=pca``) has no best known ELBO yet: its optimum is not the PLN's (another
variational family, a rank-q Sigma), so :func:`family` and :func:`for_dataset` give None for it and
a pca run has no convergence metrics, rather than being scored against the PLN optimum.

Replicated rows (``dataset.replication=r``): the optimum of the data before replication, times r
(the optimal M and S repeat with the rows; Sigma is the same). The fit is made on the data before
replication, so oaks x100's optimum costs nothing and a large replicated set costs one small fit.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..core.data import Data

log = logging.getLogger(__name__)

CACHE_FILE = "optima.json"
CACHE_FORMAT = 1
# The fit that computes an optimum: float64, the profiled model (B in closed form), rprop (it
# reaches oaks's optimum to 1e-12 relative: docs/concepts/convergence.md), stopped by while_loop
# once the relative ELBO change stays below tol for `patience` iterations in a row.
FIT: dict[str, Any] = {
    "model": "profiled",
    "optimizer": "rprop",
    "strategy": "while_loop",
    "precision": "float64",
    "init": "data",
    "n_iter": 20000,
    "tol": 1e-12,
    "patience": 50,
}
# max |gradient| above which a computed optimum is said not to be stationary. Not 0: rprop's
# smallest step (1e-6) leaves |gradient| ~ curvature x 1e-6 where the curvature is largest (an S
# near 0: 1/S^2); on oaks 4e-3 after 2,000 iterations and still after 20,000, the ELBO then
# constant to 1e-12 relative (adam's, 0.5 nats short after 2,000, has 0.6).
STATIONARY = 1e-2
# The families of models sharing an optimum (one ELBO, parametrised differently); a model mapped
# to None has no best known ELBO (pca: see the module's docstring).
FAMILY: dict[str, str | None] = {"full": "pln", "profiled": "pln", "pca": None}
# Shipped data: name -> (its digest, plnexp.core.data.Data.digest; the model family; the ELBO with the
# exact log y!). oaks: the FIT above run 20,000 iterations (the ELBO constant to 1e-12 relative from
# 2,000 on; max |gradient| 4.3e-3); PLNmodels' published -32028.47 uses Ramanujan's log y!.
SHIPPED = {
    "oaks": ("5bae55a8db6151a2e29f047a4273f80b4e02de88be4316f69442ad5ed41c01c1", "pln", -32026.0156956),
}


@dataclass(frozen=True)
class Optimum:
    """The best known ELBO (exact log y!) of the data as fitted, and where it comes from."""

    elbo: float
    source: str  # given | shipped | cached | computed
    grad_max: float = math.nan  # largest |gradient| entry at the computing fit's end (computed, cached)
    n_iter: int = 0  # iterations of the computing fit

    def tags(self) -> dict[str, str]:
        return {"plnexp.optimum_source": self.source}

    def metrics(self) -> dict[str, float]:
        out = {"optimum_elbo": self.elbo}
        if math.isfinite(self.grad_max):
            out["optimum_grad_max"] = self.grad_max
        return out


def family(model: str) -> str | None:
    """The family of models sharing ``model``'s optimum; None where none is known (pca)."""
    return FAMILY.get(model, model)


def cache_path() -> Path:
    from ..measure.floor import cache_dir

    return cache_dir() / CACHE_FILE


def _read(path: Path) -> dict[str, dict]:
    """The cache's entries; empty when missing, unreadable, corrupt or of another format."""
    from ..measure.floor import finite, kept, read_cache

    entries = read_cache(path, format=CACHE_FORMAT).get("entries")
    return kept(entries, lambda v: isinstance(v, dict) and finite(v.get("elbo")))


def store(key: str, entry: dict) -> None:
    """Add ``entry`` to the cache (read again just before: another job may have added one), replaced
    atomically."""
    from ..system.paths import write_atomic

    path = cache_path()
    entries = _read(path)
    entries[key] = entry
    write_atomic(path, json.dumps({"format": CACHE_FORMAT, "entries": entries}, indent=1, sort_keys=True))


def compute(data: Data) -> dict:
    """The tight float64 fit of :data:`FIT` on ``data``: its exact ELBO at the end (the float64 host
    value), the largest entry of the gradient there, the iterations it took, its settings."""
    from . import engine as fitting
    from ..core import reference
    from .spec import parse

    settings = dict(FIT)
    spec = parse(**settings)  # its compile through JAX's persistent cache, as any plnexp.fit's
    t0 = time.monotonic()
    res = fitting.run(data, spec, timed=False)
    p = res.params
    grad = reference.elbo_gradient_max(data.Y, data.O, data.X, p["B"], p["M"], p["S"], p["Sigma"])
    return {
        "elbo": float(res.loglik),
        "grad_max": float(grad),
        "n_iter": int(res.n_iter),
        "fit_s": round(time.monotonic() - t0, 3),
        "settings": settings,
        "data": data.name,
        "shape": [data.n, data.p, data.d],
    }


def best_known(base: Data, model: str, replication: int = 1) -> Optimum:
    """The best known ELBO of ``base`` (the data before replication) stacked ``replication`` times,
    for ``model``'s family: shipped, cached or computed (see the module's docstring; a given one:
    :func:`for_dataset`)."""
    fam = family(model)
    if fam is None:
        raise ValueError(
            f"model={model}: has no best known ELBO; allowed models are {', '.join(k for k, v in FAMILY.items() if v)}"
        )
    digest = base.digest()
    for ship_digest, ship_family, elbo in SHIPPED.values():
        if ship_digest == digest and ship_family == fam:
            return Optimum(replication * elbo, "shipped")
    key = f"{digest}:{fam}"
    entry = _read(cache_path()).get(key)
    source = "cached"
    if entry is None:
        log.info(
            "plnexp: %s (%d x %d) has no best known ELBO yet: computing it once with a float64 %s fit "
            "(%s, while_loop tol %g), cached in %s",
            base.name,
            base.n,
            base.p,
            FIT["model"],
            FIT["optimizer"],
            FIT["tol"],
            cache_path(),
        )
        entry, source = compute(base), "computed"
        try:
            store(key, entry)
        except OSError as e:  # a cache that cannot be written: the value still serves this run
            log.warning("plnexp: the best known ELBO could not be cached (%s): computed again next time", e)
        stationary = "" if entry["grad_max"] <= STATIONARY else f" (NOT stationary: above {STATIONARY:g})"
        log.info(
            "plnexp: %s: best known ELBO %.10g after %d iterations, max |gradient| %.1e%s",
            base.name,
            entry["elbo"],
            entry["n_iter"],
            entry["grad_max"],
            stationary,
        )
    return Optimum(
        replication * entry["elbo"], source, float(entry.get("grad_max", math.nan)), int(entry.get("n_iter", 0))
    )


def for_dataset(spec, model: str, load=None) -> Optimum | None:
    """The best known ELBO of the data set ``spec`` (a :class:`plnexp.jobs.dataset_specs.DatasetSpec`) as fitted
    (its replication included). ``load``: how the data before replication is loaded (the runner's
    cached loader), ``spec.load`` by default. ``dataset.optimum=false``, or a model without a family
    (pca): None (no convergence metrics)."""
    if family(model) is None:
        return None
    given = getattr(spec, "optimum", None)
    if given is False:
        return None
    if given is not None:
        return Optimum(float(given), "given")
    base_spec = replace(spec, replication=1)
    base = (load or (lambda s: s.load()))(base_spec)
    return best_known(base, model, spec.replication)
