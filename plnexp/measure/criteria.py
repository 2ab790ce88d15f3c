"""Model-selection criteria of a PLN fit: its number of free parameters, BIC and ICL, with
PLNmodels' conventions (pure functions on plain numbers and arrays: no fit, no I/O).

The conventions are R PLNmodels' (``R/PLNfit-class.R`` and ``R/PLNPCAfit-class.R``, version 1.3):
**larger is better**, as ``getBestModel()`` picks ``which.max``, and

- ``BIC = loglik - k/2 log(n)``, ``loglik`` the fit's variational lower bound (the ELBO, with
  ``-log y!``), ``k`` its number of free parameters (:func:`n_params`), ``n`` the number of samples;
- ``ICL = BIC - entropy``, the entropy of the variational posterior q(W) = prod_i N(M_i, diag(S_i^2)):
  ``1/2 (n q log(2 pi e) + sum_ik log S_ik^2)`` over its n x q variances (q = p for the full PLN).
  R's field is named a "variational lower bound of the ICL": its entropy term penalises latent
  positions that the data leave uncertain.

The numbers of parameters are R PLNmodels' ``nb_param`` and pyPLNmodels' ``number_of_parameters``
(they agree): ``p d + p (p + 1)/2`` for the full PLN (B, and Sigma symmetric), ``p (d + q) - q (q - 1)/2``
for PLN-PCA of rank q (B, and C up to a rotation of the latent space, which leaves C C' unchanged).

pyPLNmodels (1.0.x, ``models/base.py``) writes ``BIC`` with the opposite sign, ``-loglike + k/2 log n``
(smaller is better); :func:`bic` is the negative of its ``BIC``. Its ``ICL`` is not comparable:
its ``BIC - entropy`` keeps R's minus sign on the flipped BIC, and its ``entropy_gaussian``
(``calculations/entropies.py``) sums the variances S^2 where the entropy has their logarithms.
"""

from __future__ import annotations

import math

import numpy as np

FULL_MODELS = ("full", "profiled")  # one PLN, two parametrisations: the same free parameters
PCA = "pca"


def n_params(model: str, p: int, d: int, rank: int | None = None) -> int:
    """The number of free parameters k of a PLN fit to p species with d covariates (intercept included).

    - ``full`` / ``profiled`` (one model): ``p d + p (p + 1)/2`` (B, and Sigma symmetric p x p);
      R PLNmodels' ``PLNfit$nb_param``, pyPLNmodels' ``Pln.number_of_parameters``.
    - ``pca`` of rank q = ``rank``: ``p (d + q) - q (q - 1)/2`` (B, and the p x q loadings C less the
      q (q - 1)/2 of a rotation of the latent space); R PLNmodels' ``PLNPCAfit$nb_param``,
      pyPLNmodels' ``PlnPCA.number_of_parameters``.
    """
    if model in FULL_MODELS:
        return p * d + p * (p + 1) // 2
    if model == PCA:
        if rank is None or rank < 1:
            raise ValueError(f"rank={rank!r}: model=pca needs its rank, an integer >= 1")
        return p * (d + rank) - rank * (rank - 1) // 2
    raise ValueError(f"model={model!r}: allowed values are {', '.join((*FULL_MODELS, PCA))}")


def bic(loglik: float, k: int, n: int) -> float:
    """``loglik - k/2 log(n)`` (R PLNmodels' ``BIC``; larger is better): the fit's ELBO ``loglik``
    (with ``-log y!``) less the penalty of its ``k`` free parameters at ``n`` samples."""
    return float(loglik) - 0.5 * k * math.log(n)


def entropy(S) -> float:
    """The entropy of the variational posterior prod_i N(M_i, diag(S_i^2)), from its standard
    deviations ``S`` (n x q; their sign is irrelevant): ``1/2 (n q log(2 pi e) + sum log S^2)``
    (R PLNmodels' ``entropy``), in float64."""
    S = np.asarray(S, dtype=np.float64)
    return 0.5 * (S.size * math.log(2.0 * math.pi * math.e) + float(np.sum(np.log(S * S))))


def icl(loglik: float, k: int, n: int, S) -> float:
    """``BIC - entropy(S)`` (R PLNmodels' ``ICL``; larger is better), see :func:`bic`, :func:`entropy`."""
    return bic(loglik, k, n) - entropy(S)


def criteria(model: str, loglik: float, params: dict, n: int, p: int, rank: int | None = None) -> dict[str, float]:
    """``{"n_params", "bic", "icl"}`` of a fit of ``model`` (``params``: its B (d, p) and S, as a
    :class:`~plnexp.fitting.engine.FitResult` holds them) to n samples of p species. ``rank``: pca's q."""
    d = int(np.shape(params["B"])[0])
    k = n_params(model, p, d, rank)
    return {"n_params": float(k), "bic": bic(loglik, k, n), "icl": icl(loglik, k, n, params["S"])}
