"""Bulk state access for vectorized functions: many keys of one state in one call.

Backends may provide ``bulk_get(descriptor, keys)`` / ``bulk_put(descriptor, keys, values)`` fast
paths (one multi-get / one write batch); otherwise, and whenever TTL or a state interceptor
(change recording) is involved, each key is visited through the regular state API.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from statekit.backends.base import NO_KEY, KeyedStateBackend
from statekit.state.descriptors import StateDescriptor, StateKind


class BulkState:
    """Reads and writes value states for many keys at once."""

    def __init__(self, backend: KeyedStateBackend) -> None:
        self.backend = backend

    def _check(self, descriptor: StateDescriptor) -> None:
        if descriptor.kind != StateKind.VALUE:
            raise TypeError(f"bulk access covers value states, not {descriptor.kind.value} states")

    def _fast(self, name: str, descriptor: StateDescriptor) -> Any:
        if descriptor.ttl_config is not None or self.backend.state_interceptor is not None:
            return None
        return getattr(self.backend, name, None)

    @contextmanager
    def _current_key_kept(self) -> Iterator[None]:
        """Leave the backend's current key as it was (Flink: reading other keys' state, as
        queryable state does, never moves the current key); one rule for every backend."""
        previous = self.backend.current_key
        try:
            yield
        finally:
            if previous is not NO_KEY and self.backend.current_key is not previous:
                self.backend.set_current_key(previous)

    def get(self, descriptor: StateDescriptor, keys: Sequence[Any]) -> list[Any]:
        """The current value of ``descriptor`` for each key (None where unset)."""
        self._check(descriptor)
        with self._current_key_kept():
            fast = self._fast("bulk_get", descriptor)
            if fast is not None:
                return list(fast(descriptor, keys))
            read = self.backend.get_partitioned_state(descriptor).value  # type: ignore[attr-defined]
            out = []
            set_key = self.backend.set_current_key
            for key in keys:
                set_key(key)
                out.append(read())
            return out

    def put(self, descriptor: StateDescriptor, keys: Sequence[Any], values: Sequence[Any]) -> None:
        """Set ``descriptor`` for each key (a value of None clears it)."""
        self._check(descriptor)
        if len(keys) != len(values):
            raise ValueError("keys and values differ in length")
        with self._current_key_kept():
            fast = self._fast("bulk_put", descriptor)
            if fast is not None:
                fast(descriptor, keys, values)
                return
            state = self.backend.get_partitioned_state(descriptor)
            set_key = self.backend.set_current_key
            update = state.update  # type: ignore[attr-defined]
            for key, value in zip(keys, values, strict=True):
                set_key(key)
                update(value)
