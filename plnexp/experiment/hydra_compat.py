"""Hydra's private API that plnexp uses, behind one shim (docs/development.md, "Private APIs").
Written for hydra-core 1.3.8; the shim's version gate (:func:`plnexp.system.versions.gate`) says
what it does on another release (pyproject asks for hydra-core>=1.3.2). No Hydra launcher runs
plnexp's jobs (:mod:`plnexp.experiment.executors`), so none of Hydra's job machinery is used.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..system.versions import gate

HYDRA = "1.3.8"  # the hydra-core release every shim here was written for (and checked against)


def parse_overrides(overrides: Sequence[str]) -> list:
    """``overrides`` parsed by Hydra's override grammar: its ``Override`` objects, in order; a
    ``HydraException`` (Hydra's own message) for a bad one.

    Wraps ``hydra.core.override_parser.overrides_parser.OverridesParser`` (hydra-core 1.3.8, not
    documented): Hydra's public compose API composes a config from overrides but never hands them
    back parsed (a sweep's values, a group's option). Gate: on another hydra-core, warns, then uses
    it anyway."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    gate("hydra-core", HYDRA, "hydra_compat.parse_overrides", "using its OverridesParser anyway")
    return OverridesParser.create().parse_overrides(list(overrides))


# (source kind, its path, its provider, the file's bytes) -> the pickled ConfigResult Hydra made of them
_SOURCE_CACHE: dict[tuple, bytes] = {}
_MARK = "_plnexp_cached"  # set on each Hydra class patched here: whether this process's sources are cached


def cache_config_sources() -> bool:
    """Cache, for this process, what Hydra's config sources make of a config file: each
    ``compose`` re-reads and re-parses every YAML file of its defaults tree (``conf/``'s, a user's
    config folder's, Hydra's own package's), which is most of a composition's work once a
    command composes many jobs. Keyed by the file's bytes (read again at each load, so an edited
    file is parsed afresh), and each load gets its own copy of the parsed config (Hydra merges
    it into the composition and edits it there). And each composition's copy of the config
    repository shares Hydra's one ``ConfigStore`` (whose configs it copies at each load anyway)
    instead of copying the whole store first. The composition itself stays Hydra's (its defaults
    tree, its merges, its overrides): the same config as without the cache. Returns whether the
    cache is on; cheap once it is (called before each composition).

    Wraps the config source classes that Hydra's ``SourcesRegistry`` makes its repositories of
    (``file``, ``pkg``, ``structured``: ``hydra._internal.core_plugins``, hydra-core 1.3.8, not
    documented): ``FileConfigSource.load_config``, ``ImportlibResourcesConfigSource._read_config``
    and the deep copy of ``StructuredConfigSource`` (``CachingConfigRepository`` deep-copies its
    sources at each composition). Nothing public hands Hydra parsed configs. Gate: on another
    hydra-core, warns, then leaves Hydra's reads uncached."""
    import copy
    import os
    import pickle

    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.plugins import Plugins

    # the classes Hydra's repositories are made of: its plugin scan runs their modules again, so
    # these, not the ones an import gives (the registry keeps the class first registered)
    registry = SourcesRegistry.instance()
    if all(_MARK in vars(registry.types.get(scheme, object)) for scheme in ("file", "pkg", "structured")):
        return True
    if not gate("hydra-core", HYDRA, "hydra_compat.cache_config_sources", "reading configs uncached"):
        return False
    Plugins.instance()  # the scan, once per process: registers Hydra's config sources

    def cached(kind: str, source, read, load):
        try:
            text = read()
        except (OSError, ValueError):
            text = None
        if text is None:
            return load()  # Hydra's own error (a missing file), or its read of what this one could not
        key = (kind, source.path, source.provider, text)
        hit = _SOURCE_CACHE.get(key)
        if hit is not None:
            return pickle.loads(hit)
        ret = load()
        try:
            unchanged = read() == text
        except (OSError, ValueError):
            unchanged = False
        if unchanged:  # the result is of these bytes (the file did not change while Hydra read it)
            _SOURCE_CACHE[key] = pickle.dumps(ret)
        return ret

    def cache_file(cls) -> None:
        load = cls.load_config

        def load_config(self, config_path: str):
            full = os.path.realpath(os.path.join(self.path, self._normalize_file_name(config_path)))

            def read() -> bytes:
                with open(full, "rb") as f:
                    return f.read()

            return cached("file", self, read, lambda: load(self, config_path))

        cls.load_config = load_config

    def cache_pkg(cls) -> None:
        read_config = cls._read_config

        def _read_config(self, res):
            return cached("pkg", self, res.read_bytes, lambda: read_config(self, res))

        cls._read_config = _read_config

    def share_store(cls) -> None:
        def __deepcopy__(self, memo):
            return copy.copy(self)  # the same path and provider, and the one ConfigStore

        cls.__deepcopy__ = __deepcopy__

    for scheme, patch in (("file", cache_file), ("pkg", cache_pkg), ("structured", share_store)):
        cls = registry.resolve(scheme)
        if _MARK not in vars(cls):
            patch(cls)
            setattr(cls, _MARK, True)
    return True
