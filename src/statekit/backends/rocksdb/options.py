"""RocksDB options for the embedded backend: PyFlink's ``PredefinedOptions`` and options factories.

A profile sets what Flink's ``PredefinedOptions.java`` documents; Flink's configurable options
(``state.backend.rocksdb.compaction.style`` and its siblings, only those set) come next; an options
factory (a callable, or the dotted name of one) then adjusts the rocksdict ``Options`` on top, as
Flink's ``RocksDBOptionsFactory`` does, and the process's memory budget (:mod:`.memory`) comes last.
The same options are used for the database and every column family, on every open, so a
reopened database never falls back to rocksdict's defaults.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from enum import IntEnum
from typing import Any

from rocksdict import BlockBasedOptions, Cache, DBCompactionStyle, Options

from statekit.backends.rocksdb.memory import SharedMemory, apply_memory
from statekit.errors import ConfigError
from statekit.registry import import_path

MB = 1024 * 1024

#: an options factory: gets the prepared ``Options``, may return a replacement (or None)
OptionsFactory = Callable[[Options], "Options | None"]


class PredefinedOptions(IntEnum):
    """Pre-tuned RocksDB option profiles (same names and values as PyFlink)."""

    DEFAULT = 0
    SPINNING_DISK_OPTIMIZED = 1
    SPINNING_DISK_OPTIMIZED_HIGH_MEM = 2
    FLASH_SSD_OPTIMIZED = 3

    @classmethod
    def parse(cls, value: Any, key: str = "state.backend.rocksdb.predefined-options"
              ) -> PredefinedOptions:
        """A profile from an instance, its int value or its (case-insensitive) name."""
        if isinstance(value, PredefinedOptions):
            return value
        try:
            if isinstance(value, int) and not isinstance(value, bool):
                return cls(value)
            if isinstance(value, str):
                text = value.strip()
                if text.lstrip("-").isdigit():
                    return cls(int(text))
                return cls[text.upper().replace("-", "_")]
        except (KeyError, ValueError):
            pass
        raise ConfigError(key, f"unknown predefined options {value!r}; expected one of "
                          f"{', '.join(p.name for p in cls)}")


_caches: dict[int, Cache] = {}
_cache_lock = threading.Lock()


def shared_cache(capacity: int) -> Cache:
    """One process-wide LRU block cache per capacity, so many databases do not multiply memory."""
    with _cache_lock:
        cache = _caches.get(capacity)
        if cache is None:
            cache = _caches[capacity] = Cache(capacity)
        return cache


def resolve_options_factory(factory: OptionsFactory | str | None,
                            key: str = "state.backend.rocksdb.options-factory"
                            ) -> OptionsFactory | None:
    """The callable behind ``factory`` (importing a ``module:name`` or ``module.name`` path)."""
    if factory is None or callable(factory):
        return factory
    if not isinstance(factory, str) or not factory.strip():
        raise ConfigError(key, f"expected a callable or a dotted name, got {factory!r}")
    try:
        target = import_path(factory.strip(), key)
    except ConfigError as exc:
        raise ConfigError(key, str(exc)) from exc
    if isinstance(target, type):
        target = target()
    if not callable(target):
        raise ConfigError(key, f"{factory!r} is not callable")
    return target  # type: ignore[no-any-return]


def _common(opts: Options) -> None:
    """Settings every profile shares: no fsync, no stats dumps, few info logs, create on open."""
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_use_fsync(False)
    opts.set_stats_dump_period_sec(0)
    opts.set_keep_log_file_num(2)


#: Flink's configurable RocksDB options statekit applies (``state.backend.rocksdb.`` + name)
TUNING_PREFIX = "state.backend.rocksdb."
TUNING_KEYS = tuple(TUNING_PREFIX + name for name in (
    "compaction.style", "compaction.level.use-dynamic-size",
    "compaction.level.target-file-size-base", "compaction.level.max-size-level-base",
    "writebuffer.size", "writebuffer.count", "writebuffer.number-to-merge", "block.blocksize",
    "files.open", "thread.num"))
#: memtables per column family where neither the profile nor the configuration sets them, and
#: where SPINNING_DISK_OPTIMIZED_HIGH_MEM does
_DEFAULT_WRITE_BUFFERS, _HIGH_MEM_WRITE_BUFFERS = 2, 4


def check_tuning(tuning: Mapping[str, Any], predefined: PredefinedOptions) -> None:
    """ConfigError for settings RocksDB would ignore or change silently: a level compaction
    setting with UNIVERSAL compaction, a flush merging as many memtables as a column family may
    hold (it caps ``number-to-merge`` at ``count - 1``)."""
    if tuning.get(TUNING_PREFIX + "compaction.style") == "UNIVERSAL":
        for key in tuning:
            if key.startswith(TUNING_PREFIX + "compaction.level."):
                raise ConfigError(key, "applies to LEVEL compaction only, and "
                                  "state.backend.rocksdb.compaction.style is UNIVERSAL")
    merge = tuning.get(TUNING_PREFIX + "writebuffer.number-to-merge")
    count = tuning.get(TUNING_PREFIX + "writebuffer.count") or (
        _HIGH_MEM_WRITE_BUFFERS if predefined is PredefinedOptions.SPINNING_DISK_OPTIMIZED_HIGH_MEM
        else _DEFAULT_WRITE_BUFFERS)
    if merge is not None and merge >= count:
        raise ConfigError(TUNING_PREFIX + "writebuffer.number-to-merge",
                          f"must be below {TUNING_PREFIX}writebuffer.count ({count}), got {merge}")


def _apply_tuning(opts: Options, table: BlockBasedOptions, tuning: Mapping[str, Any]) -> None:
    """Flink's configurable options that were set, over the profile (unset ones leave it)."""
    for key, value in tuning.items():
        name = key[len(TUNING_PREFIX):]
        if name == "compaction.style":
            opts.set_compaction_style(DBCompactionStyle.universal() if value == "UNIVERSAL"
                                      else DBCompactionStyle.level())
        elif name == "block.blocksize":
            table.set_block_size(value)
            opts.set_block_based_table_factory(table)
        elif name == "thread.num":
            opts.increase_parallelism(value)
            opts.set_max_background_jobs(value)
        else:
            _SETTERS[name](opts, value)


_SETTERS: dict[str, Callable[[Options, Any], None]] = {
    "compaction.level.use-dynamic-size": Options.set_level_compaction_dynamic_level_bytes,
    "compaction.level.target-file-size-base": Options.set_target_file_size_base,
    "compaction.level.max-size-level-base": Options.set_max_bytes_for_level_base,
    "writebuffer.size": Options.set_write_buffer_size,
    "writebuffer.count": Options.set_max_write_buffer_number,
    "writebuffer.number-to-merge": Options.set_min_write_buffer_number_to_merge,
    "files.open": Options.set_max_open_files,
}


def build_options(predefined: PredefinedOptions = PredefinedOptions.DEFAULT,
                  factory: OptionsFactory | str | None = None,
                  memory: SharedMemory | None = None,
                  tuning: Mapping[str, Any] | None = None) -> Options:
    """Raw-mode ``Options`` for ``predefined``, then Flink's configurable options in ``tuning``
    (full keys, parsed), then the options factory on top, and then (Flink's precedence) the
    process's shared memory budget, when ``memory`` is given: it replaces the block cache and
    write-buffer limits of the profile and the factory."""
    opts = Options(raw_mode=True)
    table = BlockBasedOptions()
    _common(opts)
    if predefined is PredefinedOptions.SPINNING_DISK_OPTIMIZED:
        opts.set_compaction_style(DBCompactionStyle.level())
        opts.set_level_compaction_dynamic_level_bytes(True)
        opts.increase_parallelism(4)
        opts.set_max_background_jobs(4)
        opts.set_max_open_files(-1)
    elif predefined is PredefinedOptions.SPINNING_DISK_OPTIMIZED_HIGH_MEM:
        opts.set_compaction_style(DBCompactionStyle.level())
        opts.set_level_compaction_dynamic_level_bytes(True)
        opts.set_target_file_size_base(256 * MB)
        opts.set_max_bytes_for_level_base(1024 * MB)
        opts.set_write_buffer_size(64 * MB)
        opts.increase_parallelism(4)
        opts.set_max_background_jobs(4)
        opts.set_min_write_buffer_number_to_merge(3)
        opts.set_max_write_buffer_number(_HIGH_MEM_WRITE_BUFFERS)
        opts.set_max_open_files(-1)
        table.set_block_cache(shared_cache(256 * MB))
        table.set_block_size(128 * 1024)
        table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
    elif predefined is PredefinedOptions.FLASH_SSD_OPTIMIZED:
        opts.increase_parallelism(4)
        opts.set_max_background_jobs(4)
        opts.set_max_open_files(-1)
    if tuning:
        _apply_tuning(opts, table, tuning)
    fn = resolve_options_factory(factory)
    if fn is not None:
        replaced = fn(opts)
        if isinstance(replaced, Options):
            opts = replaced
        elif replaced is not None:
            raise ConfigError("state.backend.rocksdb.options-factory",
                              f"the options factory returned {type(replaced).__name__}, "
                              "expected rocksdict.Options or None")
    if memory is not None:
        buffer = (tuning or {}).get("state.backend.rocksdb.writebuffer.size", 64 * MB)
        apply_memory(opts, table, memory, int(buffer))
    return opts
