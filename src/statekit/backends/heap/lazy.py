"""Lazy restore of heap state: values stay in their serialized parts until first needed.

A restore reads and checks only each part's head (its keys, with the checksum recorded for them)
and decodes the keys; each key maps to its :class:`LazyPart`, whose bytes are read, checked and
decoded when one of its keys is first accessed, or ahead of time by a background thread
(:class:`LazyValues`); parts of entries written without head checksums are read whole at
restore.  Only the processing thread installs decoded values into the live table, a part at a
time, so a part's keys are either all pending or all in the table: a snapshot writes a
still-pending part's bytes through unchanged.  The processing and background threads never read
a part twice; a snapshot reads the parts whose bytes are not held yet, so one the background
thread is reading at that moment (at most one run of :data:`RUN_BYTES`) is read by both.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import compress, repeat
from operator import not_
from typing import Any

from statekit.backends.plainparts import plain_parts
from statekit.checkpoint.checksum import crc32
from statekit.errors import CorruptCheckpointError, SerializationError
from statekit.serde.msgpack import unpack_pair_head, unpackb

#: parts the background thread decodes ahead of the processing thread installing them (their
#: values wait in memory beside the serialized bytes until installed)
DECODE_AHEAD = 4
#: the most bytes the background thread reads ahead in one run of parts
RUN_BYTES = 32 * 1024 * 1024


class LazyPart:
    """One restored plain part: its (converted) keys, its bytes (``raw``, or ``load`` to read
    them), where the values start (``at``: the head's length), and the entries kept (``keep``:
    None for all; otherwise the indices kept by a rescale's key filter).  ``dropped`` holds kept
    keys a later changelog overrode (not to be installed)."""

    __slots__ = ("at", "check", "count", "decoded", "dropped", "failed", "groups", "head_crc",
                 "keep", "keys", "load", "name", "raw", "slot", "source", "unverified")

    def __init__(self, name: str, raw: bytes | memoryview | None, keys: list[Any], at: int,
                 count: int, keep: list[int] | None, check: Callable[[list[Any]], None], *,
                 source: tuple[Any, dict[str, Any], list[int]] | None = None,
                 head_crc: int | None = None) -> None:
        self.name, self.raw, self.keys, self.at, self.count = name, raw, keys, at, count
        self.keep, self.check, self.head_crc = keep, check, head_crc
        # where its bytes are: (reader, data handle, [offset, length, crc])
        self.source = source
        self.load: Callable[[], bytes | memoryview] | None = None if source is None else (
            lambda: source[0].read(source[1], *source[2]))
        self.dropped: set[Any] | None = None
        self.slot = -1  # its number in its LazyValues (the key index maps keys to it)
        self.decoded: list[Any] | None = None  # values decoded ahead, not installed yet
        self.failed = False  # a decode of its values failed (raised wherever they are needed)
        # ``check_keys()`` of keys not checked against their recorded key groups yet
        self.unverified: Callable[[list[Any]], None] | None = None
        # the key groups its kept keys lie in, ``(first, last)`` (recorded when written through)
        self.groups: tuple[int, int] = (0, -1)

    @property
    def whole(self) -> bool:
        """The part's bytes are exactly its pending entries (a snapshot may write them through)."""
        return self.keep is None and not self.dropped

    def _bytes(self) -> bytes | memoryview:
        """The part's bytes: held, or read now (checked against the part's checksum, and its
        head against the keys this part was restored with)."""
        raw = self.raw
        if raw is not None:
            return raw
        assert self.load is not None
        return self.checked(self.load())

    def checked(self, raw: bytes | memoryview) -> bytes | memoryview:
        """The part's bytes, read now, after checking their head against the restored keys'."""
        if crc32(memoryview(raw)[:self.at]) != self.head_crc:
            self.failed = True
            raise CorruptCheckpointError(f"state '{self.name}': a part differs from its head")
        return raw

    def hold(self) -> bytes | memoryview:
        """The part's bytes, kept from now on (a snapshot that writes them through: the files
        they were restored from may be deleted once it completes)."""
        if self.raw is None:
            self.raw = self._bytes()
        return self.raw

    def verify(self) -> None:
        """Check the keys against the key groups their snapshot recorded, if that was left for
        later (before any of them is installed or written)."""
        check_keys = self.unverified
        if check_keys is not None:
            try:
                check_keys(self.keys)
            except CorruptCheckpointError:
                self.failed = True
                raise
            self.unverified = None

    def values(self, raw: bytes | memoryview | None = None) -> list[Any]:
        """The kept keys' plain values (decoded ahead, or now from ``raw`` if given, just read),
        each part checked as every restore checks one: keys inside their recorded key groups, as
        many values as keys, of the entry's kind and types."""
        values = self.decoded
        if values is not None:
            return values
        self.verify()
        raw = self._bytes() if raw is None or self.raw is not None else self.checked(raw)
        try:
            try:
                values = unpackb(memoryview(raw)[self.at:])
            except SerializationError as exc:
                raise CorruptCheckpointError(
                    f"state '{self.name}': malformed values ({exc})") from None
            if type(values) is not list or len(values) != self.count:
                raise CorruptCheckpointError(f"state '{self.name}': malformed part")
            self.check(values)
        except CorruptCheckpointError:
            self.failed = True
            raise
        if self.keep is not None:
            values = [values[i] for i in self.keep]
        return values

    def entries(self) -> tuple[list[Any], list[Any]]:
        """``(keys, plain values)`` of the entries still pending (overridden ones left out)."""
        keys, values = self.keys, self.values()
        if self.dropped:  # (C-level passes: a changelog drops a few keys of every part)
            kept = list(map(not_, map(self.dropped.__contains__, keys)))
            keys, values = list(compress(keys, kept)), list(compress(values, kept))
        return keys, values


def read_head(name: str, raw: bytes | memoryview) -> tuple[list[Any], int, int]:
    """A part's plain keys, where its values start and how many there are; a part that is no pair
    of equally long arrays is a CorruptCheckpointError here, at restore."""
    try:
        keys, at, count = unpack_pair_head(raw)
    except SerializationError as exc:
        raise CorruptCheckpointError(f"state '{name}': malformed part ({exc})") from None
    if count != len(keys):
        raise CorruptCheckpointError(f"state '{name}': malformed part ({len(keys)} keys, "
                                     f"{count} values)")
    return keys, at, count


class LazyValues:
    """The pending parts of one restored state and the key -> part index over them.

    The processing thread asks for parts (:meth:`take`) and installs what they hold; a background
    thread (:meth:`start`) decodes up to :data:`DECODE_AHEAD` parts ahead of it, so a key the job
    reaches later finds its values ready.  A part that fails to decode is marked and raised to
    the processing thread when it takes that part (never installed, never written through).
    """

    __slots__ = ("__weakref__", "_claimed", "_cond", "_reading", "_slots", "_stop", "_thread",
                 "_wanted", "parts", "pending")

    def __init__(self) -> None:
        self.parts: dict[int, LazyPart] = {}  # by slot, in restore order
        # key -> its part's slot: ints, not the parts, so that a dict of restored int or str keys
        # holds no tracked object and the garbage collector never walks it (a walk of 10^7
        # entries was a 0.1 s pause just after the restore)
        self.pending: dict[Any, int] = {}
        self._slots = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        # slots the background thread is reading now, those the processing thread reads itself,
        # and the one it waits for: neither thread reads a part the other reads
        self._reading: set[int] = set()
        self._claimed: set[int] = set()
        self._wanted: int | None = None

    def add(self, part: LazyPart) -> None:
        """Index a restored part's keys; a key already pending (or twice in the part) is a
        CorruptCheckpointError: the sources of one restore hold disjoint keys."""
        pending = self.pending
        before = len(pending)
        part.slot = self._slots
        self._slots += 1
        pending.update(zip(part.keys, repeat(part.slot)))
        if len(pending) - before != len(part.keys):
            raise CorruptCheckpointError(f"state '{part.name}': a key is restored twice")
        self.parts[part.slot] = part

    def part_of(self, key: Any) -> LazyPart | None:
        """The pending part holding ``key``, if any."""
        slot = self.pending.get(key)
        return None if slot is None else self.parts.get(slot)

    def drop(self, keys: list[Any]) -> None:
        """Entries restored later (a changelog, another source) override these keys: they are
        no longer pending (restore only)."""
        pending = self.pending
        if pending:
            for key in pending.keys() & keys:
                self.drop_from(self.parts[pending.pop(key)], key)

    def drop_from(self, part: LazyPart, key: Any) -> None:
        if part.dropped is None:
            part.dropped = set()
        part.dropped.add(key)
        if len(part.dropped) == len(part.keys):
            self.parts.pop(part.slot, None)

    def __len__(self) -> int:
        return len(self.pending)

    def snapshot_parts(self) -> list[LazyPart]:
        """The pending parts now (processing thread: nothing is installed meanwhile)."""
        return list(self.parts.values())

    def take(self, part: LazyPart) -> tuple[list[Any], list[Any]]:
        """Remove a pending part and return its ``(keys, plain values)`` for installing
        (processing thread): a part the background thread is reading is waited for, any other
        is read here; a failed decode is raised here and the part stays pending."""
        slot = part.slot
        with self._cond:
            while (slot in self._reading and part.decoded is None and not part.failed
                   and not self._stop):
                self._wanted = slot
                self._cond.notify_all()
                self._cond.wait(0.5)
            self._wanted = None
            self._claimed.add(slot)
        try:
            keys, values = part.entries()
        except BaseException:
            with self._cond:
                self._claimed.discard(slot)
            raise
        with self._cond:
            self._claimed.discard(slot)
            self.parts.pop(slot, None)
            part.decoded = None
            self._cond.notify_all()
        deque(map(self.pending.pop, keys, repeat(None)), 0)
        return keys, values

    def step(self) -> tuple[list[Any], list[Any]] | None:
        """The first pending part's entries once the background thread has decoded it (or
        failed to: raised here), else None: the processing thread installs one part per call."""
        part = next(iter(self.parts.values()), None)
        if part is None or (part.decoded is None and not part.failed):
            return None
        return self.take(part)

    def take_all(self) -> Iterator[tuple[list[Any], list[Any]]]:
        """Every pending part's entries, in order (an enumeration of all keys, a timer table)."""
        while self.parts:
            yield self.take(next(iter(self.parts.values())))

    # --- the background thread ---------------------------------------------------------------------

    def start(self, name: str) -> None:
        """Decode the pending parts ahead of the processing thread, on a daemon thread that ends
        when every part is decoded or :meth:`stop` is called."""
        if self._thread is None and self.parts:
            self._thread = threading.Thread(target=self._run, name=f"statekit-lazy-{name}",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:  # nothing is read while DECODE_AHEAD parts wait to be installed
                    while not self._stop and self._ahead() >= DECODE_AHEAD:
                        self._cond.wait(0.5)
                    run = None if self._stop else self._next_run()
                    self._reading = {part.slot for part in run or ()}
                if not run:
                    return
                with contextlib.closing(_read(run)) as reading:
                    for part, raw in reading:
                        if not self._decode(part, raw):
                            return
        except Exception:  # unreadable now: the processing thread reads what it needs itself
            return
        finally:
            with self._cond:
                self._reading = set()
                self._cond.notify_all()

    def _decode(self, part: LazyPart, raw: bytes | memoryview | None) -> bool:
        """Decode one part the background thread read, at most :data:`DECODE_AHEAD` ahead of
        the processing thread unless that thread waits for a part (False: stopped)."""
        slot = part.slot
        with self._cond:
            while not self._stop and self._wanted is None and self._ahead() >= DECODE_AHEAD:
                self._cond.wait(0.5)
            if self._stop:
                return False
            if slot not in self.parts or slot in self._claimed:  # installed or read meanwhile
                self._reading.discard(slot)
                self._cond.notify_all()
                return True
        try:
            values = part.values(raw)
        except CorruptCheckpointError:  # marked failed: raised where needed
            values = None
        with self._cond:
            if values is not None and slot in self.parts:
                part.decoded = values
                if part.raw is None and raw is not None:
                    part.raw = raw  # a snapshot writing it through reads nothing
            self._reading.discard(slot)
            self._cond.notify_all()
        return True

    def _ahead(self) -> int:
        """Parts decoded and not installed yet."""
        return sum(p.decoded is not None for p in self.parts.values())

    def _next_run(self) -> list[LazyPart]:
        """The next parts to read ahead: the first pending part not yet decoded and those after it
        in the same file, up to :data:`RUN_BYTES` (runs are picked one at a time, so parts the
        processing thread read and installed meanwhile are not read again)."""
        run: list[LazyPart] = []
        size = 0
        for part in self.parts.values():
            if part.decoded is not None or part.failed or part.slot in self._claimed:
                if run:
                    break
                continue
            if run and (size >= RUN_BYTES or not _same_file(part, run[-1])):
                break
            run.append(part)
            size += part.source[2][1] if part.source is not None else 0
        return run

    def halt(self) -> None:
        """Ask the background thread to end, without waiting for it (the owner was collected
        without being disposed: the thread would otherwise wait for it forever, holding the
        parts' bytes)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def stop(self) -> None:
        """End the background thread (the owner is disposed) and wait for it."""
        self.halt()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._thread = None


# --- what a snapshot makes of pending parts -----------------------------------------------------------


def pending_parts(parts: Iterable[LazyPart], key_plain: Callable[[Any], Any] | None,
                  pace: Callable[[], None] | None) -> Iterator[tuple[bytes, tuple[int, int]]]:
    """Plain parts of a snapshot for parts still pending at its capture, with their key-group
    ranges: a whole part's bytes unchanged (its values never decoded), the rest re-packed from
    their pending entries."""
    for part in held(parts):  # kept: the restored files may go once this snapshot completes
        if pace is not None:
            pace()
        if part.failed:
            raise CorruptCheckpointError(f"state '{part.name}': a restored part failed to decode; "
                                         "it is not written into a new snapshot")
        part.verify()
        raw = part.hold()
        if part.whole:
            yield raw, part.groups
            continue
        keys, values = part.entries()
        for packed in plain_parts(keys, values, key_plain=key_plain, pace=pace):
            yield packed, part.groups


def _same_file(part: LazyPart, after: LazyPart) -> bool:
    source, last = part.source, after.source
    return (part.raw is None and source is not None and last is not None
            and source[0] is last[0] and source[1] is last[1] and source[2][0] > last[2][0])


def _read(parts: list[LazyPart]) -> Iterator[tuple[LazyPart, bytes | memoryview | None]]:
    """Each part with its bytes, just read (None: held already, or read by the part itself):
    runs of parts from one file are read ahead on the reader's helper thread, each checked
    against its checksum."""
    i = 0
    while i < len(parts):
        part = parts[i]
        if part.raw is not None or part.source is None:
            yield part, None
            i += 1
            continue
        run = [part]
        while i + len(run) < len(parts) and _same_file(parts[i + len(run)], run[-1]):
            run.append(parts[i + len(run)])
        reader, data, _ = part.source
        locations = [p.source[2] for p in run]  # type: ignore[index]
        yield from zip(run, reader.read_parts(data, locations, owned=True), strict=True)
        i += len(run)


def held(parts: Iterable[LazyPart]) -> Iterator[LazyPart]:
    """The parts, each holding its bytes once yielded (see :func:`_read`)."""
    for part, raw in _read(list(parts)):
        if part.raw is None:
            part.raw = part.checked(raw) if raw is not None else part.hold()
        yield part


def pending_items(parts: Iterable[LazyPart], convert: Callable[[Any], Any] | None
                  ) -> Iterator[tuple[Any, Any]]:
    """``(key, stored value)`` of the entries of parts still pending at a snapshot's capture."""
    for part in parts:
        keys, values = part.entries()
        yield from zip(keys, values if convert is None else map(convert, values), strict=True)
