"""RocksDB options: kept importable from here; they live in :mod:`statekit.backends.rocksdb.options`."""

from statekit.backends.rocksdb.options import (
    MB,
    OptionsFactory,
    PredefinedOptions,
    build_options,
    resolve_options_factory,
    shared_cache,
)

__all__ = [
    "MB",
    "OptionsFactory",
    "PredefinedOptions",
    "build_options",
    "resolve_options_factory",
    "shared_cache",
]
