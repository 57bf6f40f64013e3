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

from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

from statekit.backends.base import StateMeta

_ABSENT: Any = object()
#: entries a snapshot copies out of a live table per slice (about 1.5 ms of GIL here)
COPY_SLICE = 1 << 16


class Capture:
    """What one pending snapshot of a table sees: the live dict read in slices, corrected by the
    values it had at capture for keys changed since, plus the keys staged at capture when it was
    taken while another capture was pending (``extra``, copied).

    Immutable values: every change appends ``(key, old value)`` to the table's ``log`` (one list
    append, no lookup), the snapshot copies the dict out in slices, releases the capture and then
    takes the *first* logged value of each key as its value at capture.  Mutable values (changed
    in place, so copied on first change anyway): ``undo`` maps each changed key to the object it
    held at capture, and the capture stays pending until its parts are packed.
    """

    __slots__ = ("extra", "log_start", "released", "table", "tombs", "undo")

    def __init__(self, table: HeapTable, extra: dict[Any, Any] | None, tombs: bool) -> None:
        self.table = table
        self.undo: dict[Any, Any] = {}
        self.log_start = len(table.log) if table.log is not None else 0
        self.extra = extra
        self.tombs = tombs  # the live dict held tombstones at capture: filter None values
        self.released = False

    # --- immutable values: copied out, then corrected from the log --------------------------------

    def _corrections(self) -> dict[Any, Any]:
        """Key -> value at capture of every key changed since (after the capture is released)."""
        log = self.table.log
        if not log:
            return {}
        return dict(reversed(log[self.log_start:]))  # the first logged value of each key wins

    def copy_out(self, count: int = COPY_SLICE) -> list[tuple[list[Any], list[Any]]]:
        """The captured entries as private ``(keys, values)`` slices; releases the capture.  The
        live dict is read ``count`` entries per slice (a few C-level passes each: the GIL is held
        briefly); the slices are kept as they are (no second copy into one list)."""
        table = self.table
        data = table.data
        keys_it, values_it = iter(data), iter(data.values())  # aligned: the size never changes
        slices = []
        while ks := list(islice(keys_it, count)):
            slices.append((ks, list(islice(values_it, len(ks)))))
        table.release(self)
        fix = self._corrections()
        # None: removed since (the first logged value) or a tombstone at capture
        drop = self.tombs or None in fix.values()
        out = []
        for ks, vs in slices:
            if fix:
                vs = list(map(fix.get, ks, vs))
            if drop:
                ks, vs = _without_none(ks, vs)
            if ks:
                out.append((ks, vs))
        if self.extra:
            out.append((list(self.extra), list(self.extra.values())))
        return out

    def values_of(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """Key -> value at capture (None: absent) of ``keys``; releases the capture."""
        get = self.table.data.get
        out = {key: get(key) for key in keys}
        self.table.release(self)
        for key, value in self._corrections().items():
            if key in out:
                out[key] = value
        if self.extra:
            for key, value in out.items():
                if value is None:
                    out[key] = self.extra.get(key)
        return out

    # --- mutable values: read while pending, corrected by ``undo`` --------------------------------

    def get(self, key: Any) -> Any:
        """The key's value at capture (None if absent); safe while the live table changes: the
        live value is read first and a value saved meanwhile wins."""
        value = self.table.data.get(key)
        saved = self.undo.get(key, _ABSENT)
        if saved is not _ABSENT:
            return saved
        if value is None and self.extra:
            return self.extra.get(key)
        return value

    def reader(self) -> Callable[[int], tuple[list[Any], list[Any]] | None]:
        """``take(count)``: the next ``count`` entries as ``(keys, values)`` (fewer when removed
        entries are dropped), None at the end.  Each call is a few C-level passes over ``count``
        entries (the GIL is held for one slice only)."""
        data = self.table.data
        keys_it, values_it = iter(data), iter(data.values())  # aligned: the size never changes
        extra = self.extra
        undo = self.undo
        state = {"live": True}

        def take(count: int) -> tuple[list[Any], list[Any]] | None:
            if state["live"]:
                ks = list(islice(keys_it, count))
                if ks:
                    vs = list(islice(values_it, len(ks)))
                    if undo:  # values changed since the capture: the saved ones (C-level)
                        vs = list(map(undo.get, ks, vs))
                    if self.tombs:  # (a key removed after the capture has a saved value)
                        ks, vs = _without_none(ks, vs)
                    return ks, vs
                state["live"] = False
                if extra:
                    return list(extra), list(extra.values())
            return None

        return take

    def items(self) -> Iterator[tuple[Any, Any]]:
        take = self.reader()
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

    __slots__ = ("copy", "data", "dirty", "immutable", "log", "meta", "snaps", "staged",
                 "tombs", "watch")

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
        # immutable values: (key, old value) of every change while captures are pending
        self.log: list[tuple[Any, Any]] | None = None
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
            self.settle()
        extra = None
        if self.staged:  # another capture is pending: its staged keys are part of this one too
            copy = self.copy
            extra = dict(self.staged) if self.immutable else {
                k: copy(v) for k, v in self.staged.items()}
        elif self.staged is None:
            self.staged = {}
        if self.immutable and self.log is None:
            self.log = []
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

    def settle(self) -> None:
        """Fold staged keys and tombstones into the dict once no snapshot is pending (processing
        thread only): one C-level update for the keys first written during the snapshots."""
        if self.snaps:
            return
        staged, data = self.staged, self.data
        if staged:
            data.update(staged)
        for key in self.tombs:
            if key in data and data[key] is None:
                del data[key]
        self.tombs = set()
        self.staged = None
        self.log = None
        self.watch = self.dirty is not None

    # --- the slow paths of the states (processing thread) ------------------------------------------

    def _save(self, snaps: tuple[Capture, ...], key: Any, old: Any) -> None:
        for cap in snaps:
            undo = cap.undo
            if key not in undo:
                undo[key] = old

    def get(self, key: Any) -> Any:
        """A key missing from (or removed in) ``data``: staged while snapshots are pending."""
        staged = self.staged
        if staged is None:
            return None
        if not self.snaps:
            self.settle()
            return self.data.get(key)
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
            log = self.log
            if log is not None:
                log.append((key, old))
            else:
                for cap in snaps:  # (inlined _save: this is the write path during snapshots)
                    undo = cap.undo
                    if key not in undo:
                        undo[key] = old
            data[key] = value
            if old is None:
                self.tombs.discard(key)
            return
        if self.staged is not None:
            self.settle()
        self.data[key] = value

    def remove(self, key: Any) -> None:
        """Remove a key (a tombstone while snapshots are pending)."""
        if self.dirty is not None:
            self.dirty.add(key)
        snaps = self.snaps
        if not snaps:
            if self.staged is not None:
                self.settle()
            self.data.pop(key, None)
            return
        data = self.data
        old = data.get(key, _ABSENT)
        if old is _ABSENT:
            self.staged.pop(key, None)  # type: ignore[union-attr]
            return
        if old is None:
            return
        if self.log is not None:
            self.log.append((key, old))
        else:
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
        if key in snaps[-1].undo:  # replaced since the newest capture: private already
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
