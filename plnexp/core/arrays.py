"""The data as the fit sees it: device arrays (:class:`Arrays`) and which of their rows are data
(:class:`Rows`). Shared by the maths (:mod:`plnexp.core.pln_elbo`, :mod:`plnexp.core.pca_elbo`, ...)
and the data's move to a device (:meth:`plnexp.core.data.Data.to_device`), so that neither imports
the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp


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


@jax.tree_util.register_pytree_node_class
@dataclass(frozen=True)
class SparseCounts:
    """Counts Y (n, p) on the device as CSR: ``indptr`` (n + 1,) int32, ``indices`` (nnz + 1,)
    int32 columns, ``values`` (nnz + 1,) the counts in the fit's dtype, row after row, then one
    entry of value 0 (so that no data set has none). ``shape`` (n, p) and ``row_nnz_max`` (the most non-zeros of any row) are static.

    A fit reads it a block of rows at a time (:meth:`dense_rows`: the block as the dense ``(b, p)``
    array, on the device and only while it is used), so that the device holds the non-zeros and a
    few ``b x p`` arrays, never ``n x p`` (docs/concepts/memory.md). ``shape``, ``dtype`` and
    ``ndim`` are those of the dense counts it stands for."""

    indptr: jax.Array
    indices: jax.Array
    values: jax.Array
    shape: tuple[int, int]
    row_nnz_max: int

    def tree_flatten(self):
        return (self.indptr, self.indices, self.values), (self.shape, self.row_nnz_max)

    @classmethod
    def tree_unflatten(cls, static, children):
        return cls(*children, *static)

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def ndim(self) -> int:
        return 2

    def capacity(self, b: int) -> int:
        """The entries a window of ``b`` rows is read in: ``b`` times the fullest row's, at most every
        stored entry (the static length of :meth:`dense_rows`' slice)."""
        return max(1, min(b * self.row_nnz_max, self.values.shape[0]))

    def dense_rows(self, start, b: int) -> jax.Array:
        """Rows ``[start, start + b)`` as a dense ``(b, p)`` array (``start`` may be traced): one slice
        of :meth:`capacity` entries from the window's first non-zero (moved back where it would run
        past the end), its entries of the window's rows scattered into zeros, the others dropped.
        Each count is written once, into zeros: the block equals the dense counts' rows exactly."""
        k = self.capacity(b)
        bounds = jax.lax.dynamic_slice_in_dim(self.indptr, start, b + 1)  # the window's row starts
        first = jnp.minimum(bounds[0], self.values.shape[0] - k)  # dynamic_slice's own clamp, made explicit
        at = first + jnp.arange(k, dtype=self.indptr.dtype)
        row = jnp.searchsorted(bounds, at, side="right") - 1  # -1 before the window, b after it
        row = jnp.where(row < 0, b, row)  # dropped by the scatter, as b is
        cols = jax.lax.dynamic_slice_in_dim(self.indices, first, k)
        vals = jax.lax.dynamic_slice_in_dim(self.values, first, k)
        zeros = jnp.zeros((b, self.shape[1]), self.values.dtype)
        return zeros.at[row, cols].add(vals, mode="drop")


def dense_rows(Y, start, b: int) -> jax.Array:
    """Rows ``[start, start + b)`` of the counts ``Y``: a dense array's ``dynamic_slice``, a
    :class:`SparseCounts`' block densified (:meth:`SparseCounts.dense_rows`)."""
    if isinstance(Y, SparseCounts):
        return Y.dense_rows(start, b)
    if b == Y.shape[0]:
        return Y
    return jax.lax.dynamic_slice_in_dim(Y, start, b, axis=0)


class Arrays(NamedTuple):
    """The data as device arrays: counts Y (n, p), log-offsets O (n, p), or (n, 1) where the offsets
    are one per row (:meth:`plnexp.core.data.Data.to_device`: every computation here broadcasts it against
    the (n, p) arrays, so read p from Y, never from O), covariates X (n, d). Y is a
    :class:`SparseCounts` for sparse counts (a PLN-PCA fit with ``block_rows`` reads it block by block).

    ``log_factorial`` = sum log(Y!) (a float64 host constant cast to the fit's dtype); the ELBOs
    here leave it out, only the early-stopping rule uses it (relative change of the full ELBO).
    ``rows``: None when every row is data and on this device (every fit but a row-sharded one).
    """

    Y: jax.Array  # or a SparseCounts (sparse counts: only the blocked PLN-PCA fit reads them, block by block)
    O: jax.Array
    X: jax.Array
    log_factorial: jax.Array | float = 0.0
    rows: Rows | None = None
