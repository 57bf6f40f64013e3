"""Flat configuration keys (Flink's names and their Flink 2 aliases) from dicts and the environment.

``STATEKIT_STATE_BACKEND_TYPE=rocksdb`` sets ``state.backend.type``: upper case, with dots and
dashes as underscores.  Spark conf under ``spark.statekit.`` maps the same way (see
``statekit.spark``).  Malformed values raise :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from statekit.errors import ConfigError

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


# --- value parsers ---------------------------------------------------------------------------------

_DURATION_UNITS = {
    "ms": 1, "milli": 1, "millis": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "min": 60_000, "mins": 60_000, "minute": 60_000, "minutes": 60_000, "m": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
}
_SIZE_UNITS = {
    "b": 1, "bytes": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1 << 20, "mb": 1 << 20,
    "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
}


def _number_with_unit(key: str, value: Any, units: dict[str, int], what: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(key, f"expected a {what}, got {value!r}")
    if isinstance(value, int | float):
        return int(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(value))
    if not match or match.group(2).lower() not in ({""} | set(units)):
        raise ConfigError(key, f"expected a {what} such as '10 s' or '20 kb', got {value!r}")
    factor = units.get(match.group(2).lower(), 1)
    return int(float(match.group(1)) * factor)


def parse_duration_ms(key: str, value: Any) -> int:
    return _number_with_unit(key, value, _DURATION_UNITS, "duration")


def parse_size(key: str, value: Any) -> int:
    return _number_with_unit(key, value, _SIZE_UNITS, "memory size")


def parse_int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ConfigError(key, f"expected an integer, got {value!r}")
    try:
        return int(str(value).strip())
    except ValueError as exc:
        raise ConfigError(key, f"expected an integer, got {value!r}") from exc


def parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ConfigError(key, f"expected true or false, got {value!r}")


def parse_enum(key: str, value: Any, choices: Mapping[str, Any]) -> Any:
    text = str(getattr(value, "name", value)).strip().upper().replace("-", "_")
    if text not in choices:
        raise ConfigError(key, f"expected one of {', '.join(sorted(choices))}, got {value!r}")
    return choices[text]


def get(config: Mapping[str, Any], key: str, parse: Callable[[str, Any], Any],
        default: Any = None) -> Any:
    """``parse(key, config[key])`` or ``default`` when the key is absent."""
    if key not in config or config[key] is None:
        return default
    return parse(key, config[key])
