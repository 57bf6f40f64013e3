"""The heap keyed backend: one partition's working state as Python objects (Flink's heap backend).

Incremental mode tracks the keys written since the last confirmed checkpoint and writes only a
changelog of them (puts with full values, removes), grouped by key group, as a shared file; every
``materialization_interval`` checkpoints (or when the log grows past ``max_log_ratio`` of the
base) it writes a full base instead, so recovery replays a bounded log.  Restored entries stay in
plain form until their state is registered (its serializer is known then).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from statekit.backends.base import (
    NO_KEY,
    KeyedStateBackend,
    RestoreSource,
    SnapshotRun,
    StateMeta,
    gc_paused,
)
from statekit.backends.heap.lazy import LazyValues
from statekit.backends.heap.restore import SourceLoad
from statekit.backends.heap.snapshot import (
    HEAP_CHANGELOG_FORMAT,
    RUNS,
    HeapSnapshotStrategy,
    check_snapshot_mode,
)
from statekit.backends.heap.states import (
    HeapListState,
    HeapMapState,
    HeapMutableValueState,
    HeapValueState,
)
from statekit.backends.heap.table import HeapTable, Restored
from statekit.backends.kvformat import KV_FORMAT, KV_FORMATS, check_kv_handle
from statekit.backends.timers import (
    TIMERS_KIND,
    HeapTimerQueue,
    TimerQueue,
    check_restored_timers,
    timer_meta,
)
from statekit.checkpoint.streams import CheckpointStreams
from statekit.errors import CheckpointError, CorruptCheckpointError, StateError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.serializers import TypeSerializer
from statekit.state.api import State, check_value
from statekit.state.descriptors import StateDescriptor

#: ints within this magnitude are one digit in CPython: they compare fastest (_set_int_key)
_COMPACT = (1 << 30) - 1
# incremental attempts neither confirmed nor aborted that are tracked; older ones are folded back
# into the dirty sets (and can no longer become a base) so a caller that never notifies leaks nothing
_MAX_UNCONFIRMED = 16


class HeapKeyedStateBackend(KeyedStateBackend):
    """Working state of one partition as Python objects.

    ``incremental``: checkpoints write changelogs over the last confirmed base;
    ``materialization_interval`` / ``max_log_ratio``: when to write a new base;
    ``pace_ratio``: how long the transfer thread sleeps per unit of work (GIL share, thread mode);
    ``snapshot_mode``: ``thread`` (copy-on-write view) or ``fork`` (a child process serializes).
    """

    backend_name = "hashmap"

    def __init__(self, key_serializer: TypeSerializer, key_group_range: KeyGroupRange,
                 max_parallelism: int, clock: Callable[[], int] | None = None,
                 using_asynchronous_snapshots: bool = True, *, incremental: bool = False,
                 materialization_interval: int = 10, max_log_ratio: float = 0.5,
                 pace_ratio: float = 1.0, snapshot_mode: str = "thread",
                 lazy_restore: bool = True, key_group_order: bool = True) -> None:
        super().__init__(key_serializer, key_group_range, max_parallelism, clock,
                         using_asynchronous_snapshots)
        # set_current_key's fast path: key types that pass without a call; INT and LONG keys
        # (bounded, so checked per key) get a method of their own, chosen once
        self._fast_keys = self.key_check.fast
        bounds = self.key_check.bounds
        if bounds is not None and bounds[0] <= -_COMPACT and bounds[1] >= _COMPACT:
            self.set_current_key = self._set_int_key  # type: ignore[method-assign]
        self.tables: dict[str, HeapTable] = {}
        # restored, still serialized chunks of states not registered yet
        self._restored: dict[str, Restored] = {}
        self.incremental = incremental
        self.materialization_interval = materialization_interval
        self.max_log_ratio = max_log_ratio
        self.pace_ratio = pace_ratio
        self.snapshot_mode = check_snapshot_mode(snapshot_mode)
        # restored values stay serialized until first needed (a background thread decodes ahead)
        self.lazy_restore = lazy_restore
        # full snapshots written by key group (a rescale reads only its key groups' parts)
        self.key_group_order = key_group_order
        # the handle of the last confirmed (complete) incremental checkpoint: a valid base
        self._confirmed: dict[str, Any] | None = None
        # in-flight incremental attempts: dirty keys each captured, and its handle once written
        self._attempts: dict[int, dict[str, Any]] = {}
        self._timer_queues: dict[str, TimerQueue] = {}
        self._decoders: list[LazyValues] = []  # lazy restores' background threads, ended at dispose
        self._disposed = False

    def set_current_key(self, key: Any) -> None:
        """Set the current key; keys of exactly the declared key type (str/int/bytes for generic
        keys) pass without a call, others are checked here: a key of another type, NaN or an
        unhashable key is a StateTypeError, as on RocksDB."""
        if type(key) not in self._fast_keys and key is not NO_KEY:
            self.key_check.check(key)
        self.current_key = key

    def _set_int_key(self, key: Any) -> None:
        """:meth:`set_current_key` of INT and LONG keys (bound in ``__init__``): an int of at
        most 30 bits passes with two comparisons of one-digit ints, CPython's fastest (literal
        bounds: loading them from attributes cost as much again); anything else is checked in
        full."""
        if not (type(key) is int and key >= -1073741823 and key <= 1073741823  # +-_COMPACT
                ) and key is not NO_KEY:
            self.key_check.check(key)
        self.current_key = key

    def _create_state(self, meta: StateMeta) -> State:
        table = HeapTable(meta, track_dirty=self.incremental)
        self.tables[meta.name] = table
        stored = meta.stored_serializer
        restored = self._restored.pop(meta.name, None)
        if restored is not None:
            lazy = restored.lazy
            if lazy is not None and (restored.kind != meta.kind or list(restored.layout) != list(
                    meta.layout) or meta.snapshot_filter() is not None):
                restored.decode_all()  # checkpoints could not write its parts through unchanged
            elif lazy is not None:
                table.attach(lazy, None if stored.identity else stored.from_plain)
                lazy.start(meta.name)
                self._decoders.append(lazy)
                # a backend collected without dispose ends it too (the thread keeps it alive)
                weakref.finalize(self, _halt, weakref.ref(lazy))
            if stored.identity and not restored.shared:  # the restored dict becomes the table
                table.data = restored.data
            else:  # converted, and private copies while a snapshot still writes the originals
                from_plain, copy = stored.from_plain, stored.copy
                table.data = {key: copy(from_plain(plain)) if restored.shared else from_plain(plain)
                              for key, plain in restored.data.items()}
        if meta.kind == "value":
            if table.immutable:
                return HeapValueState(self, table, stored)
            return HeapMutableValueState(self, table, stored)
        if meta.kind == "list":
            return HeapListState(self, table, stored.element)  # type: ignore[attr-defined]
        return HeapMapState(self, table, stored.value, stored.key)  # type: ignore[attr-defined]

    # --- timers ------------------------------------------------------------------------------------

    def timer_queue(self, name: str, create: bool = True) -> TimerQueue | None:
        """The timer queue ``name``: a heap table (snapshotted like every state) and a sorted list
        rebuilt from the restored timers."""
        queue = self._timer_queues.get(name)
        if queue is not None:
            return queue
        meta = timer_meta(name, self.key_serializer)
        if not create and meta.name not in self._restored:
            return None
        table = HeapTable(meta, track_dirty=self.incremental)
        restored = self._restored.pop(meta.name, None)
        with gc_paused():  # the restored timers' order is built here
            if restored is not None:
                if restored.kind != TIMERS_KIND:
                    raise CorruptCheckpointError(
                        f"state '{meta.name}': expected timers, the checkpoint holds a "
                        f"{restored.kind} state")
                check_restored_timers(meta.name, restored.decode_all())
                # the lists are never changed in place; the dict is, so it is copied while an
                # asynchronous snapshot still writes the restored one
                table.data = dict(restored.data) if restored.shared else restored.data
            self.tables[meta.name] = table
            queue = HeapTimerQueue(name, table)
        if self.timer_interceptor is not None:
            queue = self.timer_interceptor(queue)
        self._timer_queues[name] = queue
        return queue

    # --- snapshots ---------------------------------------------------------------------------------

    def snapshot(self, checkpoint_id: int, streams: CheckpointStreams, *,
                 savepoint: bool = False) -> SnapshotRun:
        """Capture now (a dict copy per table with copy-on-write, or a fork), write later.

        Full snapshots and savepoints are ``KV_FORMAT``; incremental checkpoints are
        ``HEAP_CHANGELOG_FORMAT`` handles referencing a shared base and shared changelogs.
        """
        start = time.perf_counter()
        mode = self.snapshot_mode if self.asynchronous else "sync"
        if mode == "fork" and self._lazy_on_disk():
            mode = "thread"  # a forked child would read restored files behind other threads' locks
        strategy = HeapSnapshotStrategy(self, checkpoint_id, streams, savepoint)
        strategy.capture(copy_on_write=mode == "thread")
        run = RUNS[mode](strategy)  # whatever the mode does synchronously happens here
        run.sync_seconds = time.perf_counter() - start
        return run

    def _lazies(self) -> list[LazyValues]:
        """The pending parts of every lazily restored state, registered or not."""
        found = [t.lazy for t in self.tables.values()] + [r.lazy for r in self._restored.values()]
        return [lazy for lazy in found if lazy is not None]

    def _lazy_on_disk(self) -> bool:
        """Some values of a lazy restore are still only in the restored files."""
        return any(p.raw is None for lazy in self._lazies() for p in lazy.parts.values())

    def _must_materialize(self) -> bool:
        base = self._confirmed
        if base is None:
            return True
        if len(base["logs"]) >= self.materialization_interval:
            return True
        return base["log_bytes"] > self.max_log_ratio * max(1, base["base_bytes"])

    def begin_attempt(self, checkpoint_id: int, tables: list[HeapTable]
                       ) -> tuple[bool, dict[str, set[Any]]]:
        """Track an incremental attempt: whether it writes a new base, and otherwise the keys
        changed since the confirmed base (in-flight attempts' changes included)."""
        materialize = self._must_materialize()
        own = {t.meta.name: t.take_dirty() for t in tables}
        changed: dict[str, set[Any]] = {}
        if not materialize:
            for table in tables:
                keys = set(own[table.meta.name])
                for attempt in self._attempts.values():
                    keys |= attempt["dirty"].get(table.meta.name, set())
                changed[table.meta.name] = keys
        self._attempts[checkpoint_id] = {"dirty": own, "handle": None}
        while len(self._attempts) > _MAX_UNCONFIRMED:  # never notified: stop tracking it
            self._fold_back(self._attempts.pop(min(self._attempts)))
        return materialize, changed

    def record_handle(self, checkpoint_id: int, handle: dict[str, Any]) -> None:
        """The handle an incremental attempt wrote (confirmed by its completion notice)."""
        attempt = self._attempts.get(checkpoint_id)
        if attempt is not None:
            attempt["handle"] = handle

    @property
    def restored_states(self) -> dict[str, Restored]:
        """Restored states no one registered yet (plain values), carried over by snapshots."""
        return self._restored

    @property
    def confirmed_handle(self) -> dict[str, Any] | None:
        """The handle of the last confirmed incremental checkpoint (the next one's base)."""
        return self._confirmed

    def prepare_snapshot(self) -> bool:
        """Folds one step of each table's staged keys (a capture would fold all of them), and
        installs a part a lazy restore decoded ahead."""
        for table in self.tables.values():
            table.step()
        return all([t.settle() for t in self.tables.values()])

    def pending_restore(self) -> int:
        """Restored entries whose values are still serialized (a lazy restore), 0 once all are
        installed."""
        return sum(map(len, self._lazies()))

    def finish_restore(self) -> None:
        """Decode and install every value a lazy restore left serialized, now."""
        for table in self.tables.values():
            table.install_all()
        for restored in self._restored.values():
            restored.decode_all()

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """The checkpoint is durable: its handle becomes the base of later incremental ones."""
        attempt = self._attempts.get(checkpoint_id)
        if attempt is None or attempt["handle"] is None:
            return
        self._confirmed = attempt["handle"]
        for cid in [c for c in self._attempts if c <= checkpoint_id]:
            del self._attempts[cid]  # their changes are part of the confirmed checkpoint

    def adopt_restored_base(self, handle: dict[str, Any]) -> None:
        """The next changelog builds on the restored incremental handle, not on a new full base."""
        if (self.incremental and handle.get("format") == HEAP_CHANGELOG_FORMAT
                and {"base", "logs", "base_bytes", "log_bytes"} <= handle.keys()):
            self._confirmed = handle

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """The attempt will never complete: fold its dirty keys back so no change is lost."""
        attempt = self._attempts.pop(checkpoint_id, None)
        if attempt is not None:
            self._fold_back(attempt)

    def _fold_back(self, attempt: dict[str, Any]) -> None:
        for name, keys in attempt["dirty"].items():
            table = self.tables.get(name)
            if table is not None and table.dirty is not None:
                table.dirty |= keys

    # --- restore -----------------------------------------------------------------------------------

    native_formats = (*KV_FORMATS, HEAP_CHANGELOG_FORMAT)
    filterable_formats = native_formats

    def restore_sources(self, sources: list[RestoreSource], *,
                        key_filter: Callable[[Any], bool] | None = None,
                        skip_states: frozenset[str] = frozenset()) -> None:
        """Load this range's entries of full (``KV_FORMATS``) and incremental handles; the values
        stay in plain form until their state is registered (its serializer is known then)."""
        mine = self.key_group_range
        key_checks = [self.restore_key_check(handle) for handle, _ in sources]  # before loading
        for (handle, reader), key_check in zip(sources, key_checks, strict=True):
            incremental = handle.get("format") == HEAP_CHANGELOG_FORMAT
            if incremental:
                handle = {**handle, "format": KV_FORMAT}  # the same range and parallelism checks
            theirs = check_kv_handle(handle, self.max_parallelism)
            if not len(theirs.intersection(mine)):
                continue
            load = SourceLoad(self, reader, theirs, key_filter, skip_states, key_check)
            if not incremental:
                for name, entry in handle["states"].items():
                    load.entry(name, entry)
                continue
            for name, entry in handle.get("base", {}).items():
                load.entry(name, entry)
            for log in handle.get("logs", []):  # replayed in order over the base
                for name, entry in log.items():
                    load.log(name, entry)

    def restored_entry(self, name: str, entry: dict[str, Any]) -> Restored:
        """The restored state ``name`` (key -> plain value, and lazy parts), created on first
        use."""
        if name in self.tables:
            raise StateError("restore must happen before the state is registered", name)
        self._restored_layouts[name] = entry["layout"]
        restored = self._restored.get(name)
        if restored is None:
            restored = self._restored[name] = Restored(entry["layout"], entry["kind"])
        return restored

    # --- bulk access -------------------------------------------------------------------------------

    def bulk_get(self, descriptor: StateDescriptor, keys: Sequence[Any]) -> list[Any]:
        """Values of a (TTL-less) value state for many keys: one dict lookup each, no key switch."""
        self.get_partitioned_state(descriptor)
        self.key_check.check_all(keys)
        table = self.tables[descriptor.name]
        get = table.data.get
        if not table.watch:
            return [get(key) for key in keys]
        if table.immutable:  # misses may be staged while a snapshot is pending
            slow = table.get
            return [value if (value := get(key)) is not None else slow(key) for key in keys]
        live = table.live  # mutable values handed out: private copies, marked dirty
        return [live(key, get(key)) for key in keys]

    def bulk_put(self, descriptor: StateDescriptor, keys: Sequence[Any],
                 values: Sequence[Any]) -> None:
        """Set a (TTL-less) value state for many keys; None clears a key."""
        self.get_partitioned_state(descriptor)
        self.key_check.check_all(keys)
        table = self.tables[descriptor.name]
        serializer = table.meta.stored_serializer
        for value in values:
            if value is not None:
                check_value(serializer, value, descriptor.name)
        if table.watch:
            put, remove = table.put, table.remove
            for key, value in zip(keys, values, strict=True):
                if value is None:
                    remove(key)
                else:
                    put(key, value)
            return
        data = table.data
        for key, value in zip(keys, values, strict=True):
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value

    def _keys_of(self, state: str) -> Iterator[Any]:
        table = self.tables.get(state)
        if table is None:
            restored = self._restored.get(state)
            return iter(restored.keys() if restored is not None else ())
        return table.live_keys(state)

    def check_not_disposed(self) -> None:
        """CheckpointError once :meth:`dispose` ran: an in-flight snapshot fails, never completes."""
        if self._disposed:
            raise CheckpointError("the heap state backend was disposed while a snapshot ran")

    def dispose(self) -> None:
        self._disposed = True
        for lazy in self._decoders:
            lazy.stop()
        self._decoders.clear()
        self._timer_queues.clear()
        self.tables.clear()
        self._restored.clear()
        self._states.clear()
        self._attempts.clear()
        self._confirmed = None


def _halt(lazy: weakref.ref[LazyValues]) -> None:
    """End a lazy restore's decoder thread whose backend was collected without :meth:`dispose`
    (it would wait for that backend forever, holding the parts' bytes)."""
    values = lazy()
    if values is not None:
        values.halt()
