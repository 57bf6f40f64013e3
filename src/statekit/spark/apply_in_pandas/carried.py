"""A key's carried change log, decoded once per process instead of once per call.

The log a key carries in its ``GroupState`` holds every change since the trusted snapshot; for a
key with large state that is thousands of operations, and decoding and re-encoding all of them on
every call cost more than the call's own work.  A process remembers, per key, the log bytes it
last handed to Spark with their decoded entries: when Spark hands the same bytes back (the
committed ``GroupState`` is what this process wrote), the entries are reused, and the next log is
built from the old bytes (entries dropped from the front, the new one appended) without encoding
them again.  Any other bytes are decoded in full, so the cache never decides what the log holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from statekit.serde.msgpack import array_header, packb, unpack_array_ends

#: at most this many keys' logs are remembered per partition (then the cache starts afresh)
MAX_CACHED_KEYS = 200_000


@dataclass(frozen=True)
class CarriedLog:
    """A key's log: its bytes, its entries ``[seq, batch, attempt, ops]`` and where each ends."""

    blob: bytes
    entries: list[list[Any]]
    start: int
    ends: list[int]

    @property
    def last_size(self) -> int:
        """Encoded bytes of the newest entry (0 for an empty log)."""
        if not self.ends:
            return 0
        return self.ends[-1] - (self.ends[-2] if len(self.ends) > 1 else self.start)

    @classmethod
    def decode(cls, blob: bytes | None) -> CarriedLog:
        if not blob:
            return EMPTY
        entries, start, ends = unpack_array_ends(bytes(blob))
        return cls(bytes(blob), entries, start, ends)

    def rewrite(self, drop: int, new_entry: list[Any] | None) -> CarriedLog:
        """The log without its first ``drop`` entries, with ``new_entry`` appended; the kept
        entries' bytes are copied, not encoded again (the same bytes ``packb`` would make)."""
        kept = self.entries[drop:]
        begin = self.ends[drop - 1] if drop else self.start
        body = self.blob[begin:self.ends[-1]] if kept else b""
        ends = [e - begin for e in self.ends[drop:]]
        entries = list(kept)
        if new_entry is not None:
            encoded = packb(new_entry)
            entries.append(new_entry)
            body += encoded
            ends.append(len(body))
        if not entries:
            return EMPTY
        header = array_header(len(entries))
        return CarriedLog(header + body, entries, len(header), [len(header) + e for e in ends])


EMPTY = CarriedLog(b"", [], 0, [])


class LogCache:
    """The carried logs this process last wrote, per key (see the module's reasons)."""

    def __init__(self) -> None:
        self.logs: dict[Any, CarriedLog] = {}
        self.hits = 0

    def get(self, key: Any, blob: bytes | None) -> CarriedLog:
        """The log of ``blob``: remembered when it is the one this process wrote, else decoded."""
        if not blob:
            return EMPTY
        known = self.logs.get(key)
        if known is not None and known.blob == blob:
            self.hits += 1
            return known
        return CarriedLog.decode(blob)

    def put(self, key: Any, log: CarriedLog) -> None:
        if len(self.logs) >= MAX_CACHED_KEYS and key not in self.logs:
            self.logs.clear()
        self.logs[key] = log

    def forget(self, key: Any) -> None:
        self.logs.pop(key, None)
