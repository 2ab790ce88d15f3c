"""The PLN models as plain functions (:class:`Model`): ``full`` and ``profiled`` (:data:`FULL`,
:data:`PROFILED`, :data:`MODELS`; their ELBOs and gradients in :mod:`plnexp.core.pln_elbo`) and
PLN-PCA (:func:`pca_model`; :mod:`plnexp.core.pca_elbo`, :mod:`plnexp.core.pca_newton`), and what
one iteration of each must do at least (:class:`Work`). Their initial states:
:mod:`plnexp.core.initial_state`. No jit, no I/O, no global state.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial, cache
from typing import TYPE_CHECKING
from collections.abc import Callable

import jax

from . import reference
from .arrays import Arrays
from .pca_elbo import _pca_complete, _pca_params, pca_elbo, pca_value_and_grad
from .pca_newton import pca_newton_step
from .pln_elbo import (
    Params,
    PLNState,
    _complete_full,
    _complete_profiled,
    full_elbo,
    full_value_and_grad,
    profiled_elbo,
    profiled_value_and_grad,
)

if TYPE_CHECKING:
    from .data import Data


@dataclass(frozen=True)
class Model:
    """A PLN parametrisation as plain functions (pure, jit-able).

    - ``free(state)``: the pytree the optimizer updates;
    - ``elbo(params, state, data)``: partial ELBO (no log-factorial) at those params;
    - ``value_and_grad(params, state, data)``: (elbo, its gradient), written out by hand; valid for
      a complete ``state`` whose free part is ``params`` (what every fit step has);
    - ``complete(params, data)``: the full :class:`PLNState`, closed forms filled in;
    - ``centred_m(state, data)``: M as the centred residual W (the reporting convention); it reads
      ``data.X`` only, so the host's :class:`~plnexp.core.data.Data` does as well;
    - ``params(state, data)``: what a :class:`~plnexp.fitting.engine.FitResult` reports, by name (B, centred
      M, S, Sigma for ``full`` and ``profiled``; B, C, M, S for ``pca``), arrays of the state's kind;
    - ``host_reference(params, data)``: the ELBO (exact log y!) at those params, by :mod:`plnexp.core.reference`
      in float64 on the host (what every compiled ELBO is checked against), and the sum of the
      magnitudes of its terms (what the check's tolerance scales with);
    - ``work``: the least traffic and products of one iteration, in n x p data arrays, n x q latent
      arrays (q: ``rank``, or p where it is 0) and n x p x q products (:class:`Work`).
    """

    name: str
    free: Callable[[PLNState], Params]
    elbo: Callable[[Params, PLNState, Arrays], jax.Array]
    value_and_grad: Callable[[Params, PLNState, Arrays], tuple[jax.Array, Params]]
    complete: Callable[[Params, Arrays], PLNState]
    centred_m: Callable[[PLNState, Arrays | Data], jax.Array]
    params: Callable[[PLNState, Data], dict]
    host_reference: Callable[[dict, Data], tuple[float, float]]
    work: Work  # what one iteration must do at least (plnexp.measure.floor: the machine's floor for the fit)
    rank: int = 0  # the latent dimension q of ``pca``; 0: the models whose latent is p-dimensional
    block_rows: int | None = None  # ``pca``: rows per block inside a step (None: every row at once)
    newton: bool = False  # ``pca`` for optimizer="newton": value_and_grad gives the block Newton step

    def state_elbo(self, state: PLNState, data: Arrays) -> jax.Array:
        """Partial ELBO at a complete state (what the host reference re-computes)."""
        return self.elbo(self.free(state), state, data)


@dataclass(frozen=True)
class Work:
    """What one iteration of a model must do at least, whatever the data's shape (each
    :class:`plnexp.core.model.Model` declares its own): ``data_arrays`` n x p arrays read (Y, O),
    ``latent_arrays`` n x q arrays read and written (M, S and the optimizer's two moments of each),
    ``dots`` n x p x q products, q the model's latent width, and ``factorizations`` p x p Cholesky
    factors with the inverse they give (Sigma's, for the closed-form Omega: :func:`inverse_spd`)."""

    data_arrays: int
    latent_arrays: int
    dots: int
    factorizations: int = 0

    def __post_init__(self):
        for key in ("data_arrays", "latent_arrays", "dots", "factorizations"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key}={value!r}: allowed values are integers >= 0")


# One iteration of full or profiled, at least: read Y, O (n x p); read and write M, S and the
# optimizer's two moments of each (n x p); two n x p x p products (M Omega for the gradient, M'M for
# Sigma); Sigma's Cholesky factor and the Omega it gives (p x p: what the floor's n-independent part
# is at small n). X'A and XB are n x d x p: d is small, not counted.
PLN_WORK = Work(data_arrays=2, latent_arrays=6, dots=2, factorizations=1)


def _pln_model(name: str, free: tuple[str, ...], elbo, value_and_grad, complete, centred_m) -> Model:
    """``full`` or ``profiled``: ``free`` the state's fields the optimizer updates; what a fit reports
    is B, M (the centred residual ``centred_m``), S, Sigma, checked by :func:`reference.elbo_and_terms`."""
    return Model(
        name=name,
        free=lambda s: {k: getattr(s, k) for k in free},
        elbo=elbo,
        value_and_grad=value_and_grad,
        complete=complete,
        centred_m=centred_m,
        params=lambda s, data: {"B": s.B, "M": centred_m(s, data), "S": s.S, "Sigma": s.Sigma},
        host_reference=lambda p, data: reference.elbo_and_terms(
            data.Y, data.O, data.X, p["B"], p["M"], p["S"], p["Sigma"]
        ),
        work=PLN_WORK,
    )


FULL = _pln_model("full", ("B", "M", "S"), full_elbo, full_value_and_grad, _complete_full, lambda s, data: s.M)
PROFILED = _pln_model(
    "profiled",
    ("M", "S"),
    profiled_elbo,
    profiled_value_and_grad,
    _complete_profiled,
    lambda s, data: s.M - data.X @ s.B,
)
MODELS: dict[str, Model] = {m.name: m for m in (FULL, PROFILED)}


PCA_NAME = "pca"
# One iteration, at least: read Y, O (n x p); read and write M, S and their two moments each (n x q);
# six n x p x q products: MC' and S^2 (C o C)' for the exponent, RC and A (C o C) for dM and dS,
# R'M and A'S^2 for dC (pca_value_and_grad does two more, as it never forms R = Y - A: AC and M'A,
# taking RC = YC - AC and R'M = Y'M - A'M; see _pca_block_value_and_grad).
PCA_WORK = Work(data_arrays=2, latent_arrays=6, dots=6)


def _pca_host_reference(params: dict, data: Data) -> tuple[float, float]:
    return reference.pca_elbo_and_terms(data.Y, data.O, data.X, params["B"], params["C"], params["M"], params["S"])


def pca_model(rank: int, block_rows: int | None = None, newton: bool = False) -> Model:
    """The PLN-PCA :class:`Model` of rank ``rank`` (q), one object per (rank, block_rows, newton) (the
    fits' caches key on it). ``block_rows``: the rows in blocks of that many inside every step
    (:func:`pca_value_and_grad`; memory O(b p) instead of O(n p), docs/concepts/memory.md); None
    (the default): every row at once. ``newton``: the model optimizer="newton" fits, whose
    ``value_and_grad`` gives one round of block Newton updates (:func:`pca_newton_step`) in place
    of the gradient; every row at once (no ``block_rows``)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank={rank!r}: allowed values are integers >= 1 (at most the data's p)")
    block_rows = check_block_rows(block_rows)
    if newton and block_rows is not None:
        raise ValueError(
            f"block_rows={block_rows!r} with optimizer=newton: its step takes every row at once; "
            "allowed values are None, or use optimizer=rprop or adam"
        )
    return _pca_model(rank, block_rows, bool(newton))


def check_block_rows(block_rows, key: str = "block_rows", none: str = "None") -> int | None:
    """``block_rows``: None or an integer >= 1; a one-line ValueError naming ``key`` otherwise
    (``none``: how the message spells None, ``null`` for a config)."""
    if block_rows is not None and (isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1):
        raise ValueError(
            f"{key}={block_rows!r}: allowed values are integers >= 1 (rows per block) or {none} (no blocks)"
        )
    return block_rows


def _pca_free(s: PLNState) -> Params:
    return {"B": s.B, "C": s.Sigma, "M": s.M, "S": s.S, "R": s.Omega}


def _pca_free_newton(s: PLNState) -> Params:
    return {"B": s.B, "C": s.Sigma, "M": s.M, "S": s.S}


@cache
def _pca_model(rank: int, block_rows: int | None, newton: bool = False) -> Model:
    return Model(
        name=PCA_NAME,
        # Newton's rounds never turn the latent axes (R stays 0): no R among its parameters, so that
        # neither its step nor its ELBO computes the rotation (fewer kernels to compile)
        free=_pca_free_newton if newton else _pca_free,
        elbo=partial(pca_elbo, block_rows=block_rows),
        value_and_grad=pca_newton_step if newton else partial(pca_value_and_grad, block_rows=block_rows),
        complete=_pca_complete,
        centred_m=lambda s, data: s.M,
        params=_pca_params,
        host_reference=_pca_host_reference,
        work=PCA_WORK,
        rank=rank,
        block_rows=block_rows,
        newton=newton,
    )
