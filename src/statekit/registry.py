"""Plugin registries: built-in names, runtime registrations, entry points and dotted class paths.

Modelled on fsspec's ``registry.py``: names map to lazy import strings, third-party packages add
names through an entry-point group, and any ``package.module.Class`` path also resolves.
"""

from __future__ import annotations

import difflib
import importlib
import threading
from importlib.metadata import entry_points
from typing import Any

from statekit.errors import UnknownPluginError


class PluginRegistry:
    """Resolves a short name or dotted path to a class, loading entry points on first miss."""

    def __init__(self, group: str, config_key: str, builtins: dict[str, str]) -> None:
        self.group = group
        self.config_key = config_key
        self._targets: dict[str, Any] = dict(builtins)
        self._entry_points_loaded = False
        self._lock = threading.Lock()

    def register(self, name: str, target: type | str, *, clobber: bool = False) -> None:
        """Register ``target`` (a class or ``"module:Class"`` string) under ``name``."""
        with self._lock:
            if name in self._targets and not clobber and self._targets[name] != target:
                raise ValueError(f"{self.group}: name {name!r} is already registered")
            self._targets[name] = target

    def names(self) -> list[str]:
        self._load_entry_points()
        return sorted(self._targets)

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        with self._lock:
            for ep in entry_points(group=self.group):
                self._targets.setdefault(ep.name, ep.value)
            self._entry_points_loaded = True

    def resolve(self, name: str) -> Any:
        """The class registered as ``name``, or importable at dotted path ``name``."""
        key = name.strip()
        target = self._targets.get(key.lower())
        if target is None:
            self._load_entry_points()
            target = self._targets.get(key.lower())
        if target is None and "." in key:
            target = key
        if target is None:
            close = difflib.get_close_matches(key.lower(), self.names(), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UnknownPluginError(
                self.config_key, f"unknown name {name!r}; {hint}known: "
                f"{', '.join(self.names())} or a dotted class path"
            )
        if isinstance(target, str):
            return _import(target, self.config_key)
        return target


def _import(path: str, config_key: str) -> Any:
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise UnknownPluginError(config_key, f"cannot import {path!r}: {exc}") from exc
    return obj


backend_registry = PluginRegistry(
    "statekit.backends",
    "state.backend.type",
    {
        "hashmap": "statekit.backends.heap:HashMapStateBackend",
        "rocksdb": "statekit.backends.rocksdb:EmbeddedRocksDBStateBackend",
    },
)

storage_registry = PluginRegistry(
    "statekit.checkpoint_storage",
    "state.checkpoint-storage",
    {
        "jobmanager": "statekit.checkpoint.storage:JobManagerCheckpointStorage",
        "filesystem": "statekit.checkpoint.storage:FileSystemCheckpointStorage",
    },
)
