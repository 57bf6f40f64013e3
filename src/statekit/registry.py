"""Plugin registries: one path from a name to a configured backend or checkpoint storage.

Modelled on fsspec's ``registry.py``: one table maps every name, built in or alias, to a lazy
import string, with an install hint (``err``) for an optional dependency; third-party packages
add names through an entry-point group, and any ``package.module.Class`` path also resolves.
A resolved class is built from flat keys by its ``from_config(conf)`` classmethod, so built-in
and third-party plugins are configured the same way, with no special cases beside the table.
"""

from __future__ import annotations

import difflib
import importlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, TypeVar

from statekit.errors import ConfigError, MissingDependencyError, UnknownPluginError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    """What a name stands for: a class (or ``"module:Class"`` path), and what to install when
    importing it fails for want of an optional dependency."""

    target: Any
    err: str | None = None


class PluginRegistry:
    """Resolves a short name or dotted path to a class, loading entry points on first miss."""

    def __init__(self, group: str, config_key: str,
                 builtins: Mapping[str, Mapping[str, str]]) -> None:
        self.group = group
        self.config_key = config_key
        self._entries: dict[str, Entry] = {
            name: Entry(spec["class"], spec.get("err")) for name, spec in builtins.items()
        }
        self._entry_points_loaded = False
        self._lock = threading.Lock()

    def register(self, name: str, target: type | str, *, err: str | None = None,
                 clobber: bool = False) -> None:
        """Register ``target`` (a class or ``"module:Class"`` string) under ``name``.

        ``err`` is the hint shown when importing ``target`` fails (e.g. what to install).
        """
        with self._lock:
            known = self._entries.get(name)
            if known is not None and not clobber and known.target != target:
                raise ValueError(f"{self.group}: name {name!r} is already registered")
            self._entries[name] = Entry(target, err)

    def names(self) -> list[str]:
        self._load_entry_points()
        return sorted(self._entries)

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        with self._lock:
            for ep in entry_points(group=self.group):
                self._entries.setdefault(ep.name, Entry(ep.value))
            self._entry_points_loaded = True

    def resolve(self, name: str) -> Any:
        """The class registered as ``name``, or importable at dotted path ``name``."""
        key = name.strip()
        entry = self._entries.get(key.lower())
        if entry is None:
            self._load_entry_points()
            entry = self._entries.get(key.lower())
        if entry is None and "." in key:
            entry = Entry(key)
        if entry is None:
            close = difflib.get_close_matches(key.lower(), self.names(), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UnknownPluginError(
                self.config_key, f"unknown name {name!r}; {hint}known: "
                f"{', '.join(self.names())} or a dotted class path"
            )
        if isinstance(entry.target, str):
            return import_path(entry.target, self.config_key, entry.err)
        return entry.target

    def create(self, name: str, config: Mapping[str, Any], expected: type[T]) -> T:
        """The plugin ``name``, built from the flat keys ``config``: ``Class.from_config(config)``.

        A target that is not a subclass of ``expected`` (a factory function, say) is called with
        no arguments and its result configured; anything but an ``expected`` instance raises
        :class:`ConfigError` naming this registry's key.
        """
        target = self.resolve(name)
        conf = dict(config)
        if isinstance(target, type) and issubclass(target, expected):
            plugin: Any = target.from_config(conf)  # type: ignore[attr-defined]
        else:
            plugin = target() if callable(target) else target
            if isinstance(plugin, expected):
                plugin = plugin.configure(conf)  # type: ignore[attr-defined]
        if not isinstance(plugin, expected):
            raise ConfigError(self.config_key,
                              f"{name!r} does not create a statekit {expected.__name__}")
        return plugin


def import_path(path: str, config_key: str, err: str | None = None) -> Any:
    """The object at ``module:name`` or ``module.name`` (typed errors naming ``config_key``).

    ``err`` replaces the import error's text when the import itself fails (a missing optional
    dependency), as fsspec's ``known_implementations`` hints do.
    """
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        if err is not None:
            raise MissingDependencyError(config_key, f"{err} ({exc})") from exc
        raise UnknownPluginError(config_key, f"cannot import {path!r}: {exc}") from exc
    except ValueError as exc:
        raise UnknownPluginError(config_key, f"cannot import {path!r}: {exc}") from exc
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as exc:
        raise UnknownPluginError(config_key, f"cannot import {path!r}: {exc}") from exc
    return obj


_ROCKSDB_HINT = ("the RocksDB state backend needs rocksdict: "
                 "pip install 'rocksdict>=0.3.29,<0.4'")

#: state backends by name; ``jobmanager`` and ``filesystem`` are Flink's legacy names of the
#: heap backend bundled with JobManager / file system checkpoint storage
backend_registry = PluginRegistry(
    "statekit.backends",
    "state.backend.type",
    {
        "hashmap": {"class": "statekit.backends.heap:HashMapStateBackend"},
        "rocksdb": {"class": "statekit.backends.rocksdb:EmbeddedRocksDBStateBackend",
                    "err": _ROCKSDB_HINT},
        "jobmanager": {"class": "statekit.backends.legacy:MemoryStateBackend"},
        "filesystem": {"class": "statekit.backends.legacy:FsStateBackend"},
    },
)

#: checkpoint storages by name
storage_registry = PluginRegistry(
    "statekit.checkpoint_storage",
    "state.checkpoint-storage",
    {
        "jobmanager": {"class": "statekit.checkpoint.jobmanager:JobManagerCheckpointStorage"},
        "filesystem": {"class": "statekit.checkpoint.filesystem:FileSystemCheckpointStorage"},
    },
)
