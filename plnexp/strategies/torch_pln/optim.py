"""The optimizers of :mod:`plnexp.core.optim` in PyTorch, written from optax's own formulas (optax 0.2.8:
``_src/transform.py`` scale_by_adam, scale_by_radam, scale_by_rprop, scale; ``transforms/_clipping.py``
clip; ``_src/alias.py`` adam, rprop, sgd; ``_src/update.py`` apply_updates) so that a torch fit
takes the same steps as the JAX one.

The state is optax's own state structure with tensors for leaves (``ScaleByAdamState(count, mu,
nu)``, ``ScaleByRpropState(step_sizes, prev_updates)``, ``EmptyState()``, in the chain's tuple),
so that a fit starts from the state ``optax.init`` made and returns one JAX can carry on with.

Scalars follow JAX's promotion rules: a Python float meets a tensor in the tensor's dtype, and
the bias corrections (``decay ** count``, an int32 count) are computed in the fit's dtype, as JAX
does under ``jax_enable_x64`` (float64) or without it (float32).
"""

from __future__ import annotations

from collections.abc import Callable

import optax
import torch

INT32_MAX = 2**31 - 1


def _safe_increment(count: torch.Tensor) -> torch.Tensor:
    """optax.safe_increment: count + 1, saturating at int32's maximum."""
    return torch.where(count < INT32_MAX, count + 1, count)


def _power(decay: float, count: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``decay ** count`` in ``like``'s dtype (a weakly typed Python float meets an int32 count)."""
    return torch.pow(torch.tensor(decay, dtype=like.dtype, device=like.device), count.to(like.dtype))


def _moment(g, t, decay: float, order: int):
    """optax.tree.update_moment(_per_elem_norm) for real tensors: (1 - decay) g^order + decay t."""
    return {k: (1 - decay) * (g[k] ** order) + decay * t[k] for k in g}


def _bias_correction(moment, decay: float, count: torch.Tensor):
    correction = 1 - _power(decay, count, next(iter(moment.values())))
    return {k: m / correction for k, m in moment.items()}


def _adam_moments(updates, state, b1: float, b2: float):
    """scale_by_adam's and scale_by_radam's shared start: the new moments, the incremented count and
    the bias-corrected moments."""
    mu = _moment(updates, state.mu, b1, 1)
    nu = _moment(updates, state.nu, b2, 2)
    count_inc = _safe_increment(state.count)
    return mu, nu, count_inc, _bias_correction(mu, b1, count_inc), _bias_correction(nu, b2, count_inc)


def scale_by_adam(updates, state, b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0):
    mu, nu, count_inc, mu_hat, nu_hat = _adam_moments(updates, state, b1, b2)
    out = {k: mu_hat[k] / (torch.sqrt(nu_hat[k] + eps_root) + eps) for k in mu_hat}
    return out, optax.ScaleByAdamState(count=count_inc, mu=mu, nu=nu)


def scale_by_radam(updates, state, b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, threshold=5.0):
    ro_inf = 2.0 / (1.0 - b2) - 1.0
    mu, nu, count_inc, mu_hat, nu_hat = _adam_moments(updates, state, b1, b2)
    b2t = _power(b2, count_inc, next(iter(mu.values())))
    ro = ro_inf - 2 * count_inc * b2t / (1 - b2t)
    r = torch.sqrt((ro - 4.0) * (ro - 2.0) * ro_inf / ((ro_inf - 4.0) * (ro_inf - 2.0) * ro))
    rectified = {k: r * mu_hat[k] / (torch.sqrt(nu_hat[k] + eps_root) + eps) for k in mu_hat}
    out = {k: torch.where(ro >= threshold, rectified[k], mu_hat[k]) for k in mu_hat}
    return out, optax.ScaleByAdamState(count=count_inc, mu=mu, nu=nu)


def scale_by_rprop(updates, state, eta_minus=0.5, eta_plus=1.2, min_step_size=1e-6, max_step_size=50.0):
    """optax's Rprop, quirks included: the update returned is the *previous* step's (zero where the
    gradient changed sign), so the first update is exactly zero."""
    sign = {k: updates[k] * state.prev_updates[k] for k in updates}
    step_sizes = {}
    for k, s in sign.items():
        step = state.step_sizes[k]
        factor = torch.where(s > 0, torch.full_like(step, eta_plus), torch.full_like(step, eta_minus))
        step_sizes[k] = torch.where(s == 0, step, torch.clamp(step * factor, min=min_step_size, max=max_step_size))
    prev_updates = {
        k: torch.where(sign[k] < 0, torch.zeros_like(updates[k]), step_sizes[k] * torch.sign(updates[k]))
        for k in updates
    }
    out = {k: torch.where(sign[k] < 0, torch.zeros_like(state.prev_updates[k]), state.prev_updates[k]) for k in updates}
    return out, optax.ScaleByRpropState(step_sizes, prev_updates)


def _scale(updates, step_size: float):
    return {k: step_size * u for k, u in updates.items()}


def _chain(scale_by, step_size: float, clip: float | None = None) -> Callable:
    """chain(scale_by, scale(step_size)), then clip(clip) where given: the update of the chain whose
    state is ``scale_by``'s first, the others' (empty) after it."""

    def update(grads, state, params):
        u, first = scale_by(grads, state[0])
        u = _scale(u, step_size)
        if clip is not None:
            u = {k: torch.clamp(v, -clip, clip) for k, v in u.items()}
        return u, (first, *state[1:])

    return update


def radam_clip(lr: float | None = None) -> Callable:
    """chain(scale_by_radam(), scale(-1.0), clip(0.1)); like the JAX one, it has no learning rate."""
    return _chain(scale_by_radam, -1.0, 0.1)


def adam(lr: float) -> Callable:
    """chain(scale_by_adam(), scale_by_learning_rate(lr)) = ... scale(-lr)."""
    return _chain(scale_by_adam, -1 * lr)


def rprop(lr: float) -> Callable:
    """chain(scale_by_rprop(lr), scale(-1.0)); ``lr`` only sets the initial step sizes (in the state)."""
    return _chain(scale_by_rprop, -1.0)


def sgd(lr: float) -> Callable:
    """chain(identity(), scale_by_learning_rate(lr)) = scale(-lr)."""

    def update(grads, state, params):
        return _scale(grads, -1 * lr), state

    return update


# name -> factory(lr) -> update(grads, state, params) -> (updates, state); the keys of plnexp.core.optim.OPTIMIZERS
OPTIMIZERS: dict[str, Callable[..., Callable]] = {"radam_clip": radam_clip, "adam": adam, "rprop": rprop, "sgd": sgd}


def apply_updates(params, updates):
    """optax.apply_updates: p + u, in p's dtype."""
    return {k: (p + updates[k]).to(p.dtype) for k, p in params.items()}
