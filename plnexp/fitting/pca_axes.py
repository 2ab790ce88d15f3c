"""PLN-PCA's latent axes as PCA users read them: orthonormal loadings ordered by the variance they
carry, with the matching scores, and the AnnData keys ``scanpy.tl.pca`` writes.

A PLN-PCA fit (:mod:`plnexp.core.model`) reports B, C (p, q), M (n, q), S (n, q): row i's latent
vector is W_i C' with q(W_i) = N(M_i, diag(S_i^2)) and the prior N(0, I_q). Its columns of C are
neither orthogonal nor ordered. With the thin SVD C = U D V' (D decreasing; each column of U
signed so that its largest entry is positive), the rotation V of the latent axes gives

- ``loadings`` U (p, q): orthonormal, ordered by D^2, the variance of the model's latent
  covariance C C' = U D^2 U' along each (``variance``; ``variance_ratio`` = D^2 / sum D^2);
- ``scores`` M V D (n, q): the latent positions on those axes, ``scores @ loadings.T = M C'``;
- the rotated parameters (B, C V, M V, V' diag(S_i^2) V): the same model at the same ELBO, as the
  prior N(0, I_q) and every term of the ELBO are unchanged by an orthogonal rotation of the axes
  taken together with the posterior's covariance (which is then no longer diagonal: an n x q x q
  array, made only on request by :func:`rotated_params`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

OBSM_KEY = "X_pln_pca"
VARM_KEY = "PLN_loadings"
UNS_KEY = "pln_pca"


class Axes(NamedTuple):
    loadings: np.ndarray  # U (p, q), orthonormal columns
    scores: np.ndarray  # M V D (n, q)
    rotation: np.ndarray  # V (q, q), orthogonal
    variance: np.ndarray  # D^2 (q,), decreasing
    variance_ratio: np.ndarray  # D^2 / sum D^2


def axes(C: np.ndarray, M: np.ndarray) -> Axes:
    """The ordered orthonormal axes of a PLN-PCA fit's C (p, q) and M (n, q) (module docstring)."""
    C = np.asarray(C, dtype=np.float64)
    U, D, Vt = np.linalg.svd(C, full_matrices=False)
    signs = np.sign(U[np.argmax(np.abs(U), axis=0), np.arange(U.shape[1])])
    signs[signs == 0] = 1.0
    U, V = U * signs, Vt.T * signs
    variance = D * D
    total = float(np.sum(variance))
    ratio = variance / total if total > 0 else np.full_like(variance, np.nan)
    return Axes(U, np.asarray(M, dtype=np.float64) @ V * D, V, variance, ratio)


def rotated_params(params: dict, V: np.ndarray) -> dict:
    """The fit's parameters on the rotated axes: B, C V, M V, and each row's posterior covariance
    V' diag(S_i^2) V as ``S_cov`` (n, q, q)."""
    S2 = np.asarray(params["S"], dtype=np.float64) ** 2
    cov = np.einsum("kr,ik,ks->irs", V, S2, V)
    return {"B": params["B"], "C": params["C"] @ V, "M": params["M"] @ V, "S_cov": cov}


def write_anndata(adata, scores, loadings, uns: dict, rows, variables) -> None:
    """``adata.obsm[OBSM_KEY]`` = scores, ``adata.varm[VARM_KEY]`` = loadings, ``adata.uns[UNS_KEY]``
    = ``uns``, in place (as ``scanpy.tl.pca`` writes ``X_pca``, ``PCs`` and ``uns["pca"]``), after
    checking that the AnnData is the one fitted: its shape, and its obs and var names where the fit
    has names (one ValueError line naming the first that differs)."""
    n, p = scores.shape[0], loadings.shape[0]
    if tuple(adata.shape) != (n, p):
        raise ValueError(f"adata: shape {tuple(adata.shape)}; allowed is the fitted data's ({n}, {p}) (cells x genes)")
    for what, ours, theirs in (("obs_names", rows, adata.obs_names), ("var_names", variables, adata.var_names)):
        if ours is None:
            continue
        theirs = [str(v) for v in theirs]
        bad = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        if bad is not None:
            raise ValueError(
                f"adata.{what}: {theirs[bad]!r} at position {bad}, the fit has {ours[bad]!r}; allowed is the AnnData fitted"
            )
    adata.obsm[OBSM_KEY] = np.asarray(scores)
    adata.varm[VARM_KEY] = np.asarray(loadings)
    adata.uns[UNS_KEY] = uns
