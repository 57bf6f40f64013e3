"""The RocksDB keyed backend: one partition's working state in its own local database.

One column family per state (:mod:`~statekit.backends.rocksdb.states`); snapshots and restores
are in :mod:`~statekit.backends.rocksdb.snapshot` and :mod:`~statekit.backends.rocksdb.restore`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict

from statekit import workdirs
from statekit.backends.base import NO_KEY, KeyedStateBackend, RestoreSource, SnapshotRun, StateMeta
from statekit.backends.kvformat import KV_FORMATS
from statekit.backends.rocksdb.ahead import sst_files
from statekit.backends.rocksdb.changelog import WalChangelog
from statekit.backends.rocksdb.checks import CheckedFamily, Compaction, RestoreChecks
from statekit.backends.rocksdb.db import Unusable, inherited, live_backends, open_db, write_options
from statekit.backends.rocksdb.encoding import key_bytes
from statekit.backends.rocksdb.heap_timers import HeapTimers
from statekit.backends.rocksdb.restore import RocksDBRestoreOperation, filters_natively
from statekit.backends.rocksdb.snapshot import ROCKSDB_FORMAT, RocksDBSnapshotStrategy
from statekit.backends.rocksdb.states import (
    RocksDBListState,
    RocksDBMapState,
    RocksDBValueState,
    RocksState,
)
from statekit.backends.rocksdb.timers import RocksDBTimerQueue
from statekit.backends.timers import (
    TIMERS_KIND,
    TIMERS_LAYOUT,
    TimerQueue,
    timer_meta,
    timer_state_name,
)
from statekit.checkpoint.reader import FileCheck
from statekit.checkpoint.streams import CheckpointStreams
from statekit.errors import BackendLockedError, CorruptCheckpointError, StateError
from statekit.serde.keygroups import KeyGroupRange, key_group_for_bytes
from statekit.serde.keys import as_key_serializer
from statekit.serde.serializers import TypeSerializer
from statekit.state.api import State
from statekit.state.descriptors import StateDescriptor

#: prefixes of this many str/int/bytes keys are cached per type before the cache starts over
_PREFIX_CACHE_SIZE = 1 << 16


class RocksDBKeyedStateBackend(KeyedStateBackend):
    """Working state of one partition in its own RocksDB database (one column family per state)."""

    backend_name = "rocksdb"

    def __init__(self, key_serializer: TypeSerializer, key_group_range: KeyGroupRange,
                 max_parallelism: int, clock: Callable[[], int] | None = None, *,
                 instance_dir: str, options: Callable[[], Options],
                 incremental: bool = False, transfer_threads: int = 1,
                 ttl_compaction_filter: bool = True, timer_factory: str = "ROCKSDB",
                 lazy_restore: bool = True, changelog: WalChangelog | None = None) -> None:
        self.current_prefix: bytes | None = None
        # prefixes of str/int/bytes keys, cached once the key passed the declared key type's
        # check (so a cache hit needs none)
        self._prefix_caches: dict[type, dict[Any, bytes]] = {str: {}, int: {}, bytes: {}}
        self._key_ser = as_key_serializer(key_serializer).serialize  # canonical key bytes
        self.kg_prefixes = [kg.to_bytes(2, "big") for kg in range(max_parallelism)]
        super().__init__(key_serializer, key_group_range, max_parallelism, clock, True)
        self.instance_dir = Path(instance_dir)
        self.db_path = self.instance_dir / "db"
        self.options = options
        self.incremental = incremental
        self.transfer_threads = max(1, int(transfer_threads))
        self.ttl_compaction_filter = ttl_compaction_filter
        #: check restored linked files in the background (:mod:`~.checks`), not before opening
        self.lazy_restore = lazy_restore
        self._checks: RestoreChecks | None = None
        self._compaction: Compaction | None = None
        self._damage: Exception | None = None
        #: changelog checkpoints: writes go through the WAL, which checkpoints upload
        self.changelog = changelog
        self._wo = write_options(wal=changelog is not None)
        self.db: Any = None
        self.cfs: dict[str, Rdict] = {}
        self.state_info: dict[str, dict[str, Any]] = {}  # name -> {"layout", "kind"}
        self._rstates: dict[str, RocksState] = {}
        self.metas: dict[str, StateMeta] = {}
        self.sweep_cursor: dict[str, tuple[bytes, int]] = {}  # TTL sweep: position, pass start
        self._lock = threading.Lock()
        self._pending: dict[int, dict[str, dict[str, Any]]] = {}
        self.confirmed: dict[str, Any] = {}
        self._confirmed_id = -1
        self._pid = os.getpid()
        self.disposed = False
        self._timer_queues: dict[str, TimerQueue] = {}
        self._native_queues: dict[str, RocksDBTimerQueue] = {}
        #: timers on the heap (``timer-service.factory: HEAP``), and restored ones in transit
        self.heap_timers = timer_factory == "HEAP"
        self.heap_store = HeapTimers(self)
        live_backends.add(self)

    # --- current key: the key-group prefix is computed once per key --------------------------------

    @property  # type: ignore[override]
    def current_key(self) -> Any:
        return self._current_key

    @current_key.setter
    def current_key(self, key: Any) -> None:
        self.set_current_key(key)

    def set_current_key(self, key: Any) -> None:
        """Set the current key and compute its key-group prefix once for all state accesses
        (StateTypeError, with the current key unchanged, unless it is a key of the declared
        key type)."""
        # prefixes of str/int/bytes keys (canonical as they are) are cached, one dict per exact
        # type, once checked; other keys (1.0 and True are the key 1) take the canonical
        # serialization
        cache = self._prefix_caches.get(type(key))
        if cache is not None:
            prefix = cache.get(key)
            if prefix is None:
                if not self.key_check.passes(key):
                    self.key_check.check_type(key)
                kb = self._key_ser(key)
                prefix = self.kg_prefixes[key_group_for_bytes(kb, self.max_parallelism)] + kb
                if len(cache) >= _PREFIX_CACHE_SIZE:
                    cache.clear()
                cache[key] = prefix
            self.current_prefix = prefix
        elif key is NO_KEY:
            self.current_prefix = None
        else:
            if not self.key_check.passes(key):
                self.key_check.check_type(key)  # serializing checks that it is a key at all
            kb = self._key_ser(key)
            self.current_prefix = self.kg_prefixes[key_group_for_bytes(kb, self.max_parallelism)] + kb
        self._current_key = key

    def key_prefix(self, key: Any) -> bytes:
        """Key group and serialized key of ``key``: the prefix of its entries in every state."""
        if key is self._current_key and self.current_prefix is not None:
            return self.current_prefix
        kb = self._key_ser(key)
        return self.kg_prefixes[key_group_for_bytes(kb, self.max_parallelism)] + kb

    # --- the database ------------------------------------------------------------------------------

    def ensure_open(self) -> Any:
        """The open database (opened on first use; StateError once disposed)."""
        if self.db is None:
            if self.disposed:
                raise StateError("the RocksDB state backend was disposed")
            self.db_path.parent.mkdir(parents=True, exist_ok=True)
            self.db = open_db(self.db_path, self.options)
            self.db.set_write_options(self._wo)
            self._pid = os.getpid()
        return self.db

    def cf(self, name: str) -> Rdict:
        """The column family of state ``name``, created on first use (wrapped while restored
        files are being checked)."""
        if self._damage is not None:
            raise self._damage
        cf = self.cfs.get(name)
        checks = self._checks
        if checks is not None and not checks.done:
            return CheckedFamily(cf if cf is not None else self._family(name),  # type: ignore[return-value]
                                 self.finish_restore)
        return cf if cf is not None else self._family(name)

    def _family(self, name: str) -> Rdict:
        cf = self.cfs.get(name)
        if cf is None:
            db = self.ensure_open()
            try:
                cf = db.get_column_family(name)
            except Exception:
                cf = db.create_column_family(name, self.options())
            cf.set_write_options(self._wo)
            self.cfs[name] = cf
        return cf

    def _create_state(self, meta: StateMeta) -> State:
        if self.changelog is not None:
            self.changelog.check_state(meta)
        cf = self.cf(meta.name)
        self.state_info[meta.name] = {"layout": meta.layout, "kind": meta.kind}
        self.metas[meta.name] = meta
        stored = meta.stored_serializer
        state: RocksState
        if meta.kind == "value":
            state = RocksDBValueState(self, cf, meta, stored)
        elif meta.kind == "list":
            state = RocksDBListState(self, cf, meta, stored.element)  # type: ignore[attr-defined]
        else:
            state = RocksDBMapState(self, cf, meta, stored.value, stored.key)  # type: ignore[attr-defined]
        self._rstates[meta.name] = state
        return state  # type: ignore[return-value]

    def _keys_of(self, state: str) -> Iterator[Any]:
        info = self.state_info.get(state)
        if info is None:
            return iter(())
        deserialize = self.key_serializer.deserialize
        return (deserialize(kb) for kb in key_bytes(self.cf(state), info["kind"]))

    def registered_descriptor(self, name: str) -> StateDescriptor | None:
        """The descriptor state ``name`` was registered with (None: only restored so far)."""
        registered = self._states.get(name)
        return registered[0] if registered is not None else None

    def note_restored(self, name: str, entry: dict[str, Any]) -> None:
        """Record a restored state's layout (checked when it is registered) and kind."""
        self._restored_layouts[name] = entry["layout"]
        self.state_info[name] = {"layout": entry["layout"], "kind": entry["kind"]}

    def state_names(self) -> list[str]:
        """Every state the database holds (registered or only restored), sorted."""
        return sorted(self.state_info)

    def timer_queue(self, name: str, create: bool = True) -> TimerQueue | None:
        """The timer queue ``name``: two column families (by key, by time) and each key group's
        earliest timer in memory."""
        queue = self._timer_queues.get(name)
        if queue is None and self.heap_timers:
            state = timer_state_name(name)
            if not create and state not in self.heap_store.restored:
                return None
            queue = self.heap_store.queue(name, timer_meta(name, self.key_serializer))
            if self.timer_interceptor is not None:
                queue = self.timer_interceptor(queue)
            self._timer_queues[name] = queue
        if queue is None:
            state = timer_state_name(name)
            info = self.state_info.get(state)
            if info is None and not create:
                return None
            if info is not None and info["kind"] != TIMERS_KIND:
                raise CorruptCheckpointError(
                    f"state '{state}': expected timers, the checkpoint holds a {info['kind']} "
                    "state")
            self.state_info[state] = {"layout": list(TIMERS_LAYOUT), "kind": TIMERS_KIND}
            native = self._native_queues[name] = RocksDBTimerQueue(name, self)
            queue = native if self.timer_interceptor is None else self.timer_interceptor(native)
            self._timer_queues[name] = queue
        return queue

    def poison(self, why: str, error: type[Exception] = StateError) -> None:
        """Make every state and timer queue raise ``error(why)`` (the database is gone)."""
        bad = Unusable(why, error)
        for state in list(self._rstates.values()):  # (also called from the restore check)
            state.bind(bad, bad)
        for queue in list(self._native_queues.values()):
            queue.poison(bad)
        self.cfs.clear()

    def forked(self) -> None:
        """In a forked child: the parent owns the database; never touch (or delete) it here.

        The native handles are leaked on purpose: releasing them would run RocksDB code whose
        mutexes a parent thread may have held at fork time (a deadlock in the child).
        """
        inherited.append((self.db, list(self.cfs.values()),
                           [state.native for state in self._rstates.values()]))
        self.poison(
            f"this RocksDB state backend was opened in process {self._pid} before a fork; "
            "RocksDB is not fork-safe, so create the backend (open the database) after forking",
            BackendLockedError,
        )
        self.db = Unusable("database inherited through fork")
        self.disposed = True

    def close(self) -> None:
        """Flush and close the database, keeping its files (releases the process lock)."""
        if self.db is None or isinstance(self.db, Unusable):
            return
        self.poison("the RocksDB state backend was closed")
        db, self.db = self.db, None
        try:
            db.flush()
        finally:
            db.close()

    def _bulk_state(self, descriptor: StateDescriptor) -> RocksDBValueState | None:
        state = self.get_partitioned_state(descriptor)
        return state if isinstance(state, RocksDBValueState) else None

    def key_prefixes(self, keys: Sequence[Any]) -> list[bytes]:
        """The prefix of each key (the key group and serialized key), the last one current."""
        prefixes = []
        for key in keys:
            self.set_current_key(key)
            prefixes.append(self.current_prefix)
        return prefixes

    def bulk_get(self, descriptor: StateDescriptor, keys: Sequence[Any]) -> list[Any]:
        """Values of a value state for many keys: one batched multi-get."""
        state = self._bulk_state(descriptor)
        if state is None:  # wrapped (size limits): go through the state API
            value = self.get_partitioned_state(descriptor).value  # type: ignore[attr-defined]
            return [value() for _ in self._each(keys)]
        return state.get_many(self.key_prefixes(keys))

    def bulk_put(self, descriptor: StateDescriptor, keys: Sequence[Any],
                 values: Sequence[Any]) -> None:
        """Set a value state for many keys in one write batch; None deletes a key."""
        state = self._bulk_state(descriptor)
        if state is None:
            update = self.get_partitioned_state(descriptor).update  # type: ignore[attr-defined]
            for key, value in zip(keys, values, strict=True):
                self.set_current_key(key)
                update(value)
            return
        self.ensure_open().write(state.write_many(self.key_prefixes(keys), values))

    def _each(self, keys: Sequence[Any]) -> Iterator[Any]:
        for key in keys:
            self.set_current_key(key)
            yield key

    # --- lazy restore: restored linked files checked in the background -----------------------

    def check_later(self, checks: list[FileCheck], side: Path | None = None) -> None:
        """Check these restored files on a thread while the state is in use (lazy restore);
        ``side``: where their links are (:func:`~.checks.pinned`)."""
        if checks:
            self._checks = RestoreChecks(checks, self._damaged, self._checked, side)

    def compact_later(self, ranges: list[tuple[Any, bytes, bytes]]) -> None:
        """Compact a rescaling restore's foreign ranges on a thread, after the file checks; the
        next snapshot waits for it."""
        if ranges:
            self._compaction = Compaction(ranges, self._checks)

    def _damaged(self, error: Exception) -> None:
        self._damage = error
        self.poison(str(error), CorruptCheckpointError)

    def _checked(self) -> None:
        """Every file passed: states read their column families directly again."""
        for name, state in list(self._rstates.items()):
            cf = self.cfs.get(name)
            if cf is not None:
                state.bind(cf, state.native[1])

    def pending_restore(self) -> int:
        """Restored files whose check is still running (a lazy restore), 0 once all passed."""
        checks = self._checks
        return 0 if checks is None or checks.done else checks.left

    def finish_restore(self) -> None:
        """Wait until every restored file is checked; CorruptCheckpointError if one failed."""
        if self._checks is not None:
            self._checks.wait()

    def dispose(self) -> None:
        if self.disposed:
            return
        compaction, self._compaction = self._compaction, None
        if compaction is not None:
            compaction.cancel()
        if self._checks is not None:
            self._checks.stop()
        if compaction is not None:
            compaction.stop()
        if self.db is not None and not isinstance(self.db, Unusable):
            self.poison("the RocksDB state backend was disposed")
            db, self.db = self.db, None
            try:
                db.close()
            except Exception:  # noqa: S110 - the directory is deleted below anyway
                pass
        self.disposed = True
        self._states.clear()
        self._timer_queues.clear()
        self._native_queues.clear()
        workdirs.remove(self.instance_dir)
        live_backends.discard(self)

    def pool_map(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """``fn`` over ``items``, on ``transfer_threads`` threads when there is more than one."""
        if self.transfer_threads <= 1 or len(items) <= 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(max_workers=self.transfer_threads,
                                thread_name_prefix="statekit-rocksdb-transfer") as pool:
            return list(pool.map(fn, items))

    # --- snapshots and restore -----------------------------------------------------------------------

    def snapshot(self, checkpoint_id: int, streams: CheckpointStreams, *,
                 savepoint: bool = False) -> SnapshotRun:
        """A native checkpoint now (hard links); the run uploads it, or writes a savepoint."""
        if self._compaction is not None:  # a rescale's foreign files: gone before the checkpoint
            self._compaction.wait()
        return RocksDBSnapshotStrategy(self).snapshot(checkpoint_id, streams, savepoint)

    def track_upload(self, checkpoint_id: int, sst: dict[str, Any]) -> None:
        """Remember an incremental checkpoint's SSTs (:func:`~.ahead.sst_files`): its base once it
        is confirmed."""
        with self._lock:
            self._pending[checkpoint_id] = dict(sst)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        with self._lock:
            ssts = self._pending.pop(checkpoint_id, None)
            if ssts is not None and checkpoint_id > self._confirmed_id:
                self.confirmed = ssts
                self._confirmed_id = checkpoint_id
            for cid in [c for c in self._pending if c < checkpoint_id]:
                del self._pending[cid]
        if self.changelog is not None:
            self.changelog.complete(checkpoint_id, self.db_path)

    def adopt_restored_base(self, handle: dict[str, Any]) -> None:
        """The next incremental checkpoint reuses the restored shared SSTs (same name and size)."""
        if self.incremental and handle.get("format") == ROCKSDB_FORMAT and handle.get("incremental"):
            with self._lock:
                self.confirmed = sst_files(handle)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        with self._lock:
            self._pending.pop(checkpoint_id, None)
        if self.changelog is not None:
            self.changelog.aborted(checkpoint_id)

    native_formats = (*KV_FORMATS, ROCKSDB_FORMAT)
    filterable_formats = KV_FORMATS

    def filters(self, handle: dict[str, Any]) -> bool:
        """Backend-neutral handles, and native ones of this max parallelism without timers: their
        keys are read from the restored files and filtered as they are copied (a rescale); other
        native handles are converted first (:mod:`~statekit.backends.transfer`)."""
        return super().filters(handle) or filters_natively(handle, self.max_parallelism)

    def restore_sources(self, sources: list[RestoreSource], *,
                        key_filter: Callable[[Any], bool] | None = None,
                        skip_states: frozenset[str] = frozenset()) -> None:
        """Native handles (the one overlapping most is the base) and backend-neutral ones."""
        if self._states or self._timer_queues:
            raise StateError("restore must happen before any state or timer is registered")
        RocksDBRestoreOperation(self).restore(sources, key_filter, skip_states)
