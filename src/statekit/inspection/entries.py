"""Streaming one state's entries out of one task handle, whatever wrote it, as plain chunks.

Every format is read by the one reader of checkpoint structure
(:mod:`statekit.backends.structure`), with every check a restore makes: ``statekit-kv`` entries
(heap checkpoints' plain parts, savepoints' key-grouped chunks), incremental heap checkpoints as
their base plus changelogs, native RocksDB checkpoints downloaded (verified) into a private
working directory and scanned.  Memory holds one part, one key group or one scan batch at a time;
an incremental heap checkpoint also holds the set of keys its changelogs touch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from statekit.backends import structure
from statekit.checkpoint.blobstore.base import BlobStore, check_key
from statekit.checkpoint.reader import StateReader
from statekit.errors import CorruptCheckpointError, StateError
from statekit.inspection.arrow import Chunk
from statekit.serde.keygroups import KeyGroupRange

Progress = Callable[[int], None] | None


@dataclass
class PartitionSource:
    """One task handle and the blob store of the job directory its paths are relative to
    (picklable: Spark ships it to the executor that reads the partition)."""

    store: BlobStore
    handle: dict[str, Any]
    location: str

    @property
    def reader(self) -> StateReader:
        return StateReader(self.store)

    @property
    def format(self) -> str:
        return str(self.handle.get("format"))

    @property
    def key_groups(self) -> KeyGroupRange:
        try:
            return structure.recorded_range(self.handle)
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(f"{self.location}: {exc}") from None

    @property
    def max_parallelism(self) -> int:
        return int(self.handle.get("max_parallelism") or 128)


def state_entries(handle: dict[str, Any]) -> dict[str, tuple[dict[str, Any], str]]:
    """Each state of a handle: ``(entry, encoding)``; the entry holds at least layout and kind."""
    return structure.state_entries(handle)


def iter_chunks(source: PartitionSource, name: str, key_groups: KeyGroupRange | None = None,
                progress: Progress = None) -> Iterator[Chunk]:
    """The plain entries of state ``name`` in ``source`` (inside ``key_groups`` when given),
    checked as a restore checks them."""
    for keys, values, size in structure.read_state(source.handle, source.reader, name,
                                                   key_groups, progress):
        yield Chunk(keys, values, size)


def peek_count(source: PartitionSource, entry: dict[str, Any]) -> int | None:
    """The number of keys of a ``statekit-kv`` entry from the headers of its parts or key-group
    chunks (a few bytes each), without reading the entries; None when it cannot tell."""
    if "parts" in entry and entry.get("encoding") == "plain":
        locations = [(int(loc[0]), int(loc[1])) for loc in entry["parts"]]
    elif isinstance(entry.get("index"), dict):
        locations = [(int(loc[0]), int(loc[1])) for loc in entry["index"].values()]
    else:
        return None
    data = entry.get("data", {})
    try:
        if data.get("type") == "inline":
            blob = data["data"]
            heads: Any = (blob[offset:offset + min(length, 16)] for offset, length in locations)
        elif data.get("type") == "file":
            heads = source.store.get_ranges(check_key(str(data["path"])),
                                            [(offset, min(length, 16)) for offset, length in locations],
                                            sparse=True)
        else:
            return None
        total = 0
        for head in heads:
            unpacker = msgpack.Unpacker()
            unpacker.feed(bytes(head))
            unpacker.read_array_header()
            total += unpacker.read_array_header()
        return total
    except (StateError, CorruptCheckpointError, ValueError, KeyError, TypeError,
            msgpack.OutOfData, msgpack.UnpackException):
        return None


