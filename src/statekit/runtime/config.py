"""Flat configuration keys (Flink's names and their Flink 2 aliases) from dicts and the environment.

``STATEKIT_STATE_BACKEND_TYPE=rocksdb`` sets ``state.backend.type``: upper case, with dots and
dashes as underscores.  Spark conf under ``spark.statekit.`` maps the same way (see
``statekit.spark``).  Malformed values raise :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from statekit.values import (  # noqa: F401 (re-exported: the parsers used with these keys)
    get,
    parse_bool,
    parse_duration_ms,
    parse_enum,
    parse_float,
    parse_int,
    parse_size,
)

ENV_PREFIX = "STATEKIT_"

#: canonical key -> aliases (older Flink 1.x names and Flink 2 names)
KEYS: dict[str, tuple[str, ...]] = {
    "state.backend.type": ("state.backend",),
    "state.checkpoint-storage": ("execution.checkpointing.storage",),
    "state.checkpoints.dir": ("execution.checkpointing.dir",),
    "state.savepoints.dir": ("execution.checkpointing.savepoint-dir",),
    "state.backend.incremental": ("execution.checkpointing.incremental",),
    "state.backend.async": ("execution.checkpointing.async",),
    "state.checkpoints.num-retained": ("execution.checkpointing.num-retained",),
    "state.storage.fs.memory-threshold": (
        "state.backend.fs.memory-threshold", "execution.checkpointing.data-inline-threshold",
    ),
    "state.storage.fs.write-buffer-size": (
        "state.backend.fs.write-buffer-size", "execution.checkpointing.write-buffer-size",
    ),
    "state.checkpoint-storage.jobmanager.max-state-size": (),
    "execution.checkpointing.interval": (),
    "execution.checkpointing.mode": (),
    "execution.checkpointing.timeout": (),
    "execution.checkpointing.min-pause": (),
    "execution.checkpointing.max-concurrent-checkpoints": (),
    "execution.checkpointing.tolerable-failed-checkpoints": (),
    "execution.checkpointing.externalized-checkpoint-retention": (
        "execution.checkpointing.externalized-checkpoint-cleanup",
    ),
    "execution.checkpointing.prefer-checkpoint-for-recovery": (),
    "execution.checkpointing.unaligned": ("execution.checkpointing.unaligned.enabled",),
    "execution.savepoint.path": ("execution.state-recovery.path",),
    "parallelism.default": (),
    "pipeline.max-parallelism": (),
    "restart-strategy.type": ("restart-strategy",),
    "restart-strategy.fixed-delay.attempts": (),
    "restart-strategy.fixed-delay.delay": (),
    "restart-strategy.failure-rate.max-failures-per-interval": (),
    "restart-strategy.failure-rate.failure-rate-interval": (),
    "restart-strategy.failure-rate.delay": (),
    "state.backend.rocksdb.localdir": (),
    "state.backend.rocksdb.predefined-options": (),
    "state.backend.rocksdb.options-factory": (),
    "state.backend.rocksdb.checkpoint.transfer.thread.num": (),
    "state.backend.rocksdb.ttl.compaction.filter.enabled": (),
    "state.backend.heap.incremental": (),
    "state.backend.heap.snapshot-mode": (),
    "state.backend.heap.snapshot-pace": (),
    "state.backend.heap.materialization-interval": (),
    "state.backend.heap.max-log-ratio": (),
    "state.backend.heap.transfer.thread.num": (),
    "state.backend.max-key-size": (),
    "state.backend.max-value-size": (),
    "state.storage.fs.retries": (),
    "state.storage.fs.retry-backoff": (),
    "state.storage.fs.retry-max-backoff": (),
    "state.storage.fs.multipart-threshold": (),
    "execution.checkpointing.recover-from-older-on-corruption": (),
    "s3.endpoint": (),
    "s3.access-key": (),
    "s3.secret-key": (),
    "s3.path.style.access": (),
    "state.partition.versions-retained": (),
    "state.changelog.materialize-every-batches": (),
    "state.changelog.materialize-after-calls": (),
}

_ALIASES = {alias: key for key, aliases in KEYS.items() for alias in aliases}


def canonical(key: str) -> str:
    """The canonical name of a key or alias (unknown keys pass through unchanged)."""
    return _ALIASES.get(key, key)


def env_name(key: str) -> str:
    """The environment variable that sets ``key``."""
    return ENV_PREFIX + re.sub(r"[.\-]", "_", key).upper()


def from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Known keys (and aliases) set through ``STATEKIT_*`` environment variables."""
    environ = os.environ if environ is None else environ
    found: dict[str, str] = {}
    for key in (*KEYS, *_ALIASES):
        name = env_name(key)
        if name in environ:
            found[canonical(key)] = environ[name]
    return found


def normalize(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """``config`` with every alias replaced by its canonical key."""
    out: dict[str, Any] = {}
    for key, value in (config or {}).items():
        out[canonical(str(key))] = value
    return out
