"""Independent float64 numpy implementations used by the tests (not plnexp.core.reference)."""

from __future__ import annotations

import numpy as np
from scipy.special import gammaln


def elbo_np(Y, O, X, B, M, S, Sigma):
    """ELBO of the PLN model at (B, centred M, S, Sigma) with the exact log(y!), float64."""
    Y, O, X, B, M, S, Sigma = (np.asarray(a, np.float64) for a in (Y, O, X, B, M, S, Sigma))
    n, p = Y.shape
    Omega = np.linalg.inv(Sigma)  # a plain inverse on purpose: independent of the Cholesky path
    Z = O + X @ B + M
    expected_loglik = np.sum(Y * Z - np.exp(Z + S**2 / 2) - gammaln(Y + 1))
    _, logdet_omega = np.linalg.slogdet(Omega)
    prior = 0.5 * n * logdet_omega - 0.5 * (
        np.einsum("ij,jk,ik->", M, Omega, M) + np.sum(np.diag(Omega) * np.sum(S**2, 0))
    )
    entropy = 0.5 * np.sum(np.log(S**2)) + 0.5 * n * p
    return expected_loglik + prior + entropy


def profiled_closed_forms(X, M_full, S):
    """B = (X'X)^-1 X'M and Sigma = (R'R + diag(sum S^2))/n with R = M - XB, by lstsq."""
    B = np.linalg.lstsq(X, M_full, rcond=None)[0]
    R = M_full - X @ B
    return B, R, (R.T @ R + np.diag(np.sum(S**2, 0))) / len(R)


def profiled_elbo_and_grad(Y, O, X, M_full, S):
    """Profiled ELBO (B, Sigma at closed forms) and its analytic gradient in (M, S)."""
    B, R, Sigma = profiled_closed_forms(X, M_full, S)
    Omega = np.linalg.inv(Sigma)
    value = elbo_np(Y, O, X, B, R, S, Sigma)
    A = np.exp(O + M_full + S**2 / 2)
    grad_M = Y - A - R @ Omega  # envelope theorem: B and Sigma are at their optima
    grad_S = -A * S + 1.0 / S - S * np.diag(Omega)
    return value, grad_M, grad_S


def pca_elbo_np(Y, O, X, B, C, M, S):
    """ELBO of PLN-PCA at (B (d, p), C (p, q), M (n, q), S (n, q)) with the exact log(y!), float64:
    each row's latent W_i ~ N(M_i, diag(S_i^2)) against its N(0, I) prior, Z_i = O_i + X_i B + C W_i.
    Written per row from the Gaussian moments (E exp(Z_ij) = exp(mean_ij + var_ij / 2), var_ij the
    variance of (C W_i)_j) and the KL divergence of two Gaussians: independent of plnexp.core.reference."""
    Y, O, X, B, C, M, S = (np.asarray(a, np.float64) for a in (Y, O, X, B, C, M, S))
    total = 0.0
    for i in range(Y.shape[0]):
        cov_w = np.diag(S[i] ** 2)
        mean = O[i] + X[i] @ B + C @ M[i]
        var = np.diag(C @ cov_w @ C.T)  # the variance of each coordinate of C W_i
        total += np.sum(Y[i] * mean - np.exp(mean + var / 2) - gammaln(Y[i] + 1))
        q = len(M[i])
        kl = 0.5 * (np.trace(cov_w) + M[i] @ M[i] - q - np.linalg.slogdet(cov_w)[1])
        total -= kl
    return float(total)
