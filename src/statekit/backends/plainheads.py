"""Part heads of plain state entries: the length and CRC-32 of each part's head (its array header
and keys), recorded when the entry is written, so a lazy restore reads and checks the keys alone;
every reader of a plain entry checks them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from statekit.checkpoint.checksum import crc32
from statekit.errors import CorruptCheckpointError, SerializationError
from statekit.serde.msgpack import pair_head_length, unpackb

if TYPE_CHECKING:
    from statekit.checkpoint.reader import StateReader


def part_index(name: str, entry: dict[str, Any]) -> list[list[int]]:
    """A plain entry's ``[offset, length, crc]`` per part."""
    try:
        return [[int(offset), int(length), int(crc)] for offset, length, crc in entry["parts"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptCheckpointError(f"state '{name}': malformed part index") from exc


def headed(parts: Iterable[bytes | memoryview], heads: list[list[int]]
           ) -> Iterator[bytes | memoryview]:
    """The parts, recording each one's head in ``heads`` as it passes."""
    for part in parts:
        length = pair_head_length(part)
        heads.append([length, crc32(memoryview(part)[:length])])
        yield part
        del part  # not held while the next part is packed (into the buffer it views)


def plain_heads(name: str, entry: dict[str, Any]) -> list[list[int]] | None:
    """The entry's part heads (None: an entry written before they were recorded)."""
    heads = entry.get("heads")
    if heads is None:
        return None
    if type(heads) not in (list, tuple) or len(heads) != len(entry.get("parts") or ()):
        raise CorruptCheckpointError(f"state '{name}': malformed part heads")
    return list(heads)


def _head(name: str, head: Any) -> tuple[int, int]:
    """``(length, crc)`` of one recorded head."""
    try:
        size, crc = int(head[0]), int(head[1])
        if len(head) != 2:
            raise ValueError(head)
    except (TypeError, ValueError, IndexError, KeyError) as exc:
        raise CorruptCheckpointError(f"state '{name}': malformed part heads") from exc
    return size, crc


def check_head(name: str, n: int, part: bytes | memoryview, head: Any) -> None:
    """CorruptCheckpointError unless ``head`` records part ``n``'s head: its length and checksum
    (every reader checks them, so none reads an entry a lazy restore would refuse)."""
    size, crc = _head(name, head)
    try:
        found = pair_head_length(part)
    except SerializationError as exc:
        raise CorruptCheckpointError(f"state '{name}' part {n}: malformed ({exc})") from None
    if size != found or crc32(memoryview(part)[:size]) != crc:
        raise CorruptCheckpointError(f"state '{name}' part {n}: its head does not match its "
                                     "recorded length and checksum")


def read_head_keys(name: str, entry: dict[str, Any], reader: StateReader,
                   only: list[int] | None = None
                   ) -> Iterator[tuple[list[int], list[int], list[Any]]]:
    """``(location, [head length, head crc], plain keys)`` of each part of a plain entry that
    records heads (``only``: of these parts), in order: only the heads are read
    (:meth:`StateReader.read_ranges`) and each is checked against its checksum."""
    heads = plain_heads(name, entry)
    assert heads is not None
    locations, data = part_index(name, entry), entry["data"]
    checked = []
    for head, (_, length, _) in zip(heads, locations, strict=True):
        size, crc = _head(name, head)
        if not 2 <= size <= length:
            raise CorruptCheckpointError(f"state '{name}': malformed part heads")
        checked.append([size, crc])

    def keys_of(n: int, head: bytes | memoryview) -> list[Any]:
        try:
            if head[0] != 0x92:
                raise SerializationError("not a pair of arrays")
            keys = unpackb(memoryview(head)[1:])
        except SerializationError as exc:
            raise CorruptCheckpointError(f"state '{name}' part {n}: malformed ({exc})") from None
        if type(keys) is not list:
            raise CorruptCheckpointError(f"state '{name}' part {n}: malformed")
        return keys

    picked = range(len(locations)) if only is None else only
    ranges = [[locations[n][0], *checked[n]] for n in picked]
    for n, head in zip(picked, reader.read_ranges(data, ranges), strict=True):
        yield locations[n], checked[n], keys_of(n, head)
