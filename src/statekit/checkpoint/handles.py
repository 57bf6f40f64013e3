"""State handles: what a checkpoint's metadata records for each chunk of state, and the walks
over a metadata tree that find them.

A handle is *inline* (the bytes inside ``_metadata``) or a *file* (a path relative to the
checkpoint's root); both record size and CRC-32, which every reader verifies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypedDict

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


def file_handles(obj: Any) -> Iterator[dict[str, Any]]:
    """Every file handle inside a metadata body or handle, found recursively (depth first)."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("type") == "file":
                yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def file_paths(obj: Any) -> set[str]:
    """Every file path a metadata body or handle references (found recursively)."""
    return {h["path"] for h in file_handles(obj) if isinstance(h.get("path"), str)}


def verify_body(body: dict[str, Any], reader: StateReader) -> None:
    """Read back every file handle in a metadata body, checking path, size and checksum (each
    file streamed in spans, never held in memory whole)."""
    for handle in file_handles(body):
        reader.check(handle)
