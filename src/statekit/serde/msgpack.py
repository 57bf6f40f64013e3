"""msgpack with extension types for the Python values msgpack lacks (tuple, set, Decimal, datetimes,
big ints), so every serializer's plain form encodes in one C call without pickle.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import threading
from collections.abc import Callable
from typing import Any

import msgpack

from statekit.errors import SerializationError

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



def array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def unpack_each(encoded: list[bytes]) -> list[Any]:
    """Decode many separately encoded values in one C call (as one array made of their bytes)."""
    return unpackb(array_header(len(encoded)) + b"".join(encoded)) if encoded else []


def unpack_array_ends(data: bytes) -> tuple[list[Any], int, list[int]]:
    """Decode an array made by :func:`packb`: its items, where the first item starts and where
    each item ends in ``data`` (so a caller can reuse the encoded items without encoding again)."""
    try:
        unpacker = msgpack.Unpacker(None, raw=False, strict_map_key=False, ext_hook=_ext_hook,
                                    use_list=True, max_buffer_size=max(len(data), 1 << 20))
        unpacker.feed(data)
        n = unpacker.read_array_header()
        start = unpacker.tell()
        items, ends = [], []
        for _ in range(n):
            items.append(unpacker.unpack())
            ends.append(unpacker.tell())
    except SerializationError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on damaged input
        raise SerializationError(f"cannot decode state bytes: {exc}") from exc
    if (ends[-1] if ends else start) != len(data):
        raise SerializationError("cannot decode state bytes: trailing data after the array")
    return items, start, ends
