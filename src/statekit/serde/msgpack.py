"""msgpack with extension types for the Python values msgpack lacks (tuple, set, Decimal, datetimes,
big ints), so every serializer's plain form encodes in one C call without pickle.

Each nested extension value is one more C-level msgpack call, so nesting is bounded on both sides
by one limit (:data:`MAX_EXT_NESTING`): a deeper value is a :class:`SerializationError` when it
is written and when forged bytes are read, never a C stack overflow.
"""

from __future__ import annotations

import array
import contextlib
import datetime as _dt
import decimal
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import msgpack

from statekit.errors import SerializationError

_EXT_TUPLE, _EXT_SET, _EXT_FROZENSET, _EXT_DECIMAL = 1, 2, 3, 4
_EXT_DATETIME, _EXT_DATE, _EXT_TIME, _EXT_TIMEDELTA, _EXT_BIGINT = 5, 6, 7, 8, 9

#: tuples, sets and timedeltas (extension values holding values) nest at most this deep, inside
#: each other and through lists and maps; each level costs one C-level msgpack call (about 40 KB
#: of C stack when reading), and about 200 levels overflowed an 8 MiB stack
MAX_EXT_NESTING = 32
#: lists and maps nest at most this deep within one msgpack call (msgpack's own limit, the same
#: when packing and unpacking); below a nested extension value it is checked before packing
MAX_PLAIN_NESTING = 1024
_CONTAINER_EXTS = frozenset({1, 2, 3, 8})  # tuple, set, frozenset, timedelta
_CONTAINERS = (list, tuple, dict, set, frozenset)

_local = threading.local()


def _nested(obj: Any) -> bytes:
    # a fresh packer: the thread's packer is busy with the enclosing value
    return msgpack.packb(obj, use_bin_type=True, strict_types=True, default=_ext_default)


def _container_ext(code: int, items: list[Any]) -> msgpack.ExtType:
    """``items`` packed as one extension value, within the nesting limits."""
    depth = getattr(_local, "pack_depth", 0)
    if depth >= MAX_EXT_NESTING:
        raise SerializationError(
            f"tuples and sets nest more than {MAX_EXT_NESTING} deep (the limit of statekit's format)")
    if depth == 1:  # everything below the second level, once (msgpack bounds the levels above)
        check_nesting(items, MAX_PLAIN_NESTING)
    _local.pack_depth = depth + 1
    try:
        return msgpack.ExtType(code, _nested(items))
    finally:
        _local.pack_depth = depth


def check_nesting(obj: Any, limit: int) -> None:
    """SerializationError when containers nest more than ``limit`` deep in ``obj`` (a container
    is one level; iterative, so a deep value cannot overflow the stack here)."""
    stack = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, _CONTAINERS):
            continue
        if depth > limit:
            raise SerializationError(f"a value nests more than {limit} levels deep")
        children = [*item, *item.values()] if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, _CONTAINERS))


def array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def ext_set(items: list[bytes], *, frozen: bool) -> msgpack.ExtType:
    """A (frozen) set whose items are packed already, encoded in the order given (canonical
    keys sort them: a set's own iteration order depends on the process's string hashing)."""
    return msgpack.ExtType(_EXT_FROZENSET if frozen else _EXT_SET,
                           array_header(len(items)) + b"".join(items))


def _ext_default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return _container_ext(_EXT_TUPLE, list(obj))
    if isinstance(obj, frozenset):
        return _container_ext(_EXT_FROZENSET, list(obj))
    if isinstance(obj, set):
        return _container_ext(_EXT_SET, list(obj))
    if isinstance(obj, decimal.Decimal):
        return msgpack.ExtType(_EXT_DECIMAL, str(obj).encode())
    if isinstance(obj, _dt.datetime):
        return msgpack.ExtType(_EXT_DATETIME, obj.isoformat().encode())
    if isinstance(obj, _dt.date):
        return msgpack.ExtType(_EXT_DATE, obj.isoformat().encode())
    if isinstance(obj, _dt.time):
        return msgpack.ExtType(_EXT_TIME, obj.isoformat().encode())
    if isinstance(obj, _dt.timedelta):
        return _container_ext(_EXT_TIMEDELTA, [obj.days, obj.seconds, obj.microseconds])
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
    if code not in _CONTAINER_EXTS:
        return decoder(data)
    depth = getattr(_local, "unpack_depth", 0)
    if depth >= MAX_EXT_NESTING:
        raise SerializationError(
            f"tuples and sets nest more than {MAX_EXT_NESTING} deep (the limit of statekit's format)")
    _local.unpack_depth = depth + 1
    try:
        return decoder(data)
    finally:
        _local.unpack_depth = depth


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


class ReusedBuffer:
    """Packs into a few buffers reused in turn: no fresh memory and no copy per result (a part
    of a snapshot is megabytes; a new ``bytes`` for each is a copy into memory the kernel faults
    in page by page).

    Each result is a ``memoryview`` into one of ``buffers`` buffers, valid while its holder keeps
    it: a buffer is packed into again only once no view of its last result is held (msgpack
    refuses to reset a buffer with views of it), so a kept view is never overwritten.  With
    ``buffers`` results held at once the next goes into a fresh buffer.  A consumer that writes
    one part while the next is queued and a third packed needs three."""

    __slots__ = ("_packers", "_turn")

    def __init__(self, buffers: int = 1) -> None:
        self._packers: list[msgpack.Packer | None] = [None] * max(1, buffers)
        self._turn = 0

    def pack(self, obj: Any) -> memoryview:
        packers = self._packers
        slot = self._free()
        packer = packers[slot]
        if packer is None:
            packer = packers[slot] = msgpack.Packer(use_bin_type=True, strict_types=True,
                                                   default=_ext_default, autoreset=False)
        self._turn = slot  # tried first next time: still in the CPU's cache if released
        try:
            packer.pack(obj)
        except (TypeError, OverflowError, ValueError) as exc:
            packers[slot] = None  # its buffer may hold a partial result
            raise SerializationError(str(exc)) from exc
        return packer.getbuffer()

    def _free(self) -> int:
        """The slot of a buffer nobody views (reset for reuse), the last one used first; when
        every one is viewed, the last slot's packer is dropped (its views keep its buffer) for a
        fresh one."""
        packers, n = self._packers, len(self._packers)
        for i in range(n):
            slot = (self._turn + i) % n
            packer = packers[slot]
            if packer is None:
                return slot
            try:
                packer.reset()
            except BufferError:  # a view of its last result is still held
                continue
            return slot
        packers[self._turn] = None
        return self._turn


def packed_crcs(values: list[Any]) -> array.array[int]:
    """CRC-32 of each value's encoding, in order (the thread's packer called from C for each:
    a restore checks the key group of every key)."""
    try:
        return array.array("I", map(zlib.crc32, map(_packer().pack, values)))
    except (TypeError, OverflowError, ValueError) as exc:
        _local.packer = None
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



def unpack_each(encoded: list[bytes]) -> list[Any]:
    """Decode many separately encoded values in one C call (as one array made of their bytes)."""
    return unpackb(array_header(len(encoded)) + b"".join(encoded)) if encoded else []


@contextlib.contextmanager
def _decoding() -> Iterator[None]:
    """Whatever msgpack raises on damaged input (several unrelated types) as SerializationError."""
    try:
        yield
    except SerializationError:
        raise
    except Exception as exc:
        raise SerializationError(f"cannot decode state bytes: {exc}") from exc


def unpack_array_ends(data: bytes) -> tuple[list[Any], int, list[int]]:
    """Decode an array made by :func:`packb`: its items, where the first item starts and where
    each item ends in ``data`` (so a caller can reuse the encoded items without encoding again)."""
    with _decoding():
        unpacker = msgpack.Unpacker(None, raw=False, strict_map_key=False, ext_hook=_ext_hook,
                                    use_list=True, max_buffer_size=max(len(data), 1 << 20))
        unpacker.feed(data)
        n = unpacker.read_array_header()
        start = unpacker.tell()
        items, ends = [], []
        for _ in range(n):
            items.append(unpacker.unpack())
            ends.append(unpacker.tell())
    if (ends[-1] if ends else start) != len(data):
        raise SerializationError("cannot decode state bytes: trailing data after the array")
    return items, start, ends


class _Reading:
    """A file-like view of bytes that copies only what is read (``io.BytesIO`` copies a
    ``memoryview`` whole)."""

    __slots__ = ("at", "data")

    def __init__(self, data: bytes | memoryview) -> None:
        self.data, self.at = memoryview(data), 0

    def read(self, n: int) -> bytes:
        chunk = self.data[self.at:self.at + n].tobytes()
        self.at += len(chunk)
        return chunk


def _after_pair_header(data: bytes | memoryview, **options: Any) -> msgpack.Unpacker:
    """An unpacker over ``data`` read past the header of a ``packb([keys, values])`` pair."""
    unpacker = msgpack.Unpacker(_Reading(data), read_size=1 << 16,
                                max_buffer_size=max(len(data), 1 << 20), **options)
    if unpacker.read_array_header() != 2:
        raise SerializationError("cannot decode state bytes: not a pair of arrays")
    return unpacker


def unpack_pair_head(data: bytes | memoryview) -> tuple[list[Any], int, int]:
    """The head of a ``packb([keys, values])`` pair: the decoded keys, where the values' array
    starts in ``data`` and how many items it announces, without decoding any value (a lazy
    restore reads only this much of a part)."""
    with _decoding():
        unpacker = _after_pair_header(data, raw=False, strict_map_key=False, ext_hook=_ext_hook,
                                      use_list=True)
        keys = unpacker.unpack()
        at = unpacker.tell()
        count = unpacker.read_array_header()
    if type(keys) is not list:
        raise SerializationError("cannot decode state bytes: the keys are not an array")
    return keys, at, count


def pair_head_length(data: bytes | memoryview) -> int:
    """How many bytes the head of a ``packb([keys, values])`` pair takes (its array header and
    the keys), found by skipping the keys without decoding them."""
    with _decoding():
        unpacker = _after_pair_header(data)
        unpacker.skip()
        return int(unpacker.tell())
