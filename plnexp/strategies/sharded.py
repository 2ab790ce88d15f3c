"""``scan_sharded``: one fit across the devices of a 1-D mesh, its rows split between them.

A PLN fit is data-parallel by rows: Y, O, X, M, S and the optimizer's per-row state split by rows;
the only quantities that mix rows are sums over rows (the ELBO's, M'M, sum S^2, X'M, X'(Y - A)),
which :mod:`plnexp.core.row_sums` takes in one place (``_total``). The p x p closed forms (Sigma, Omega, B)
are then computed on every device from the reduced statistics (replicated).

Two ways to write it, an option of the strategy (``strategy.via``):

- ``jit``: ``jax.jit`` of scan's own fit on row-sharded arrays (``NamedSharding``); XLA's
  partitioner inserts the all-reduces. The carry is pinned to its sharding every iteration.
- ``shard_map``: ``jax.shard_map`` of the same fit, written per device: every sum over rows is
  ``psum``-ed over the mesh axis explicitly (``Rows.axis``).

n need not divide by the device count: the arrays are padded with rows that contribute nothing
(Y = O = X = 0, weight 0, M = 0 kept there by a zero gradient; see :class:`plnexp.core.arrays.Rows`), and
Sigma divides by the number of data rows. One device gives scan's program on one device's rows.

Across JAX processes (``processes=N``: :mod:`plnexp.experiment.processes` starts them and calls
``jax.distributed.initialize`` first), the mesh is every process's devices (``jax.devices()``) and
each process puts on its own devices only the rows they hold (:func:`plnexp.core.data_rows.row_range`),
the global arrays made with ``jax.make_array_from_process_local_data``; the program is the same,
its reductions now between processes (gloo on CPUs). The curve, the final ELBO and B, Sigma are
replicated, so every process reads them. The data a process is given may be its rows alone
(:attr:`plnexp.core.data.Data.part`, :func:`rows_of_this_process`: what a job of ``processes=N``
reads); M and S are then read back as each process's rows of them (the whole data: gathered).

Sparse counts (a PLN-PCA fit with ``block_rows``, ``via=shard_map`` only: the registry's
``sparse_counts``): each device holds the CSR of its own rows (:func:`sparse_rows`), placed like the
dense arrays as global arrays split evenly over the mesh axis, so that inside ``shard_map`` every
device sees a :class:`~plnexp.core.arrays.SparseCounts` of its rows (:func:`device_view`) and the
model's block loop densifies blocks of them. Under ``via=jit`` the program sees the global arrays, whose
concatenated per-device CSRs are no one CSR: refused before placing (:func:`plnexp.fitting.engine.check_sparse`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, cast
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ..core.arrays import SparseCounts
from ..core.data import DataError, device_offsets
from ..core.data_rows import row_range
from ..core.arrays import Arrays, Rows
from ..core.initial_state import init_noise, init_state, init_state_given
from ..core.pln_elbo import PLNState
from ..core.problem import FitState, Output, Problem
from .base import WHOLE_PROGRAM, Compiled, compile_one, scanned

AXIS = "rows"
VIA = ("jit", "shard_map")


def mesh_of(platform: str, devices: int) -> Mesh:
    """A 1-D mesh over the first ``devices`` devices of ``platform`` (0: all of them); one-line
    ValueError naming ``strategy.devices`` when there are fewer."""
    available = jax.devices(platform)
    k = len(available) if devices == 0 else devices
    if k > len(available):
        hint = (
            " (simulated CPU devices: set JAX_NUM_CPU_DEVICES=N before the process starts)" if platform == "cpu" else ""
        )
        raise ValueError(
            f"strategy.devices={devices}: only {len(available)} {platform} device(s) visible to JAX "
            f"here{hint}; allowed values are 0 (all) to {len(available)}"
        )
    return Mesh(np.array(available[:k]), (AXIS,))


def _rows_in(mesh: Mesh, n: int) -> tuple[int, int, int]:
    devices = list(mesh.devices.flat)
    mine = [i for i, d in enumerate(devices) if d.process_index == jax.process_index()]
    if not mine or mine != list(range(mine[0], mine[0] + len(mine))):
        raise ValueError(f"strategy=scan_sharded: this process's devices {mine} are not one run of the mesh's")
    return row_range(n, len(devices), mine[0], len(mine))


def rows_of_this_process(n: int, platform: str, devices: int = 0) -> tuple[int, int]:
    """The rows ``(start, stop)`` of a data set of ``n`` rows that this JAX process's devices hold in
    the mesh of ``devices`` devices of ``platform`` (0: every process's all): the rows it reads."""
    start, stop, _ = _rows_in(mesh_of(platform, devices), n)
    return start, stop


def across_processes_sum(value):
    """The sum over every JAX process of ``value`` (a float or an array of floats, float64, the same
    shape in every process; each process calls this at the same point): in one process, itself."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    with jax.enable_x64(True):
        parts = multihost_utils.process_allgather(np.asarray(value, dtype=np.float64))
    total = np.sum(np.asarray(parts, dtype=np.float64), axis=0)
    return float(total) if np.ndim(value) == 0 else total


def across_processes_max(value: int) -> int:
    """The largest over every JAX process of the integer ``value`` (each process calls this at the
    same point): in one process, itself."""
    if jax.process_count() == 1:
        return int(value)
    from jax.experimental import multihost_utils

    return int(np.max(multihost_utils.process_allgather(np.asarray(value, dtype=np.int32))))


def sparse_rows(Y, dtype, mesh: Mesh, devices: int, per: int) -> SparseCounts:
    """Sparse counts split by rows over ``mesh``: ``Y`` (scipy CSR) the data rows of this process's
    ``devices`` devices (a run of the mesh's, ``per`` rows each, the rows past ``Y``'s padding rows).
    Each device's CSR of its rows: its row starts rebased to 0 (``per + 1``), its columns and values
    padded with entries of value 0 (column 0) to the most non-zeros of any device of the mesh + 1;
    placed as global arrays of one equal slice per device (``make_array_from_process_local_data``),
    their ``row_nnz_max`` the mesh's. ``shape`` is the padded data's (:func:`device_view` gives a
    device's inside ``shard_map``)."""
    starts = np.minimum(np.arange(devices + 1) * per, Y.shape[0])
    row_nnz = np.diff(Y.indptr)
    nnz = [int(Y.indptr[b] - Y.indptr[a]) for a, b in zip(starts[:-1], starts[1:])]
    if max(nnz) >= 2**31 - 1:  # int32 offsets (checked before the int32 maximum across processes)
        raise DataError(f"sparse counts: {max(nnz)} non-zeros on one device; allowed are fewer than 2**31 - 1")
    width = across_processes_max(max(nnz)) + 1  # every device's length: one entry of value 0 at least
    row_nnz_max = across_processes_max(int(row_nnz.max(initial=0)))
    indptr = np.zeros((devices, per + 1), np.int32)
    indices = np.zeros((devices, width), np.int32)
    values = np.zeros((devices, width), dtype)
    for k, (a, b) in enumerate(zip(starts[:-1], starts[1:])):
        first, last = int(Y.indptr[a]), int(Y.indptr[b])
        indptr[k, : b - a + 1] = Y.indptr[a : b + 1] - first
        indptr[k, b - a + 1 :] = last - first  # padding rows: empty
        indices[k, : last - first] = Y.indices[first:last]
        values[k, : last - first] = Y.data[first:last]
    rows = NamedSharding(mesh, P(AXIS))
    put = lambda a: jax.make_array_from_process_local_data(rows, a.reshape(-1), (mesh.size * a.shape[1],))
    shape = (mesh.size * per, int(Y.shape[1]))
    return SparseCounts(put(indptr), put(indices), put(values), shape, row_nnz_max)


def _counts(Y: SparseCounts) -> jax.Array:
    """Sparse counts where :class:`~plnexp.core.arrays.Arrays` holds Y (annotated as an array)."""
    return cast(jax.Array, Y)


def device_view(data: Arrays, devices: int) -> Arrays:
    """Inside ``shard_map`` over ``devices`` devices: the data of one device, whose sparse counts
    (:func:`sparse_rows`) then have the shape of its rows (dense arrays have it already)."""
    Y = data.Y
    if not isinstance(Y, SparseCounts):
        return data
    return data._replace(Y=replace(Y, shape=(Y.shape[0] // devices, Y.shape[1])))


def state_specs(problem: Problem, state: FitState) -> FitState:
    """The partition spec of every leaf of a fit state: the per-row arrays (M, S and the optimizer's
    state for them) split by rows, the rest (B, Sigma, Omega, step counts) replicated. The
    optimizer's leaves are told apart by shape, on an abstract state whose row count is unlike
    any other dimension."""
    pln = state.pln
    n = max(pln.M.shape[0], *pln.B.shape, *pln.M.shape[1:], *pln.Sigma.shape) + 1
    sds: Any = lambda shape: jax.ShapeDtypeStruct(shape, pln.M.dtype)  # stands in for arrays
    # trees shaped like a state or the data, holding abstract shapes or partition specs where the
    # NamedTuples' fields are annotated for arrays: hence the ignores below. Every field keeps its
    # shape (Sigma holds C (p, q) for pca, which free reads) but M and S, given n rows.
    rows_of = lambda a: sds((n, *a.shape[1:]))
    params = problem.model.free(
        PLNState(sds(pln.B.shape), rows_of(pln.M), rows_of(pln.S), sds(pln.Sigma.shape), sds(pln.Omega.shape))
    )
    opt = jax.eval_shape(problem.tx.init, params)
    by_rows = lambda x: P(AXIS) if len(x.shape) >= 1 and x.shape[0] == n else P()
    return FitState(PLNState(P(), P(AXIS), P(AXIS), P(), P()), jax.tree.map(by_rows, opt))  # type: ignore[arg-type]  # partition specs, not arrays


def data_specs(axis: str | None) -> Arrays:
    return Arrays(P(AXIS), P(AXIS), P(AXIS), P(), Rows(P(AXIS), P(), axis))  # type: ignore[arg-type]  # partition specs, not arrays


def _mesh(data: Arrays) -> Mesh:
    """The mesh the rows are split over: ``place`` puts them with a ``NamedSharding`` on a ``Mesh``."""
    sharding = cast(NamedSharding, data.X.sharding)
    return cast(Mesh, sharding.mesh)


@dataclass(frozen=True, eq=False)
class RowSharded:
    """The Program of ``scan_sharded`` (see the module's doc)."""

    problem: Problem
    n_iter: int
    devices: int = 0  # 0: every device of the platform
    via: str = "jit"
    _jitted: dict[Mesh, jax.stages.Wrapped] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_jitted", {})  # per mesh

    # ------------------------------------------------------------ data and state
    def place(self, data: Sequence, dtype, device) -> Arrays:
        """The data set's rows split across the mesh, padded to a multiple of the device count (O as
        :func:`~plnexp.core.data.device_offsets` gives it: the (n, 1) column of offsets one per row):
        the global row-sharded arrays, this process giving only the rows of its own devices (its
        padding rows included: they are the last; in one process, every row). ``one``: the whole
        data, or this process's rows of it (:attr:`~plnexp.core.data.Data.part`, which must be the
        rows :func:`rows_of_this_process` gives), whose log y! is summed across the processes."""
        (one,) = data
        mesh = mesh_of(device.platform, self.devices)
        part = one.part
        n = one.n if part is None else part.n
        start, stop, pad = _rows_in(mesh, n)
        if part is not None and (part.start, part.stop) != (start, stop):
            raise ValueError(
                f"strategy=scan_sharded: this process holds rows {part.start}:{part.stop} of {n}; its devices "
                f"hold rows {start}:{stop}"
            )
        offset = 0 if part is None else start  # where this process's rows start in ``one``'s arrays
        n_padded = n + (-n % mesh.size)
        rows, same = NamedSharding(mesh, P(AXIS)), NamedSharding(mesh, P())

        def block(a):
            a = np.asarray(a[start - offset : stop - offset], dtype=dtype).reshape(stop - start, -1)
            local = np.concatenate([a, np.zeros((pad, a.shape[1]), dtype)])
            return jax.make_array_from_process_local_data(rows, local, (n_padded, a.shape[1]))

        replicated = lambda x: jax.make_array_from_process_local_data(same, np.asarray(x), ())
        log_factorial = one.log_factorial if part is None else across_processes_sum(one.log_factorial)
        per = n_padded // mesh.size
        devices = (stop - start + pad) // per  # this process's (a run of the mesh's: _rows_in)
        return Arrays(
            _counts(sparse_rows(one.Y[start - offset : stop - offset], dtype, mesh, devices, per))
            if one.sparse
            else block(np.asarray(one.Y)),
            block(device_offsets(one.O)),
            block(np.asarray(one.X)),
            replicated(dtype(log_factorial)),
            Rows(
                block(np.ones(stop - offset)),
                replicated(dtype(n)),
                AXIS if self.via == "shard_map" else None,
            ),
        )

    def _shardings(self, state: FitState, mesh: Mesh) -> FitState:
        return jax.tree.map(lambda spec: NamedSharding(mesh, spec), state_specs(self.problem, state))

    def initial(self, problem: Problem, data: Arrays, init: str, seeds: Sequence[int]) -> FitState:
        (seed,) = seeds
        assert data.rows is not None  # place() gives the data its Rows
        if isinstance(data.Y, SparseCounts):  # each device's CSR: read on its device alone
            pln = self._initial_per_device(problem, data, init, seed)
        else:
            eager = data._replace(rows=replace(data.rows, axis=None))  # outside shard_map: XLA reduces
            pln = init_state(problem.model, eager, init, seed)
        state = problem.init(pln)
        return jax.device_put(state, self._shardings(state, _mesh(data)))

    def _initial_per_device(self, problem: Problem, data: Arrays, init: str, seed: int) -> PLNState:
        """:func:`~plnexp.core.initial_state.init_state` under ``shard_map`` (sparse counts: each device
        reads its rows' CSR), its sums over rows ``psum``-ed; the noise of ``init="random"`` drawn
        for every row, as for dense data, each device given its rows of it."""
        mesh, model = _mesh(data), problem.model
        noise = init_noise(model, data, init, seed)
        specs = PLNState(P(), P(AXIS), P(AXIS), P(), P())  # type: ignore[arg-type]  # partition specs, not arrays
        per_device = lambda d, z: init_state_given(model, device_view(d, mesh.size), init, z)
        in_specs = (data_specs(AXIS), None if noise is None else P(AXIS))
        start = jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=specs, check_vma=True)
        return jax.jit(start)(data, noise)

    def split(self, state: FitState, data: Arrays) -> list[FitState]:
        """The state without its padding rows (the optimizer's state is left as it is)."""
        assert data.rows is not None  # place() gives the data its Rows
        n = int(np.asarray(data.rows.n))
        pln = state.pln
        return [FitState(pln._replace(M=pln.M[:n], S=pln.S[:n]), state.opt_state)]

    def unbatch(self, out: Output, data: Arrays) -> list[Output]:
        return [out._replace(state=self.split(out.state, data)[0])]

    # ------------------------------------------------------------ the program
    def _program(self, state: FitState, data: Arrays):
        mesh = _mesh(data)
        if mesh not in self._jitted:
            shardings = self._shardings(state, mesh)
            if self.via == "shard_map":
                specs = state_specs(self.problem, state)
                out = Output(specs, P(), P(), P())  # type: ignore[arg-type]  # partition specs, not arrays
                per_device = lambda s, d: scanned(
                    self.problem, self.n_iter, self.problem.step, s, device_view(d, mesh.size)
                )
                fit = jax.shard_map(
                    per_device, mesh=mesh, in_specs=(specs, data_specs(AXIS)), out_specs=out, check_vma=True
                )
            else:
                fit = self._pinned(shardings)
            self._jitted[mesh] = jax.jit(fit, out_shardings=Output(shardings, *[NamedSharding(mesh, P())] * 3))  # type: ignore[arg-type]  # shardings, not arrays
        return self._jitted[mesh]

    def _pinned(self, shardings: FitState):
        """scan's fit with the carry held at its sharding every iteration (so that XLA's partitioner
        never gathers M or S onto one device)."""
        problem = self.problem

        def fit(state: FitState, data: Arrays) -> Output:
            def step(s, d):
                new, elbo = problem.step(s, d)
                return jax.lax.with_sharding_constraint(new, shardings), elbo

            return scanned(problem, self.n_iter, step, state, data)

        return fit

    def call(self, state, data):
        return self._program(state, data)(state, data)

    def compile(self, state, data) -> Compiled:
        counted = f"{WHOLE_PROGRAM} (+ one final ELBO), per device"
        return compile_one(self._program(state, data), f"scan_sharded_{self.via}", counted, state, data)
