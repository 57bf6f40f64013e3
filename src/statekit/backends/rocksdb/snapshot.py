"""RocksDB snapshots: native checkpoints uploaded file by file, and backend-neutral savepoints.

The synchronous part flushes and hard-links the live files (a native RocksDB checkpoint); the
run uploads them on ``number_of_transfering_threads``.  Incremental checkpoints re-reference the
SST files the last confirmed checkpoint already holds and upload only the others, into
``shared/``.  rocksdict has no compaction filter, so TTL "compaction-filter" cleanup is imitated
here, bounded per checkpoint.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rocksdict import Checkpoint, Options, Rdict, WriteBatch

from statekit.backends.base import SnapshotRun, StateMeta
from statekit.backends.kvformat import KvStateData, handle_header, kv_handle, write_kv_state
from statekit.backends.kvschema import check_kind, check_state_count
from statekit.backends.rocksdb.ahead import Ahead, by_kind, reusable, sst_files
from statekit.backends.rocksdb.changelog import WalChangelog, check_changelog, check_pieces
from statekit.backends.rocksdb.db import Unusable, open_db
from statekit.backends.rocksdb.encoding import drop_expired, expired, grouped, raise_stopped, scan
from statekit.backends.rocksdb.heap_timers import HeapTimerOwner, HeapTimers, check_heap_timers
from statekit.checkpoint import schema
from statekit.checkpoint.streams import CheckpointStreams
from statekit.errors import BackendLockedError, CheckpointError

if TYPE_CHECKING:
    from statekit.serde.keytypes import KeyCheck
    from statekit.state.descriptors import StateDescriptor

#: Format tag of a native RocksDB checkpoint handle.
ROCKSDB_FORMAT = "statekit-rocksdb/1"



def _check_native(task: dict[str, Any], path: str, recorded: Any) -> None:
    """The schema pass over a native RocksDB handle: states, and file handles with plain names."""
    for name, info in schema.mapping(task.get("states"), f"{path}.states").items():
        where = f"{path}.states.{schema.state_name(name, f'{path}.states')}"
        check_kind(schema.mapping(info, where), where)
    for group in ("sst", "misc"):
        schema.files(task.get(group, {}), f"{path}.{group}")
    check_pieces(task, path)
    check_state_count(task, task.get("states"), path)
    misc = task.get("misc", {})
    if "CURRENT" not in misc or not any(name.startswith("MANIFEST-") for name in misc):
        # without them RocksDB opens an empty database: every state would be silently gone
        raise schema.fail(f"{path}.misc", "a RocksDB checkpoint needs its CURRENT and MANIFEST files")
    if "incremental" in task:
        schema.boolean(task["incremental"], f"{path}.incremental")
    if "reused_sst" in task:
        schema.integer(task["reused_sst"], f"{path}.reused_sst", 0)
    check_heap_timers(task, path, recorded)
    check_changelog(task, path)


schema.register_format(ROCKSDB_FORMAT, _check_native)



_DISPOSED = "the RocksDB state backend was disposed while a snapshot ran"


class DatabaseOwner(HeapTimerOwner, Protocol):
    """What snapshots and restores use of a RocksDB backend: its database directory and options,
    the open column families, the heap timers, and its transfer threads.  The backend imports
    this module and :mod:`~statekit.backends.rocksdb.restore`, never the other way."""

    cfs: dict[str, Rdict]
    instance_dir: Path
    options: Callable[[], Options]
    heap_store: HeapTimers

    def pool_map(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """``fn`` over ``items``, on the transfer threads."""
        ...


class SnapshotOwner(DatabaseOwner, Protocol):
    """What a snapshot uses beyond :class:`DatabaseOwner`: the settings, the registered states
    (TTL sweep), the incremental bookkeeping and the header fields of a task handle."""

    backend_name: str
    key_check: KeyCheck
    incremental: bool
    ttl_compaction_filter: bool
    disposed: bool
    metas: dict[str, StateMeta]
    confirmed: dict[str, Any]
    changelog: WalChangelog | None
    db_path: Path
    sweep_cursor: dict[str, tuple[bytes, int]]

    def registered_descriptor(self, name: str) -> StateDescriptor | None:
        """The descriptor state ``name`` was registered with (None: only restored)."""
        ...

    def state_names(self) -> list[str]:
        """Every state the database holds, sorted."""
        ...

    def track_upload(self, checkpoint_id: int, sst: dict[str, Any]) -> None:
        """Remember an incremental checkpoint's SSTs."""
        ...

    def finish_restore(self) -> None:
        """Wait until a lazy restore's files are checked (CorruptCheckpointError if one failed)."""
        ...


class RocksDBSnapshotStrategy:
    """Takes one snapshot of a RocksDB keyed backend (as Flink's ``RocksSnapshotStrategy``)."""

    def __init__(self, backend: SnapshotOwner) -> None:
        self.backend = backend

    def snapshot(self, checkpoint_id: int, streams: CheckpointStreams, savepoint: bool
                 ) -> SnapshotRun:
        """The synchronous part: TTL sweep and a native checkpoint; the run writes it."""
        start = time.perf_counter()
        backend = self.backend
        db = backend.ensure_open()
        if isinstance(db, Unusable):
            raise BackendLockedError("database inherited through fork")
        self._ttl_sweep()
        for name in backend.state_names():
            backend.cf(name)  # restored-but-unregistered states are column families too
        changelog = None if savepoint else backend.changelog
        if changelog is not None:
            chain, ahead = changelog.plan(checkpoint_id, set(backend.cfs))
            if chain is not None:
                return self._log_run(checkpoint_id, streams, chain, ahead, start)
        taken = time.monotonic()
        target = self._native_checkpoint(f"chk-{checkpoint_id}")
        position = (None if changelog is None
                    else changelog.position(target, backend.db_path, list(backend.cfs)))
        info = {name: dict(backend.state_info[name]) for name in backend.state_names()}
        heap_timers = backend.heap_store.capture()  # timers kept on the heap: constant time
        base = dict(backend.confirmed) if backend.incremental and not savepoint else {}
        metas = dict(backend.metas)
        limits = {name: meta.ttl.snapshot_limit() for name, meta in metas.items() if meta.ttl}
        expiring = {name: limit for name, limit in limits.items() if limit is not None}

        def work() -> dict[str, Any]:
            timers = backend.heap_store.write(heap_timers, streams, savepoint)
            if savepoint:
                handle = self._write_savepoint(target, streams, info, metas)
                handle["states"].update(timers)
                handle["state_count"] = len(handle["states"])
                return handle
            if expiring:
                self._drop_expired_in(target, expiring)
            handle = self._upload(checkpoint_id, target, streams, info, base)
            if changelog is not None and position is not None:
                changelog.materialized(checkpoint_id, handle, position, taken)
            if timers:
                handle["heap_timers"] = timers
            return handle

        return self._run_of(work, heap_timers, target, start)

    def _native_checkpoint(self, name: str) -> Path:
        """A native checkpoint of the database beside it (hard links), in a fresh directory.
        create_checkpoint flushes every column family's memtable first (log_size_for_flush=0),
        so the files hold everything written (a changelog's live logs are copied)."""
        target = self.backend.instance_dir / f"{name}-{uuid.uuid4().hex[:8]}"
        checkpoint = Checkpoint(self.backend.db)
        try:
            checkpoint.create_checkpoint(str(target))
        finally:
            del checkpoint
        return target

    def _log_run(self, checkpoint_id: int, streams: CheckpointStreams,
                 chain: tuple[dict[str, Any], float], start_ahead: bool, start: float
                 ) -> SnapshotRun:
        """A changelog checkpoint: the logs written since ``chain`` (hard links now), uploaded
        by the run on top of ``chain``'s materialization, with a share of the next
        materialization (taken now when ``start_ahead``)."""
        backend, changelog = self.backend, self.backend.changelog
        assert changelog is not None
        target = backend.instance_dir / f"log-{checkpoint_id}-{uuid.uuid4().hex[:8]}"
        segments = changelog.capture(backend.db, backend.db_path, chain[0], target)
        info = {name: dict(backend.state_info[name]) for name in backend.state_names()}
        if start_ahead:  # right after the capture: the logs end where the materialization starts
            taken = time.monotonic()
            native = self._native_checkpoint(f"mat-{checkpoint_id}")
            # reusable: the last confirmed files and the materialization this one extends
            # (switched to now, its files uploaded by completed checkpoints)
            base = {**backend.confirmed, **sst_files(chain[0])} if backend.incremental else {}
            changelog.ahead = Ahead(
                native, changelog.position(native, backend.db_path, list(backend.cfs)), info,
                handle_header(backend, ROCKSDB_FORMAT), backend.incremental, base, taken)
        ahead = changelog.ahead
        share = ahead.assign(checkpoint_id) if ahead is not None else []
        heap_timers = backend.heap_store.capture()

        def work() -> dict[str, Any]:
            timers = backend.heap_store.write(heap_timers, streams, False)
            if share:
                ahead.upload(checkpoint_id, share, streams, self._write_file)
            upcoming = ahead.referenced(checkpoint_id) if ahead is not None else None
            handle = changelog.write(checkpoint_id, chain[0], segments, streams, info, chain[1],
                                     upcoming)
            if timers:
                handle["heap_timers"] = timers
            if backend.incremental:
                backend.track_upload(checkpoint_id, sst_files(handle))
            return handle

        return self._run_of(work, heap_timers, target, start)

    def _run_of(self, work: Callable[[], dict[str, Any]], heap_timers: Any, target: Path,
                start: float) -> SnapshotRun:
        """The asynchronous part around ``work``: never of a disposed backend or of restored
        files not yet checked; the captured heap timers and ``target`` released either way."""
        backend = self.backend

        def run() -> dict[str, Any]:
            try:
                if backend.disposed:
                    raise CheckpointError(_DISPOSED)
                backend.finish_restore()  # never a checkpoint of restored files not yet checked
                return work()
            except OSError as exc:  # dispose removed the native checkpoint under the upload
                if backend.disposed:
                    raise CheckpointError(_DISPOSED) from exc
                raise
            finally:
                backend.heap_store.release(heap_timers)
                shutil.rmtree(target, ignore_errors=True)

        def cancel() -> None:
            backend.heap_store.release(heap_timers)
            shutil.rmtree(target, ignore_errors=True)

        return SnapshotRun(run, time.perf_counter() - start, cancel=cancel)

    # --- TTL cleanup (what Flink's compaction filter does, bounded per checkpoint) ---------------

    def _ttl_sweep(self) -> None:
        backend = self.backend
        if not backend.ttl_compaction_filter:
            return
        for name, meta in backend.metas.items():
            if meta.ttl is None:
                continue
            registered = backend.registered_descriptor(name)
            config = registered.ttl_config if registered is not None else None
            strategies = config.get_cleanup_strategies() if config is not None else None
            budget = (strategies.get_rocksdb_compact_filter_cleanup_strategy()
                      if strategies is not None else None)
            if budget is None:
                continue
            self._sweep_state(name, meta, budget, strategies.get_periodic_compaction_time())  # type: ignore[union-attr]

    def _sweep_state(self, name: str, meta: StateMeta, budget: int, period: int) -> None:
        """Delete expired entries among the next ``budget`` entries of one state (the clock is
        read once for them), or all the rest of the pass when it started ``period`` ms ago."""
        backend = self.backend
        policy = meta.ttl
        assert policy is not None
        now = policy.clock()
        limit = now - policy.ttl
        cursor, started = backend.sweep_cursor.get(name, (b"", now))
        if now - started >= period:
            budget = -1  # finish the pass: every entry is looked at within the period
        cf = backend.cfs[name]
        handle = backend.db.get_column_family_handle(name)
        batch = WriteBatch(raw_mode=True)
        it = cf.iter()
        it.seek(cursor)
        seen = 0
        while it.valid() and seen != budget:
            value = it.value()
            if value and expired(value, limit):
                batch.delete(it.key(), handle)
            seen += 1
            it.next()
        if not it.valid():
            raise_stopped(it)
        backend.sweep_cursor[name] = (it.key(), started) if it.valid() else (b"", now)
        del it
        if len(batch):
            backend.db.write(batch)

    def _drop_expired_in(self, target: Path, expiring: dict[str, int]) -> None:
        """TTL full-snapshot cleanup, off the processing thread: delete expired entries in the copy.

        The native checkpoint is a separate database (hard-linked, immutable SSTs); tombstones
        written into it hide the expired entries from every restore of this checkpoint.
        """
        def options() -> Options:
            opts = self.backend.options()
            opts.set_disable_auto_compactions(True)
            return opts

        db = open_db(target, options)
        try:
            for name, limit in expiring.items():
                cf = db.get_column_family(name)
                handle = db.get_column_family_handle(name)
                batch = WriteBatch(raw_mode=True)
                for key, value in scan(cf):
                    if value and expired(value, limit):
                        batch.delete(key, handle)
                if len(batch):
                    db.write(batch)
                    cf.flush()
                del cf, handle
        finally:
            db.close()

    # --- writing ---------------------------------------------------------------------------------

    def _upload(self, checkpoint_id: int, target: Path, streams: CheckpointStreams,
                info: dict[str, Any], base: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Upload the native checkpoint's files (reusing the base's SSTs when incremental)."""
        backend = self.backend
        files, todo = reusable(target, base)
        reused = len(files)
        incremental = backend.incremental

        def upload(path: Path) -> tuple[str, dict[str, Any]]:
            return self._write_file(path, streams)

        files.update(backend.pool_map(upload, todo))
        groups = by_kind(files)  # (pieces: reused from a changelog's materialization)
        if incremental:
            backend.track_upload(checkpoint_id, files)
        return {
            **handle_header(backend, ROCKSDB_FORMAT),
            "incremental": incremental,
            "states": info,
            "state_count": len(info),
            **groups,
            "reused_sst": reused,
        }

    def _write_file(self, path: Path, streams: CheckpointStreams) -> tuple[str, dict[str, Any]]:
        """One file of a native checkpoint, streamed (a kernel copy or a streamed upload, the CRC
        computed alongside): shared when incremental checkpoints reuse it (SSTs) or changelog
        checkpoints reference it after its own checkpoint is gone; inline when small."""
        backend = self.backend
        sst = path.suffix == ".sst"
        inline = path.stat().st_size < streams.inline_threshold  # carried in each handle
        shared = (path.name if (backend.incremental and sst)
                  or (backend.changelog is not None and not inline) else None)
        return path.name, streams.write_file(path, state_name=path.name, shared_name=shared)

    def _write_savepoint(self, target: Path, streams: CheckpointStreams, info: dict[str, Any],
                         metas: dict[str, StateMeta]) -> dict[str, Any]:
        """The native checkpoint re-read as backend-neutral key-grouped chunks."""
        db = open_db(target, self.backend.options, read_only=True)
        states: dict[str, Any] = {}
        try:
            for name, entry in info.items():
                data = KvStateData(entry["layout"], entry["kind"])
                cf = db.get_column_family(name)
                meta = metas.get(name)
                limit = meta.ttl.snapshot_limit() if meta is not None and meta.ttl else None
                for kg, kb, value in grouped(cf, entry["kind"]):
                    if limit is not None:
                        value = drop_expired(entry["kind"], value, limit)
                        if value is None:
                            continue
                    data.add(kg, kb, value)
                del cf
                states[name] = write_kv_state(streams, name, data)
        finally:
            db.close()
        return dict(kv_handle(self.backend, states))
