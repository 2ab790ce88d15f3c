"""The PLN maths of :mod:`plnexp.core.pln_elbo` in PyTorch: partial ELBOs (no log y!), closed forms and the
gradients, as pure functions of tensors. No device, dtype or thread setting here: they come from
the tensors passed in, and no memory layout either: LAPACK's solves (``cholesky_solve``) return
column-major tensors, and the step of :mod:`plnexp.strategies.torch_pln.program` makes every tensor of the
state it returns row-major (:func:`plnexp.strategies.torch_pln.program.row_major`), as ``torch.compile``'s
guards on strides need.

The containers are :mod:`plnexp.core.pln_elbo`'s and :mod:`plnexp.core.arrays`' own NamedTuples
holding tensors: :class:`PLNState` (B, M, S, Sigma, Omega) and :class:`Arrays` (Y, O, X). ``full``
and ``profiled`` follow the JAX definitions line by line (Omega multiplies the whole trace bracket;
Cholesky factors, never a general inverse); see :mod:`plnexp.core.pln_elbo` for the formulas.

Two gradients, like :data:`plnexp.core.problem.GRADIENTS`: ``autodiff`` (``torch.func.grad_and_value``
of the ELBO, which ``torch.compile`` traces into the same graph) and ``analytic`` (the closed-form
gradient of :func:`plnexp.core.pln_elbo.full_value_and_grad` / ``profiled_value_and_grad``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple
from collections.abc import Callable

import torch

if TYPE_CHECKING:
    # plnexp.core's NamedTuples (arrays.Arrays, pln_elbo.PLNState) as this module takes and makes them,
    # holding tensors (their fields are annotated for JAX arrays there): the very same classes at run
    # time, typed for tensors here

    class Arrays(NamedTuple):
        Y: torch.Tensor
        O: torch.Tensor
        X: torch.Tensor
        log_factorial: torch.Tensor | float = 0.0
        rows: None = None

    class PLNState(NamedTuple):
        B: torch.Tensor
        M: torch.Tensor
        S: torch.Tensor
        Sigma: torch.Tensor
        Omega: torch.Tensor

else:
    from ...core.arrays import Arrays
    from ...core.pln_elbo import PLNState

Params = dict  # {"B", "M", "S"} (full) or {"M", "S"} (profiled), as in plnexp.core.pln_elbo


def cholesky(A: torch.Tensor) -> torch.Tensor:
    """The lower Cholesky factor, or all NaN when ``A`` is not positive definite, as JAX's
    ``jnp.linalg.cholesky`` returns it: a diverged fit gives a non-finite ELBO (reported as such)
    instead of an exception, and the check costs no host sync on CUDA."""
    L, info = torch.linalg.cholesky_ex(A)
    return torch.where(info == 0, L, torch.nan)


def _logdet_from_cholesky(L: torch.Tensor) -> torch.Tensor:
    return 2.0 * torch.sum(torch.log(torch.diagonal(L)))


def _inverse_spd(Sigma: torch.Tensor) -> torch.Tensor:
    """Sigma^-1 through its Cholesky factor."""
    L = cholesky(Sigma)
    eye = torch.eye(Sigma.shape[0], dtype=Sigma.dtype, device=Sigma.device)
    return torch.cholesky_solve(eye, L)


def closed_form_sigma(M: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    n = M.shape[0]
    return (M.T @ M + torch.diag(torch.sum(S * S, dim=0))) / n


def closed_form_b(X: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    return torch.cholesky_solve(X.T @ M, cholesky(X.T @ X))


def _poisson_part(data: Arrays, Z: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    return torch.sum(data.Y * Z - torch.exp(Z + 0.5 * S * S) + torch.log(torch.abs(S)))


def full_elbo(params: Params, state: PLNState, data: Arrays) -> torch.Tensor:
    """:func:`plnexp.core.pln_elbo.full_elbo`: (B, M, S) free, Sigma and Omega held at the state's."""
    B, M, S = params["B"], params["M"], params["S"]
    n, p = M.shape
    logdet_omega = -_logdet_from_cholesky(cholesky(state.Sigma))
    Omega = state.Omega
    trace = torch.sum(Omega * (M.T @ M)) + torch.sum(torch.diagonal(Omega) * torch.sum(S * S, dim=0))
    return _poisson_part(data, data.O + data.X @ B + M, S) + 0.5 * n * logdet_omega - 0.5 * trace + 0.5 * n * p


def profiled_elbo(params: Params, state: PLNState, data: Arrays) -> torch.Tensor:
    """:func:`plnexp.core.pln_elbo.profiled_elbo`: B and Sigma at their closed forms given (M, S)."""
    del state
    M, S = params["M"], params["S"]
    n = M.shape[0]
    R = M - data.X @ closed_form_b(data.X, M)
    L = cholesky(closed_form_sigma(R, S))
    return _poisson_part(data, data.O + M, S) - 0.5 * n * _logdet_from_cholesky(L)


def _value_and_grad_given_omega(data: Arrays, M, B, M_res, S, Sigma, Omega):
    """:func:`plnexp.core.pln_elbo._value_and_grad_given_omega`: value, dZ, dS and A = exp(Z + S^2/2)."""
    n, p = S.shape
    Z = data.O + M if B is None else data.O + data.X @ B + M
    A = torch.exp(Z + 0.5 * S * S)
    logdet_sigma = _logdet_from_cholesky(cholesky(Sigma))
    trace = n * torch.sum(Omega * Sigma)  # = tr(Omega (M_res'M_res + D)) for the closed-form Sigma
    value = torch.sum(data.Y * Z - A + torch.log(torch.abs(S))) - 0.5 * n * logdet_sigma - 0.5 * trace + 0.5 * n * p
    residual = data.Y - A
    return value, residual - M_res @ Omega, 1.0 / S - S * (A + torch.diagonal(Omega)), residual


def full_value_and_grad(params: Params, state: PLNState, data: Arrays):
    """:func:`plnexp.core.pln_elbo.full_value_and_grad` (for a complete state)."""
    B, M, S = params["B"], params["M"], params["S"]
    value, dM, dS, residual = _value_and_grad_given_omega(data, M, B, M, S, state.Sigma, state.Omega)
    return value, {"B": data.X.T @ residual, "M": dM, "S": dS}


def profiled_value_and_grad(params: Params, state: PLNState, data: Arrays):
    """:func:`plnexp.core.pln_elbo.profiled_value_and_grad` (for a complete state: B, Sigma, Omega closed forms)."""
    M, S = params["M"], params["S"]
    R = M - data.X @ state.B
    value, dM, dS, _ = _value_and_grad_given_omega(data, M, None, R, S, state.Sigma, state.Omega)
    return value, {"M": dM, "S": dS}


def _complete_full(params: Params, data: Arrays) -> PLNState:
    Sigma = closed_form_sigma(params["M"], params["S"])
    return PLNState(params["B"], params["M"], params["S"], Sigma, _inverse_spd(Sigma))


def _complete_profiled(params: Params, data: Arrays) -> PLNState:
    M, S = params["M"], params["S"]
    B = closed_form_b(data.X, M)
    Sigma = closed_form_sigma(M - data.X @ B, S)
    return PLNState(B, M, S, Sigma, _inverse_spd(Sigma))


@dataclass(frozen=True)
class TorchModel:
    """:class:`plnexp.core.model.Model` for tensors: the same five functions."""

    name: str
    free: Callable[[PLNState], Params]
    elbo: Callable[[Params, PLNState, Arrays], torch.Tensor]
    value_and_grad: Callable
    complete: Callable[[Params, Arrays], PLNState]

    def state_elbo(self, state: PLNState, data: Arrays) -> torch.Tensor:
        return self.elbo(self.free(state), state, data)


MODELS: dict[str, TorchModel] = {
    "full": TorchModel(
        "full", lambda s: {"B": s.B, "M": s.M, "S": s.S}, full_elbo, full_value_and_grad, _complete_full
    ),
    "profiled": TorchModel(
        "profiled", lambda s: {"M": s.M, "S": s.S}, profiled_elbo, profiled_value_and_grad, _complete_profiled
    ),
}


def autodiff(model: TorchModel, params: Params, pln: PLNState, data: Arrays):
    """(-ELBO, its gradient) by reverse-mode autodiff (``torch.func.grad_and_value``)."""
    grads, loss = torch.func.grad_and_value(lambda q: -model.elbo(q, pln, data))(params)
    return loss, grads


def analytic(model: TorchModel, params: Params, pln: PLNState, data: Arrays):
    """(-ELBO, its gradient) from the closed-form gradient."""
    value, grads = model.value_and_grad(params, pln, data)
    return -value, {k: -g for k, g in grads.items()}


GRADIENTS = {"analytic": analytic, "autodiff": autodiff}
