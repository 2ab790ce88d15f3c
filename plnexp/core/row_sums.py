"""Sums over rows, the only quantities of the PLN maths that mix rows (:mod:`plnexp.core.pln_elbo`,
:mod:`plnexp.core.pca_elbo`, :mod:`plnexp.core.pca_newton`, :mod:`plnexp.core.initial_state`): the
sums themselves (:func:`_total`), the number of data rows (:func:`_n`), the padding rows zeroed
(:func:`_data_rows`, :func:`_weighted`), and the rows walked in blocks inside one step
(:func:`_row_blocks`, :func:`_own_sums`, :func:`_blocks_of`). Pure functions: no jit, no I/O, no
global state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .arrays import Arrays, Rows, dense_rows


# The only quantities that mix rows: sums over rows (the ELBO's, M'M, sum S^2, X'M, X'(Y - A)) and
# the number of rows. They go through these three, so that padding rows and rows on other devices
# are accounted for in one place.
def _total(rows: Rows | None, x):
    """A sum over this device's rows -> the sum over every row (``psum`` under ``shard_map``)."""
    return x if rows is None or rows.axis is None else jax.lax.psum(x, rows.axis)


def _n(rows: Rows | None, M: jax.Array):
    """The number of data rows (static when there is no padding)."""
    return M.shape[0] if rows is None else rows.n


def _data_rows(rows: Rows | None, x: jax.Array) -> jax.Array:
    """``x`` (n, .) with its padding rows zeroed."""
    return x if rows is None else x * rows.weight


def _weighted(w: jax.Array | None, x: jax.Array) -> jax.Array:
    """``x`` (b, .) with each row times its weight ``w`` (b, 1); None: every weight is 1."""
    return x if w is None else x * w


def _row_blocks(data: Arrays, block_rows: int, body, init, checkpoint: bool = False):
    """``lax.fori_loop`` over the rows of ``data`` in ceil(n / b) blocks of b = ``block_rows`` rows:
    ``body(start, take, count, keep, carry) -> carry`` for each, where ``take(a)`` is a's rows
    [start, start + b) (a ``dynamic_slice``: no copy nor padding of Y, O), ``keep`` the block's
    padding weights (None without padding) and ``count`` its weights in sums over rows. The last
    block is clamped to end at row n: its rows an earlier block already counted have a ``count``
    of 0 (when b divides n, ``count`` is ``keep``). ``checkpoint``: the body is rematerialised in
    reverse-mode autodiff, so that the backward pass keeps no b x p array per block."""
    n = data.Y.shape[0]
    b = block_rows
    blocks = -(-n // b)
    weight = None if data.rows is None else data.rows.weight

    def step(k, carry):
        lo = k * b
        start = jnp.minimum(lo, n - b)

        def take(a):  # sparse counts: the block densified, only while it is used
            return dense_rows(a, start, b)

        keep = None if weight is None else take(weight)
        count = keep
        if n % b:  # the clamped last block: rows below lo were counted by the block before
            fresh = (start + jnp.arange(b) >= lo)[:, None].astype(data.Y.dtype)
            count = fresh if keep is None else fresh * keep
        return body(start, take, count, keep, carry)

    return jax.lax.fori_loop(0, blocks, jax.checkpoint(step) if checkpoint else step, init)


def _own_sums(rows: Rows | None, zeros):
    """Zeros (replicated: a constant, B's or C's shape) to start sums over this device's rows: under
    ``shard_map`` they vary over the rows' axis (each device's sums are its own until :func:`_total`),
    as a loop's carry must say."""
    if rows is None or rows.axis is None:
        return zeros
    return jax.lax.pcast(zeros, (rows.axis,), to="varying")


def _blocks_of(block_rows: int | None, n: int) -> int | None:
    """The block size that runs: None (one block: every row at once) when there is none or it is >= n."""
    return None if block_rows is None or block_rows >= n else block_rows
