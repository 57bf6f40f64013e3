"""State handles: what a checkpoint's metadata records for each chunk of state, and the walks
over a metadata tree that find them.

A handle is *inline* (the bytes inside ``_metadata``) or a *file* (a path relative to the
checkpoint's root); both record size and CRC-32, which every reader verifies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypedDict

from statekit.checkpoint.blobstore.base import check_key

if TYPE_CHECKING:
    from statekit.checkpoint.reader import StateReader


class InlineHandle(TypedDict):
    """Bytes stored inside the metadata (chunks under the storage's inline threshold)."""

    type: str  # "inline"
    data: bytes
    size: int
    crc: int


class FileHandle(TypedDict):
    """Bytes stored as a file under the checkpoint's root (``chk-<n>/...`` or ``shared/...``)."""

    type: str  # "file"
    path: str
    size: int
    crc: int


def inline_handle(data: bytes, crc: int) -> InlineHandle:
    """The handle of ``data`` kept inside the metadata."""
    return {"type": "inline", "data": bytes(data), "size": len(data), "crc": crc}


def file_handle(path: str, size: int, crc: int) -> FileHandle:
    """The handle of a file written under the checkpoint's root."""
    return {"type": "file", "path": path, "size": size, "crc": crc}


#: the containers a metadata body is made of (msgpack arrays decode as lists; the tuple extension
#: type decodes as a tuple, and a reader iterates both alike)
_SEQUENCES = (list, tuple)


def walk_handles(obj: Any) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Every inline or file handle inside a metadata body or handle, with the trail of keys and
    indexes that leads to it: the one walk behind the schema pass, verification, the retention
    sweep and garbage collection, so all of them see every handle a restore can read (through
    maps, lists and tuples alike).  Iterative: the decoder bounds depth, not the stack."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(obj, ())]
    while stack:
        item, trail = stack.pop()
        if type(item) is dict:
            if item.get("type") in ("inline", "file"):
                yield trail, item
                continue
            stack.extend((v, (*trail, k)) for k, v in reversed(item.items())
                         if type(v) is dict or type(v) in _SEQUENCES)
        elif type(item) in _SEQUENCES:
            stack.extend((v, (*trail, n)) for n, v in reversed(list(enumerate(item)))
                         if type(v) is dict or type(v) in _SEQUENCES)


def file_handles(obj: Any) -> Iterator[dict[str, Any]]:
    """Every file handle inside a metadata body or handle (see :func:`walk_handles`)."""
    return (handle for _, handle in walk_handles(obj) if handle.get("type") == "file")


def inline_handles(obj: Any) -> Iterator[dict[str, Any]]:
    """Every inline handle inside a metadata body or handle (see :func:`walk_handles`)."""
    return (handle for _, handle in walk_handles(obj) if handle.get("type") == "inline")


def file_path(handle: dict[str, Any]) -> str:
    """The path a file handle names, normalized exactly as a reader opens it (``shared/x/`` is
    ``shared/x``); UnsafePathError when it could leave the checkpoint's root."""
    return check_key(handle.get("path"))  # type: ignore[arg-type]


def file_paths(obj: Any) -> set[str]:
    """Every file a restore of the metadata body (or handle) ``obj`` can read, normalized as the
    reader opens it: what the retention sweep and garbage collection keep."""
    return {file_path(h) for h in file_handles(obj)}


def verify_body(body: dict[str, Any], reader: StateReader) -> None:
    """Read back every file handle in a metadata body, checking path, size and checksum (each
    file streamed in spans, never held in memory whole)."""
    for handle in file_handles(body):
        reader.check(handle)
