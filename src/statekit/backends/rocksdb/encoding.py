"""The key layout and msgpack surgery of the RocksDB backend.

Every key starts with its key group (2 bytes, big-endian) and the serialized key; list elements
add an 8-byte sequence number and map entries the serialized user key.  Serialized keys are
msgpack objects, which are self-delimiting, so no key's prefix is a prefix of another key's.
Values are combined into (and split from) the backend-neutral forms by msgpack array surgery,
without decoding the elements.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack
from rocksdict import Rdict

from statekit.errors import CorruptCheckpointError
from statekit.serde.msgpack import array_header
from statekit.state.ttl import stamp_of

SEQ_MAX = b"\xff" * 8
KG_END = b"\x80"  # key groups are < 2**15, so every key sorts below this
NIL = b"\xc0"  # msgpack nil: a None map value inside a serialized map


def split_array(buf: bytes) -> list[bytes]:
    """The raw encodings of the items of a msgpack array, without decoding them."""
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(buf), 1024))
    unpacker.feed(buf)
    try:
        n = unpacker.read_array_header()
        pos = unpacker.tell()
        out = []
        for _ in range(n):
            unpacker.skip()
            end = unpacker.tell()
            out.append(buf[pos:end])
            pos = end
    except Exception as exc:
        raise CorruptCheckpointError(f"malformed serialized list or map: {exc}") from exc
    return out


def object_length(buf: bytes, offset: int) -> int:
    """Length of the msgpack object starting at ``offset`` (the serialized key inside a key)."""
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(buf), 1024))
    unpacker.feed(buf[offset:])
    unpacker.skip()
    return int(unpacker.tell())


def kg_after(end: int, kgp: list[bytes]) -> bytes:
    """The first key of the key group after ``end`` (``kgp``: the key-group prefixes)."""
    return kgp[end + 1] if end + 1 < len(kgp) else (end + 1).to_bytes(2, "big")


def raise_stopped(it: Any) -> None:
    """Raise the error a RocksDB iterator stopped on, as CorruptCheckpointError: an iterator
    (and rocksdict's ``items()`` / ``keys()``) ends quietly where it meets a damaged block."""
    try:
        it.status()
    except Exception as exc:  # rocksdict raises a bad status as a bare Exception
        raise CorruptCheckpointError(f"RocksDB state is unreadable: {exc}") from exc


def check_scan_end(cf: Rdict, last: bytes | None, start: bytes = b"") -> None:
    """After an ``items()`` / ``keys()`` scan of ``cf`` from ``start`` ran out (``last``: the last
    key it gave): CorruptCheckpointError when it stopped on damage rather than at the end."""
    it = cf.iter()
    try:
        if last is not None:
            it.seek(last)
            it.next()
        elif start:
            it.seek(start)
        else:
            it.seek_to_first()
        raise_stopped(it)
    finally:
        del it


def scan(cf: Rdict, start: bytes = b"", end: bytes | None = None
         ) -> Iterator[tuple[bytes, bytes]]:
    """``(key, value)`` of ``cf`` in ``[start, end)``, in key order; CorruptCheckpointError where
    RocksDB stopped on a damaged block (see :func:`check_scan_end`)."""
    last = None
    for key, value in cf.items(from_key=start) if start else cf.items():
        if end is not None and key >= end:
            return
        last = key
        yield key, value
    check_scan_end(cf, last, start)


def grouped(cf: Rdict, kind: str, start: bytes = b"", end: bytes | None = None
            ) -> Iterator[tuple[int, bytes, bytes]]:
    """(key group, serialized key, backend-neutral serialized value) per key, in key order;
    only keys in ``[start, end)`` when given (a key-group range: see :func:`kg_after`).  Timer
    queues are laid out as list states (``key + 8-byte timestamp``)."""
    if kind == "timers":
        kind = "list"
    if kind == "value":
        for key, value in scan(cf, start, end):
            yield int.from_bytes(key[:2], "big"), key[2:], value
        return
    prefix: bytes | None = None
    parts: list[bytes] = []
    for key, value in scan(cf, start, end):
        if prefix is None or not key.startswith(prefix):
            if prefix is not None and parts:
                yield int.from_bytes(prefix[:2], "big"), prefix[2:], combine(parts)
            prefix = key[:-8] if kind == "list" else key[: 2 + object_length(key, 2)]
            parts = []
        if kind == "list":
            parts.append(value)
        else:
            parts.append(b"\x92" + key[len(prefix):] + (value or NIL))
    if prefix is not None and parts:
        yield int.from_bytes(prefix[:2], "big"), prefix[2:], combine(parts)


def key_bytes(cf: Rdict, kind: str) -> Iterator[bytes]:
    """The serialized keys holding entries in ``cf``, each once, in key order."""
    last = None
    for key in cf.keys():  # noqa: SIM118 (an Rdict: keys() scans the column family)
        kb = (key[2:] if kind == "value" else key[2:-8] if kind in ("list", "timers")
              else key[2: 2 + object_length(key, 2)])
        if kb != last:
            yield kb
            last = kb


def expired(value: bytes, limit: int) -> bool:
    """Whether a stored value is a TTL value stamped at or before ``limit``."""
    try:
        stamp = stamp_of(value)
    except Exception:  # not a TTL-stamped value
        return False
    return isinstance(stamp, int) and stamp <= limit


def combine(parts: list[bytes]) -> bytes:
    """A msgpack array of already serialized items."""
    return array_header(len(parts)) + b"".join(parts)


def drop_expired(kind: str, value: bytes, limit: int) -> bytes | None:
    """``value`` without TTL entries stamped at or before ``limit`` (None when nothing is left)."""
    if kind == "value":
        return None if stamp_of(value) <= limit else value
    parts = split_array(value)
    if kind == "list":
        kept = [p for p in parts if stamp_of(p) > limit]
    else:
        kept = []
        for pair in parts:
            _, uv = split_array(pair)
            if uv == NIL or stamp_of(uv) > limit:
                kept.append(pair)
    if not kept:
        return None
    return value if len(kept) == len(parts) else combine(kept)
