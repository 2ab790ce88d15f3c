"""This machine's floor for one iteration of the fit: how fast a hand-fused kernel could go at best.

What one iteration must do at least is declared by its model (:class:`plnexp.core.model.Work`, the ``work`` of each
:class:`plnexp.core.model.Model`), and sized by the data (:class:`Iteration`, made by :func:`iteration`):
with n rows, p counts per row and a latent of width q (p for ``full`` and ``profiled``, the rank for
``pca``), an iteration streams the model's data arrays (Y and O, n x p, read) and its latent arrays
(M, S and the optimizer's two moments of each, n x q, read and written), does its n x p x q
products and its p x p factorizations::

    floor_ms = streamed bytes / copy bandwidth + dots * dot_ms + factorizations * factor_ms
    streamed bytes = (data_arrays * n p + 2 * latent_arrays * n q) * itemsize

For each model:

- ``full``, ``profiled`` (q = p): 2 data arrays + 6 latent arrays read and written = 14 n x p arrays,
  2 n x p x p products (M Omega for the gradient, M'M for Sigma), and Sigma's Cholesky factor with
  the inverse Omega it gives: independent of n, it is most of the floor at oaks' 116 rows (p = 114)
  and nothing at 10^6;
- ``pca`` of rank q: 2 n x p data arrays + 12 n x q arrays (6 read and written), and 6 n x p x q
  products (MC' and S^2 (C o C)' for the exponent, RC and A (C o C) for dM and dS, R'M and A'S^2
  for dC).

Offsets one per row (a log library size: :func:`plnexp.core.data.device_offsets` sends the device their
(n, 1) column) are no n x p stream: such an iteration reads one n x p array fewer and the n offsets.

The parts are measured on the fit's own device and dtype (:func:`measure_copy`,
:func:`measure_dot`, :func:`measure_factor`), each as the fastest of a few calls of a compiled loop (so that a tiny shape
times its work, not one dispatch):

- the copy bandwidth of an in-place pass over a buffer the size of the fit's working set (its
  distinct arrays: the data and latent arrays above, rounded up to a power of two between 1 MiB and
  256 MiB: a fit whose arrays stay in cache is held to the cache's bandwidth, a large one to
  memory's). Measured once per machine, device, dtype and buffer size;
- one n x p times p x q product: measured once per machine, device, dtype and (n, p, q);
- one p x p Cholesky factor and inverse, as the model computes it (:func:`plnexp.core.pln_elbo.inverse_spd`:
  XLA's own factorization, no faster one being at hand): once per machine, device, dtype and p.

Measured values are cached per machine (:func:`cached`) in a JSON file of the user's cache folder
(``$PLNEXP_FLOOR_CACHE``, else ``$XDG_CACHE_HOME/plnexp``, else ``~/.cache/plnexp``), one file per
machine identity (host, CPU model, usable cores, jax/jaxlib versions, XLA_FLAGS, device kind),
replaced atomically: parallel jobs never leave a half-written file; an unreadable or corrupt one is
measured again, never an error. A job logs the floor of the machine that ran it
(:func:`run_metrics`, called by :mod:`plnexp.experiment.runner` before the fit), and the report divides the
job's ms/iter by it (``× floor``) and XLA's bytes per iteration by its streamed bytes.

No module-level device or dtype state: every function takes the shape, dtype and device it measures.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .metrics import FLOOR
from ..system.commandline import first_line
from ..core.model import Work

if TYPE_CHECKING:
    from ..core.data import Data
    from ..core.model import Model

log = logging.getLogger(__name__)

MIN_COPY_BYTES, MAX_COPY_BYTES = 2**20, 2**28  # the copy buffer's bounds (1 MiB, 256 MiB)
COPY_TRAFFIC = 2**28  # bytes one timed copy call passes over (in loops over a smaller buffer)
DOT_FLOPS = 2e8  # flops one timed dot call does at least (up to MAX_LOOP pairs of products)
MAX_LOOP = 256
CACHE_ENV = "PLNEXP_FLOOR_CACHE"
CACHE_FORMAT = 2  # 2: measure_dot times pairs of products (format 1's dot_ms are not read)
# what a run logs: floor_ms_per_iter, floor_copy_GBps, floor_dot_ms, floor_factor_ms, floor_bytes_per_iter
METRICS = tuple(m.key for m in FLOOR)
PARTS = ("copy", "dot", "factor")  # what the cache file holds, each keyed by what it depends on
LEGACY_STREAMED_ARRAYS = 14  # what the floor counted before it knew the model: the full model's n x p arrays


@dataclass(frozen=True)
class Iteration:
    """One fit's iteration as the floor counts it: the model's :class:`Work` at the data's n rows and
    p columns, a latent of width ``q``, and whether the offsets are one per row (``row_offsets``: O
    is read as its (n, 1) column, one n x p data array fewer)."""

    n: int
    p: int
    q: int
    work: Work
    row_offsets: bool = False

    def __post_init__(self):
        for key in ("n", "p", "q"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}={value!r}: allowed values are integers >= 1")
        if self.row_offsets and self.work.data_arrays < 1:
            raise ValueError("row_offsets=True: the model's work reads no offsets (data_arrays=0)")

    @property
    def wide_arrays(self) -> int:
        """The n x p arrays read: the model's data arrays, less O when its offsets are one per row."""
        return self.work.data_arrays - int(self.row_offsets)

    @property
    def _column(self) -> int:
        return self.n if self.row_offsets else 0  # the (n, 1) offsets, read once

    def streamed_elements(self) -> int:
        """Entries one iteration must read or write at least: the n x p arrays read, the n x q ones
        read and written, the n offsets of a per-row O."""
        return self.wide_arrays * self.n * self.p + 2 * self.work.latent_arrays * self.n * self.q + self._column

    def working_set_elements(self) -> int:
        """Entries of the distinct arrays an iteration touches (each once)."""
        return self.wide_arrays * self.n * self.p + self.work.latent_arrays * self.n * self.q + self._column

    def stream_bytes(self, itemsize: int) -> int:
        return self.streamed_elements() * itemsize

    @property
    def dot_shape(self) -> tuple[int, int, int]:
        """(n, p, q): the product the floor counts, an n x p times p x q one (flops 2 n p q)."""
        return self.n, self.p, self.q

    def describe(self) -> str:
        """The count in words, e.g. ``14 n x p arrays + 2 n x p x p products + 1 p x p Cholesky and inverse``."""
        if self.q == self.p:
            arrays = f"{self.wide_arrays + 2 * self.work.latent_arrays} n x p arrays"
            dots = "n x p x p"
        else:
            arrays = f"{self.wide_arrays} n x p + {2 * self.work.latent_arrays} n x q arrays (q={self.q})"
            dots = "n x p x q"
        column = " + the n offsets" if self.row_offsets else ""
        factor = f" + {self.work.factorizations} p x p Cholesky and inverse" if self.work.factorizations else ""
        return f"{arrays}{column} + {self.work.dots} {dots} products{factor}"


def iteration(model: Model, data: Data) -> Iteration:
    """The :class:`Iteration` of a fit of ``model`` to ``data``: the model's declared work, its
    latent width (``model.rank``, or p where it is 0), and whether the data's offsets reach the device
    as a column (:func:`plnexp.core.data.device_offsets`)."""
    from ..core.data import device_offsets

    n, p = int(data.n), int(data.p)
    row_offsets = p > 1 and np.shape(device_offsets(data.O))[1] == 1
    return Iteration(n, p, int(model.rank) or p, model.work, row_offsets)


@dataclass(frozen=True)
class Floor:
    """The floor of one :class:`Iteration` in ``dtype`` and its measured parts."""

    iteration: Iteration
    dtype: str  # numpy name: float32, float64
    copy_GBps: float  # in-place copy bandwidth (bytes read + written per second / 1e9)
    copy_bytes: int  # the buffer it was measured on
    dot_ms: float  # one n x p times p x q product
    factor_ms: float = 0.0  # one p x p Cholesky factor and inverse (0: the model does none)

    @property
    def stream_bytes(self) -> int:
        return self.iteration.stream_bytes(np.dtype(self.dtype).itemsize)

    @property
    def stream_ms(self) -> float:
        return stream_ms(self.iteration, np.dtype(self.dtype).itemsize, self.copy_GBps)

    @property
    def ms_per_iter(self) -> float:
        return floor_ms(self.iteration, np.dtype(self.dtype).itemsize, self.copy_GBps, self.dot_ms, self.factor_ms)

    @property
    def dot_GFLOPps(self) -> float:
        n, p, q = self.iteration.dot_shape
        return 2 * n * p * q / (self.dot_ms / 1e3) / 1e9

    def metrics(self) -> dict[str, float]:
        return {
            "floor_ms_per_iter": self.ms_per_iter,
            "floor_copy_GBps": self.copy_GBps,
            "floor_dot_ms": self.dot_ms,
            "floor_factor_ms": self.factor_ms,
            "floor_bytes_per_iter": float(self.stream_bytes),
        }


# ---------------------------------------------------------------- the arithmetic
def stream_ms(it: Iteration, itemsize: int, copy_GBps: float) -> float:
    """Milliseconds to stream the iteration's arrays once at ``copy_GBps``."""
    return 1e3 * it.stream_bytes(itemsize) / (copy_GBps * 1e9)


def floor_ms(it: Iteration, itemsize: int, copy_GBps: float, dot_ms: float, factor_ms: float = 0.0) -> float:
    """The floor of one iteration, in ms: the streamed arrays plus the model's products and factorizations."""
    return stream_ms(it, itemsize, copy_GBps) + it.work.dots * dot_ms + it.work.factorizations * factor_ms


def copy_bytes(it: Iteration, itemsize: int) -> int:
    """The copy buffer for a fit: its working set rounded up to a power of two, within [1 MiB, 256 MiB]."""
    want = it.working_set_elements() * itemsize
    return int(min(max(2 ** math.ceil(math.log2(max(want, 1))), MIN_COPY_BYTES), MAX_COPY_BYTES))


# ---------------------------------------------------------------- measuring
def _device(device):
    """A jax.Device from a device, a name ('cpu', 'gpu', 'auto') or None (JAX's default)."""
    import jax

    if device is None:
        return jax.devices()[0]
    if isinstance(device, str):
        from ..core.device import resolve_device

        return resolve_device(device)
    return device


def _fastest(call, x, *args, min_calls: int = 3, max_calls: int = 20, budget_s: float = 0.5) -> float:
    """Seconds of the fastest of at least ``min_calls`` blocked calls of ``x = call(x, *args)`` (x
    donated), more while they took less than ``budget_s`` in all; one untimed call first (compile)."""
    import jax

    x = jax.block_until_ready(call(x, *args))
    times: list[float] = []
    while len(times) < max_calls and (len(times) < min_calls or sum(times) < budget_s):
        t0 = time.perf_counter()
        x = jax.block_until_ready(call(x, *args))
        times.append(time.perf_counter() - t0)
    del x
    return min(times)


def _per_call(body, count: float, dtype, *make) -> float:
    """Seconds of one application of ``body``: the fastest call of a compiled loop of ``count`` of
    them (1 to :data:`MAX_LOOP`), its first argument donated (in place, as in a fit's loop), on the
    arrays that the functions ``make`` build (in ``dtype``'s x64 setting)."""
    import jax

    count = int(min(max(count, 1), MAX_LOOP))

    def run(x, *args):
        return jax.lax.fori_loop(0, count, lambda i, a: body(a, *args), x)

    with jax.enable_x64(np.dtype(dtype) == np.float64):
        return _fastest(jax.jit(run, donate_argnums=0), *(m() for m in make)) / count


def measure_copy(nbytes: int, dtype, device=None) -> float:
    """In-place copy bandwidth over a buffer of ``nbytes``, GB/s (bytes read + written)."""
    import jax.numpy as jnp

    dtype, dev = np.dtype(dtype), _device(device)
    rows = max(nbytes // (1024 * dtype.itemsize), 1)
    passes = COPY_TRAFFIC // (rows * 1024 * dtype.itemsize)
    # a * 0.5 + 1 stays at 1..2: no denormals
    seconds = _per_call(lambda a: a * 0.5 + 1.0, passes, dtype, lambda: jnp.ones((rows, 1024), dtype, device=dev))
    return 2 * rows * 1024 * dtype.itemsize / seconds / 1e9


def measure_dot(n: int, p: int, k: int, dtype, device=None) -> float:
    """Milliseconds of one (n, p) times (p, k) product: pairs of products chained in one call,
    M <- (M W) W' with W the first k columns of the p x p identity (a projection: M stays bounded,
    and the products cannot tell W from any other), the second an (n, k) times (k, p) product of the
    same flops (a fit of rank k does products of both orientations; k = p: two n x p x p ones)."""
    import jax.numpy as jnp

    dtype, dev = np.dtype(dtype), _device(device)
    pair = _per_call(
        lambda a, b: (a @ b) @ b.T,
        math.ceil(DOT_FLOPS / (4 * n * p * k)),
        dtype,
        lambda: jnp.ones((n, p), dtype, device=dev),
        lambda: jnp.eye(p, k, dtype=dtype, device=dev),
    )
    return 1e3 * pair / 2


def measure_factor(p: int, dtype, device=None) -> float:
    """Milliseconds of one p x p Cholesky factor and the inverse it gives, as the full model computes
    Omega (:func:`plnexp.core.pln_elbo.inverse_spd`), chained in one call: X <- X^-1 from 2 I (X stays 2 I
    or I / 2; the factorization's work does not depend on the values)."""
    import jax.numpy as jnp

    from ..core.pln_elbo import inverse_spd

    dtype, dev = np.dtype(dtype), _device(device)
    count = math.ceil(DOT_FLOPS / (2 * p**3))
    return 1e3 * _per_call(inverse_spd, count, dtype, lambda: 2 * jnp.eye(p, dtype=dtype, device=dev))


def measure_exp(n: int, p: int, dtype, device=None) -> float:
    """Milliseconds of one in-place ``exp`` pass over an n x p array (printed by the benchmark beside
    the floor: transcendentals, not bytes, bound the elementwise work on some CPUs; not in the floor)."""
    import jax.numpy as jnp

    dtype, dev = np.dtype(dtype), _device(device)
    count = COPY_TRAFFIC // (2 * n * p * dtype.itemsize)
    return 1e3 * _per_call(lambda x: jnp.exp(-jnp.abs(x)), count, dtype, lambda: jnp.ones((n, p), dtype, device=dev))


def measure(it: Iteration, dtype, device=None) -> Floor:
    """The floor of ``it`` measured now, uncached (the benchmark's)."""
    dtype = np.dtype(dtype)
    size = copy_bytes(it, dtype.itemsize)
    factor = measure_factor(it.p, dtype, device) if it.work.factorizations else 0.0
    return Floor(
        it, dtype.name, measure_copy(size, dtype, device), size, measure_dot(*it.dot_shape, dtype, device), factor
    )


# ---------------------------------------------------------------- the per-machine cache
def cache_dir() -> Path:
    """``$PLNEXP_FLOOR_CACHE``, else ``$XDG_CACHE_HOME/plnexp``, else ``~/.cache/plnexp``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "plnexp"


def identity(device=None) -> dict[str, str]:
    """What the measurements depend on besides the shape: the machine, the software, the device."""
    import jax
    import jaxlib

    from ..system.machine import cpu_model, usable_cores

    dev = _device(device)
    cores = usable_cores()  # what this process may use (a SLURM job: its allocation)
    return {
        "host": platform.node(),
        "cpu_model": cpu_model(),
        "cores": str(cores),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        "platform": dev.platform,
        "device_kind": str(dev.device_kind),
    }


def cache_file(ident: dict[str, str], folder: Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return (folder or cache_dir()) / f"floor-{digest}.json"


def read_cache(path: Path, **expected) -> dict:
    """The JSON object of the cache file ``path``; empty when the file is missing, unreadable,
    corrupt, or its ``expected`` keys (its format, its machine) hold other values."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and all(data.get(k) == v for k, v in expected.items()) else {}


def kept(entries, valid) -> dict:
    """The entries (a dict read from a cache file) whose values are ``valid``; none where not a dict."""
    return {k: v for k, v in entries.items() if valid(v)} if isinstance(entries, dict) else {}


def finite(value) -> bool:
    """A finite number (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _read(path: Path, ident: dict) -> dict:
    """The file's entries ({"copy": {...}, "dot": {...}, "factor": {...}}, each a positive number);
    empty when missing, unreadable, corrupt, of another format or of another machine."""
    data = read_cache(path, format=CACHE_FORMAT, machine=ident)
    return {part: kept(data.get(part), lambda v: finite(v) and v > 0) for part in PARTS}


def _write(path: Path, ident: dict, entries: dict) -> None:
    """Merge ``entries`` into the file (read again just before: another job may have added some) and
    replace it atomically (temporary file in the same folder, then os.replace)."""
    from ..system.paths import write_atomic

    now = _read(path, ident)
    for part in PARTS:
        now[part].update(entries[part])
    write_atomic(path, json.dumps({"format": CACHE_FORMAT, "machine": ident, **now}, indent=1, sort_keys=True))


def cached(it: Iteration, dtype, device=None, folder: Path | None = None) -> Floor:
    """The floor of the iteration ``it`` in ``dtype`` on ``device`` (None: JAX's default; or 'cpu',
    'gpu', 'auto'), each part measured only when this machine's cache file lacks it: the copy keyed
    by dtype and buffer size, the product by dtype and its shape (n, p, q), the factorization (only
    for a model that does one) by dtype and p. A cache that cannot be written is skipped (the
    measurement is returned all the same)."""
    dtype, dev = np.dtype(dtype), _device(device)
    ident = identity(dev)
    path = cache_file(ident, folder)
    entries = _read(path, ident)
    size = copy_bytes(it, dtype.itemsize)
    n, p, k = it.dot_shape
    wanted = {  # part -> its key in the file, and how it is measured
        "copy": (f"{dtype.name}/{size}", lambda: measure_copy(size, dtype, dev)),
        "dot": (f"{dtype.name}/{n}x{p}x{k}", lambda: measure_dot(n, p, k, dtype, dev)),
    }
    if it.work.factorizations:
        wanted["factor"] = (f"{dtype.name}/{p}", lambda: measure_factor(p, dtype, dev))
    new: dict = {part: {} for part in PARTS}
    for part, (key, measure_part) in wanted.items():
        if key not in entries[part]:
            new[part][key] = measure_part()
    if any(new.values()):
        try:
            _write(path, ident, new)
        except OSError as e:
            log.warning("floor cache not written (%s: %s); measured values used all the same", path, e)
    got = {part: float(new[part].get(key, entries[part].get(key))) for part, (key, _) in wanted.items()}
    return Floor(it, dtype.name, got["copy"], size, got["dot"], got.get("factor", 0.0))


def run_metrics(it: Iteration, dtype, device=None) -> dict[str, float]:
    """What a job logs: :meth:`Floor.metrics` of :func:`cached`; when measuring fails for any reason,
    NaN for each measured one (logged as not measured) and the streamed bytes all the same (counted,
    not measured): a job never fails for its floor."""
    try:
        return cached(it, dtype, device).metrics()
    except Exception as e:  # noqa: BLE001 - the floor is a reading aid, never a reason to fail a run
        log.warning("floor not measured (%s)", first_line(e))
        out = dict.fromkeys(METRICS, float("nan"))
        out["floor_bytes_per_iter"] = float(it.stream_bytes(np.dtype(dtype).itemsize))
        return out
