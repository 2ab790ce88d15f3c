"""Float64 host (numpy) evaluation of the ELBO: the exact number every jitted result is checked against.

Independent of XLA, so it cannot share a compiler bug with the jitted code path.
"""

from __future__ import annotations

import numpy as np
from scipy.special import gammaln


def log_factorial_sum(Y: np.ndarray) -> float:
    """sum_ij log(Y_ij!) with the exact log-gamma, in float64 on the host."""
    return float(np.sum(gammaln(np.asarray(Y, dtype=np.float64) + 1.0)))


def elbo(Y, O, X, B, M, S, Sigma, *, log_factorial: bool = True) -> float:
    """ELBO at (B, centred M, S, Sigma) in float64; with the exact log(y!) unless told otherwise."""
    Y, O, X, B, M, S, Sigma = (np.asarray(a, dtype=np.float64) for a in (Y, O, X, B, M, S, Sigma))
    n, p = M.shape
    Z = O + X @ B + M
    S2 = S * S
    poisson = np.sum(Y * Z - np.exp(Z + S2 / 2)) + 0.5 * np.sum(np.log(S2))
    L = np.linalg.cholesky(Sigma)
    logdet_sigma = 2.0 * np.sum(np.log(np.diag(L)))
    second_moment = M.T @ M + np.diag(S2.sum(axis=0))
    # tr(Sigma^-1 C) through two triangular solves of the Cholesky factor
    trace = np.trace(np.linalg.solve(L.T, np.linalg.solve(L, second_moment)))
    value = poisson - 0.5 * n * logdet_sigma - 0.5 * trace + 0.5 * n * p
    return float(value - log_factorial_sum(Y)) if log_factorial else float(value)

