"""Every value of a job that sizes memory, checked against the machine once, before any work.

A job's memory grows with three of its values, each estimated here in bytes (:func:`needs`):

- ``dataset.replication``: the data, ``rows x (p + d + 1)`` numbers held on the host as float64 (a
  sparse Y: its first row's CSR bytes per row) and, dense, once more on the device in the fit's dtype;
- ``n_iter``: the ELBO history, allocated up front on the device (``n_iter`` numbers of the fit's
  dtype per replicate) and read back on the host as float64 (the curve, its shift by log y!, its gap
  to the optimum: 3 copies);
- ``processes``: each of the N processes started on this machine is a Python with JAX, counted as
  :data:`WORKER_COPIES` times this process's resident memory (what it has imported, then the
  compiled program), besides the data they share out.

:func:`check` adds them up and compares the sum with what the machine can give
(:func:`plnexp.system.machine.available_memory`); over it, one :class:`ConfigError` line names the
value that needs the most, its estimate, the limit and the largest value that fits. ``processes``
above the data's rows is refused there too (each process fits rows of its own). The estimates are
lower bounds (the fit's own arrays come on top): a job refused here could never have run.
:func:`plnexp.experiment.plan.check_data` calls :func:`check` for every job, before its data is
loaded and before any run exists.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..system import machine
from .config import ConfigError

if TYPE_CHECKING:
    from .config import Config

HOST_ITEMSIZE = 8  # the host's copy of the data and of the ELBO history: float64
HOST_CURVES = 3  # the curve read back, shifted by log y!, and its gap to the optimum
# a worker of processes=N holds what this process holds (Python, JAX, plnexp's imports) and about as much
# again once its program is compiled and its collectives started (docs/results.md, 2026-11-28: #62)
WORKER_COPIES = 2


@dataclass(frozen=True)
class Shape:
    """What the estimates read of a data set: its rows (replicated), columns p, covariates d, the
    host bytes of one row, whether Y is sparse, and its rows before replication."""

    rows: int
    p: int
    d: int
    row_bytes: int
    sparse: bool = False
    base_rows: int = 0

    @classmethod
    def of(cls, dataset) -> Shape:
        """The shape of ``dataset`` as :meth:`~plnexp.jobs.dataset_specs.DatasetSpec.load` would give it, read
        from its settings or its first row (never its whole data)."""
        rows = int(dataset.rows())
        base = rows // max(1, dataset.replication)
        p, d = getattr(dataset, "p", None), getattr(dataset, "d", None)
        sparse = bool(getattr(dataset, "sparse", False))
        if isinstance(p, int) and isinstance(d, int) and not sparse:
            return cls(rows, p, d, (p + d + 1) * HOST_ITEMSIZE, False, base)
        first = dataset.load_rows(0, 1)
        X = np.asarray(first.X)
        d = int(X.shape[1]) if X.ndim == 2 else 1
        if first.sparse:
            Y = first.Y
            y_bytes = sum(int(getattr(Y, a).nbytes) for a in ("data", "indices", "indptr") if hasattr(Y, a))
            return cls(rows, first.p, d, y_bytes + (d + 1) * HOST_ITEMSIZE, True, base)
        return cls(rows, first.p, d, (first.p + d + 1) * HOST_ITEMSIZE, False, base)


@dataclass(frozen=True)
class Need:
    """The bytes one value of the config sizes: ``key=value`` needs ``nbytes`` (``per_unit`` for each
    unit of the value), counted as ``how`` says."""

    key: str
    value: int
    nbytes: int
    per_unit: int
    how: str


def needs(config: Config, shape: Shape, *, local: bool = True, resident: int | None = None) -> list[Need]:
    """The memory each value of ``config`` that sizes it (``dataset.replication``, ``n_iter``,
    ``processes``) needs on data of ``shape`` (``local``: the processes of ``processes`` > 1 start on
    this machine; ``resident``: one process's bytes, this one's by default)."""
    itemsize = int(np.dtype(config.precision.dtype).itemsize)
    device_row = 0 if shape.sparse else (shape.p + shape.d + 1) * itemsize
    per_row = shape.row_bytes + device_row
    per_replica = max(1, shape.base_rows) * per_row
    replication = config.dataset.replication
    data = Need(
        "dataset.replication",
        replication,
        per_replica * replication,
        per_replica,
        f"the data: {shape.rows:,} rows x {per_row:,} bytes, on the host and the device",
    )
    per_iter = config.replicates * (itemsize + HOST_CURVES * HOST_ITEMSIZE)
    history = Need(
        "n_iter", config.n_iter, per_iter * config.n_iter, per_iter, f"the ELBO history: {per_iter} bytes an iteration"
    )
    out = [data, history]
    if config.processes > 1 and local:
        one = WORKER_COPIES * (machine.resident_memory() if resident is None else resident)
        out.append(
            Need(
                "processes",
                config.processes,
                one * config.processes,
                one,
                f"{config.processes} processes of ~{size(one)} each",
            )
        )
    return out


def size(nbytes: float) -> str:
    """``1.2 GB``, ``96.2 TB``: bytes in decimal units, three figures."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(nbytes) < 1000 or unit == "PB":
            return f"{nbytes:.3g} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1000
    raise AssertionError  # the loop returns at PB


def check(
    config: Config,
    shape: Shape,
    *,
    local: bool = True,
    available: tuple[int | None, str] | None = None,
    resident: int | None = None,
) -> None:
    """Refuse ``config`` on data of ``shape`` in one :class:`ConfigError` line where ``processes``
    exceeds the data's rows, or where what its values need (:func:`needs`) exceeds what the machine
    can give (``available``: bytes and their source, :func:`plnexp.system.machine.available_memory`
    by default; unknown: not checked)."""
    limit, where = machine.available_memory() if available is None else available
    found = needs(config, shape, local=local, resident=resident)
    if config.processes > shape.rows:
        most = shape.rows  # and no more than the memory holds (the processes' need is the last one)
        if limit is not None and found[-1].key == "processes" and found[-1].per_unit > 0:
            most = min(most, max(1, (limit - sum(n.nbytes for n in found[:-1])) // found[-1].per_unit))
        raise ConfigError(
            f"processes={config.processes}: more processes than the data's {shape.rows:,} rows (each process fits "
            f"rows of its own); allowed values are integers from 1 to {most:,}"
        )
    if limit is None:
        return
    total = sum(n.nbytes for n in found)
    if total <= limit:
        return
    worst = max(found, key=lambda n: n.nbytes)
    room = limit - (total - worst.nbytes)
    allowed = room // worst.per_unit if worst.per_unit > 0 else 0
    allowed_text = (
        f"integers from 1 to {allowed:,}"
        if allowed >= 1
        else f"none with the other values as they are ({size(total - worst.nbytes)} already)"
    )
    if worst.key == "processes" and allowed >= 1:
        allowed_text = f"integers from 1 to {min(allowed, shape.rows):,}"
    raise ConfigError(
        f"{worst.key}={worst.value}: needs ~{size(worst.nbytes)} ({worst.how}), {size(total)} in all, over the "
        f"{size(limit)} {where}; allowed values are {allowed_text}"
    )


def check_all(configs: Any, local: bool = True) -> None:
    """:func:`check` for each of ``configs`` (each distinct data set's shape read once)."""
    shape = functools.cache(Shape.of)
    for config in configs:
        check(config, shape(config.dataset), local=local)
