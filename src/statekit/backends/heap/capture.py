"""Snapshot captures of heap tables: what one pending snapshot sees of a live table.

A capture is a constant-time mark on the table (:meth:`~statekit.backends.heap.table.HeapTable.
capture`); the snapshot reads the live dict in slices, corrected by the values saved since, or
copies immutable values out in short steps and releases the capture early (:class:`Copied`).
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable, Iterator
from itertools import islice, repeat, starmap
from typing import Any, Protocol


class CapturedTable(Protocol):
    """What a capture uses of its table: the live dict, and the release of the capture."""

    data: dict[Any, Any]

    def release(self, cap: Capture) -> None: ...


_ABSENT: Any = object()
#: entries :meth:`Capture.drain` frees per step (about half a millisecond)
DRAIN_STEP = 8192
#: entries :meth:`Capture.copy_out` copies per step (a fraction of a millisecond)
COPY_STEP = 4096
#: keys of the table per dict of a capture's saved values: no dict of them grows past about this
#: many (a dict resizes in one C call; at 700k entries that holds the GIL for about 23 ms)
UNDO_SHARD_KEYS = 1 << 15


class Capture:
    """What one pending snapshot of a table sees: the live dict read in slices, corrected by the
    values it had at capture for keys changed since, plus the keys staged at capture when it was
    taken while another capture was pending (``extra``, copied).

    Every change of a key while the capture is pending saves the value it had at capture in
    ``undo`` (the first change wins; a mutable value is copied on first change, an immutable one
    is simply replaced).  Immutable values are copied out in short steps and the capture is
    released (:meth:`copy_out`); mutable ones are read while the capture stays pending.  The
    copies and ``undo`` are containers the garbage collector does not scan once they hold plain
    keys and values, and every step over them is short, so no pass over the state holds the GIL
    long; the snapshot thread empties ``undo`` in short steps when it ends.
    """

    __slots__ = ("extra", "mask", "released", "shards", "table", "tombs", "undo")

    def __init__(self, table: CapturedTable, extra: dict[Any, Any] | None, tombs: bool) -> None:
        self.table = table
        # saved values, spread by key hash over enough dicts that none outgrows UNDO_SHARD_KEYS
        # even if every key changes: saving one never resizes a big dict (a pause); ``undo`` is
        # the only shard of a small table, read in C-level passes
        count = -(-len(table.data) // UNDO_SHARD_KEYS)
        self.shards: list[dict[Any, Any]] = [{} for _ in range(1 << max(0, count - 1).bit_length())]
        self.mask = len(self.shards) - 1
        self.undo = self.shards[0]
        self.extra = extra
        self.tombs = tombs  # the live dict held tombstones at capture: filter None values
        self.released = False

    def copy_out(self, pace: Callable[[], None] | None) -> Copied:
        """Immutable values: the captured entries copied out of the live dict as tuples,
        :data:`COPY_STEP` per C-level step, then the capture is released, so the live side's
        writes take the fast path again long before the snapshot is written.  Values changed
        meanwhile are corrected from ``undo`` when the copy is read.

        Each step also runs a young-generation collection (when the collector is enabled): it
        stops tracking the two new tuples of plain values at once (a fraction of a millisecond),
        where the first automatic collection after a million copied entries scanned all of them
        in one 20 ms pause."""
        data = self.table.data
        keys_it, values_it = iter(data), iter(data.values())  # the size never changes while pending
        chunks: list[tuple[tuple[Any, ...], tuple[Any, ...]] | None] = []
        collect = gc.isenabled()
        while keys := tuple(islice(keys_it, COPY_STEP)):
            chunks.append((keys, tuple(islice(values_it, len(keys)))))
            if collect:
                gc.collect(0)
            if pace is not None:
                pace()
        self.table.release(self)
        return Copied(self, chunks)

    def drain(self, pace: Callable[[], None] | None) -> None:
        """Free the saved values, :data:`DRAIN_STEP` entries per C-level step (freeing a big
        dict at once would hold the GIL for milliseconds); after :meth:`HeapTable.release`."""
        for undo in self.shards:
            while undo:
                deque(starmap(undo.popitem, repeat((), min(len(undo), DRAIN_STEP))), 0)
                if pace is not None:
                    pace()

    def saved_for(self, key: Any) -> dict[Any, Any]:
        """The dict that holds ``key``'s saved value, if any."""
        return self.shards[hash(key) & self.mask] if self.mask else self.undo

    def corrected(self, ks: list[Any], vs: list[Any]) -> list[Any]:
        """``vs`` (values read for ``ks``) with the values saved since the capture in their
        place: one C-level pass with a single dict, one Python-level pass with shards (only
        while something is saved)."""
        if not self.mask:
            undo = self.undo
            return list(map(undo.get, ks, vs)) if undo else vs
        if not any(self.shards):
            return vs
        shards, mask = self.shards, self.mask
        return [shards[hash(k) & mask].get(k, v) for k, v in zip(ks, vs, strict=True)]

    # --- reading while pending, corrected by ``undo`` ---------------------------------------------

    def get(self, key: Any) -> Any:
        """The key's value at capture (None if absent); safe while the live table changes: the
        live value is read first and a value saved meanwhile wins."""
        value = self.table.data.get(key)
        saved = self.saved_for(key).get(key, _ABSENT)
        if saved is not _ABSENT:
            return saved
        if value is None and self.extra:
            return self.extra.get(key)
        return value

    def reader(self) -> Callable[[int], tuple[list[Any], list[Any]] | None]:
        """``take(count)``: the next ``count`` entries as ``(keys, values)`` (fewer when removed
        entries are dropped), None at the end.  Each call is a few C-level passes over ``count``
        entries (the GIL is held for one slice only); values changed since the capture are
        replaced by their saved ones (``undo``)."""
        data = self.table.data
        keys_it, values_it = iter(data), iter(data.values())  # aligned: the size never changes
        extra = self.extra
        state = {"live": True}

        def take(count: int) -> tuple[list[Any], list[Any]] | None:
            if state["live"]:
                ks = list(islice(keys_it, count))
                if ks:
                    # values changed since the capture: the saved ones
                    vs = self.corrected(ks, list(islice(values_it, len(ks))))
                    if self.tombs:  # (a key removed after the capture has a saved value)
                        ks, vs = _without_none(ks, vs)
                    return ks, vs
                state["live"] = False
                if extra:
                    return list(extra), list(extra.values())
            return None

        return take

    def items(self) -> Iterator[tuple[Any, Any]]:
        return _entries(self.reader())


class Copied:
    """A released capture's entries (:meth:`Capture.copy_out`), read as the capture saw them."""

    __slots__ = ("cap", "chunks")

    def __init__(self, cap: Capture,
                 chunks: list[tuple[tuple[Any, ...], tuple[Any, ...]] | None]) -> None:
        self.cap = cap
        self.chunks = chunks

    def reader(self) -> Callable[[int], tuple[list[Any], list[Any]] | None]:
        """``take(count)`` as :meth:`Capture.reader`'s; each chunk is freed once read."""
        chunks, cap = self.chunks, self.cap
        state: dict[str, Any] = {"next": 0, "ks": [], "vs": [], "at": 0}

        def load() -> bool:
            n = state["next"]
            state["next"] = n + 1
            if n < len(chunks):
                chunk = chunks[n]
                chunks[n] = None
                assert chunk is not None
                ks = list(chunk[0])
                vs = cap.corrected(ks, list(chunk[1]))  # values changed since the capture
                if cap.tombs:
                    ks, vs = _without_none(ks, vs)
            elif n == len(chunks) and cap.extra:
                ks, vs = list(cap.extra), list(cap.extra.values())
            else:
                return False
            state.update(ks=ks, vs=vs, at=0)
            return True

        def take(count: int) -> tuple[list[Any], list[Any]] | None:
            if state["at"] >= len(state["ks"]) and not load():
                return None
            ks, vs, at = state["ks"], state["vs"], state["at"]
            state["at"] = at + count
            if at == 0 and count >= len(ks):
                return ks, vs
            return ks[at:at + count], vs[at:at + count]

        return take

    def items(self) -> Iterator[tuple[Any, Any]]:
        return _entries(self.reader())


def _entries(take: Callable[[int], tuple[list[Any], list[Any]] | None]
             ) -> Iterator[tuple[Any, Any]]:
    """The ``(key, value)`` pairs a ``take`` reader yields, 4,096 at a time."""
    while (chunk := take(4096)) is not None:
        yield from zip(*chunk, strict=True)


def _without_none(ks: list[Any], vs: list[Any]) -> tuple[list[Any], list[Any]]:
    """Entries whose value is not None (removed: tombstones, or absent at capture)."""
    if None not in vs:
        return ks, vs
    kept = [i for i, v in enumerate(vs) if v is not None]
    return [ks[i] for i in kept], [vs[i] for i in kept]


def dict_reader(data: dict[Any, Any]) -> Callable[[int], tuple[list[Any], list[Any]] | None]:
    """``take(count)`` over a dict nothing changes meanwhile (synchronous and forked snapshots)."""
    keys_it, values_it = iter(data), iter(data.values())

    def take(count: int) -> tuple[list[Any], list[Any]] | None:
        ks = list(islice(keys_it, count))
        if not ks:
            return None
        return ks, list(islice(values_it, len(ks)))

    return take
