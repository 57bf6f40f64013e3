"""The ``_metadata`` file format: versioned, length-prefixed and checksummed.

Layout: ``b"STATEKIT"`` magic, format version (u16), body length (u64), msgpack body, CRC-32 of
everything before it (u32).  A reader checks each of these before trusting the body.
"""

from __future__ import annotations

import struct
from typing import Any

from statekit.checkpoint.checksum import crc32
from statekit.checkpoint.schema import check_metadata
from statekit.errors import (
    ChecksumMismatchError,
    CorruptCheckpointError,
    SerializationError,
    TruncatedCheckpointError,
    UnsupportedFormatVersionError,
)
from statekit.serde.types import packb, unpackb

MAGIC = b"STATEKIT"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">8sHQ")
_TRAILER = struct.Struct(">I")


def encode_metadata(body: dict[str, Any]) -> bytes:
    payload = packb(body)
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, len(payload)) + payload
    return head + _TRAILER.pack(crc32(head))


def decode_metadata(data: bytes, where: str = "_metadata", checkpoint_id: int | None = None
                    ) -> dict[str, Any]:
    """The body of a metadata file after the schema pass (:mod:`statekit.checkpoint.schema`;
    ``checkpoint_id``: the id its directory names); a :class:`CorruptCheckpointError` for
    every way it can be damaged."""
    if len(data) < _HEADER.size + _TRAILER.size:
        raise TruncatedCheckpointError(f"{where}: {len(data)} bytes is too short for metadata")
    magic, version, length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptCheckpointError(f"{where}: not a statekit metadata file")
    if version != FORMAT_VERSION:
        raise UnsupportedFormatVersionError(
            f"{where}: format version {version}; this statekit reads version {FORMAT_VERSION}"
        )
    expected = _HEADER.size + length + _TRAILER.size
    if len(data) != expected:
        raise TruncatedCheckpointError(f"{where}: {len(data)} bytes, header says {expected}")
    (crc,) = _TRAILER.unpack_from(data, expected - _TRAILER.size)
    if crc32(data[: expected - _TRAILER.size]) != crc:
        raise ChecksumMismatchError(f"{where}: checksum mismatch")
    try:
        body = unpackb(data[_HEADER.size : _HEADER.size + length])
    except SerializationError as exc:
        raise CorruptCheckpointError(f"{where}: undecodable body: {exc}") from None
    if not isinstance(body, dict):
        raise CorruptCheckpointError(f"{where}: body is not a map")
    return check_metadata(body, where, checkpoint_id)
