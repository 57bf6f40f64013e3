"""The embedded RocksDB backend: working state as bytes in a local ``rocksdict`` database.

One column family per state; every key starts with its key group (2 bytes, big-endian) and the
serialized key, so a key-group range is one contiguous scan.  List elements are stored under
``prefix + 8-byte sequence number`` (appends never rewrite the list) and map entries under
``prefix + serialized user key`` (iteration is a prefix scan).  Serialized keys are msgpack
objects, which are self-delimiting, so no key's prefix is a prefix of another key's.

Checkpoints are native: flush and hard-link the live files (the synchronous part), then upload
them on a pool of ``number_of_transfering_threads``.  Incremental checkpoints upload only SST
files the last confirmed checkpoint did not already hold, into ``shared/``; the checkpoint
storage reference-counts shared files by sweeping the retained checkpoints' metadata.
Savepoints use the backend-neutral key-grouped format, so they restore into any backend.
"""

from __future__ import annotations

import copy
import os
import random
import re
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgpack
from rocksdict import AccessType, Checkpoint, Options, Rdict, WriteBatch, WriteOptions

from statekit import workdirs
from statekit.backends.base import (
    KV_FORMATS,
    NO_KEY,
    KeyedStateBackend,
    KvStateData,
    SnapshotRun,
    StateBackend,
    StateMeta,
    kv_handle,
    read_kv_states,
    write_kv_state,
)
from statekit.backends.rocksdb_options import (
    OptionsFactory,
    PredefinedOptions,
    build_options,
    resolve_options_factory,
)
from statekit.checkpoint.storage import CheckpointStorage
from statekit.checkpoint.streams import CheckpointStreams, StateReader
from statekit.errors import (
    BackendLockedError,
    CheckpointError,
    ConfigError,
    CorruptCheckpointError,
    StateError,
)
from statekit.serde.keygroups import KeyGroupRange, key_group_for_bytes
from statekit.serde.types import TypeSerializer, packb, unpackb
from statekit.state.api import ListState, MapState, State, ValueState, check_value
from statekit.state.descriptors import StateDescriptor
from statekit.values import parse_bool, parse_int

__all__ = [
    "ROCKSDB_FORMAT",
    "EmbeddedRocksDBStateBackend",
    "PredefinedOptions",
    "RocksDBKeyedStateBackend",
    "RocksDBStateBackend",
    "open_db",
]

#: Format tag of a native RocksDB checkpoint handle.
ROCKSDB_FORMAT = "statekit-rocksdb/1"

_DEFAULT_CF = "default"
_SEQ_MAX = b"\xff" * 8
_KG_END = b"\x80"  # key groups are < 2**15, so every key sorts below this
_BATCH = 20_000
_TTL_SWEEP_BUDGET = 1000  # entries per TTL state examined per checkpoint (compaction-filter stand-in)
_NIL = b"\xc0"
_PREFIX_CACHE_SIZE = 1 << 16  # msgpack nil: a None map value inside a serialized map
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")

_live_backends: weakref.WeakSet[RocksDBKeyedStateBackend] = weakref.WeakSet()
_inherited: list[Any] = []  # handles inherited through fork: never released in the child


def _after_fork_in_child() -> None:
    for backend in list(_live_backends):
        backend._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# --- opening databases ---------------------------------------------------------------------------


def _write_options() -> WriteOptions:
    wo = WriteOptions()
    wo.disable_wal = True  # state is made durable by checkpoints, as in Flink
    return wo


def open_db(path: str | os.PathLike[str], options_factory: Callable[[], Options],
            *, read_only: bool = False) -> Rdict:
    """Open (or create) the database at ``path`` with the options on every column family.

    A database another process (or this one) holds open raises :class:`BackendLockedError`.
    """
    path = str(path)
    cfs: dict[str, Options] = {}
    if os.path.exists(os.path.join(path, "CURRENT")):
        try:
            names = Rdict.list_cf(path, options_factory())
        except Exception as exc:
            raise CorruptCheckpointError(f"cannot list column families of {path}: {exc}") from exc
        cfs = {name: options_factory() for name in names if name != _DEFAULT_CF}
    access = AccessType.read_only(False) if read_only else AccessType.read_write()
    try:
        return Rdict(path, options_factory(), column_families=cfs or None, access_type=access)
    except Exception as exc:
        text = str(exc)
        if "lock" in text.lower():
            raise BackendLockedError(
                f"RocksDB database {path} is already open in another process or handle "
                f"(RocksDB allows one process per database): {text}"
            ) from exc
        raise CheckpointError(f"cannot open RocksDB database {path}: {text}") from exc


class _Unusable:
    """Stands in for a database handle that must not be used (closed, or inherited by fork)."""

    __slots__ = ("_error", "_why")

    def __init__(self, why: str, error: type[Exception] = BackendLockedError) -> None:
        self._why = why
        self._error = error

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise self._error(self._why)

        return fail


# --- msgpack helpers: combine stored pieces into backend-neutral values and split them back -------


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _split_array(buf: bytes) -> list[bytes]:
    """The raw encodings of the items of a msgpack array, without decoding them."""
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(buf), 1024))
    unpacker.feed(buf)
    try:
        n = unpacker.read_array_header()
        pos = unpacker.tell()
        out = []
        for _ in range(n):
            unpacker.skip()
            end = unpacker.tell()
            out.append(buf[pos:end])
            pos = end
    except Exception as exc:
        raise CorruptCheckpointError(f"malformed serialized list or map: {exc}") from exc
    return out


def _object_length(buf: bytes, offset: int) -> int:
    """Length of the msgpack object starting at ``offset`` (the serialized key inside a key)."""
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(buf), 1024))
    unpacker.feed(buf[offset:])
    unpacker.skip()
    return int(unpacker.tell())


# --- states --------------------------------------------------------------------------------------


class _RocksState:
    __slots__ = ("_b", "_cf", "_check", "_de", "_del", "_get", "_handle", "_name", "_put",
                 "_ser", "_valid")

    def __init__(self, backend: RocksDBKeyedStateBackend, cf: Rdict, meta: StateMeta,
                 element: TypeSerializer) -> None:
        self._b = backend
        self._cf: Any = cf
        self._name = meta.name
        self._check = element
        self._ser = packb if element.identity else element.serialize
        self._de = unpackb if element.identity else element.deserialize
        self._valid = element.check
        self._bind(cf, backend._db.get_column_family_handle(meta.name))

    def _bind(self, cf: Any, handle: Any) -> None:
        # bound methods of the column family, cached: the hot path is one C call per operation
        self._cf = cf
        self._handle = handle
        self._get = cf.get
        self._put = cf.put
        self._del = cf.delete

    def _prefix(self) -> bytes:
        prefix = self._b._prefix
        if prefix is None:
            raise self._b.no_key(self._name)
        return prefix

    def _scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) of every entry under ``prefix``, in key order."""
        it = self._cf.iter()
        it.seek(prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                return
            yield key, it.value()
            it.next()

    def _delete_prefix(self, prefix: bytes) -> None:
        batch = WriteBatch(raw_mode=True)
        self._delete_prefix_into(batch, prefix)
        if len(batch):
            self._b._db.write(batch)

    def _delete_prefix_into(self, batch: WriteBatch, prefix: bytes) -> None:
        """Add deletes of every entry under ``prefix`` to ``batch``."""
        handle = self._handle
        for key in self._cf.keys(from_key=prefix):
            if not key.startswith(prefix):
                break
            batch.delete(key, handle)


class RocksDBValueState(_RocksState, ValueState):
    """Value state: one entry under the key's prefix."""

    __slots__ = ()

    def value(self) -> Any:
        prefix = self._b._prefix
        if prefix is None:
            raise self._b.no_key(self._name)
        data = self._get(prefix)
        return None if data is None else self._de(data)

    def update(self, value: Any) -> None:
        prefix = self._b._prefix
        if prefix is None:
            raise self._b.no_key(self._name)
        if value is None:
            self._del(prefix)
            return
        if self._valid(value) is not None:
            check_value(self._check, value, self._name)
        self._put(prefix, self._ser(value))

    def clear(self) -> None:
        self._del(self._prefix())


class RocksDBListState(_RocksState, ListState):
    """List state: one entry per element, keyed by an 8-byte sequence number, so appends are puts."""

    __slots__ = ()

    def _next_seq(self, prefix: bytes) -> int:
        it = self._cf.iter()
        it.seek_for_prev(prefix + _SEQ_MAX)
        if it.valid():
            key = it.key()
            if key.startswith(prefix) and len(key) == len(prefix) + 8:
                return int.from_bytes(key[-8:], "big") + 1
        return 0

    def get(self) -> list[Any]:
        de = self._de
        return [de(v) for _, v in self._scan(self._prefix())]

    def add(self, value: Any) -> None:
        prefix = self._prefix()
        if value is None:
            raise StateError("cannot add None to a list state", self._name)
        check_value(self._check, value, self._name)
        seq = self._next_seq(prefix)
        self._put(prefix + seq.to_bytes(8, "big"), self._ser(value))

    def _validated(self, values: Iterable[Any] | None) -> list[Any]:
        values = [] if values is None else list(values)
        for v in values:
            if v is None:
                raise StateError("cannot add None to a list state", self._name)
            check_value(self._check, v, self._name)
        return values

    def _append(self, batch: WriteBatch, prefix: bytes, seq: int, values: list[Any]) -> None:
        ser, handle = self._ser, self._handle
        for i, v in enumerate(values, seq):
            batch.put(prefix + i.to_bytes(8, "big"), ser(v), handle)

    def add_all(self, values: Iterable[Any]) -> None:
        prefix = self._prefix()
        values = self._validated(values)
        if not values:
            return
        batch = WriteBatch(raw_mode=True)
        self._append(batch, prefix, self._next_seq(prefix), values)
        self._b._db.write(batch)

    def update(self, values: Iterable[Any] | None) -> None:
        prefix = self._prefix()
        values = self._validated(values)
        batch = WriteBatch(raw_mode=True)
        self._delete_prefix_into(batch, prefix)
        self._append(batch, prefix, 0, values)
        if len(batch):
            self._b._db.write(batch)

    def clear(self) -> None:
        self._delete_prefix(self._prefix())


class RocksDBMapState(_RocksState, MapState):
    """Map state: one entry per user key under the key's prefix; iteration is a prefix scan."""

    __slots__ = ("_kde", "_kser", "_ukey")

    def __init__(self, backend: RocksDBKeyedStateBackend, cf: Rdict, meta: StateMeta,
                 element: TypeSerializer, user_key: TypeSerializer) -> None:
        super().__init__(backend, cf, meta, element)
        self._ukey = user_key
        self._kser = packb if user_key.identity else user_key.serialize
        self._kde = unpackb if user_key.identity else user_key.deserialize

    def _value_bytes(self, value: Any) -> bytes:
        return b"" if value is None else self._ser(value)

    def get(self, key: Any) -> Any:
        data = self._get(self._prefix() + self._kser(key))
        return None if not data else self._de(data)

    def put(self, key: Any, value: Any) -> None:
        prefix = self._prefix()
        check_value(self._ukey, key, self._name)
        if value is not None:
            check_value(self._check, value, self._name)
        self._put(prefix + self._kser(key), self._value_bytes(value))

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        prefix = self._prefix()
        batch = WriteBatch(raw_mode=True)
        handle = self._handle
        for k, v in dict_value.items():
            check_value(self._ukey, k, self._name)
            if v is not None:
                check_value(self._check, v, self._name)
            batch.put(prefix + self._kser(k), self._value_bytes(v), handle)
        if len(batch):
            self._b._db.write(batch)

    def remove(self, key: Any) -> None:
        self._del(self._prefix() + self._kser(key))

    def contains(self, key: Any) -> bool:
        return self._get(self._prefix() + self._kser(key)) is not None

    def items(self) -> list[tuple[Any, Any]]:
        prefix = self._prefix()
        n = len(prefix)
        kde, de = self._kde, self._de
        return [(kde(k[n:]), de(v) if v else None) for k, v in self._scan(prefix)]

    def keys(self) -> list[Any]:
        prefix = self._prefix()
        n = len(prefix)
        kde = self._kde
        out = []
        for key in self._cf.keys(from_key=prefix):
            if not key.startswith(prefix):
                break
            out.append(kde(key[n:]))
        return out

    def values(self) -> list[Any]:
        de = self._de
        return [de(v) if v else None for _, v in self._scan(self._prefix())]

    def is_empty(self) -> bool:
        for _ in self._scan(self._prefix()):
            return False
        return True

    def clear(self) -> None:
        self._delete_prefix(self._prefix())


# --- the keyed backend ----------------------------------------------------------------------------


class RocksDBKeyedStateBackend(KeyedStateBackend):
    """Working state of one partition in its own RocksDB database (one column family per state)."""

    backend_name = "rocksdb"

    def __init__(self, key_serializer: TypeSerializer, key_group_range: KeyGroupRange,
                 max_parallelism: int, clock: Callable[[], int] | None = None, *,
                 instance_dir: str, options: Callable[[], Options],
                 incremental: bool = False, transfer_threads: int = 1,
                 ttl_compaction_filter: bool = True) -> None:
        self._prefix: bytes | None = None
        self._prefix_caches: dict[type, dict[Any, bytes]] = {str: {}, int: {}, bytes: {}}
        self._key_ser = packb if key_serializer.identity else key_serializer.serialize
        self._kgp = [kg.to_bytes(2, "big") for kg in range(max_parallelism)]
        super().__init__(key_serializer, key_group_range, max_parallelism, clock, True)
        self.instance_dir = Path(instance_dir)
        self.db_path = self.instance_dir / "db"
        self._options = options
        self.incremental = incremental
        self.transfer_threads = max(1, int(transfer_threads))
        self.ttl_compaction_filter = ttl_compaction_filter
        self._wo = _write_options()
        self._db: Any = None
        self._cfs: dict[str, Rdict] = {}
        self._state_info: dict[str, dict[str, Any]] = {}  # name -> {"layout", "kind"}
        self._rstates: dict[str, _RocksState] = {}
        self._metas: dict[str, StateMeta] = {}
        self._sweep_cursor: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._pending: dict[int, dict[str, dict[str, Any]]] = {}
        self._confirmed: dict[str, dict[str, Any]] = {}
        self._confirmed_id = -1
        self._pid = os.getpid()
        self._disposed = False
        _live_backends.add(self)

    # --- current key: the key-group prefix is computed once per key --------------------------------

    @property  # type: ignore[override]
    def current_key(self) -> Any:
        return self._current_key

    @current_key.setter
    def current_key(self, key: Any) -> None:
        self.set_current_key(key)

    def set_current_key(self, key: Any) -> None:
        """Set the current key and compute its key-group prefix once for all state accesses."""
        self._current_key = key
        # prefixes of str/int/bytes keys are cached, one dict per exact type (keeps 1, 1.0 and
        # True apart, which compare equal but serialize differently)
        cache = self._prefix_caches.get(type(key))
        if cache is not None:
            prefix = cache.get(key)
            if prefix is None:
                kb = self._key_ser(key)
                prefix = self._kgp[key_group_for_bytes(kb, self.max_parallelism)] + kb
                if len(cache) >= _PREFIX_CACHE_SIZE:
                    cache.clear()
                cache[key] = prefix
            self._prefix = prefix
        elif key is NO_KEY:
            self._prefix = None
        else:
            kb = self._key_ser(key)
            self._prefix = self._kgp[key_group_for_bytes(kb, self.max_parallelism)] + kb

    # --- the database ------------------------------------------------------------------------------

    def _ensure_open(self) -> Any:
        if self._db is None:
            if self._disposed:
                raise StateError("the RocksDB state backend was disposed")
            self.db_path.parent.mkdir(parents=True, exist_ok=True)
            self._db = open_db(self.db_path, self._options)
            self._db.set_write_options(self._wo)
            self._pid = os.getpid()
        return self._db

    def _cf(self, name: str) -> Rdict:
        cf = self._cfs.get(name)
        if cf is None:
            db = self._ensure_open()
            try:
                cf = db.get_column_family(name)
            except Exception:
                cf = db.create_column_family(name, self._options())
            cf.set_write_options(self._wo)
            self._cfs[name] = cf
        return cf

    def _create_state(self, meta: StateMeta) -> State:
        cf = self._cf(meta.name)
        self._state_info[meta.name] = {"layout": meta.layout, "kind": meta.kind}
        self._metas[meta.name] = meta
        stored = meta.stored_serializer
        state: _RocksState
        if meta.kind == "value":
            state = RocksDBValueState(self, cf, meta, stored)
        elif meta.kind == "list":
            state = RocksDBListState(self, cf, meta, stored.element)  # type: ignore[attr-defined]
        else:
            state = RocksDBMapState(self, cf, meta, stored.value, stored.key)  # type: ignore[attr-defined]
        self._rstates[meta.name] = state
        return state  # type: ignore[return-value]

    def _state_names(self) -> list[str]:
        return sorted(self._state_info)

    def _poison(self, why: str, error: type[Exception] = StateError) -> None:
        bad = _Unusable(why, error)
        for state in self._rstates.values():
            state._bind(bad, bad)
        self._cfs.clear()

    def _forked(self) -> None:
        """In a forked child: the parent owns the database; never touch (or delete) it here.

        The native handles are leaked on purpose: releasing them would run RocksDB code whose
        mutexes a parent thread may have held at fork time (a deadlock in the child).
        """
        _inherited.append((self._db, list(self._cfs.values()),
                           [(state._cf, state._handle) for state in self._rstates.values()]))
        self._poison(
            f"this RocksDB state backend was opened in process {self._pid} before a fork; "
            "RocksDB is not fork-safe, so create the backend (open the database) after forking",
            BackendLockedError,
        )
        self._db = _Unusable("database inherited through fork")
        self._disposed = True

    def close(self) -> None:
        """Flush and close the database, keeping its files (releases the process lock)."""
        if self._db is None or isinstance(self._db, _Unusable):
            return
        self._poison("the RocksDB state backend was closed")
        db, self._db = self._db, None
        try:
            db.flush()
        finally:
            db.close()

    def _bulk_state(self, descriptor: StateDescriptor) -> RocksDBValueState | None:
        state = self.get_partitioned_state(descriptor)
        return state if isinstance(state, RocksDBValueState) else None

    def _prefixes(self, keys: Sequence[Any]) -> list[bytes]:
        prefixes = []
        for key in keys:
            self.set_current_key(key)
            prefixes.append(self._prefix)
        return prefixes

    def bulk_get(self, descriptor: StateDescriptor, keys: Sequence[Any]) -> list[Any]:
        """Values of a value state for many keys: one batched multi-get."""
        state = self._bulk_state(descriptor)
        if state is None:  # wrapped (size limits): go through the state API
            value = self.get_partitioned_state(descriptor).value  # type: ignore[attr-defined]
            return [value() for _ in self._each(keys)]
        de = state._de
        return [None if v is None else de(v) for v in state._cf.get(self._prefixes(keys))]

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
        batch = WriteBatch(raw_mode=True)
        handle, ser, valid = state._handle, state._ser, state._valid
        for prefix, value in zip(self._prefixes(keys), values, strict=True):
            if value is None:
                batch.delete(prefix, handle)
            else:
                if valid(value) is not None:
                    check_value(state._check, value, descriptor.name)
                batch.put(prefix, ser(value), handle)
        self._ensure_open().write(batch)

    def _each(self, keys: Sequence[Any]) -> Iterator[Any]:
        for key in keys:
            self.set_current_key(key)
            yield key

    def dispose(self) -> None:
        if self._disposed:
            return
        if self._db is not None and not isinstance(self._db, _Unusable):
            self._poison("the RocksDB state backend was disposed")
            db, self._db = self._db, None
            try:
                db.close()
            except Exception:  # noqa: S110 - the directory is deleted below anyway
                pass
        self._disposed = True
        self._states.clear()
        workdirs.remove(self.instance_dir)
        _live_backends.discard(self)

    # --- TTL cleanup (what Flink's compaction filter does, bounded per checkpoint) ---------------------

    def _ttl_sweep(self) -> None:
        if not self.ttl_compaction_filter:
            return
        for name, meta in self._metas.items():
            if meta.ttl is None:
                continue
            registered = self._states.get(name)
            config = registered[0].ttl_config if registered else None
            if config is None or config.get_cleanup_strategies(
            ).get_rocksdb_compact_filter_cleanup_strategy() is None:
                continue
            self._sweep_state(name, meta)

    def _sweep_state(self, name: str, meta: StateMeta) -> None:
        policy = meta.ttl
        assert policy is not None
        now = policy.clock()
        limit = now - policy.ttl
        cf = self._cfs[name]
        handle = self._db.get_column_family_handle(name)
        batch = WriteBatch(raw_mode=True)
        it = cf.iter()
        it.seek(self._sweep_cursor.get(name, b""))
        seen = 0
        while it.valid() and seen < _TTL_SWEEP_BUDGET:
            value = it.value()
            if value and _expired(value, limit):
                batch.delete(it.key(), handle)
            seen += 1
            it.next()
        self._sweep_cursor[name] = it.key() if it.valid() else b""
        del it
        if len(batch):
            self._db.write(batch)

    # --- snapshots ---------------------------------------------------------------------------------

    def snapshot(self, checkpoint_id: int, streams: CheckpointStreams, *,
                 savepoint: bool = False) -> SnapshotRun:
        start = time.perf_counter()
        db = self._ensure_open()
        if isinstance(db, _Unusable):
            raise BackendLockedError("database inherited through fork")
        self._ttl_sweep()
        for name in self._state_names():
            self._cf(name)  # restored-but-unregistered states are column families too
        # create_checkpoint flushes every column family's memtable first (log_size_for_flush=0),
        # so the hard-linked files hold everything written with the WAL disabled
        target = self.instance_dir / f"chk-{checkpoint_id}-{uuid.uuid4().hex[:8]}"
        checkpoint = Checkpoint(db)
        try:
            checkpoint.create_checkpoint(str(target))
        finally:
            del checkpoint
        info = {name: dict(self._state_info[name]) for name in self._state_names()}
        base = dict(self._confirmed) if self.incremental and not savepoint else {}
        metas = dict(self._metas)
        expiring = {name: meta.ttl.clock() - meta.ttl.ttl
                    for name, meta in metas.items()
                    if meta.ttl is not None and meta.ttl.cleanup_full_snapshot}

        def run() -> dict[str, Any]:
            try:
                if savepoint:
                    return self._write_savepoint(target, streams, info, metas)
                if expiring:
                    self._drop_expired_in(target, expiring)
                return self._upload(checkpoint_id, target, streams, info, base)
            finally:
                shutil.rmtree(target, ignore_errors=True)

        def cancel() -> None:
            shutil.rmtree(target, ignore_errors=True)

        return SnapshotRun(run, time.perf_counter() - start, cancel=cancel)

    def _drop_expired_in(self, target: Path, expiring: dict[str, int]) -> None:
        """TTL full-snapshot cleanup, off the processing thread: delete expired entries in the copy.

        The native checkpoint is a separate database (hard-linked, immutable SSTs); tombstones
        written into it hide the expired entries from every restore of this checkpoint.
        """
        def options() -> Options:
            opts = self._options()
            opts.set_disable_auto_compactions(True)
            return opts

        db = open_db(target, options)
        try:
            for name, limit in expiring.items():
                cf = db.get_column_family(name)
                handle = db.get_column_family_handle(name)
                batch = WriteBatch(raw_mode=True)
                for key, value in cf.items():
                    if value and _expired(value, limit):
                        batch.delete(key, handle)
                if len(batch):
                    db.write(batch)
                    cf.flush()
                del cf, handle
        finally:
            db.close()

    def _pool_map(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        if self.transfer_threads <= 1 or len(items) <= 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(max_workers=self.transfer_threads,
                                thread_name_prefix="statekit-rocksdb-transfer") as pool:
            return list(pool.map(fn, items))

    def _upload(self, checkpoint_id: int, target: Path, streams: CheckpointStreams,
                info: dict[str, Any], base: dict[str, dict[str, Any]]) -> dict[str, Any]:
        files = sorted(p for p in target.iterdir() if p.is_file())
        sst: dict[str, dict[str, Any]] = {}
        reused = 0
        todo = []
        for path in files:
            if path.suffix == ".sst":
                previous = base.get(path.name)
                if previous is not None and previous.get("size") == path.stat().st_size:
                    sst[path.name] = previous
                    reused += 1
                    continue
            todo.append(path)
        incremental = self.incremental

        def upload(path: Path) -> tuple[str, dict[str, Any]]:
            # streamed: a kernel copy / streamed upload, the crc computed alongside
            if path.suffix == ".sst":
                shared = path.name if incremental else None
                return path.name, streams.write_file(path, state_name=path.name, shared_name=shared)
            return path.name, streams.write_file(path, state_name=path.name)

        misc: dict[str, dict[str, Any]] = {}
        for name, handle in self._pool_map(upload, todo):
            (sst if name.endswith(".sst") else misc)[name] = handle
        if incremental:
            with self._lock:
                self._pending[checkpoint_id] = dict(sst)
        return {
            "format": ROCKSDB_FORMAT,
            "backend": self.backend_name,
            "key_group_range": self.key_group_range.to_list(),
            "max_parallelism": self.max_parallelism,
            "incremental": incremental,
            "states": info,
            "sst": sst,
            "misc": misc,
            "reused_sst": reused,
        }

    def _write_savepoint(self, target: Path, streams: CheckpointStreams, info: dict[str, Any],
                         metas: dict[str, StateMeta]) -> dict[str, Any]:
        db = open_db(target, self._options, read_only=True)
        states: dict[str, Any] = {}
        try:
            for name, entry in info.items():
                data = KvStateData(entry["layout"], entry["kind"])
                cf = db.get_column_family(name)
                meta = metas.get(name)
                policy = meta.ttl if meta is not None else None
                drop = policy is not None and policy.cleanup_full_snapshot
                limit = policy.clock() - policy.ttl if drop else 0  # type: ignore[union-attr]
                for kg, kb, value in _grouped(cf, entry["kind"]):
                    if drop:
                        value = _drop_expired(entry["kind"], value, limit)
                        if value is None:
                            continue
                    data.add(kg, kb, value)
                del cf
                states[name] = write_kv_state(streams, name, data)
        finally:
            db.close()
        return kv_handle(self, states)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        with self._lock:
            ssts = self._pending.pop(checkpoint_id, None)
            if ssts is not None and checkpoint_id > self._confirmed_id:
                self._confirmed = ssts
                self._confirmed_id = checkpoint_id
            for cid in [c for c in self._pending if c < checkpoint_id]:
                del self._pending[cid]

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        with self._lock:
            self._pending.pop(checkpoint_id, None)

    # --- restore -------------------------------------------------------------------------------------

    def restore(self, handles: list[dict[str, Any]], reader: StateReader) -> None:
        if self._states:
            raise StateError("restore must happen before any state is registered")
        mine = self.key_group_range
        native, neutral = [], []
        for handle in handles:
            fmt = handle.get("format")
            kgr = KeyGroupRange.of(handle["key_group_range"])
            if len(kgr.intersection(mine)) == 0:
                continue
            if fmt == ROCKSDB_FORMAT:
                if int(handle.get("max_parallelism", self.max_parallelism)) != self.max_parallelism:
                    raise CorruptCheckpointError(
                        f"checkpoint was taken with max_parallelism {handle['max_parallelism']}, "
                        f"this job uses {self.max_parallelism}"
                    )
                native.append((len(kgr.intersection(mine)), handle))
            elif fmt in KV_FORMATS:
                neutral.append(handle)
            else:
                raise CorruptCheckpointError(f"cannot restore snapshot format {fmt!r} into RocksDB")
        self._reset_db()
        native.sort(key=lambda pair: -pair[0])
        if native:
            base = native[0][1]
            self._download(base, reader, self.db_path)
            db = self._ensure_open()
            lo, hi = self._kgp[mine.start], _kg_after(mine.end, self._kgp)
            for name in base["states"]:
                cf = self._cf(name)
                if mine.start > 0:
                    cf.delete_range(b"", lo)
                cf.delete_range(hi, _KG_END)
            self._note_states(base)
            del db
            for _, handle in native[1:]:
                self._copy_from(handle, reader)
        if neutral:
            self._ingest_kv(neutral, reader)
        if not native and not neutral:
            self._ensure_open()

    def _reset_db(self) -> None:
        if self._db is not None:
            self._poison("database replaced by restore")
            db, self._db = self._db, None
            db.close()
        self._cfs.clear()
        shutil.rmtree(self.db_path, ignore_errors=True)

    def _note_states(self, handle: dict[str, Any]) -> None:
        for name, entry in handle["states"].items():
            self._restored_layouts[name] = entry["layout"]
            self._state_info[name] = {"layout": entry["layout"], "kind": entry["kind"]}

    def _download(self, handle: dict[str, Any], reader: StateReader, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        files = list(handle.get("sst", {}).items()) + list(handle.get("misc", {}).items())
        for name, _ in files:
            if "/" in name or name.startswith(".") or not name:
                raise CorruptCheckpointError(f"unsafe file name {name!r} in a RocksDB checkpoint")

        def fetch(item: tuple[str, dict[str, Any]]) -> None:
            # SST files are immutable: a local-disk store may hard-link them (Flink's local
            # recovery); MANIFEST, CURRENT, OPTIONS... are copied, RocksDB may rewrite them
            name, file_handle = item
            reader.read_file(file_handle, dest / name, allow_link=name.endswith(".sst"))

        self._pool_map(fetch, files)

    def _copy_from(self, handle: dict[str, Any], reader: StateReader) -> None:
        """Copy the in-range key groups of another partition's checkpoint into this database."""
        theirs = KeyGroupRange.of(handle["key_group_range"]).intersection(self.key_group_range)
        tmp = Path(tempfile.mkdtemp(prefix="restore-", dir=self.instance_dir))
        try:
            self._download(handle, reader, tmp / "db")
            src = open_db(tmp / "db", self._options, read_only=True)
            try:
                lo, hi = self._kgp[theirs.start], _kg_after(theirs.end, self._kgp)
                for name in handle["states"]:
                    source = src.get_column_family(name)
                    self._cf(name)
                    target = self._db.get_column_family_handle(name)
                    batch = WriteBatch(raw_mode=True)
                    for key, value in source.items(from_key=lo):
                        if key >= hi:
                            break
                        batch.put(key, value, target)
                        if len(batch) >= _BATCH:
                            self._db.write(batch)
                            batch = WriteBatch(raw_mode=True)
                    if len(batch):
                        self._db.write(batch)
                    del source
            finally:
                src.close()
            self._note_states(handle)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _ingest_kv(self, handles: list[dict[str, Any]], reader: StateReader) -> None:
        """Load backend-neutral chunks (heap checkpoints, savepoints) as RocksDB entries."""
        self._ensure_open()
        batch = WriteBatch(raw_mode=True)
        kgp = self._kgp
        for name, entry, kg, keys, values in read_kv_states(handles, reader, self.key_group_range,
                                                            self.max_parallelism):
            self._restored_layouts[name] = entry["layout"]
            self._state_info[name] = {"layout": entry["layout"], "kind": entry["kind"]}
            self._cf(name)
            handle = self._db.get_column_family_handle(name)
            kind = entry["kind"]
            for kb, vb in zip(keys, values, strict=True):
                prefix = kgp[kg] + kb
                if kind == "value":
                    batch.put(prefix, vb, handle)
                elif kind == "list":
                    for i, elem in enumerate(_split_array(vb)):
                        batch.put(prefix + i.to_bytes(8, "big"), elem, handle)
                else:
                    for pair in _split_array(vb):
                        uk, uv = _split_array(pair)
                        batch.put(prefix + uk, b"" if uv == _NIL else uv, handle)
            if len(batch) >= _BATCH:
                self._db.write(batch)
                batch = WriteBatch(raw_mode=True)
        if len(batch):
            self._db.write(batch)


def _kg_after(end: int, kgp: list[bytes]) -> bytes:
    return kgp[end + 1] if end + 1 < len(kgp) else (end + 1).to_bytes(2, "big")


def _grouped(cf: Rdict, kind: str) -> Iterator[tuple[int, bytes, bytes]]:
    """(key group, serialized key, backend-neutral serialized value) per key, in key order."""
    if kind == "value":
        for key, value in cf.items():
            yield int.from_bytes(key[:2], "big"), key[2:], value
        return
    prefix: bytes | None = None
    parts: list[bytes] = []
    for key, value in cf.items():
        if prefix is None or not key.startswith(prefix):
            if prefix is not None and parts:
                yield int.from_bytes(prefix[:2], "big"), prefix[2:], _combine(kind, parts)
            prefix = key[:-8] if kind == "list" else key[: 2 + _object_length(key, 2)]
            parts = []
        if kind == "list":
            parts.append(value)
        else:
            parts.append(b"\x92" + key[len(prefix):] + (value or _NIL))
    if prefix is not None and parts:
        yield int.from_bytes(prefix[:2], "big"), prefix[2:], _combine(kind, parts)


def _expired(value: bytes, limit: int) -> bool:
    try:
        stamp = unpackb(value)[1]
    except Exception:  # not a TTL-stamped value
        return False
    return isinstance(stamp, int) and stamp <= limit


def _combine(kind: str, parts: list[bytes]) -> bytes:
    return _array_header(len(parts)) + b"".join(parts)


def _drop_expired(kind: str, value: bytes, limit: int) -> bytes | None:
    """``value`` without TTL entries stamped at or before ``limit`` (None when nothing is left)."""
    if kind == "value":
        return None if unpackb(value)[1] <= limit else value
    parts = _split_array(value)
    if kind == "list":
        kept = [p for p in parts if unpackb(p)[1] > limit]
    else:
        kept = []
        for pair in parts:
            _, uv = _split_array(pair)
            if uv == _NIL or unpackb(uv)[1] > limit:
                kept.append(pair)
    if not kept:
        return None
    return value if len(kept) == len(parts) else _combine(kind, kept)


# --- the factories ---------------------------------------------------------------------------------


def _local_path(path: Any, key: str = "state.backend.rocksdb.localdir") -> str:
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(key, f"expected a local directory path, got {path!r}")
    path = path.strip()
    if path.startswith("file://"):
        path = path[len("file://"):]
    elif "://" in path:
        raise ConfigError(key, f"{path!r}: RocksDB working directories must be local paths")
    return os.path.abspath(os.path.expanduser(path))


class EmbeddedRocksDBStateBackend(StateBackend):
    """Working state in embedded RocksDB (via rocksdict): state larger than memory, native snapshots.

    Snapshots are always asynchronous; incremental checkpoints are opt-in, as in Flink.
    """

    name = "rocksdb"
    DEFAULT_TRANSFER_THREADS = 1

    def __init__(self, enable_incremental_checkpointing: bool | None = None) -> None:
        super().__init__(True)
        self._incremental: bool | None = (
            None if enable_incremental_checkpointing is None
            else parse_bool("execution.checkpointing.incremental",
                             enable_incremental_checkpointing)
        )
        self._paths: list[str] | None = None
        self._predefined: PredefinedOptions | None = None
        self._options_factory: OptionsFactory | str | None = None
        self._threads: int | None = None
        self._ttl_filter: bool | None = None

    # --- PyFlink getters and setters ------------------------------------------------------------

    def is_incremental_checkpoints_enabled(self) -> bool:
        """Whether checkpoints upload only new SST files (default False, as in Flink)."""
        return bool(self._incremental)

    def set_db_storage_paths(self, *paths: str | None) -> None:
        """Local directories for the databases' files, spread across them; None resets the default."""
        if not paths or (len(paths) == 1 and paths[0] is None):
            self._paths = None
            return
        flat: list[Any] = []
        for p in paths:
            flat.extend(p if isinstance(p, list | tuple) else [p])
        self._paths = [_local_path(p) for p in flat]

    def working_roots(self) -> list[str]:
        """Where this backend's instances keep their working directories."""
        return self._paths or [os.path.join(tempfile.gettempdir(), "statekit-rocksdb")]

    def get_db_storage_paths(self) -> list[str] | None:
        """The configured local directories, or None (then the temp directory is used)."""
        return None if self._paths is None else list(self._paths)

    def set_predefined_options(self, options: PredefinedOptions) -> None:
        """Select a pre-tuned option profile (see :class:`PredefinedOptions`)."""
        if options is None:
            raise ConfigError("state.backend.rocksdb.predefined-options", "must not be None")
        self._predefined = PredefinedOptions.parse(options)

    def get_predefined_options(self) -> PredefinedOptions:
        """The option profile in use (``PredefinedOptions.DEFAULT`` unless set)."""
        return self._predefined or PredefinedOptions.DEFAULT

    def set_options(self, options_factory: OptionsFactory | str) -> None:
        """An options factory (callable or dotted name) adjusting rocksdict ``Options`` on top."""
        resolve_options_factory(options_factory)  # fail early on a bad name
        self._options_factory = options_factory

    def get_options(self) -> OptionsFactory | str | None:
        """The options factory as set (callable or dotted name), or None."""
        return self._options_factory

    def set_number_of_transfering_threads(self, number_of_transfering_threads: int) -> None:
        """Threads uploading and downloading files while snapshotting and restoring."""
        self._threads = self._parse_threads(number_of_transfering_threads)

    def get_number_of_transfering_threads(self) -> int:
        """Threads used to transfer files (default 1)."""
        return self._threads or self.DEFAULT_TRANSFER_THREADS

    def enable_ttl_compaction_filter(self) -> None:
        """Clean up expired TTL state in the background (the default)."""
        self._ttl_filter = True

    def disable_ttl_compaction_filter(self) -> None:
        """Stop background cleanup of expired TTL state."""
        self._ttl_filter = False

    def is_ttl_compaction_filter_enabled(self) -> bool:
        """Whether expired TTL state is cleaned up in the background (default True)."""
        return True if self._ttl_filter is None else self._ttl_filter

    @staticmethod
    def _parse_threads(value: Any) -> int:
        key = "state.backend.rocksdb.checkpoint.transfer.thread.num"
        n = parse_int(key, value)
        if n < 1:
            raise ConfigError(key, f"expected a positive number of threads, got {value!r}")
        return n

    # --- configuration ----------------------------------------------------------------------------

    def configure(self, config: dict[str, Any]) -> EmbeddedRocksDBStateBackend:
        """A copy with flat configuration keys applied; settings made in code take precedence."""
        new = copy.copy(self)
        for key in ("execution.checkpointing.incremental", "state.backend.incremental"):
            if key in config and self._incremental is None:
                new._incremental = parse_bool(key, config[key])
                break
        key = "state.backend.rocksdb.localdir"
        if key in config and self._paths is None and config[key] not in (None, ""):
            value = config[key]
            if isinstance(value, str):
                seps = ",;" if "://" in value else ",;" + os.pathsep
                value = [p for p in re.split(f"[{re.escape(seps)}]", value) if p.strip()]
            elif not isinstance(value, list | tuple):
                value = [value]
            new._paths = [_local_path(p, key) for p in value]
        key = "state.backend.rocksdb.predefined-options"
        if key in config and self._predefined is None:
            new._predefined = PredefinedOptions.parse(config[key], key)
        key = "state.backend.rocksdb.options-factory"
        if key in config and self._options_factory is None and config[key] not in (None, ""):
            resolve_options_factory(config[key], key)
            new._options_factory = config[key]
        key = "state.backend.rocksdb.checkpoint.transfer.thread.num"
        if key in config and self._threads is None:
            new._threads = self._parse_threads(config[key])
        key = "state.backend.rocksdb.ttl.compaction.filter.enabled"
        if key in config and self._ttl_filter is None:
            new._ttl_filter = parse_bool(key, config[key])
        return new

    # --- keyed backends ---------------------------------------------------------------------------

    def _options_builder(self) -> Callable[[], Options]:
        predefined = self.get_predefined_options()
        factory = resolve_options_factory(self._options_factory)

        def build() -> Options:
            return build_options(predefined, factory)

        return build

    def _instance_dir(self, operator_id: str, key_group_range: KeyGroupRange) -> str:
        roots = self.working_roots()
        root = roots[0] if len(roots) == 1 else random.choice(roots)
        prefix = (f"{_UNSAFE.sub('_', operator_id)[:64]}-kg{key_group_range.start}-"
                  f"{key_group_range.end}-")
        return str(workdirs.create(root, prefix))  # removed on dispose, at exit, or by a sweep

    def create_keyed_state_backend(self, *, key_serializer: TypeSerializer,
                                   key_group_range: KeyGroupRange, max_parallelism: int,
                                   operator_id: str = "op",
                                   clock: Callable[[], int] | None = None
                                   ) -> RocksDBKeyedStateBackend:
        return RocksDBKeyedStateBackend(
            key_serializer, key_group_range, max_parallelism, clock,
            instance_dir=self._instance_dir(operator_id, key_group_range),
            options=self._options_builder(),
            incremental=self.is_incremental_checkpoints_enabled(),
            transfer_threads=self.get_number_of_transfering_threads(),
            ttl_compaction_filter=self.is_ttl_compaction_filter_enabled(),
        )

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(incremental={self.is_incremental_checkpoints_enabled()}, "
                f"predefined_options={self.get_predefined_options().name})")


class RocksDBStateBackend(EmbeddedRocksDBStateBackend):
    """PyFlink's seed facade: embedded RocksDB working state plus file-system checkpoints.

    ``checkpoint_data_uri`` creates an ``FsStateBackend`` the checkpoints are written through;
    ``checkpoint_stream_backend`` supplies one (any backend with a default checkpoint storage).
    """

    def __init__(self, checkpoint_data_uri: str | None = None,
                 enable_incremental_checkpointing: bool | None = None,
                 checkpoint_stream_backend: StateBackend | None = None) -> None:
        super().__init__(enable_incremental_checkpointing)
        from statekit.backends.legacy import FsStateBackend

        if checkpoint_stream_backend is not None:
            if checkpoint_stream_backend.default_checkpoint_storage() is None:
                raise ConfigError("state.checkpoints.dir",
                                  "checkpoint_stream_backend has no checkpoint storage")
            self._checkpoint_backend = checkpoint_stream_backend
        elif checkpoint_data_uri:
            self._checkpoint_backend = FsStateBackend(checkpoint_data_uri)
        else:
            raise ConfigError("state.checkpoints.dir", "RocksDBStateBackend needs "
                              "checkpoint_data_uri or checkpoint_stream_backend")

    def get_checkpoint_backend(self) -> StateBackend:
        """The backend whose checkpoint storage persists this backend's snapshot bytes."""
        return self._checkpoint_backend

    def default_checkpoint_storage(self) -> CheckpointStorage | None:
        return self._checkpoint_backend.default_checkpoint_storage()

    def __repr__(self) -> str:
        return (f"RocksDBStateBackend({self._checkpoint_backend!r}, "
                f"incremental={self.is_incremental_checkpoints_enabled()})")
