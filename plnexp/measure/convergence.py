"""How far a run got, and how fast: its ELBO curve against its data's best known ELBO.

Pure functions of numbers (a leaf module: numpy only); :mod:`plnexp.experiment.runner` logs what
:func:`run_metrics` and :func:`gap_curve` return for every run whose data has a best known ELBO
(:mod:`plnexp.fitting.optimum`), and the reports read them back.

- ``gap_final_rel``: (optimum - ELBO) / |optimum| at the run's final parameters, the ELBO being the
  float64 host value there (:func:`plnexp.core.reference.elbo`, exact log y!), never the compiled one: a
  float32 run is scored on what its parameters are worth, not on its own rounding. Never negative
  (a run that beats the best known is at 0: the best known is then not the best).
- ``gap_resolution_rel``: the smallest relative gap this run's compiled ELBO curve can tell
  (:func:`resolution`): the larger of the rounding a sum of n*p terms carries, eps * sqrt(n*p), and
  what the compiled ELBO at the final state was off from the float64 host's. float32 on oaks:
  1.4e-5, where its curve was seen to end 3.8e-6 and peak 1.2e-5 *above* the optimum; float64: 2e-14.
- ``iters_to_<eps>``, ``s_to_<eps>`` for eps in :data:`EPSILONS`: the iterations (updates) until the
  curve is first within eps of the optimum (relative), and the steady run seconds that took:
  ``run_s * iterations / n_iter_run`` (the fit's median steady time, shared evenly by its
  iterations). Absent where never reached, and where eps is not above the run's resolution (float32:
  1e-3 only, on oaks): a curve cannot tell a gap smaller than its rounding.
- ``gap_rel_log10`` (a step metric): log10 of the relative gap of each iteration, floored at the
  resolution: a run that stalls reads as a flat line above the others on MLflow's chart.
"""

from __future__ import annotations

import math

import numpy as np

EPSILONS = (1e-3, 1e-5, 1e-7)


def eps_key(eps: float) -> str:
    """``1e-3`` for 0.001: the suffix of the metrics of ``eps``."""
    mantissa, exponent = f"{eps:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def iters_key(eps: float) -> str:
    return f"iters_to_{eps_key(eps)}"


def seconds_key(eps: float) -> str:
    return f"s_to_{eps_key(eps)}"


def gap_rel(curve, optimum: float) -> np.ndarray:
    """(optimum - ELBO) / |optimum| per iteration (negative where the curve is above the optimum:
    rounding, or a best known that is not the best)."""
    return (optimum - np.asarray(curve, dtype=np.float64)) / abs(optimum)


def first_within(curve, optimum: float, eps: float) -> int | None:
    """The first iteration i whose ELBO (``curve[i]``, before update i: after i updates) is within
    ``eps`` of the optimum, relative; None where none is."""
    hits = np.flatnonzero(gap_rel(curve, optimum) <= eps)
    return int(hits[0]) if len(hits) else None


def resolution(eps: float, size: int, optimum: float, compiled_final: float, host_final: float) -> float:
    """The smallest relative gap a compiled curve can tell (see the module's docstring): ``eps``, the
    precision's machine epsilon; ``size``, n*p entries summed; the compiled and float64 host ELBOs at
    the final state."""
    rounding = eps * math.sqrt(max(size, 1))
    off = abs(compiled_final - host_final) / abs(optimum) if math.isfinite(compiled_final - host_final) else 0.0
    return max(rounding, off)


def gap_final(optimum: float, host_final: float) -> float:
    """``gap_final_rel``: never negative."""
    return max(0.0, (optimum - host_final) / abs(optimum))


def run_metrics(
    curve,
    optimum: float,
    host_final: float,
    compiled_final: float,
    eps: float,
    size: int,
    run_s: float,
    n_iter_run: int,
) -> dict[str, float]:
    """A run's convergence metrics (see the module's docstring)."""
    res = resolution(eps, size, optimum, compiled_final, host_final)
    out = {"gap_final_rel": gap_final(optimum, host_final), "gap_resolution_rel": res}
    for target in EPSILONS:
        if target <= res:
            continue
        k = first_within(curve, optimum, target)
        if k is None:
            continue
        out[iters_key(target)] = float(k)
        if math.isfinite(run_s) and n_iter_run > 0:
            out[seconds_key(target)] = run_s * k / n_iter_run
    return out


def gap_curve(curve, optimum: float, floor: float) -> np.ndarray:
    """``gap_rel_log10``: log10 of each iteration's relative gap, no lower than ``floor`` (the
    resolution)."""
    return np.log10(np.maximum(gap_rel(curve, optimum), max(floor, np.finfo(np.float64).tiny)))


def while_stop(curve, tol: float, patience: int) -> int:
    """How many iterations ``while_loop`` (:func:`plnexp.strategies.loops.while_program`) runs on
    this ELBO curve: it stops after the iteration at which the relative change
    |e_i - e_(i-1)| / |e_(i-1)| has been below ``tol`` ``patience`` times in a row; the whole curve
    where it never does. (The curve of a scan of the same fit: while_loop's are the same iterations.)"""
    c = np.asarray(curve, dtype=np.float64)
    calm = 0
    for i in range(1, len(c)):
        calm = calm + 1 if abs(c[i] - c[i - 1]) / abs(c[i - 1]) < tol else 0
        if calm >= patience:
            return i + 1
    return len(c)


# How a fit ended (plnexp.fitting.engine puts it on every FitResult: converged, gap_to_best, at_best).
# Converged: over its last WINDOW iterations its ELBO, averaged over BLOCK iterations at each end (the
# compiled values step by their rounding: float32 rounds oaks' to 0.125 nats), rose by at most
# CONVERGED_RTOL (relative) plus CURVE_ULPS/2 rounding steps of the compiled values. 1e-6 over 500
# iterations: a fit still that far from its optimum gains more (docs/results.md, "Defaults that converge").
WINDOW = 500
BLOCK = 50
CONVERGED_RTOL = 1e-6
CURVE_ULPS = 4


def ending(curve, compiled_final: float, eps: float, size: int, log_factorial: float = 0.0) -> tuple[bool, float, bool]:
    """How a fit ended, from its compiled ELBO curve (``curve[i]`` before update i, the iterations
    run, with the exact log y!) and its compiled ELBO at the final state: (converged, gap_to_best,
    at_best).

    ``converged``: the mean of its last :data:`BLOCK` ELBOs exceeds that of the block :data:`WINDOW`
    iterations earlier (or its first, in a shorter fit) by at most :data:`CONVERGED_RTOL` relative
    plus two rounding steps of the compiled values (it may have fallen: a drifting fit is converged,
    not at its best). ``gap_to_best``: the best ELBO it reached minus its final one, in nats (>= 0),
    both compiled. ``at_best``: that gap is within the rounding of a sum of ``size`` = n*p terms in
    a precision of machine epsilon ``eps`` (``eps * sqrt(size)`` relative: :func:`resolution`'s), or
    within :data:`CURVE_ULPS` rounding steps of the compiled values themselves (they are the partial
    ELBO, ``ELBO + log_factorial`` with ``log_factorial`` = sum log y!, often far larger), so that
    rounding is not taken for a drift. A non-finite curve or final: (False, nan, False)."""
    c = np.asarray(curve, dtype=np.float64)
    if not len(c) or not np.all(np.isfinite(c)) or not math.isfinite(compiled_final):
        return False, math.nan, False
    scale = abs(compiled_final) or 1.0
    step = eps * abs(compiled_final + log_factorial)  # the compiled values' rounding step, about
    n = len(c)
    block = max(1, min(BLOCK, n // 4))
    back = min(WINDOW, n - block)
    gain = float(np.mean(c[n - block :]) - np.mean(c[n - block - back : n - back])) if back > 0 else math.inf
    converged = gain <= CONVERGED_RTOL * scale + 2 * step
    gap = max(float(c.max()) - compiled_final, 0.0)
    at_best = gap <= max(eps * math.sqrt(max(size, 1)) * scale, CURVE_ULPS * step)
    return bool(converged), gap, bool(at_best)
