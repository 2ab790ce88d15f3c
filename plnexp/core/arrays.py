"""The data as the fit sees it: device arrays (:class:`Arrays`) and which of their rows are data
(:class:`Rows`). Shared by the maths (:mod:`plnexp.core.model`) and the data's move to a device
(:meth:`plnexp.core.data.Data.to_device`), so that neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax


@jax.tree_util.register_pytree_node_class
@dataclass(frozen=True)
class Rows:
    """Which rows of the arrays are data, and where the rest of the rows are (a row-sharded fit).

    - ``weight`` (n, 1): 1 for a data row, 0 for a padding row (rows added so that n splits evenly
      across devices: Y = O = X = 0 and M = 0 there; they contribute nothing to any sum);
    - ``n`` (): the number of data rows, over all devices (what Sigma = (M'M + D) / n divides by);
    - ``axis``: under ``shard_map`` the mesh axis the rows are split over: every sum over rows
      taken on a device's rows is then ``psum``-ed over it (None: the arrays hold every row, as
      under ``jit`` with a ``NamedSharding``, where XLA inserts the reductions itself).

    A pytree (``weight`` and ``n`` are leaves, ``axis`` static), so it travels inside :class:`Arrays`.
    """

    weight: jax.Array
    n: jax.Array
    axis: str | None = None

    def tree_flatten(self):
        return (self.weight, self.n), self.axis

    @classmethod
    def tree_unflatten(cls, axis, children):
        return cls(*children, axis)


class Arrays(NamedTuple):
    """The data as device arrays: counts Y (n, p), log-offsets O (n, p), or (n, 1) where the offsets
    are one per row (:meth:`plnexp.core.data.Data.to_device`: every computation here broadcasts it against
    the (n, p) arrays, so read p from Y, never from O), covariates X (n, d).

    ``log_factorial`` = sum log(Y!) (a float64 host constant cast to the fit's dtype); the ELBOs
    here leave it out, only the early-stopping rule uses it (relative change of the full ELBO).
    ``rows``: None when every row is data and on this device (every fit but a row-sharded one).
    """

    Y: jax.Array
    O: jax.Array
    X: jax.Array
    log_factorial: jax.Array | float = 0.0
    rows: Rows | None = None
