"""Serializers: turn values of one type into msgpack plain forms and back, check and deep-copy them.

Every serializer maps a value to a *plain* form that msgpack encodes natively (None, bool, int,
float, str, bytes, list, dict, plus the extension types of :mod:`statekit.serde.msgpack`), so
whole chunks of state encode in one C call.  Only :class:`PickleSerializer` uses pickle, and only
``Types.PICKLED_BYTE_ARRAY()`` selects it.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import pickle
from collections.abc import Iterable, Sequence
from typing import Any

from statekit.errors import SerializationError
from statekit.serde.msgpack import packb, unpackb


class TypeSerializer:
    """Turns values of one type into bytes and back; also validates and deep-copies them.

    ``identity`` means the plain form is the value itself (no per-value conversion), and
    ``immutable`` means values can be shared between the live table and a snapshot.
    """

    identity = True
    immutable = True
    uses_pickle = False

    def to_plain(self, value: Any) -> Any:
        return value

    def from_plain(self, plain: Any) -> Any:
        return plain

    def serialize(self, value: Any) -> bytes:
        return packb(self.to_plain(value))

    def deserialize(self, data: bytes) -> Any:
        return self.from_plain(unpackb(data))

    def copy(self, value: Any) -> Any:
        """A deep copy, so a snapshot never sees later in-place mutation."""
        if self.immutable:
            return value
        return self.from_plain(unpackb(packb(self.to_plain(value))))

    def check(self, value: Any) -> str | None:
        """Why ``value`` is not of this type, or None when it is."""
        return None

    def exact_type(self) -> tuple[type | None, Any, Any]:
        """``(T, low, high)``: every value of exactly type ``T`` (within ``low..high`` unless
        they are None) passes :meth:`check`, so hot paths can skip the call; ``T`` None: no such
        type."""
        return None, None, None

    def config(self) -> Any:
        """A JSON-able description, recorded in checkpoints to detect incompatible restores."""
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TypeSerializer) and self.config() == other.config()

    def __hash__(self) -> int:
        return hash(repr(self.config()))


class ScalarSerializer(TypeSerializer):
    """A msgpack-native scalar checked with isinstance and an optional range."""

    def __init__(self, name: str, types: tuple[type, ...], bounds: tuple[int, int] | None = None,
                 length: int | None = None) -> None:
        self._name = name
        self._types = types
        self._bounds = bounds
        self._length = length

    def check(self, value: Any) -> str | None:
        if not isinstance(value, self._types) or (
            isinstance(value, bool) and bool not in self._types
        ):
            return f"expected {self._name}, got {type(value).__name__}"
        if self._bounds is not None and not (self._bounds[0] <= value <= self._bounds[1]):
            return f"{value} is out of range for {self._name}"
        if self._length is not None and len(value) != self._length:
            return f"expected a single character for {self._name}, got {value!r}"
        return None

    def exact_type(self) -> tuple[type | None, Any, Any]:
        if self._length is not None:
            return None, None, None
        low, high = self._bounds or (None, None)
        return self._types[0], low, high

    def config(self) -> Any:
        return self._name


class ExtSerializer(TypeSerializer):
    """A scalar encoded through a msgpack extension type (Decimal, datetimes, big ints)."""

    def __init__(self, name: str, types: tuple[type, ...], exclude: tuple[type, ...] = ()) -> None:
        self._name = name
        self._types = types
        self._exclude = exclude

    def check(self, value: Any) -> str | None:
        if not isinstance(value, self._types) or isinstance(value, self._exclude):
            return f"expected {self._name}, got {type(value).__name__}"
        return None

    def config(self) -> Any:
        return self._name


_PLAIN_SCALARS = (type(None), bool, int, float, str, bytes)
_GENERIC_SCALARS = (
    *_PLAIN_SCALARS, decimal.Decimal, _dt.datetime, _dt.date, _dt.time, _dt.timedelta,
)


class GenericSerializer(TypeSerializer):
    """The default when a descriptor gives no type: common Python values, without pickle."""

    immutable = False

    def check(self, value: Any) -> str | None:
        if isinstance(value, _GENERIC_SCALARS):
            return None
        try:
            packb(value)
        except SerializationError as exc:
            return str(exc)
        return None

    def copy(self, value: Any) -> Any:
        if isinstance(value, _GENERIC_SCALARS):
            return value
        return unpackb(packb(value))

    def config(self) -> Any:
        return "generic"


class PickleSerializer(TypeSerializer):
    """Pickle: any picklable value.  Only used when a descriptor asks for it explicitly."""

    identity = False
    immutable = False
    uses_pickle = True

    def to_plain(self, value: Any) -> Any:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def from_plain(self, plain: Any) -> Any:
        return pickle.loads(plain)  # the descriptor opted into pickle

    def check(self, value: Any) -> str | None:
        return None

    def config(self) -> Any:
        return "pickle"


class ListSerializer(TypeSerializer):
    """A Python list of one element type (``Types.LIST``, ``BASIC_ARRAY``, ``OBJECT_ARRAY``)."""

    immutable = False

    def __init__(self, element: TypeSerializer, name: str = "list") -> None:
        self.element = element
        self.identity = element.identity
        self._name = name

    def to_plain(self, value: Any) -> Any:
        if self.identity:
            return list(value)
        to_plain = self.element.to_plain
        return [to_plain(v) for v in value]

    def from_plain(self, plain: Any) -> Any:
        if self.identity:
            return plain
        from_plain = self.element.from_plain
        return [from_plain(p) for p in plain]

    def check(self, value: Any) -> str | None:
        if not isinstance(value, list | tuple):
            return f"expected a list, got {type(value).__name__}"
        for item in value:
            problem = self.element.check(item)
            if problem:
                return f"element: {problem}"
        return None

    def config(self) -> Any:
        return [self._name, self.element.config()]


class MapSerializer(TypeSerializer):
    """A dict; plain form is a list of [key, value] pairs so any hashable key survives.  A value
    may be None (Flink's map serializer allows null values, as map state does)."""

    immutable = False
    identity = False

    def __init__(self, key: TypeSerializer, value: TypeSerializer) -> None:
        self.key = key
        self.value = value

    def to_plain(self, value: Any) -> Any:
        kp, vp = self.key.to_plain, self.value.to_plain
        return [[kp(k), None if v is None else vp(v)] for k, v in value.items()]

    def from_plain(self, plain: Any) -> Any:
        kf, vf = self.key.from_plain, self.value.from_plain
        return {kf(k): None if v is None else vf(v) for k, v in plain}

    def check(self, value: Any) -> str | None:
        if not isinstance(value, dict):
            return f"expected a dict, got {type(value).__name__}"
        for k, v in value.items():
            problem = self.key.check(k) or (None if v is None else self.value.check(v))
            if problem:
                return f"entry {k!r}: {problem}"
        return None

    def config(self) -> Any:
        return ["map", self.key.config(), self.value.config()]


class TupleSerializer(TypeSerializer):
    """A fixed-arity tuple of typed fields (``Types.TUPLE`` and ``Types.ROW``); a field may be
    None, as a Spark struct's fields and Flink's row fields may be null."""

    identity = False

    def __init__(self, fields: Sequence[TypeSerializer], name: str = "tuple") -> None:
        self.fields = list(fields)
        self.immutable = all(f.immutable for f in self.fields)
        self._name = name

    def to_plain(self, value: Any) -> Any:
        return [None if v is None else f.to_plain(v)
                for f, v in zip(self.fields, value, strict=True)]

    def from_plain(self, plain: Any) -> Any:
        return tuple(None if p is None else f.from_plain(p)
                     for f, p in zip(self.fields, plain, strict=True))

    def check(self, value: Any) -> str | None:
        if not isinstance(value, tuple | list) or len(value) != len(self.fields):
            return f"expected a {len(self.fields)}-tuple, got {value!r}"
        return _check_fields(enumerate(value), self.fields)

    def config(self) -> Any:
        return [self._name, [f.config() for f in self.fields]]


def _check_fields(values: Iterable[tuple[Any, Any]], fields: Sequence[TypeSerializer]
                  ) -> str | None:
    """The first problem of (name, value) pairs against their fields' serializers (None passes)."""
    for (name, v), f in zip(values, fields, strict=True):
        problem = None if v is None else f.check(v)
        if problem:
            return f"field {name}: {problem}"
    return None


def _as_dict(value: Any) -> Any:
    """A NamedTuple or a Spark ``Row`` as the dict of its fields; anything else unchanged."""
    if isinstance(value, tuple):
        as_dict = getattr(value, "_asdict", None) or getattr(value, "asDict", None)
        if as_dict is not None:
            return as_dict()
    return value


class NamedRowSerializer(TypeSerializer):
    """A row with named fields, represented in Python as a dict (``Types.ROW_NAMED``); a
    NamedTuple or Spark ``Row`` with the same fields is taken too, and a field may be None."""

    identity = False
    immutable = False

    def __init__(self, names: Sequence[str], fields: Sequence[TypeSerializer]) -> None:
        self.names = list(names)
        self.fields = list(fields)

    def to_plain(self, value: Any) -> Any:
        value = _as_dict(value)
        return [None if value[n] is None else f.to_plain(value[n])
                for n, f in zip(self.names, self.fields, strict=True)]

    def from_plain(self, plain: Any) -> Any:
        return {n: None if p is None else f.from_plain(p)
                for n, f, p in zip(self.names, self.fields, plain, strict=True)}

    def check(self, value: Any) -> str | None:
        value = _as_dict(value)
        if not isinstance(value, dict) or set(value) != set(self.names):
            return f"expected a dict with fields {self.names}, got {value!r}"
        return _check_fields(((n, value[n]) for n in self.names), self.fields)

    def config(self) -> Any:
        return ["row_named", self.names, [f.config() for f in self.fields]]

