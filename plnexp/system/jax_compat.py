"""JAX's and jaxlib's private APIs that plnexp uses, each behind one shim (docs/development.md,
"Private APIs"). Written for jax and jaxlib 0.10.2 (pyproject pins both); each shim's version gate
(:func:`plnexp.system.versions.gate`) warns once where another release is installed.

Importing this module does not import JAX: :func:`backends_initialized` must answer before JAX is
imported (plnexp's process settings are set first).
"""

from __future__ import annotations

import sys

from .versions import gate

JAX = "0.10.2"  # the jax release every shim here was written for (and checked against)
JAXLIB = "0.10.2"
# the jax.monitoring event that jax 0.10.2 records (jax/_src/compiler.py) once per XLA compilation
# served by the persistent compilation cache
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def backends_initialized() -> bool:
    """Whether JAX has created its backends, found without starting them; False while JAX is not
    even imported.

    Wraps ``jax._src.xla_bridge.backends_are_initialized`` (jax 0.10.2): no public API says it
    (``jax.extend.backend.backends()`` starts them). Gate: on another jax, warns, then uses that
    function if the release has it, else the module's ``_backends`` registry, else answers False."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is None:
        return False
    if gate("jax", JAX, "jax_compat.backends_initialized", "reading jax._src.xla_bridge as far as it goes"):
        return bool(bridge.backends_are_initialized())
    initialized = getattr(bridge, "backends_are_initialized", None)
    if initialized is not None:
        return bool(initialized())
    return bool(getattr(bridge, "_backends", None))


def reset_compilation_cache() -> None:
    """Drop JAX's persistent compilation cache object, so that the next compilation builds it again
    from the cache options then set (JAX builds it once, at its first use).

    Wraps ``jax.experimental.compilation_cache.compilation_cache.reset_cache`` (jax 0.10.2; an
    experimental module, undocumented): ``jax.clear_caches()`` clears the in-memory caches only.
    Gate: on another jax, warns, then calls it (an AttributeError names it if the release lacks it)."""
    from jax.experimental.compilation_cache import compilation_cache

    gate("jax", JAX, "jax_compat.reset_compilation_cache", "calling compilation_cache.reset_cache anyway")
    compilation_cache.reset_cache()


def cache_hit_event() -> str:
    """The name of the ``jax.monitoring`` event that JAX records once per compilation served by the
    persistent cache: :data:`CACHE_HIT_EVENT`.

    Wraps the event's name in jax 0.10.2's private ``jax/_src/compiler.py`` (not documented; no public
    API counts cache hits). Gate: on another jax, warns (cache hits may then read 0) and returns it."""
    gate("jax", JAX, "jax_compat.cache_hit_event", "counting the same event name (cache hits may read 0)")
    return CACHE_HIT_EVENT


def hlo_module_cost(text: str, client) -> dict:
    """XLA's cost analysis of an HLO module given as text, by ``client``'s backend (what it returns:
    "flops", "bytes accessed", ... -> value).

    Wraps jaxlib's private ``jaxlib._hlo.hlo_module_from_text`` and
    ``jaxlib._jax.hlo_module_cost_analysis`` (jaxlib 0.10.2): JAX's public cost analysis
    (``Compiled.cost_analysis()``) needs a jitted function, not a module's text. Gate: on another
    jaxlib, warns, then calls them (an ImportError or AttributeError where the release lacks them)."""
    gate("jaxlib", JAXLIB, "jax_compat.hlo_module_cost", "calling jaxlib._hlo and jaxlib._jax anyway")
    from jaxlib import _hlo, _jax  # type: ignore[attr-defined]  # jaxlib's private modules

    return _jax.hlo_module_cost_analysis(client, _hlo.hlo_module_from_text(text))


def barrier(name: str, timeout_s: float) -> None:
    """Wait until every JAX process of this ``jax.distributed`` job has reached the barrier ``name``
    (a no-op in a process that is not one of several).

    A fit across processes must reach its first collective in every process within gloo's 30 s of
    each other (its context's set-up waits that long, and no option sets it): process 0 does work
    the others do not before the fit (the data's digest, its best known ELBO, the floor), which on
    large data takes longer. The coordination service's barrier waits as long as it is told.

    Wraps ``jax._src.distributed.global_state.client.wait_at_barrier`` (jax 0.10.2): JAX's public
    barrier, ``multihost_utils.sync_global_devices``, is itself a collective, so it times out the
    same way. Gate: on another jax, warns, then calls it (an AttributeError names it if the release
    lacks it)."""
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        return
    gate("jax", JAX, "jax_compat.barrier", "calling the coordination service's wait_at_barrier anyway")
    client.wait_at_barrier(name, int(timeout_s * 1000))
