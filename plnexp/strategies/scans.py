"""The lax.scan family: one compiled program per fit, differing only in the carry's container.

After tracing, every container flattens to the same leaves, so these programs should compile to
the same XLA and run at the same speed: that is what the study measures.

- ``scan``: the carry is a plain dict (the seed's level 2);
- ``scan_namedtuple``: a ``typing.NamedTuple`` (level 3);
- ``scan_pytree``: a class registered with ``register_pytree_node_class`` (level 4), whose
  flatten/unflatten keep *every* field (the seed's dropped Sigma and Omega);
- ``scan_dataclass``: a frozen dataclass registered with ``jax.tree_util.register_dataclass``;
- ``scan_unrolled``: ``lax.scan(..., unroll=k)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
from jax.tree_util import register_pytree_node_class

from ..core.pln_elbo import PLNState
from ..core.problem import FitState, Output, Problem
from .base import SingleProgram, scanned

FIELDS = ("B", "M", "S", "Sigma", "Omega", "opt_state")


class NamedTupleCarry(NamedTuple):
    B: jax.Array
    M: jax.Array
    S: jax.Array
    Sigma: jax.Array
    Omega: jax.Array
    opt_state: Any


@register_pytree_node_class
class PytreeCarry:
    """A plain class made a pytree by hand: every array is a child, nothing is dropped."""

    def __init__(self, B, M, S, Sigma, Omega, opt_state):
        self.B, self.M, self.S, self.Sigma, self.Omega, self.opt_state = B, M, S, Sigma, Omega, opt_state

    def tree_flatten(self):
        return tuple(getattr(self, f) for f in FIELDS), None

    @classmethod
    def tree_unflatten(cls, aux_data, children):
        del aux_data
        return cls(*children)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DataclassCarry:
    B: jax.Array
    M: jax.Array
    S: jax.Array
    Sigma: jax.Array
    Omega: jax.Array
    opt_state: Any


def _to_fields(state: FitState) -> dict:
    return {**state.pln._asdict(), "opt_state": state.opt_state}


def _from_fields(get) -> FitState:
    return FitState(PLNState(*(get(f) for f in FIELDS[:-1])), get("opt_state"))


CONTAINERS = {
    "dict": (lambda s: _to_fields(s), lambda c: _from_fields(c.__getitem__)),
    "namedtuple": (lambda s: NamedTupleCarry(**_to_fields(s)), lambda c: _from_fields(lambda f: getattr(c, f))),
    "pytree": (lambda s: PytreeCarry(**_to_fields(s)), lambda c: _from_fields(lambda f: getattr(c, f))),
    "dataclass": (lambda s: DataclassCarry(**_to_fields(s)), lambda c: _from_fields(lambda f: getattr(c, f))),
}


def scan_program(problem: Problem, n_iter: int, container: str = "dict", unroll: int = 1) -> SingleProgram:
    pack, unpack = CONTAINERS[container]

    def step(carry, data):
        new_state, elbo = problem.step(unpack(carry), data)
        return pack(new_state), elbo

    def fit(state: FitState, data) -> Output:
        return scanned(problem, n_iter, step, pack(state), data, unroll, unpack)

    return SingleProgram(fit, label=f"scan_{container}")
