"""Optimizers: a registry of names -> optax GradientTransformation factories.

Every optimizer *minimises* the negative ELBO. ``radam_clip`` is the seed tutorial's chain; it has
no learning rate (RAdam's update is rescaled by -1 and clipped at 0.1 per coordinate).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

import optax


def radam_clip(lr: float | None = None) -> optax.GradientTransformation:
    del lr  # the seed's chain ignores it: steps are clipped at 0.1
    return optax.chain(optax.scale_by_radam(), optax.scale(-1.0), optax.clip(0.1))


def newton(lr: float | None = None) -> optax.GradientTransformation:
    """PLN-PCA's block Newton rounds (:func:`plnexp.core.pca_newton.pca_newton_step`): the model's
    ``value_and_grad`` gives the whole step, which this adds to the parameters as it is (the fit
    minimises the negative ELBO, whose "gradient" the Problem negates: scale by -1). No learning rate."""
    del lr
    return optax.scale(-1.0)


OPTIMIZERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "radam_clip": radam_clip,
    "adam": optax.adam,
    "rprop": optax.rprop,
    "sgd": optax.sgd,
    "newton": newton,
}
NEWTON = "newton"  # model="pca" only: plnexp.core.pca_newton.pca_newton_step
# Defaults measured on oaks (profiled model, float64, seed init, 1000 iterations; benchmarks/convergence.py):
# rprop at 0.01 reaches the optimum (-32026.02) in ~520 iterations; adam plateaus short of it
# (lr 0.01: -590731, 0.1: -39683, 0.2: -34233); sgd stays far (lr 1e-4: -97074; larger rates
# overflow exp() on the first steps because the gradient scales with the counts).
DEFAULT_LR: dict[str, float | None] = {"radam_clip": None, "adam": 1e-1, "rprop": 1e-2, "sgd": 1e-4, "newton": None}


@dataclass(frozen=True)
class OptimizerSpec:
    """A resolved, hashable optimizer choice; ``make()`` builds the optax transformation."""

    name: str
    lr: float | None = None

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.name!r}: allowed values are {', '.join(OPTIMIZERS)}")
        if self.lr is None:
            object.__setattr__(self, "lr", DEFAULT_LR[self.name])
        elif not (isinstance(self.lr, (int, float)) and 0 < self.lr < float("inf")):  # nan and inf: refused
            raise ValueError(f"optimizer.lr={self.lr!r}: must be a number > 0 and finite")

    def make(self) -> optax.GradientTransformation:
        return OPTIMIZERS[self.name](self.lr) if self.lr is not None else OPTIMIZERS[self.name]()
