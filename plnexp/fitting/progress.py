"""A fit's progress bar (tqdm): iterations per second and the current ELBO, on stderr.

**Only an untimed fit shows it, and the timing stays honest.** A compiled scan cannot report from
inside itself without a host callback, and a callback inside the program would change the program
that is timed (its ``hlo_fingerprint``, :mod:`plnexp.measure.fingerprint`) and add a host sync per
update to its time. So a timed fit (``plnexp.fit``'s ``timed=True``, every job of ``run`` and
``sweep``) runs its one compiled program exactly as before and shows no bar; an untimed fit that
shows one runs the *same strategy* in chunks of iterations instead (:func:`run_chunks`): a few
compiled programs of the strategy for shorter lengths, each chunk's end state handed to the next,
the bar updated between chunks. The chunks make the same iterations: the curve and the final state
are those of one program of the whole length (to the last bit on CPU: tests/test_progress.py).

When: ``progress=None`` (the default) shows it where stderr is an interactive terminal
(``isatty``), never in a CI log or a file; ``True``/``False`` force it. It appears only once a fit
has run :data:`SHOW_AFTER_S` seconds (tqdm's ``delay``): a short fit prints nothing.

Chunks: a first one of :data:`MIN_CHUNK` iterations measures the time per iteration; then chunks of
the power of two iterations that take about :data:`UPDATE_S` (at least :data:`MIN_CHUNK`, so that the
one ELBO evaluation each chunk adds at its end costs at most ~1/16 of it), the rest in one last chunk:
at most three compiles.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..core.problem import Output
from ..measure import timing

SHOW_AFTER_S = 3.0
UPDATE_S = 1.0
MIN_CHUNK = 8
# the strategies whose fit is one compiled program that starts from any state of the fit and returns
# the state it ends in (while_loop: its stopping rule would start again in each chunk; the Python
# loops, sharded, unrolled and PyTorch strategies: their own placement or shapes): the others run whole
CHUNKED = frozenset(("scan", "scan_namedtuple", "scan_pytree", "scan_dataclass", "fori_loop", "scan_fused"))


def wanted(progress: bool | None, stream=None) -> bool:
    """Whether an untimed fit shows its bar: ``progress`` where given, else whether ``stream``
    (stderr by default) is an interactive terminal."""
    if progress is not None:
        return bool(progress)
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def can_chunk(strategy: str, replicates: int, across_processes: bool) -> bool:
    """Whether a fit can run in chunks (:data:`CHUNKED`, one fit, in one process)."""
    return strategy in CHUNKED and replicates == 1 and not across_processes


def chunk_length(seconds_per_iter: float, left: int) -> int:
    """The chunk after the first: the power of two of iterations taking about :data:`UPDATE_S`,
    at least :data:`MIN_CHUNK`, at most ``left``."""
    if not math.isfinite(seconds_per_iter) or seconds_per_iter <= 0:
        return max(min(left, MIN_CHUNK), 1)
    k = 2 ** max(int(math.floor(math.log2(UPDATE_S / seconds_per_iter))), 0)
    return max(min(max(k, MIN_CHUNK), left), 1)


def run_chunks(
    build: Callable[[int], object],
    state,
    arrays,
    n_iter: int,
    *,
    log_factorial: float,
    compile_cache_dir=None,
    stream=None,
) -> tuple[Output, timing.Timing]:
    """The fit of ``n_iter`` iterations from ``state``, run in chunks by the programs ``build(k)``
    makes (the strategy's program of ``k`` iterations), with a tqdm bar on ``stream`` (stderr):
    iterations, iterations per second, the ELBO (with the exact log y!: ``log_factorial``) at each
    chunk's end. Returns the Output of one program of ``n_iter`` iterations (the curves joined, the
    last chunk's state and final ELBO) and an untimed :class:`~plnexp.measure.timing.Timing` (its wall
    time in ``first_call_s``, as :func:`plnexp.measure.timing.untimed`'s)."""
    from tqdm.auto import tqdm

    compiled: dict[int, object] = {}
    curves: list[np.ndarray] = []
    done, k, out = 0, min(MIN_CHUNK, n_iter), None
    t0 = time.perf_counter()
    bar = tqdm(
        total=n_iter,
        desc="fit",
        unit="it",
        file=sys.stderr if stream is None else stream,
        delay=SHOW_AFTER_S,
        dynamic_ncols=True,
        leave=True,
    )
    with timing.persistent_cache(compile_cache_dir), bar:
        while done < n_iter:
            k = min(k, n_iter - done)
            if k not in compiled:
                compiled[k] = build(k).compile(state, arrays).run  # type: ignore[attr-defined]
            start = time.perf_counter()
            out = jax.block_until_ready(compiled[k](state, arrays))  # type: ignore[operator]
            seconds = time.perf_counter() - start
            curves.append(np.asarray(out.elbo)[: int(out.n_run)])
            state, done = out.state, done + int(out.n_run)
            bar.set_postfix_str(f"ELBO {float(out.final_elbo) - log_factorial:.8g}", refresh=False)
            bar.update(int(out.n_run))
            if len(curves) == 1:  # the first chunk measured an iteration (its compile apart)
                k = chunk_length(seconds / max(int(out.n_run), 1), n_iter - done)
    assert out is not None  # n_iter >= 1
    wall = time.perf_counter() - t0
    curve = jnp.asarray(np.concatenate(curves))
    whole = Output(out.state, curve, jnp.asarray(done, jnp.int32), out.final_elbo)
    return whole, timing.Timing(first_call_s=wall, runs_s=(wall,))
