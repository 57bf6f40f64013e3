"""The heap backend's tables: Python objects in one dict per state, and their live side.

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
while a snapshot is pending (or the backend is incremental, or a lazy restore still holds
serialized parts) and removals call into the table.  Captures live in
:mod:`statekit.backends.heap.capture`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import repeat, starmap
from typing import Any

from statekit.backends.base import StateMeta
from statekit.backends.heap.capture import Capture
from statekit.backends.heap.lazy import LazyValues
from statekit.errors import ConcurrentModificationError

_ABSENT: Any = object()
#: staged keys (and tombstones) :meth:`HeapTable.settle` folds per call
SETTLE_STEP = 8192


class HeapTable:
    """One state's key → stored value dict, plus the bookkeeping of pending snapshots.

    ``watch`` is true while writes must go through :meth:`put` / :meth:`remove` and misses
    through :meth:`get`: a snapshot is pending or not settled yet, or the backend tracks dirty
    keys (incremental).  Otherwise the states use ``data`` directly.
    """

    __slots__ = ("convert", "copy", "data", "dirty", "immutable", "lazy", "meta", "snaps",
                 "staged", "tombs", "watch")

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
        # restored parts whose values are still serialized (lazy restore) and the conversion of
        # their plain values (None: stored as plain)
        self.lazy: LazyValues | None = None
        self.convert: Callable[[Any], Any] | None = None
        self.watch = track_dirty

    # --- lazy restore (processing thread) ----------------------------------------------------------

    def attach(self, lazy: LazyValues, convert: Callable[[Any], Any] | None) -> None:
        """Serve the pending parts of a lazy restore: their keys take the slow path until their
        part is installed."""
        if lazy.pending:
            self.lazy, self.convert, self.watch = lazy, convert, True

    def _pull(self, lazy: LazyValues, key: Any) -> None:
        """Install the pending part holding ``key``, else one part decoded ahead."""
        part = lazy.part_of(key)
        entries = lazy.take(part) if part is not None else lazy.step()
        if entries is not None:
            self._install(*entries)
        if not lazy.pending:
            self.lazy = self.convert = None
            self.watch = bool(self.snaps) or self.staged is not None or self.dirty is not None

    def _install(self, keys: list[Any], values: list[Any]) -> None:
        if self.convert is not None:
            values = list(map(self.convert, values))
        # while a capture is pending the dict's size must not change: staged like new keys
        target = self.staged if self.snaps else self.data
        target.update(zip(keys, values, strict=True))  # type: ignore[union-attr]

    def install_all(self) -> None:
        """Install every pending part now (an enumeration of all keys)."""
        lazy = self.lazy
        if lazy is not None:
            for entries in lazy.take_all():
                self._install(*entries)
            self._pull(lazy, _ABSENT)

    def step(self) -> None:
        """Install one part decoded ahead, if any (between micro-batches, before snapshots)."""
        lazy = self.lazy
        if lazy is not None:
            self._pull(lazy, _ABSENT)

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
        self.watch = self.dirty is not None or self.lazy is not None
        return True

    def live_keys(self, state: str) -> Iterator[Any]:
        """The keys the table holds: ``data``'s (not its tombstones) and the staged ones; a key
        added or removed meanwhile ends the iteration with an error."""
        self.install_all()
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
        """A key missing from (or removed in) ``data``: staged while snapshots are pending, or
        still serialized in a pending part of a lazy restore."""
        lazy = self.lazy
        if lazy is not None:
            self._pull(lazy, key)
            value = self.data.get(key)
            if value is not None:
                return value
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
        lazy = self.lazy
        if lazy is not None:
            self._pull(lazy, key)
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
        lazy = self.lazy
        if lazy is not None:
            self._pull(lazy, key)
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
    """A restored state not registered yet: its layout and kind, key -> plain stored value
    (converted by the state's serializer when the state is registered), and the parts a lazy
    restore left serialized (``lazy``)."""

    __slots__ = ("data", "kind", "layout", "lazy", "shared")

    def __init__(self, layout: list[Any], kind: str) -> None:
        self.layout = layout
        self.kind = kind
        self.data: dict[Any, Any] = {}
        self.lazy: LazyValues | None = None
        self.shared = 0  # asynchronous snapshots still writing ``data`` (carried over)

    def data_drop(self, keys: list[Any]) -> None:
        """Entries restored later (a lazy part) override these keys' decoded values."""
        data = self.data
        if data:
            for key in data.keys() & keys:
                del data[key]

    def decode_all(self) -> dict[Any, Any]:
        """``data`` with every pending part decoded into it (where values are needed at once)."""
        lazy = self.lazy
        if lazy is not None:
            for keys, values in lazy.take_all():
                self.data.update(zip(keys, values, strict=True))
            self.lazy = None
        return self.data

    def keys(self) -> list[Any]:
        """Every restored key, decoded or pending (checked against their key groups)."""
        if self.lazy is None:
            return list(self.data)
        for part in self.lazy.parts.values():
            part.verify()
        return [*self.data, *self.lazy.pending]
