"""Flat configuration keys (Flink's names and their Flink 2 aliases) from dicts and the environment.

``STATEKIT_STATE_BACKEND_TYPE=rocksdb`` sets ``state.backend.type``: upper case, with dots and
dashes as underscores.  Spark conf under ``spark.statekit.`` maps the same way (see
``statekit.spark``).  Every key statekit reads is one :class:`Option` of :data:`OPTIONS` (name,
aliases, default, a parser with its range, a line of documentation), so that validation, the
generated configuration reference and the readers agree.  Malformed values raise
:class:`ConfigError` naming the key; unknown keys in statekit's namespaces raise it too, with the
nearest known key suggested.

The table sits on the ground floor, beside the value parsers it uses, because every layer reads
keys from it: checkpoint settings and storages, backends, the runtime and the Spark adapters.
Plugins share one protocol over these keys (:mod:`statekit.configurable`).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from statekit.errors import ConfigError
from statekit.registry import backend_registry, storage_registry
from statekit.values import (
    at_least,
    choice,
    compaction_style,
    get,
    materialize_interval,
    open_files,
    open_ratio,
    parse_bool,
    parse_duration_ms,
    parse_enum,
    parse_float,
    parse_int,
    parse_size,
    parse_str,
    refused,
)

ENV_PREFIX = "STATEKIT_"

__all__ = [  # with the value parsers, which callers use with these keys
    "BY_KEY",
    "ENV_PREFIX",
    "KEYS",
    "NAMESPACES",
    "OPTIONS",
    "Option",
    "at_least",
    "canonical",
    "default",
    "env_name",
    "from_env",
    "get",
    "in_namespace",
    "normalize",
    "parse_bool",
    "parse_duration_ms",
    "parse_enum",
    "parse_float",
    "parse_int",
    "parse_size",
    "parse_str",
    "read",
    "validate",
]


def _plugin(key: str, value: Any) -> str:
    """A backend or storage name: resolved (and checked) by the registry when it is used."""
    return parse_str(key, value)


@dataclass(frozen=True)
class Option:
    """One configuration key: its Flink name, aliases, default, parser and what it does.

    ``default`` is written as a user would write the value, and readers get it parsed
    (:meth:`read`), so the documented default and the one in effect cannot drift apart.  Where
    the default depends on the situation it is described in words instead (``described``), and
    readers get None and decide themselves.
    """

    key: str
    parse: Callable[[str, Any], Any]
    default: str
    doc: str
    aliases: tuple[str, ...] = ()
    described: bool = False

    @property
    def spark_key(self) -> str:
        return "spark.statekit." + self.key

    @property
    def env_var(self) -> str:
        return env_name(self.key)

    @property
    def default_value(self) -> Any:
        """The value in effect when the key is not set (None where ``default`` is a description)."""
        return None if self.described else self.parse(self.key, self.default)

    def read(self, config: Mapping[str, Any]) -> Any:
        """This key's value in ``config`` (canonical keys), parsed and checked, else the default."""
        value = config.get(self.key)
        return self.default_value if value is None else self.parse(self.key, value)


_DUR = parse_duration_ms
_NONNEG_DUR = at_least(parse_duration_ms, 0)
_POS_DUR = at_least(parse_duration_ms, 1)
_POS_SIZE = at_least(parse_size, 1)
_NONNEG_INT = at_least(parse_int, 0)
_POS_INT = at_least(parse_int, 1)


OPTIONS: tuple[Option, ...] = (
    # --- backend and storage ------------------------------------------------------------------
    Option("state.backend.type", _plugin, "hashmap",
           "State backend: `hashmap`, `rocksdb`, legacy `jobmanager`/`filesystem`, a registered "
           "name or a dotted class path.", ("state.backend",)),
    Option("state.checkpoint-storage", _plugin,
           "`jobmanager` (local runner); on Spark: files under the query's checkpointLocation",
           "Checkpoint storage: `jobmanager`, `filesystem` or a registered name.",
           ("execution.checkpointing.storage",), described=True),
    Option("state.checkpoints.dir", parse_str, "(none)",
           "Checkpoint directory: a path or fsspec URL (`s3://...`).",
           ("execution.checkpointing.dir",), described=True),
    Option("state.savepoints.dir", parse_str, "(none)", "Default savepoint directory.",
           ("execution.checkpointing.savepoint-dir",), described=True),
    Option("state.backend.incremental", parse_bool, "false", "Incremental checkpoints.",
           ("execution.checkpointing.incremental",)),
    Option("state.backend.async", parse_bool, "true", "Asynchronous snapshots.",
           ("execution.checkpointing.async",)),
    Option("state.changelog.enabled", parse_bool, "false", "RocksDB: checkpoints upload the "
           "write-ahead log between materializations.", ("state.backend.changelog.enabled",)),
    Option("state.changelog.periodic-materialize.interval", materialize_interval, "10 min",
           "Changelog: the next materialization starts at the first checkpoint this long after "
           "the last (negative: never by time, as in Flink).",
           ("state.backend.changelog.periodic-materialize.interval",)),
    Option("state.changelog.storage", refused(
        "the changelog is RocksDB's write-ahead log, uploaded to the checkpoint storage"),
        "(refused)", "Refused: the changelog goes to the checkpoint storage.",
        ("state.backend.changelog.storage",), described=True),
    Option("state.changelog.max-failures-allowed", refused(
        "a failed materialization fails its checkpoint (execution.checkpointing."
        "tolerable-failed-checkpoints decides)"), "(refused)",
        "Refused: a failed materialization fails its checkpoint.",
        ("state.backend.changelog.max-failures-allowed",), described=True),
    Option("state.backend.rocksdb.changelog.max-log-ratio", at_least(parse_float, 1e-9, 1e9), "0.5",
           "Changelog: the next materialization starts once the logs exceed this share of the last."),
    Option("state.checkpoints.num-retained", _POS_INT, "1", "Completed checkpoints retained.",
           ("execution.checkpointing.num-retained",)),
    Option("state.storage.fs.memory-threshold", at_least(parse_size, 0, 1 << 20), "20 kb",
           "State chunks below this size are inlined into `_metadata` (at most 1 mb).",
           ("state.backend.fs.memory-threshold", "execution.checkpointing.data-inline-threshold")),
    Option("state.storage.fs.write-buffer-size", at_least(parse_size, 0), "4096",
           "Write buffer of checkpoint streams.",
           ("state.backend.fs.write-buffer-size", "execution.checkpointing.write-buffer-size")),
    Option("state.checkpoint-storage.jobmanager.max-state-size", _POS_SIZE, "5 mb",
           "JobManager storage: the largest state a checkpoint may hold, per state."),
    Option("state.checkpoint-storage.jobmanager.max-total-size", _POS_SIZE, "256 mb",
           "JobManager storage on Spark: the most bytes one operator of one query may keep in "
           "the driver's memory, all its checkpoints together (a quarter of Flink's default "
           "JobManager heap)."),
    Option("state.backend.max-key-size", _POS_SIZE, "(unlimited)", "Largest serialized key.", described=True),
    Option("state.backend.max-value-size", _POS_SIZE, "(unlimited)",
           "Largest serialized value (list element, map entry).", described=True),
    # --- checkpointing --------------------------------------------------------------------------
    Option("execution.checkpointing.interval", _NONNEG_DUR, "(disabled)",
           "Checkpoint interval of the local runner (Spark adapters checkpoint every batch).",
           described=True),
    Option("execution.runtime-mode", choice("STREAMING", "BATCH", "AUTOMATIC"), "STREAMING",
           "Local runner: BATCH (and AUTOMATIC) runs by key, each key's timers at its end."),
    Option("execution.checkpointing.mode", choice("EXACTLY_ONCE", "AT_LEAST_ONCE"),
           "EXACTLY_ONCE", "Checkpointing mode."),
    Option("execution.checkpointing.timeout", _POS_DUR, "10 min",
           "A checkpoint running longer is aborted."),
    Option("execution.checkpointing.min-pause", _NONNEG_DUR, "0 ms",
           "Minimum pause between the end of one checkpoint and the start of the next."),
    Option("execution.checkpointing.max-concurrent-checkpoints", _POS_INT, "1",
           "Checkpoints that may run at once."),
    Option("execution.checkpointing.tolerable-failed-checkpoints", _NONNEG_INT, "0",
           "Consecutive failed checkpoints tolerated before the job fails."),
    Option("execution.checkpointing.externalized-checkpoint-retention",
           choice("DELETE_ON_CANCELLATION", "RETAIN_ON_CANCELLATION", "NO_EXTERNALIZED_CHECKPOINTS"),
           "NO_EXTERNALIZED_CHECKPOINTS", "Whether checkpoints outlive a cancelled job.",
           ("execution.checkpointing.externalized-checkpoint-cleanup",)),
    Option("execution.checkpointing.prefer-checkpoint-for-recovery", parse_bool, "false",
           "Recover from the newest checkpoint even when a newer savepoint exists."),
    Option("execution.checkpointing.unaligned", parse_bool, "false",
           "Accepted for compatibility; one source makes alignment trivial.",
           ("execution.checkpointing.unaligned.enabled",)),
    Option("execution.checkpointing.recover-from-older-on-corruption", parse_bool, "false",
           "When the newest checkpoint is damaged, restore the newest intact older one."),
    Option("state.backend.local-recovery", parse_bool, "false",
           "Keep a local copy of each task's last completed snapshot and restore from it when "
           "it is intact, else from checkpoint storage.", ("execution.state-recovery.from-local",)),
    Option("taskmanager.state.local.root-dirs", parse_str,
           "`<temp dir>/statekit-localstate`; on Spark the executor's local directories",
           "Local runner: where tasks keep their local copies (comma-separated for several).",
           described=True),
    Option("execution.savepoint.path", parse_str, "(none)",
           "Restore from this checkpoint or savepoint.", ("execution.state-recovery.path",), described=True),
    Option("execution.state-recovery.allow-missing-state", parse_bool, "false",
           "Spark: start from empty state when a query resumed past its first batch finds no "
           "statekit state (otherwise that is an error)."),
    # --- parallelism and restarts ---------------------------------------------------------------
    Option("parallelism.default", _POS_INT, "number of CPUs", "Partitions of the local runner.",
           described=True),
    Option("pipeline.max-parallelism", at_least(parse_int, 1, 32768), "128",
           "Key groups: the most partitions state can ever be split into."),
    Option("restart-strategy.type", choice("none", "off", "disable", "fixed-delay", "fixeddelay",
                                            "failure-rate", "failurerate"),
           "none, or fixed-delay with checkpointing", "Restart strategy of the local runner.",
           ("restart-strategy",), described=True),
    Option("restart-strategy.fixed-delay.attempts", _NONNEG_INT, "1", "Restart attempts."),
    Option("restart-strategy.fixed-delay.delay", _NONNEG_DUR, "1 s", "Delay between restarts."),
    Option("restart-strategy.failure-rate.max-failures-per-interval", _POS_INT, "1",
           "Failures tolerated per interval."),
    Option("restart-strategy.failure-rate.failure-rate-interval", _POS_DUR, "1 min",
           "The failure-rate interval."),
    Option("restart-strategy.failure-rate.delay", _NONNEG_DUR, "1 s", "Delay between restarts."),
    # --- RocksDB ----------------------------------------------------------------------------------
    Option("state.backend.rocksdb.localdir", parse_str, "<temp dir>/statekit-rocksdb",
           "Working directories of RocksDB instances (comma-separated for several).", described=True),
    Option("state.backend.rocksdb.predefined-options",
           choice("DEFAULT", "SPINNING_DISK_OPTIMIZED", "SPINNING_DISK_OPTIMIZED_HIGH_MEM",
                   "FLASH_SSD_OPTIMIZED"), "DEFAULT", "RocksDB option profile."),
    Option("state.backend.rocksdb.options-factory", parse_str, "(none)",
           "Dotted path of a RocksDBOptionsFactory.", described=True),
    Option("state.backend.rocksdb.checkpoint.transfer.thread.num", _POS_INT, "1",
           "Threads uploading a RocksDB backend's checkpoint files and downloading them at "
           "restore (all at once, each verified as it lands); the local runner also runs this "
           "many tasks' asynchronous snapshot parts at once."),
    Option("state.backend.rocksdb.timer-service.factory", choice("ROCKSDB", "HEAP"), "ROCKSDB",
           "Where the RocksDB backend keeps timers: `ROCKSDB` (column families, larger than "
           "memory) or `HEAP` (in memory, faster)."),
    Option("state.backend.rocksdb.lazy-restore", parse_bool, "true",
           "Restore RocksDB state lazily: the database opens as soon as the checkpoint's files "
           "are in place, and the SST files hard-linked from a checkpoint on the local disk are "
           "checked against their CRC-32 by a background thread; until then RocksDB's block "
           "checksums guard every point read, scans and checkpoints wait for the check, and a "
           "damaged file fails the next state access. `false` checks every file before "
           "opening."),
    Option("state.backend.rocksdb.ttl.compaction.filter.enabled", parse_bool, "true",
           "Drop expired TTL entries during checkpoints (compaction-filter stand-in)."),
    Option("state.backend.rocksdb.memory.managed", parse_bool, "true",
           "All RocksDB instances of a process share one block cache and write-buffer budget."),
    Option("state.backend.rocksdb.memory.fixed-per-slot", _POS_SIZE, "(none: 322122552 b)",
           "That budget for one process (default: Flink's managed memory of a 1 GB slot).",
           described=True),
    Option("state.backend.rocksdb.memory.write-buffer-ratio", open_ratio, "0.5",
           "Share of the budget memtables may use."),
    Option("state.backend.rocksdb.memory.high-prio-pool-ratio", refused(
        "the block cache rocksdict offers has no high-priority pool (index and filter blocks "
        "share the cache with data blocks, level-0 ones pinned)"), "(refused)",
           "Refused: rocksdict's block cache has no high-priority pool.", described=True),
    # Flink's configurable options: applied over the profile, below the options factory, when set
    Option("state.backend.rocksdb.compaction.style", compaction_style, "(RocksDB's: LEVEL)",
           "`LEVEL` or `UNIVERSAL`; `FIFO` is refused (it deletes state).", described=True),
    Option("state.backend.rocksdb.compaction.level.use-dynamic-size", parse_bool, "(RocksDB's: "
           "true)", "Level sizes follow the last level's.", described=True),
    Option("state.backend.rocksdb.compaction.level.target-file-size-base", _POS_SIZE,
           "(RocksDB's: 64 mb)", "Target size of a level-1 SST file.", described=True),
    Option("state.backend.rocksdb.compaction.level.max-size-level-base", _POS_SIZE,
           "(RocksDB's: 256 mb)", "Size of level 1.", described=True),
    Option("state.backend.rocksdb.writebuffer.size", at_least(parse_size, 64 * 1024),
           "(RocksDB's: 64 mb)", "One memtable's size (at least 64 kb).", described=True),
    Option("state.backend.rocksdb.writebuffer.count", at_least(parse_int, 2), "(RocksDB's: 2)",
           "Memtables per column family (at least 2).", described=True),
    Option("state.backend.rocksdb.writebuffer.number-to-merge", _POS_INT, "(RocksDB's: 1)",
           "Memtables merged into one flush (below writebuffer.count).", described=True),
    Option("state.backend.rocksdb.block.blocksize", at_least(parse_size, 1, 2**32 - 1),
           "(RocksDB's: 4 kb)", "Uncompressed size of an SST data block (below 4 gb).",
           described=True),
    Option("state.backend.rocksdb.block.cache-size", refused(
        "the memory budget (state.backend.rocksdb.memory.*) sets the block cache, one per "
        "process"), "(refused)", "Refused: the memory budget sets the block cache.", described=True),
    Option("state.backend.rocksdb.files.open", open_files, "(RocksDB's: -1)",
           "Open files per instance: -1 (no limit) or at least 20.", described=True),
    Option("state.backend.rocksdb.thread.num", _POS_INT, "(RocksDB's: 2)",
           "Background flush and compaction jobs.", described=True),
    # --- heap ---------------------------------------------------------------------------------------
    Option("state.backend.heap.incremental", parse_bool, "false",
           "Incremental (changelog) heap checkpoints."),
    Option("state.backend.heap.snapshot-mode", choice("thread", "fork"), "thread",
           "How asynchronous heap snapshots are written."),
    Option("state.backend.heap.lazy-restore", parse_bool, "true",
           "Restore heap state lazily: keys are indexed at restore and values stay serialized "
           "until first accessed or decoded by a background thread, so processing starts "
           "before the state is decoded; checkpoints write still-serialized values through."),
    Option("state.backend.heap.snapshot-key-group-order", choice("auto", "true", "false"), "auto",
           "Write full heap snapshots by key group, each part recording the key groups it holds, "
           "so a rescaling restore reads only the parts of the key groups it takes over (as "
           "Flink's heap backend does). It costs a hash of every key per full snapshot: 1.1x the "
           "time with 1 KiB values, 2.3x with 100-byte values. auto: when the task holds part "
           "of the key groups (parallelism above 1, foreach_batch routed by key group)."),
    Option("state.backend.heap.snapshot-pace", at_least(parse_float, 0, 1000), "4.0",
           "Seconds the snapshot thread yields per second of work while processing runs "
           "(at most 1000); it works in turns of at most 0.8 ms, so no element waits longer: 4 "
           "keeps about 85 % of processing throughput during a snapshot, lower values finish "
           "the snapshot sooner."),
    Option("state.backend.heap.materialization-interval", _POS_INT, "10",
           "Incremental heap checkpoints: a full base every this many checkpoints."),
    Option("state.backend.heap.max-log-ratio", at_least(parse_float, 1e-9, 1e9), "0.5",
           "Incremental heap checkpoints: a new base once the log exceeds this share of it."),
    Option("state.backend.heap.transfer.thread.num", _POS_INT, "1",
           "Local runner: how many tasks' asynchronous heap snapshot parts run at once (each "
           "snapshot is written by one thread). Restores do not use it (a heap restore reads "
           "part heads in one pass and values with one read-ahead thread); the Spark "
           "adapters refuse it."),
    # --- object stores ----------------------------------------------------------------------------
    Option("state.storage.fs.retries", _NONNEG_INT, "4", "Retries of a failed store operation."),
    Option("state.storage.fs.retry-backoff", _NONNEG_DUR, "100 ms", "First retry delay."),
    Option("state.storage.fs.retry-max-backoff", _NONNEG_DUR, "5 s", "Longest retry delay."),
    Option("state.storage.fs.multipart-threshold", _POS_SIZE, "16 mb",
           "Object stores: files larger than this upload in parts."),
    Option("s3.endpoint", parse_str, "(AWS)", "S3 endpoint URL.", described=True),
    Option("s3.access-key", parse_str, "(AWS credentials chain)", "S3 access key.", described=True),
    Option("s3.secret-key", parse_str, "(AWS credentials chain)", "S3 secret key.", described=True),
    Option("s3.path.style.access", parse_bool, "false", "Path-style S3 addressing."),
    # --- Spark adapters ---------------------------------------------------------------------------
    Option("compat.enabled", parse_bool, "false",
           "Spark: run Spark's own `applyInPandasWithState`, `transformWithStateInPandas` and "
           "`transformWithState` calls on statekit state (see Coming from Spark)."),
    Option("state.partition.versions-retained", at_least(parse_int, 2), "10",
           "Spark: versions (batches) of each partition's state kept."),
    Option("state.changelog.materialize-every-batches", _POS_INT, "5",
           "applyInPandasWithState: snapshot a partition every this many batches."),
    Option("state.changelog.materialize-after-calls", _POS_INT, "1000",
           "applyInPandasWithState: also snapshot within a task after this many key calls."),
    Option("state.changelog.max-log-bytes", _POS_SIZE, "64 kb",
           "applyInPandasWithState: a key whose carried change log grows past this size (or "
           "holds changes older than materialize-every-batches) makes its task snapshot."),
)

#: canonical key -> option
BY_KEY: dict[str, Option] = {o.key: o for o in OPTIONS}
#: canonical key -> aliases (older Flink 1.x names and Flink 2 names)
KEYS: dict[str, tuple[str, ...]] = {o.key: o.aliases for o in OPTIONS}
_ALIASES = {alias: key for key, aliases in KEYS.items() for alias in aliases}

#: key prefixes that belong to statekit: a key under one of them that statekit does not know is
#: a mistake (a typo would otherwise be ignored), while other keys are the job's own parameters
NAMESPACES = ("state.", "execution.checkpointing.", "execution.savepoint.",
              "execution.state-recovery.", "restart-strategy", "s3.", "taskmanager.state.",
              "pipeline.max-parallelism", "parallelism.")


def canonical(key: str) -> str:
    """The canonical name of a key or alias (unknown keys pass through unchanged)."""
    return _ALIASES.get(key, key)


def env_name(key: str) -> str:
    """The environment variable that sets ``key``."""
    return ENV_PREFIX + re.sub(r"[.\-]", "_", key).upper()


_ENV_NAMES = {env_name(k): canonical(k) for k in (*KEYS, *_ALIASES)}
_PLUGINS = {"state.backend.type": backend_registry, "state.checkpoint-storage": storage_registry}
_ENV_NAMESPACES = tuple(env_name(n).rstrip("_") for n in NAMESPACES)


def from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Keys set through ``STATEKIT_*`` environment variables.

    A variable in a statekit namespace (``STATEKIT_STATE_...``, ``STATEKIT_EXECUTION_...``, ...)
    that names no known key, or holds a malformed value, raises :class:`ConfigError` naming the
    variable (with the nearest known one): every variable is checked, also one the job's own
    configuration then overrides, on the local runner and on Spark alike.
    """
    environ = os.environ if environ is None else environ
    found: dict[str, str] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        key = _ENV_NAMES.get(name)
        if key is not None:
            registry = _PLUGINS.get(key)
            try:
                validate({key: value})
                if registry is not None and value.strip():
                    registry.resolve(value)  # a backend or storage name: known, importable
            except ConfigError as exc:
                raise type(exc)(name, str(exc).split(": ", 1)[-1]) from None
            found[key] = value
        elif name.startswith(_ENV_NAMESPACES):
            raise ConfigError(name, "unknown statekit environment variable"
                              + _hint(name, _ENV_NAMES))
    return found


def normalize(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """``config`` with every alias replaced by its canonical key; a key and its alias set to
    different values is a ConfigError (one of them would be dropped silently)."""
    out: dict[str, Any] = {}
    written: dict[str, str] = {}
    for key, value in (config or {}).items():
        name = canonical(str(key))
        if name in out and _differ(name, out[name], value):
            raise ConfigError(str(key), f"set to {value!r}, but {written[name]} is set to "
                              f"{out[name]!r}: they name the same option")
        out[name], written[name] = value, str(key)
    return out


def _differ(key: str, a: Any, b: Any) -> bool:
    """Whether two values of ``key`` mean different things (parsed where the key is known)."""
    option = BY_KEY.get(key)
    if option is not None:
        try:
            return bool(option.parse(key, a) != option.parse(key, b))
        except ConfigError:
            pass  # the validation names the bad one
    return str(a).strip().lower() != str(b).strip().lower()


def read(config: Mapping[str, Any], key: str) -> Any:
    """The value of the canonical ``key`` in ``config``, parsed by its option, else its default."""
    return BY_KEY[key].read(config)


def default(key: str) -> Any:
    """The value in effect when the canonical ``key`` is not set (None: it depends)."""
    return BY_KEY[key].default_value


def in_namespace(key: str) -> bool:
    """Whether ``key`` lies in one of statekit's namespaces."""
    return key.startswith(NAMESPACES)


def _hint(key: str, known: Iterable[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"; did you mean '{prefix}{close[0]}'?" if close else ""


def validate(config: Mapping[str, Any], *, all_keys_are_statekit: bool = False,
             prefix: str = "") -> dict[str, Any]:
    """Check every key of ``config`` (already normalized) and parse every known one.

    Unknown keys in statekit's namespaces (every key, with ``all_keys_are_statekit``, as under
    Spark's ``spark.statekit.``) raise :class:`ConfigError` naming the nearest known key;
    malformed or out-of-range values raise it naming the key.  ``prefix`` is how the user wrote
    the keys (e.g. ``spark.statekit.``), for the messages.  Returns ``config`` unchanged.
    """
    for key, value in config.items():
        option = BY_KEY.get(key)
        if option is None:
            if all_keys_are_statekit or in_namespace(key):
                raise ConfigError(prefix + key, "unknown statekit configuration key"
                                  + _hint(key, [*BY_KEY, *_ALIASES], prefix))
            continue
        if value is None:
            continue
        try:
            option.parse(key, value)
        except ConfigError as exc:
            if prefix:
                raise ConfigError(prefix + key, str(exc).split(": ", 1)[-1]) from None
            raise
    return dict(config)
