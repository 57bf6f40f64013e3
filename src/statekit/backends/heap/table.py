"""The heap backend's tables: Python objects in one dict per state, and snapshot captures.

A snapshot's synchronous part is a constant-time mark (:meth:`HeapTable.capture`); the snapshot
then reads the *live* dict in slices while processing goes on, and the live side keeps what the
snapshot must see:

* the first change of a key after a capture saves the value it had (``undo``: the old object,
  never mutated again; a mutable value is copied before it is changed in place), and the snapshot
  prefers a saved value to the live one;
* the dict's size never changes while a capture is pending (a dict iterator fails on a size
  change): keys first written meanwhile are *staged* in a side dict and removed keys become
  ``None`` tombstones; both are folded into the dict (:meth:`HeapTable.settle`) by the processing
  thread at its first slow-path access after the last pending snapshot ended.

Reads and writes of the live dict take the same path as without a snapshot; only misses, writes
while a snapshot is pending (or the backend is incremental) and removals call into the table.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice, repeat, starmap
from typing import Any

from statekit.backends.base import StateMeta
from statekit.errors import ConcurrentModificationError

_ABSENT: Any = object()
#: entries :meth:`Capture.drain` frees per step (about half a millisecond)
DRAIN_STEP = 8192
#: entries :meth:`Capture.copy_out` copies per step (a fraction of a millisecond)
COPY_STEP = 4096
#: staged keys (and tombstones) :meth:`HeapTable.settle` folds per call
SETTLE_STEP = 8192
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

    def __init__(self, table: HeapTable, extra: dict[Any, Any] | None, tombs: bool) -> None:
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


class HeapTable:
    """One state's key → stored value dict, plus the bookkeeping of pending snapshots.

    ``watch`` is true while writes must go through :meth:`put` / :meth:`remove` and misses
    through :meth:`get`: a snapshot is pending or not settled yet, or the backend tracks dirty
    keys (incremental).  Otherwise the states use ``data`` directly.
    """

    __slots__ = ("copy", "data", "dirty", "immutable", "meta", "snaps", "staged", "tombs",
                 "watch")

    def __init__(self, meta: StateMeta, track_dirty: bool = False) -> None:
        self.meta = meta
        self.data: dict[Any, Any] = {}
        self.copy: Callable[[Any], Any] = meta.stored_serializer.copy
        self.immutable = bool(meta.stored_serializer.immutable)
        # keys written (or whose mutable value was handed out) since the last capture; None when
        # the backend is not incremental
        self.dirty: set[Any] | None = set() if track_dirty else None
        self.snaps: tuple[Capture, ...] = ()  # pending captures, oldest first
        # keys first written while a capture was pending (None: not in snapshot mode)
        self.staged: dict[Any, Any] | None = None
        self.tombs: set[Any] = set()  # keys whose live value is a None tombstone
        self.watch = track_dirty

    def take_dirty(self) -> set[Any]:
        """The dirty keys since the last call, resetting the set (incremental snapshots)."""
        dirty = self.dirty
        if dirty is None:
            return set()
        self.dirty = set()
        return dirty

    # --- snapshots (capture on the processing thread, release from any thread) ---------------------

    def capture(self) -> Capture:
        """Mark the table's current content for a snapshot: O(1) (O(staged keys) only when
        another snapshot is still pending with staged keys)."""
        if not self.snaps and self.staged is not None:
            self.settle(full=True)
        extra = None
        if self.staged:  # another capture is pending: its staged keys are part of this one too
            copy = self.copy
            extra = dict(self.staged) if self.immutable else {
                k: copy(v) for k, v in self.staged.items()}
        elif self.staged is None:
            self.staged = {}
        cap = Capture(self, extra, bool(self.tombs))
        self.snaps = (*self.snaps, cap)
        self.watch = True
        return cap

    def release(self, cap: Capture) -> None:
        """The snapshot no longer reads the table (it ended or will never start).  Only the
        tuple of pending captures changes here; the processing thread settles later."""
        if not cap.released:
            cap.released = True
            self.snaps = tuple(c for c in self.snaps if c is not cap)

    def settle(self, full: bool = False) -> bool:
        """Fold staged keys and tombstones into the dict once no snapshot is pending (processing
        thread only), at most :data:`SETTLE_STEP` of each per call unless ``full``: a big fold is
        spread over the next slow-path accesses instead of pausing one element.  The table stays
        watched (and its staged keys readable) until the fold is done.  True when nothing is
        left to fold now (or a pending snapshot keeps it from folding)."""
        if self.snaps or self.staged is None:
            return True
        staged, data, tombs = self.staged, self.data, self.tombs
        if full:  # one C-level update (a capture needs the fold done now)
            data.update(staged)
            staged.clear()
            removed: Iterable[Any] = list(tombs)
            tombs.clear()
        else:
            data.update(starmap(staged.popitem, repeat((), min(len(staged), SETTLE_STEP))))
            removed = starmap(tombs.pop, repeat((), min(len(tombs), SETTLE_STEP)))
        for key in removed:
            if key in data and data[key] is None:
                del data[key]
        if staged or tombs:
            return False
        self.staged = None
        self.watch = self.dirty is not None
        return True

    def live_keys(self, state: str) -> Iterator[Any]:
        """The keys the table holds: ``data``'s (not its tombstones) and the staged ones; a key
        added or removed meanwhile ends the iteration with an error."""
        try:
            for key, value in self.data.items():
                if value is not None:
                    yield key
            if self.staged:
                yield from self.staged
        except RuntimeError as exc:  # "dictionary changed size during iteration"
            raise ConcurrentModificationError(
                "a key was added or removed while the state's keys were enumerated (collect them "
                "first, or use apply_to_all_keys)", state) from exc

    # --- the slow paths of the states (processing thread) ------------------------------------------

    def _save(self, snaps: tuple[Capture, ...], key: Any, old: Any) -> None:
        for cap in snaps:
            undo = cap.saved_for(key)
            if key not in undo:
                undo[key] = old

    def get(self, key: Any) -> Any:
        """A key missing from (or removed in) ``data``: staged while snapshots are pending."""
        staged = self.staged
        if staged is None:
            return None
        if not self.snaps:
            self.settle()
            value = self.data.get(key)
            return value if value is not None or self.staged is None else staged.get(key)
        return staged.get(key)

    def put(self, key: Any, value: Any) -> None:
        """Set a key's value (not None), saving the old one for pending snapshots."""
        if self.dirty is not None:
            self.dirty.add(key)
        snaps = self.snaps
        if snaps:
            data = self.data
            old = data.get(key, _ABSENT)
            if old is _ABSENT:  # a new key: the dict's size must not change, stage it
                self.staged[key] = value  # type: ignore[index]
                return
            for cap in snaps:  # (inlined _save: this is the write path during snapshots)
                undo = cap.shards[hash(key) & cap.mask] if cap.mask else cap.undo
                if key not in undo:
                    undo[key] = old
            data[key] = value
            if old is None:
                self.tombs.discard(key)
            return
        if self.staged is not None:
            self.settle()
            if self.staged:
                self.staged.pop(key, None)
        self.data[key] = value

    def remove(self, key: Any) -> None:
        """Remove a key (a tombstone while snapshots are pending)."""
        if self.dirty is not None:
            self.dirty.add(key)
        snaps = self.snaps
        if not snaps:
            if self.staged is not None:
                self.settle()
                if self.staged:
                    self.staged.pop(key, None)
            self.data.pop(key, None)
            return
        data = self.data
        old = data.get(key, _ABSENT)
        if old is _ABSENT:
            self.staged.pop(key, None)  # type: ignore[union-attr]
            return
        if old is None:
            return
        self._save(snaps, key, old)
        data[key] = None
        self.tombs.add(key)

    def live(self, key: Any, value: Any) -> Any:
        """``value`` (``data``'s, possibly None) made private to the live table for an in-place
        change or a hand-out of a mutable value: copied once if a pending snapshot shares it,
        and marked dirty."""
        if value is None:
            value = self.get(key)  # staged values are private (a later capture copies them)
            if value is not None and self.dirty is not None:
                self.dirty.add(key)
            return value
        if self.dirty is not None:
            self.dirty.add(key)
        snaps = self.snaps
        if not snaps:
            if self.staged is not None:
                self.settle()
            return value
        if key in snaps[-1].saved_for(key):  # replaced since the newest capture: private already
            return value
        self._save(snaps, key, value)
        value = self.copy(value)
        self.data[key] = value
        return value


class Restored:
    """A restored state not registered yet: its layout and kind, and key -> plain stored value
    (converted by the state's serializer when the state is registered)."""

    __slots__ = ("data", "kind", "layout", "shared")

    def __init__(self, layout: list[Any], kind: str) -> None:
        self.layout = layout
        self.kind = kind
        self.data: dict[Any, Any] = {}
        self.shared = 0  # asynchronous snapshots still writing ``data`` (carried over)
