"""Size limits for keys and values of keyed state (RocksDB's 2^31-1 bytes by default).

A backend with limits below the default wraps each state in a proxy that measures the serialized
current key, map key and value before a write and raises :class:`StateSizeError` naming the state,
leaving the state (and every checkpoint) unchanged.  At the default limits nothing is wrapped, so
the hot path pays nothing; the serializers then bound sizes at snapshot time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from statekit.errors import StateSizeError

#: RocksDB's limit for one key or value (and the default of both limits here)
DEFAULT_MAX_SIZE = 2**31 - 1

MAX_KEY_SIZE_KEY = "state.backend.max-key-size"
MAX_VALUE_SIZE_KEY = "state.backend.max-value-size"


class _Limited:
    """Forwards everything to the wrapped state, checking sizes on writes."""

    def __init__(self, inner: Any, meta: Any, backend: Any, max_key: int, max_value: int) -> None:
        self._inner = inner
        self._name = meta.name
        self._backend = backend
        self._key_ser = meta.key_serializer
        self._max_key = max_key
        self._max_value = max_value
        self._ok_key: Any = object()
        stored = meta.stored_serializer
        self._value_ser = getattr(stored, "element", None) or getattr(stored, "value", None) or stored
        self._user_key_ser = getattr(stored, "key", None) if meta.kind == "map" else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _check_key(self) -> None:
        key = self._backend.current_key
        if key is self._ok_key:
            return
        try:
            size = len(self._key_ser.serialize(key))
        except Exception:  # no key context / unserializable: the backend reports it
            return
        if size > self._max_key:
            raise StateSizeError(f"key of {size} bytes exceeds the maximum key size of "
                                 f"{self._max_key} bytes", self._name)
        self._ok_key = key

    def _check(self, value: Any, serializer: Any, what: str, limit: int) -> None:
        if value is None or serializer is None:
            return
        try:
            size = len(serializer.serialize(value))
        except Exception:  # a type error: the state's own check names it
            return
        if size > limit:
            raise StateSizeError(f"{what} of {size} bytes exceeds the maximum {what} size of "
                                 f"{limit} bytes", self._name)

    def _value(self, value: Any) -> None:
        self._check(value, self._value_ser, "value", self._max_value)


class LimitedValueState(_Limited):
    def update(self, value: Any) -> None:
        self._check_key()
        self._value(value)
        self._inner.update(value)


class LimitedListState(_Limited):
    def add(self, value: Any) -> None:
        self._check_key()
        self._value(value)
        self._inner.add(value)

    def add_all(self, values: Iterable[Any]) -> None:
        values = list(values) if values is not None else values
        self._check_key()
        for value in values or ():
            self._value(value)
        self._inner.add_all(values)

    def update(self, values: Iterable[Any]) -> None:
        values = list(values) if values is not None else values
        self._check_key()
        for value in values or ():
            self._value(value)
        self._inner.update(values)


class LimitedMapState(_Limited):
    def put(self, key: Any, value: Any) -> None:
        self._check_key()
        self._check(key, self._user_key_ser, "key", self._max_key)
        self._value(value)
        self._inner.put(key, value)

    def put_all(self, entries: dict[Any, Any]) -> None:
        self._check_key()
        for key, value in dict(entries).items():
            self._check(key, self._user_key_ser, "key", self._max_key)
            self._value(value)
        self._inner.put_all(entries)

    def __contains__(self, key: Any) -> bool:
        return key in self._inner

    def __iter__(self) -> Any:
        return iter(self._inner)


def limit_state(inner: Any, meta: Any, backend: Any) -> Any:
    """``inner`` wrapped to enforce the backend's size limits, or ``inner`` at the defaults."""
    max_key = int(getattr(backend, "max_key_size", DEFAULT_MAX_SIZE))
    max_value = int(getattr(backend, "max_value_size", DEFAULT_MAX_SIZE))
    if max_key >= DEFAULT_MAX_SIZE and max_value >= DEFAULT_MAX_SIZE:
        return inner
    cls = {"value": LimitedValueState, "list": LimitedListState, "map": LimitedMapState}[meta.kind]
    return cls(inner, meta, backend, max_key, max_value)
