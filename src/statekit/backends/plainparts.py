"""A plain state entry's parts: ``packb([keys, values])`` chunks produced lazily from a reader
of ``(keys, values)`` slices, each packed into a reused buffer small enough to stay in the CPU's
cache while it is checksummed and written; beside a busy processing thread each part is packed in
short, paced steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from statekit.serde.msgpack import ReusedBuffer, array_header, packb

#: a plain state entry's parts (one C-level msgpack call each) aim at this many bytes: packed
#: into a buffer that is still in the CPU's cache when it is checksummed and written (parts of
#: 16 MiB made a checkpoint of 10^5 small values 1.4x as long, of 10^6 1.15x)
PLAIN_PART_BYTES = 1024 * 1024
_FIRST_PART_ENTRIES, _MAX_PART_ENTRIES = 1024, 1 << 16
#: buffers an unpaced state's parts are packed into in turn: one being written, one queued for
#: the local disk's helper thread, one being packed (:class:`PartWriter`)
PART_BUFFERS = 3
#: entries serialized between two pacing pauses
PACE_SLICE = 2048
#: a paced part's size (a snapshot written beside a busy processing thread: joining its packed
#: steps is one copy under the GIL, into fresh memory: 1.6-2.2 ms for 4 MiB) and the most bytes
#: one step packs
PACED_PART_BYTES, PACED_STEP_BYTES = 1024 * 1024, 512 * 1024

#: ``take(count)``: the next ``count`` entries of a state as ``(keys, values)`` lists (possibly
#: fewer), None when there are no more
Take = Callable[[int], "tuple[list[Any], list[Any]] | None"]


def slice_reader(keys: Sequence[Any], values: Sequence[Any]) -> Take:
    """``take(count)`` over parallel key and value sequences."""
    pos = [0]

    def take(count: int) -> tuple[list[Any], list[Any]] | None:
        start = pos[0]
        if start >= len(keys):
            return None
        pos[0] = start + count
        return list(keys[start:start + count]), list(values[start:start + count])

    return take


def plain_parts(keys: Sequence[Any], values: Sequence[Any], *,
                key_plain: Callable[[Any], Any] | None = None,
                value_plain: Callable[[Any], Any] | None = None,
                pace: Callable[[], None] | None = None) -> Iterator[bytes | memoryview]:
    """One state's entries as parts of ``packb([keys, values])`` in plain form, produced lazily.

    With identity serializers a part is one C-level msgpack call over the objects the table
    already holds; ``key_plain`` / ``value_plain`` convert other types part by part.  ``pace``
    runs before each part (GIL sharing with the processing thread).
    """
    return reader_parts(slice_reader(keys, values), key_plain=key_plain,
                        value_plain=value_plain, pace=pace)


def packed_items(values: Sequence[Any]) -> memoryview:
    """``packb(values)`` without its array header: the items' encodings, to join with others'."""
    return memoryview(packb(values))[len(array_header(len(values))):]


#: ``plain(keys, values)``: a slice of a state's entries in plain form
Plain = Callable[[Sequence[Any], Sequence[Any]], "tuple[Sequence[Any], Sequence[Any]]"]


def plain_slices(key_plain: Callable[[Any], Any] | None, value_plain: Callable[[Any], Any] | None,
                 drop: Callable[[Any], Any] | None) -> Plain:
    """What turns a slice of stored entries into plain ones: ``drop`` (a TTL filter mapping a
    stored value to None when it is not written), then the key and value conversions."""

    def plain(ks: Sequence[Any], vs: Sequence[Any]) -> tuple[Sequence[Any], Sequence[Any]]:
        if drop is not None:
            kept = [(k, v) for k, v in zip(ks, map(drop, vs), strict=True) if v is not None]
            ks, vs = [k for k, _ in kept], [v for _, v in kept]
        if key_plain is not None:
            ks = [key_plain(k) for k in ks]
        if value_plain is not None:
            vs = [value_plain(v) for v in vs]
        return ks, vs

    return plain


def joined_part(n: int, key_items: list[memoryview], value_items: list[memoryview]) -> bytes:
    """``packb([keys, values])``'s bytes for ``n`` entries packed in steps (:func:`packed_items`)."""
    head = array_header(n)
    return b"".join([b"\x92", head, *key_items, head, *value_items])


def reader_parts(take: Take, *, key_plain: Callable[[Any], Any] | None = None,
                 value_plain: Callable[[Any], Any] | None = None,
                 drop: Callable[[Any], Any] | None = None,
                 pace: Callable[[], None] | None = None) -> Iterator[bytes | memoryview]:
    """:func:`plain_parts` of the entries ``take`` reads, part by part (``drop``: a TTL filter
    mapping a stored value to None when it is not written).

    Unpaced, each part is packed into one of :data:`PART_BUFFERS` reused buffers: a
    ``memoryview`` left alone while its consumer holds it (:class:`ReusedBuffer`).

    Paced (beside a processing thread), a part is gathered from steps of at most
    :data:`PACE_SLICE` entries / :data:`PACED_STEP_BYTES`, each packed on its own (a short C
    call) and the pacer called between them; the part is the same bytes ``packb([keys,
    values])`` writes, so parts stay as large (and as few) as unpaced ones."""

    plain = plain_slices(key_plain, value_plain, drop)
    if pace is None:  # nothing shares the GIL: one take and one pack per part, into one buffer
        count, buffer = _FIRST_PART_ENTRIES, ReusedBuffer(PART_BUFFERS)
        while (chunk := take(count)) is not None:
            ks, vs = plain(*chunk)
            if ks:
                part = buffer.pack([ks, vs])
                count = max(1, min(_MAX_PART_ENTRIES,
                                   len(ks) * PLAIN_PART_BYTES // max(1, len(part))))
                yield part
                del part  # the buffer is reused unless the consumer still holds the part
        return
    yield from _stepped_parts(take, plain, pace)


def _stepped_parts(take: Take, plain: Plain, pace: Callable[[], None]) -> Iterator[bytes]:
    """Parts of up to :data:`PACED_PART_BYTES`, each joined from short packing steps (see
    :func:`reader_parts`)."""
    count, per_entry, ended = _FIRST_PART_ENTRIES, 0, False
    while not ended:
        key_items: list[memoryview] = []
        value_items: list[memoryview] = []
        n = size = 0
        while n < count and size < PACED_PART_BYTES:
            pace()
            chunk = take(min(count - n, PACE_SLICE, max(1, PACED_STEP_BYTES // max(1, per_entry))))
            if chunk is None:
                ended = True
                break
            ks, vs = plain(*chunk)
            if not ks:
                continue
            key_items.append(packed_items(ks))
            value_items.append(packed_items(vs))
            n += len(ks)
            size += len(key_items[-1]) + len(value_items[-1])
            per_entry = max(1, size // n)
        if n:
            yield joined_part(n, key_items, value_items)
            count = max(1, min(_MAX_PART_ENTRIES, n * PACED_PART_BYTES // max(1, size)))
