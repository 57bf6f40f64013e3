"""Bulk state access for vectorized functions: many keys of one state in one call.

Backends may provide ``bulk_get(descriptor, keys)`` / ``bulk_put(descriptor, keys, values)`` fast
paths (one multi-get / one write batch); otherwise each key is visited through the regular
state API, which keeps TTL, type checks and copy-on-write exactly as for single access.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from statekit.backends.base import KeyedStateBackend
from statekit.state.descriptors import StateDescriptor, StateKind


class BulkState:
    """Reads and writes value states for many keys at once."""

    def __init__(self, backend: KeyedStateBackend) -> None:
        self.backend = backend

    def _check(self, descriptor: StateDescriptor) -> None:
        if descriptor.kind != StateKind.VALUE:
            raise TypeError(f"bulk access covers value states, not {descriptor.kind.value} states")

    def get(self, descriptor: StateDescriptor, keys: Sequence[Any]) -> list[Any]:
        """The current value of ``descriptor`` for each key (None where unset)."""
        self._check(descriptor)
        fast = getattr(self.backend, "bulk_get", None)
        if fast is not None and descriptor.ttl_config is None:
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
        fast = getattr(self.backend, "bulk_put", None)
        if fast is not None and descriptor.ttl_config is None:
            fast(descriptor, keys, values)
            return
        state = self.backend.get_partitioned_state(descriptor)
        set_key = self.backend.set_current_key
        update = state.update  # type: ignore[attr-defined]
        for key, value in zip(keys, values, strict=True):
            set_key(key)
            update(value)
