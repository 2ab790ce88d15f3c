"""One optimisation step of a PLN fit, split into the pieces every JIT strategy composes.

A :class:`Problem` binds a :class:`~plnexp.core.model.Model` to an optax transformation. Its methods are
pure functions of (state, data): the strategies decide how to trace and compile them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from .arrays import Arrays
from .model import Model
from .pln_elbo import PLNState
from .optim import OptimizerSpec


class FitState(NamedTuple):
    """What a fit carries from one iteration to the next."""

    pln: PLNState
    opt_state: optax.OptState


class Output(NamedTuple):
    """What every strategy returns. ``elbo[i]`` is the partial ELBO *before* update i (NaN after
    the last iteration run); ``final_elbo`` is the partial ELBO at the returned state."""

    state: FitState
    elbo: jax.Array  # (n_iter,)
    n_run: jax.Array  # () int
    final_elbo: jax.Array  # ()


def autodiff(model: Model, params, pln: PLNState, data: Arrays):
    """(-ELBO, its gradient) by reverse-mode autodiff of ``model.elbo``."""
    return jax.value_and_grad(lambda q: -model.elbo(q, pln, data))(params)


def analytic(model: Model, params, pln: PLNState, data: Arrays):
    """(-ELBO, its gradient) from the model's hand-written gradient: one exp and one n x p x p
    product per call, instead of the forward and backward passes of autodiff."""
    value, grads = model.value_and_grad(params, pln, data)
    return -value, jax.tree.map(jnp.negative, grads)


# How the gradient is computed: a new axis of the study (config key ``gradient``).
GRADIENTS = {"analytic": analytic, "autodiff": autodiff}


@dataclass(frozen=True)
class Problem:
    model: Model
    tx: optax.GradientTransformation
    gradient: Callable = analytic  # a value of GRADIENTS
    optimizer: OptimizerSpec | None = None  # what ``tx`` was made from (the torch strategies rebuild it)

    def init(self, pln: PLNState) -> FitState:
        return FitState(pln, self.tx.init(self.model.free(pln)))

    def loss_and_grad(self, params, pln: PLNState, data: Arrays):
        """(-ELBO, its gradient) at ``params = model.free(pln)`` with the rest of ``pln`` held fixed."""
        return self.gradient(self.model, params, pln, data)

    def update(self, grads, opt_state, params):
        """One optimizer update: returns (new params, new optimizer state)."""
        updates, opt_state = self.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def complete(self, params, data: Arrays) -> PLNState:
        """Closed forms (Sigma, Omega; B for the profiled model) after a step."""
        return self.model.complete(params, data)

    def step(self, state: FitState, data: Arrays) -> tuple[FitState, jax.Array]:
        """The whole iteration: returns the new state and the ELBO at the *old* one."""
        params = self.model.free(state.pln)
        loss, grads = self.loss_and_grad(params, state.pln, data)
        params, opt_state = self.update(grads, state.opt_state, params)
        return FitState(self.complete(params, data), opt_state), -loss

    def elbo(self, state: FitState, data: Arrays) -> jax.Array:
        return self.model.state_elbo(state.pln, data)


def relative_change(elbo: jax.Array, previous: jax.Array, log_factorial: jax.Array) -> jax.Array:
    """|Δ ELBO| / |ELBO_prev| on the *full* ELBO (partial - sum log y!): the early-stopping metric."""
    return jnp.abs(elbo - previous) / jnp.abs(previous - log_factorial)
