"""Type information and serializers: fast, safe (no pickle) encodings chosen by PyFlink-style ``Types``.

Every serializer maps a value to a *plain* form that msgpack encodes natively (None, bool, int,
float, str, bytes, list, dict, plus a few extension types for tuple, set, Decimal and datetimes),
so whole chunks of state encode in one C call.  Pickle is used only by
``Types.PICKLED_BYTE_ARRAY()``, the explicit opt-in.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import pickle
import threading
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from statekit.errors import SerializationError

# --- msgpack with extension types for the Python values msgpack lacks ----------------------------

_EXT_TUPLE, _EXT_SET, _EXT_FROZENSET, _EXT_DECIMAL = 1, 2, 3, 4
_EXT_DATETIME, _EXT_DATE, _EXT_TIME, _EXT_TIMEDELTA, _EXT_BIGINT = 5, 6, 7, 8, 9

_local = threading.local()


def _nested(obj: Any) -> bytes:
    # a fresh packer: the thread's packer is busy with the enclosing value
    return msgpack.packb(obj, use_bin_type=True, strict_types=True, default=_ext_default)


def _ext_default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return msgpack.ExtType(_EXT_TUPLE, _nested(list(obj)))
    if isinstance(obj, frozenset):
        return msgpack.ExtType(_EXT_FROZENSET, _nested(list(obj)))
    if isinstance(obj, set):
        return msgpack.ExtType(_EXT_SET, _nested(list(obj)))
    if isinstance(obj, decimal.Decimal):
        return msgpack.ExtType(_EXT_DECIMAL, str(obj).encode())
    if isinstance(obj, _dt.datetime):
        return msgpack.ExtType(_EXT_DATETIME, obj.isoformat().encode())
    if isinstance(obj, _dt.date):
        return msgpack.ExtType(_EXT_DATE, obj.isoformat().encode())
    if isinstance(obj, _dt.time):
        return msgpack.ExtType(_EXT_TIME, obj.isoformat().encode())
    if isinstance(obj, _dt.timedelta):
        return msgpack.ExtType(_EXT_TIMEDELTA, _nested([obj.days, obj.seconds, obj.microseconds]))
    if type(obj) is int:  # outside the 64-bit range msgpack handles natively
        return msgpack.ExtType(_EXT_BIGINT, str(obj).encode())
    for base in (bool, int, float, str, bytes, list, dict):
        if isinstance(obj, base):  # subclasses (IntEnum, str enums, ...) keep their base value
            return base(obj)  # type: ignore[return-value]
    raise TypeError(f"cannot serialize object of type {type(obj).__name__} without pickle")


_EXT_DECODERS: dict[int, Callable[[bytes], Any]] = {
    _EXT_TUPLE: lambda b: tuple(unpackb(b)),
    _EXT_SET: lambda b: set(unpackb(b)),
    _EXT_FROZENSET: lambda b: frozenset(unpackb(b)),
    _EXT_DECIMAL: lambda b: decimal.Decimal(b.decode()),
    _EXT_DATETIME: lambda b: _dt.datetime.fromisoformat(b.decode()),
    _EXT_DATE: lambda b: _dt.date.fromisoformat(b.decode()),
    _EXT_TIME: lambda b: _dt.time.fromisoformat(b.decode()),
    _EXT_TIMEDELTA: lambda b: _dt.timedelta(*unpackb(b)),
    _EXT_BIGINT: lambda b: int(b.decode()),
}


def _ext_hook(code: int, data: bytes) -> Any:
    decoder = _EXT_DECODERS.get(code)
    if decoder is None:
        raise SerializationError(f"unknown msgpack extension type {code}")
    return decoder(data)


def _packer() -> msgpack.Packer:
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = msgpack.Packer(use_bin_type=True, strict_types=True, default=_ext_default)
        _local.packer = packer
    return packer


def packb(obj: Any) -> bytes:
    """Encode a plain value (thread-safe: one packer per thread)."""
    try:
        return _packer().pack(obj)
    except (TypeError, OverflowError, ValueError) as exc:
        _local.packer = None  # a failed pack can leave the packer's buffer dirty
        raise SerializationError(str(exc)) from exc


def unpackb(data: bytes) -> Any:
    """Decode bytes produced by :func:`packb`; damaged input raises SerializationError."""
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=False, ext_hook=_ext_hook, use_list=True
        )
    except SerializationError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on damaged input
        raise SerializationError(f"cannot decode state bytes: {exc}") from exc


# --- serializers -----------------------------------------------------------------------------------


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


class _ScalarSerializer(TypeSerializer):
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


class _ExtSerializer(TypeSerializer):
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
    """A dict; plain form is a list of [key, value] pairs so any hashable key survives."""

    immutable = False
    identity = False

    def __init__(self, key: TypeSerializer, value: TypeSerializer) -> None:
        self.key = key
        self.value = value

    def to_plain(self, value: Any) -> Any:
        kp, vp = self.key.to_plain, self.value.to_plain
        return [[kp(k), vp(v)] for k, v in value.items()]

    def from_plain(self, plain: Any) -> Any:
        kf, vf = self.key.from_plain, self.value.from_plain
        return {kf(k): vf(v) for k, v in plain}

    def check(self, value: Any) -> str | None:
        if not isinstance(value, dict):
            return f"expected a dict, got {type(value).__name__}"
        for k, v in value.items():
            problem = self.key.check(k) or self.value.check(v)
            if problem:
                return f"entry {k!r}: {problem}"
        return None

    def config(self) -> Any:
        return ["map", self.key.config(), self.value.config()]


class TupleSerializer(TypeSerializer):
    """A fixed-arity tuple of typed fields (``Types.TUPLE`` and ``Types.ROW``)."""

    identity = False

    def __init__(self, fields: Sequence[TypeSerializer], name: str = "tuple") -> None:
        self.fields = list(fields)
        self.immutable = all(f.immutable for f in self.fields)
        self._name = name

    def to_plain(self, value: Any) -> Any:
        return [f.to_plain(v) for f, v in zip(self.fields, value, strict=True)]

    def from_plain(self, plain: Any) -> Any:
        return tuple(f.from_plain(p) for f, p in zip(self.fields, plain, strict=True))

    def check(self, value: Any) -> str | None:
        if not isinstance(value, tuple | list) or len(value) != len(self.fields):
            return f"expected a {len(self.fields)}-tuple, got {value!r}"
        for i, (f, v) in enumerate(zip(self.fields, value, strict=True)):
            problem = f.check(v)
            if problem:
                return f"field {i}: {problem}"
        return None

    def config(self) -> Any:
        return [self._name, [f.config() for f in self.fields]]


class NamedRowSerializer(TypeSerializer):
    """A row with named fields, represented in Python as a dict (``Types.ROW_NAMED``)."""

    identity = False
    immutable = False

    def __init__(self, names: Sequence[str], fields: Sequence[TypeSerializer]) -> None:
        self.names = list(names)
        self.fields = list(fields)

    def to_plain(self, value: Any) -> Any:
        return [f.to_plain(value[n]) for n, f in zip(self.names, self.fields, strict=True)]

    def from_plain(self, plain: Any) -> Any:
        return {n: f.from_plain(p) for n, f, p in zip(self.names, self.fields, plain, strict=True)}

    def check(self, value: Any) -> str | None:
        if not isinstance(value, dict) or set(value) != set(self.names):
            return f"expected a dict with fields {self.names}, got {value!r}"
        for n, f in zip(self.names, self.fields, strict=True):
            problem = f.check(value[n])
            if problem:
                return f"field {n}: {problem}"
        return None

    def config(self) -> Any:
        return ["row_named", self.names, [f.config() for f in self.fields]]


# --- type information ------------------------------------------------------------------------------


class TypeInformation:
    """Describes a value type and creates its serializer (PyFlink's ``TypeInformation``)."""

    def __init__(self, name: str, factory: Callable[[], TypeSerializer]) -> None:
        self._name = name
        self._factory = factory
        self._serializer: TypeSerializer | None = None

    def get_serializer(self) -> TypeSerializer:
        if self._serializer is None:
            self._serializer = self._factory()
        return self._serializer

    def __repr__(self) -> str:
        return f"Types.{self._name}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TypeInformation) and (
            self.get_serializer().config() == other.get_serializer().config()
        )

    def __hash__(self) -> int:
        return hash(repr(self.get_serializer().config()))


def _int(name: str, bits: int) -> TypeInformation:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return TypeInformation(f"{name}()", lambda: _ScalarSerializer(name, (int,), (lo, hi)))


def _scalar(name: str, *types: type) -> TypeInformation:
    return TypeInformation(f"{name}()", lambda: _ScalarSerializer(name, types))


class Types:
    """PyFlink's ``Types`` factory: each call returns type information selecting a serializer."""

    @staticmethod
    def STRING() -> TypeInformation:
        return _scalar("STRING", str)

    @staticmethod
    def BYTE() -> TypeInformation:
        return _int("BYTE", 8)

    @staticmethod
    def SHORT() -> TypeInformation:
        return _int("SHORT", 16)

    @staticmethod
    def INT() -> TypeInformation:
        return _int("INT", 32)

    @staticmethod
    def LONG() -> TypeInformation:
        return _int("LONG", 64)

    @staticmethod
    def BOOLEAN() -> TypeInformation:
        return _scalar("BOOLEAN", bool)

    @staticmethod
    def FLOAT() -> TypeInformation:
        return _scalar("FLOAT", float, int)

    @staticmethod
    def DOUBLE() -> TypeInformation:
        return _scalar("DOUBLE", float, int)

    @staticmethod
    def CHAR() -> TypeInformation:
        return TypeInformation("CHAR()", lambda: _ScalarSerializer("CHAR", (str,), length=1))

    @staticmethod
    def BIG_INT() -> TypeInformation:
        return TypeInformation("BIG_INT()", lambda: _ExtSerializer("BIG_INT", (int,), (bool,)))

    @staticmethod
    def BIG_DEC() -> TypeInformation:
        return TypeInformation("BIG_DEC()", lambda: _ExtSerializer("BIG_DEC", (decimal.Decimal,)))

    @staticmethod
    def SQL_DATE() -> TypeInformation:
        return TypeInformation(
            "SQL_DATE()", lambda: _ExtSerializer("SQL_DATE", (_dt.date,), (_dt.datetime,))
        )

    @staticmethod
    def SQL_TIME() -> TypeInformation:
        return TypeInformation("SQL_TIME()", lambda: _ExtSerializer("SQL_TIME", (_dt.time,)))

    @staticmethod
    def SQL_TIMESTAMP() -> TypeInformation:
        return TypeInformation(
            "SQL_TIMESTAMP()", lambda: _ExtSerializer("SQL_TIMESTAMP", (_dt.datetime,))
        )

    @staticmethod
    def INSTANT() -> TypeInformation:
        return TypeInformation("INSTANT()", lambda: _ExtSerializer("INSTANT", (_dt.datetime,)))

    @staticmethod
    def PICKLED_BYTE_ARRAY() -> TypeInformation:
        """The explicit pickle opt-in: any picklable value; never chosen by default."""
        return TypeInformation("PICKLED_BYTE_ARRAY()", PickleSerializer)

    @staticmethod
    def PRIMITIVE_ARRAY(element_type: TypeInformation) -> TypeInformation:
        if element_type.get_serializer().config() == "BYTE":
            return TypeInformation(
                "PRIMITIVE_ARRAY(BYTE())", lambda: _ScalarSerializer("BYTES", (bytes,))
            )
        return TypeInformation(
            f"PRIMITIVE_ARRAY({element_type!r})",
            lambda: ListSerializer(element_type.get_serializer(), "primitive_array"),
        )

    @staticmethod
    def BASIC_ARRAY(element_type: TypeInformation) -> TypeInformation:
        return TypeInformation(
            f"BASIC_ARRAY({element_type!r})",
            lambda: ListSerializer(element_type.get_serializer(), "basic_array"),
        )

    @staticmethod
    def OBJECT_ARRAY(element_type: TypeInformation) -> TypeInformation:
        return TypeInformation(
            f"OBJECT_ARRAY({element_type!r})",
            lambda: ListSerializer(element_type.get_serializer(), "object_array"),
        )

    @staticmethod
    def LIST(element_type: TypeInformation) -> TypeInformation:
        return TypeInformation(
            f"LIST({element_type!r})", lambda: ListSerializer(element_type.get_serializer())
        )

    @staticmethod
    def MAP(key_type: TypeInformation, value_type: TypeInformation) -> TypeInformation:
        return TypeInformation(
            f"MAP({key_type!r}, {value_type!r})",
            lambda: MapSerializer(key_type.get_serializer(), value_type.get_serializer()),
        )

    @staticmethod
    def TUPLE(field_types: Sequence[TypeInformation]) -> TypeInformation:
        return TypeInformation(
            "TUPLE(...)", lambda: TupleSerializer([t.get_serializer() for t in field_types])
        )

    @staticmethod
    def ROW(field_types: Sequence[TypeInformation]) -> TypeInformation:
        return TypeInformation(
            "ROW(...)", lambda: TupleSerializer([t.get_serializer() for t in field_types], "row")
        )

    @staticmethod
    def ROW_NAMED(
        field_names: Sequence[str], field_types: Sequence[TypeInformation]
    ) -> TypeInformation:
        return TypeInformation(
            "ROW_NAMED(...)",
            lambda: NamedRowSerializer(field_names, [t.get_serializer() for t in field_types]),
        )

    @staticmethod
    def GENERIC() -> TypeInformation:
        """Any common Python value (the default when a descriptor gives no type), without pickle."""
        return TypeInformation("GENERIC()", GenericSerializer)


def serializer_for(type_info: TypeInformation | TypeSerializer | None) -> TypeSerializer:
    """The serializer a descriptor's (optional) type information selects."""
    if type_info is None:
        return GenericSerializer()
    if isinstance(type_info, TypeSerializer):
        return type_info
    if isinstance(type_info, TypeInformation):
        return type_info.get_serializer()
    raise TypeError(f"expected TypeInformation from statekit.Types, got {type(type_info).__name__}")
