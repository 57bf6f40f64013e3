"""Type information: PyFlink-style ``Types`` select fast, safe (no pickle) serializers.

``Types.PICKLED_BYTE_ARRAY()`` is the explicit pickle opt-in; everything else encodes through
msgpack plain forms (:mod:`statekit.serde.serializers`).
"""

from __future__ import annotations

import datetime as _dt
import decimal
from collections.abc import Callable, Sequence
from typing import Any

from statekit.serde.msgpack import packb, unpackb
from statekit.serde.serializers import (
    ExtSerializer,
    GenericSerializer,
    ListSerializer,
    MapSerializer,
    NamedRowSerializer,
    PickleSerializer,
    ScalarSerializer,
    TupleSerializer,
    TypeSerializer,
)

# kept importable from here, where they were defined before serde was split
__all__ = [
    "GenericSerializer",
    "ListSerializer",
    "MapSerializer",
    "NamedRowSerializer",
    "PickleSerializer",
    "PickledBytesSerializer",
    "TupleSerializer",
    "TypeInformation",
    "TypeSerializer",
    "Types",
    "describe_type",
    "packb",
    "serializer_for",
    "serializer_from_config",
    "unpackb",
]


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
    return TypeInformation(f"{name}()", lambda: ScalarSerializer(name, (int,), (lo, hi)))


def _scalar(name: str, *types: type) -> TypeInformation:
    return TypeInformation(f"{name}()", lambda: ScalarSerializer(name, types))


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
        return TypeInformation("CHAR()", lambda: ScalarSerializer("CHAR", (str,), length=1))

    @staticmethod
    def BIG_INT() -> TypeInformation:
        return TypeInformation("BIG_INT()", lambda: ExtSerializer("BIG_INT", (int,), (bool,)))

    @staticmethod
    def BIG_DEC() -> TypeInformation:
        return TypeInformation("BIG_DEC()", lambda: ExtSerializer("BIG_DEC", (decimal.Decimal,)))

    @staticmethod
    def SQL_DATE() -> TypeInformation:
        return TypeInformation(
            "SQL_DATE()", lambda: ExtSerializer("SQL_DATE", (_dt.date,), (_dt.datetime,))
        )

    @staticmethod
    def SQL_TIME() -> TypeInformation:
        return TypeInformation("SQL_TIME()", lambda: ExtSerializer("SQL_TIME", (_dt.time,)))

    @staticmethod
    def SQL_TIMESTAMP() -> TypeInformation:
        return TypeInformation(
            "SQL_TIMESTAMP()", lambda: ExtSerializer("SQL_TIMESTAMP", (_dt.datetime,))
        )

    @staticmethod
    def LOCAL_DATE() -> TypeInformation:
        """A ``datetime.date`` (PyFlink's ``LOCAL_DATE``)."""
        return TypeInformation(
            "LOCAL_DATE()", lambda: ExtSerializer("LOCAL_DATE", (_dt.date,), (_dt.datetime,)))

    @staticmethod
    def LOCAL_TIME() -> TypeInformation:
        """A ``datetime.time`` (PyFlink's ``LOCAL_TIME``)."""
        return TypeInformation("LOCAL_TIME()", lambda: ExtSerializer("LOCAL_TIME", (_dt.time,)))

    @staticmethod
    def LOCAL_DATE_TIME() -> TypeInformation:
        """A ``datetime.datetime`` (PyFlink's ``LOCAL_DATE_TIME``)."""
        return TypeInformation(
            "LOCAL_DATE_TIME()", lambda: ExtSerializer("LOCAL_DATE_TIME", (_dt.datetime,)))

    @staticmethod
    def INSTANT() -> TypeInformation:
        return TypeInformation("INSTANT()", lambda: ExtSerializer("INSTANT", (_dt.datetime,)))

    @staticmethod
    def PICKLED_BYTE_ARRAY() -> TypeInformation:
        """The explicit pickle opt-in: any picklable value; never chosen by default."""
        return TypeInformation("PICKLED_BYTE_ARRAY()", PickleSerializer)

    @staticmethod
    def PRIMITIVE_ARRAY(element_type: TypeInformation) -> TypeInformation:
        if element_type.get_serializer().config() == "BYTE":
            return TypeInformation(
                "PRIMITIVE_ARRAY(BYTE())", lambda: ScalarSerializer("BYTES", (bytes,))
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


# --- serializers from their recorded config --------------------------------------------------------

_SCALAR_CONFIGS: dict[str, Callable[[], TypeInformation]] = {
    "STRING": Types.STRING, "BYTE": Types.BYTE, "SHORT": Types.SHORT, "INT": Types.INT,
    "LONG": Types.LONG, "BOOLEAN": Types.BOOLEAN, "FLOAT": Types.FLOAT, "DOUBLE": Types.DOUBLE,
    "CHAR": Types.CHAR, "BIG_INT": Types.BIG_INT, "BIG_DEC": Types.BIG_DEC,
    "SQL_DATE": Types.SQL_DATE, "SQL_TIME": Types.SQL_TIME, "SQL_TIMESTAMP": Types.SQL_TIMESTAMP,
    "INSTANT": Types.INSTANT, "generic": Types.GENERIC, "LOCAL_DATE": Types.LOCAL_DATE,
    "LOCAL_TIME": Types.LOCAL_TIME, "LOCAL_DATE_TIME": Types.LOCAL_DATE_TIME,
    "BYTES": lambda: Types.PRIMITIVE_ARRAY(Types.BYTE()),
}
_LIST_CONFIGS = ("list", "basic_array", "object_array", "primitive_array")


class PickledBytesSerializer(TypeSerializer):
    """Reads pickled values as their raw pickle bytes and never unpickles them: what a reader
    that did not opt into pickle gets for a ``Types.PICKLED_BYTE_ARRAY()`` state."""

    def config(self) -> Any:
        return "pickle"


def serializer_from_config(config: Any) -> TypeSerializer:
    """The serializer whose :meth:`TypeSerializer.config` is ``config`` (as recorded in a
    checkpoint's state layout), for reading state without its descriptor.

    A pickled type becomes :class:`PickledBytesSerializer`: its values stay pickle bytes.
    Unknown configs raise ``ValueError``.
    """
    if isinstance(config, str):
        if config == "pickle":
            return PickledBytesSerializer()
        if config in _SCALAR_CONFIGS:
            return _SCALAR_CONFIGS[config]().get_serializer()
    elif isinstance(config, list | tuple) and config:
        name = config[0]
        if name in _LIST_CONFIGS and len(config) == 2:
            return ListSerializer(serializer_from_config(config[1]), name)
        if name == "map" and len(config) == 3:
            return MapSerializer(serializer_from_config(config[1]), serializer_from_config(config[2]))
        if name in ("tuple", "row") and len(config) == 2:
            return TupleSerializer([serializer_from_config(c) for c in config[1]], name)
        if name == "row_named" and len(config) == 3:
            return NamedRowSerializer(list(config[1]), [serializer_from_config(c) for c in config[2]])
    raise ValueError(f"unknown serializer config {config!r}")


def describe_type(config: Any) -> str:
    """A short type name for a serializer config (``LONG``, ``LIST<STRING>``, ``MAP<...>``)."""
    if isinstance(config, str):
        return {"generic": "GENERIC", "pickle": "PICKLED"}.get(config, config)
    if isinstance(config, list | tuple) and config:
        name = str(config[0])
        if name in _LIST_CONFIGS and len(config) == 2:
            return f"{name.upper()}<{describe_type(config[1])}>"
        if name == "map" and len(config) == 3:
            return f"MAP<{describe_type(config[1])}, {describe_type(config[2])}>"
        if name in ("tuple", "row") and len(config) == 2:
            return f"{name.upper()}<{', '.join(describe_type(c) for c in config[1])}>"
        if name == "row_named" and len(config) == 3:
            fields = ", ".join(f"{n}: {describe_type(c)}"
                               for n, c in zip(config[1], config[2], strict=False))
            return f"ROW<{fields}>"
    return repr(config)
