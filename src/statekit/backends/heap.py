"""The heap backend: working state as Python objects in dicts (Flink's ``HashMapStateBackend``).

Snapshots are copy-on-write: the synchronous part copies each table's dict (references only);
afterwards any in-place change or hand-out of a value a pending snapshot still shares copies that
value first, so the snapshot sees exactly the state at capture time.  The synchronous part is a
C-level dict copy per table (references only, no serialization); serialization and upload run on
the transfer threads in paced slices so the processing thread keeps most of the GIL.

Incremental mode (``HashMapStateBackend(incremental=True)``) tracks the keys written since the last
confirmed checkpoint and writes only a changelog of them (puts with full values, removes), grouped by
key group, as a shared file; every ``materialization_interval`` checkpoints (or when the log grows
past ``max_log_ratio`` of the base) it writes a full base instead, so recovery replays a bounded log.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from statekit.backends.base import (
    KV_FORMAT,
    NO_KEY,
    KeyedStateBackend,
    KvStateData,
    SnapshotRun,
    StateBackend,
    StateMeta,
    check_kv_handle,
    group_entries,
    kv_handle,
    plain_in_range,
    plain_parts,
    read_kv_entry,
    read_plain_entry,
    write_plain_entry,
)
from statekit.checkpoint.streams import CheckpointStreams, StateReader
from statekit.errors import CheckpointError, ConfigError, CorruptCheckpointError, StateError
from statekit.serde.keygroups import KeyGroupRange, key_group_for_bytes
from statekit.serde.types import TypeSerializer, packb, unpackb
from statekit.state.api import ListState, MapState, State, ValueState, check_value
from statekit.state.descriptors import StateDescriptor
from statekit.values import parse_bool, parse_float, parse_int

#: Format tag of incremental heap checkpoints: a base plus ordered changelogs, both key-grouped.
HEAP_CHANGELOG_FORMAT = "statekit-heap-changelog/1"


class HeapTable:
    """One state's key → stored value dict, plus copy-on-write bookkeeping for pending snapshots."""

    __slots__ = ("copy", "cow", "data", "dirty", "fresh", "meta", "pending")

    def __init__(self, meta: StateMeta, track_dirty: bool = False) -> None:
        self.meta = meta
        self.data: dict[Any, Any] = {}
        self.copy: Callable[[Any], Any] = meta.stored_serializer.copy
        self.cow = False  # a pending snapshot shares this table's values
        self.pending = 0
        self.fresh: set[Any] = set()  # keys whose values were copied since the last capture
        # keys written (or whose mutable value was handed out) since the last capture; None when
        # the backend is not incremental
        self.dirty: set[Any] | None = set() if track_dirty else None

    def take_dirty(self) -> set[Any]:
        """The dirty keys since the last call, resetting the set (incremental snapshots)."""
        dirty = self.dirty
        if dirty is None:
            return set()
        self.dirty = set()
        return dirty

    def own(self, key: Any, value: Any) -> Any:
        """``value`` made private to the live table (copied once if a snapshot shares it)."""
        if key in self.fresh:
            return value
        value = self.copy(value)
        self.data[key] = value
        self.fresh.add(key)
        return value

    def capture(self) -> dict[Any, Any]:
        """A frozen view for a snapshot: a shallow dict copy, with copy-on-write from now on."""
        view = dict(self.data)
        if not self.meta.stored_serializer.immutable:
            self.pending += 1
            self.cow = True
            self.fresh = set()
        return view

    def release(self) -> None:
        if not self.meta.stored_serializer.immutable and self.pending:
            self.pending -= 1
            if not self.pending:
                self.cow = False
                self.fresh = set()


class _HeapState:
    __slots__ = ("_b", "_check", "_exact", "_high", "_low", "_name", "_t")

    def __init__(self, backend: HeapKeyedStateBackend, table: HeapTable,
                 element: TypeSerializer) -> None:
        self._b = backend
        self._t = table
        self._name = table.meta.name
        self._check = element
        # values of exactly this type (within the bounds) need no call to ``element.check``
        self._exact, self._low, self._high = element.exact_type()

    def _needs_check(self, value: Any) -> bool:
        return type(value) is not self._exact or (
            self._low is not None and not self._low <= value <= self._high)

    def _check_all(self, values: list[Any]) -> None:
        """Validate a batch: one C-level pass when every element has the exact type."""
        exact = self._exact
        if exact is not None and set(map(type, values)) == {exact} and (
                self._low is None or (self._low <= min(values) and max(values) <= self._high)):
            return
        for v in values:
            if v is None:
                raise StateError("cannot add None to a list state", self._name)
            check_value(self._check, v, self._name)

    def _key(self) -> Any:
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        return key

    def clear(self) -> None:
        key = self._key()
        table = self._t
        if table.dirty is not None:
            table.dirty.add(key)
        table.data.pop(key, None)


class HeapValueState(_HeapState, ValueState):
    __slots__ = ()

    def value(self) -> Any:
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        table = self._t
        value = table.data.get(key)
        if value is not None and not table.meta.stored_serializer.immutable:
            if table.cow:
                value = table.own(key, value)
            if table.dirty is not None:  # a mutable value handed out may be changed in place
                table.dirty.add(key)
        return value

    def update(self, value: Any) -> None:
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        table = self._t
        if table.dirty is not None:
            table.dirty.add(key)
        if value is None:
            table.data.pop(key, None)
            return
        if type(value) is not self._exact or (
                self._low is not None and not self._low <= value <= self._high):  # inlined
            check_value(self._check, value, self._name)
        table.data[key] = value


class HeapListState(_HeapState, ListState):
    __slots__ = ()

    def _live(self, key: Any) -> list[Any] | None:
        table = self._t
        if table.dirty is not None:
            table.dirty.add(key)
        lst = table.data.get(key)
        if lst is not None and table.cow:
            lst = table.own(key, lst)
        return lst

    def get(self) -> list[Any]:
        return self._live(self._key()) or []

    def add(self, value: Any) -> None:
        key = self._key()
        if value is None:
            raise StateError("cannot add None to a list state", self._name)
        if self._needs_check(value):
            check_value(self._check, value, self._name)
        lst = self._live(key)
        if lst is None:
            self._t.data[key] = [value]
        else:
            lst.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        key = self._key()
        values = list(values)
        if not values:
            return
        self._check_all(values)
        lst = self._live(key)
        if lst is None:
            self._t.data[key] = values
        else:
            lst.extend(values)

    def update(self, values: Iterable[Any] | None) -> None:
        key = self._key()
        values = [] if values is None else list(values)
        if values:
            self._check_all(values)
        if self._t.dirty is not None:
            self._t.dirty.add(key)
        if values:
            self._t.data[key] = values
        else:
            self._t.data.pop(key, None)


class HeapMapState(_HeapState, MapState):
    __slots__ = ("_shared_reads", "_ukey", "_ukey_exact")

    def __init__(self, backend: HeapKeyedStateBackend, table: HeapTable,
                 element: TypeSerializer, user_key: TypeSerializer) -> None:
        super().__init__(backend, table, element)
        self._ukey = user_key
        exact, low, _ = user_key.exact_type()
        self._ukey_exact = exact if low is None else None  # bounded keys take the full check
        # immutable map values may be handed out without copy-on-write or dirty marking
        self._shared_reads = bool(getattr(element, "immutable", False))

    def _read(self, key: Any) -> dict[Any, Any] | None:
        if self._shared_reads:
            return self._t.data.get(key)
        return self._live(key)

    def _live(self, key: Any) -> dict[Any, Any] | None:
        table = self._t
        if table.dirty is not None:
            table.dirty.add(key)
        m = table.data.get(key)
        if m is not None and table.cow:
            m = table.own(key, m)
        return m

    def get(self, key: Any) -> Any:
        m = self._read(self._key())
        return None if m is None else m.get(key)

    def put(self, key: Any, value: Any) -> None:
        current = self._key()
        if type(key) is not self._ukey_exact:
            check_value(self._ukey, key, self._name)
        if value is not None and self._needs_check(value):
            check_value(self._check, value, self._name)
        m = self._live(current)
        if m is None:
            self._t.data[current] = {key: value}
        else:
            m[key] = value

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        for k, v in dict_value.items():
            self.put(k, v)

    def remove(self, key: Any) -> None:
        current = self._key()
        m = self._live(current)
        if m is not None:
            m.pop(key, None)
            if not m:
                del self._t.data[current]

    def contains(self, key: Any) -> bool:
        m = self._t.data.get(self._key())
        return m is not None and key in m

    def items(self) -> list[tuple[Any, Any]]:
        m = self._read(self._key())
        return [] if m is None else list(m.items())

    def keys(self) -> list[Any]:
        m = self._t.data.get(self._key())
        return [] if m is None else list(m)

    def values(self) -> list[Any]:
        m = self._read(self._key())
        return [] if m is None else list(m.values())

    def is_empty(self) -> bool:
        return not self._t.data.get(self._key())


class _Pacer:
    """Keeps a background writer from starving a busy processing thread of the GIL.

    After every slice of work the writer sleeps ``ratio`` times as long as the slice took (it
    then holds the GIL for at most ``1 / (1 + ratio)`` of wall time), but only while the
    processing thread works: when the backend's current key has not changed since the last slice
    (between micro-batches, or when the job waits for input) the writer runs at full speed.
    """

    __slots__ = ("_current", "_key", "_mark", "ratio")

    def __init__(self, ratio: float, current_key: Callable[[], Any]) -> None:
        self.ratio = ratio
        self._current = current_key
        self._key = current_key()
        self._mark = time.perf_counter()

    def __call__(self) -> None:
        now = time.perf_counter()
        key = self._current()
        if key is not self._key:
            self._key = key
            time.sleep((now - self._mark) * self.ratio)
        self._mark = time.perf_counter()


_SLICE = 2048  # entries serialized between two pacing pauses
# incremental attempts neither confirmed nor aborted that are tracked; older ones are folded back
# into the dirty sets (and can no longer become a base) so a caller that never notifies leaks nothing
_MAX_UNCONFIRMED = 16


def _group_view(view: dict[Any, Any], meta: StateMeta, max_parallelism: int,
                pace: Callable[[], None] | None) -> KvStateData:
    """``group_entries`` over a frozen view, pausing every slice when ``pace`` is given."""
    if pace is None:
        return group_entries(view.items(), meta, max_parallelism)
    data = KvStateData(meta.layout, meta.kind)
    key_ser = meta.key_serializer.serialize
    val_ser = meta.stored_serializer.serialize
    drop = meta.ttl.drop_expired if meta.ttl is not None and meta.ttl.cleanup_full_snapshot else None
    now = meta.ttl.clock() if drop is not None else 0  # type: ignore[union-attr]
    chunks = data.chunks
    for n, (key, stored) in enumerate(view.items(), 1):
        if n % _SLICE == 0:
            pace()
        if drop is not None:
            stored = drop(meta.kind, stored, now)
            if stored is None:
                continue
        kb = key_ser(key)
        kg = key_group_for_bytes(kb, max_parallelism)
        chunk = chunks.get(kg)
        if chunk is None:
            chunks[kg] = ([kb], [val_ser(stored)])
        else:
            chunk[0].append(kb)
            chunk[1].append(val_ser(stored))
    return data


def _plain_entries(view: dict[Any, Any], meta: StateMeta) -> tuple[list[Any], list[Any]]:
    """A frozen view's keys and stored values, without entries TTL full-snapshot cleanup drops."""
    drop = meta.ttl.drop_expired if meta.ttl is not None and meta.ttl.cleanup_full_snapshot else None
    if drop is None:
        return list(view), list(view.values())
    now = meta.ttl.clock()  # type: ignore[union-attr]
    keys, values = [], []
    for key, stored in view.items():
        stored = drop(meta.kind, stored, now)
        if stored is not None:
            keys.append(key)
            values.append(stored)
    return keys, values


def _table_parts(view: dict[Any, Any], meta: StateMeta, pace: Callable[[], None] | None
                 ) -> Iterator[bytes]:
    """A registered state's plain parts (lazy: the view is read when writing starts)."""
    keys, values = _plain_entries(view, meta)
    key_ser, stored = meta.key_serializer, meta.stored_serializer
    yield from plain_parts(keys, values, pace=pace,
                           key_plain=None if key_ser.identity else key_ser.to_plain,
                           value_plain=None if stored.identity else stored.to_plain)


class _Restored:
    """A restored state not registered yet: its layout and kind, and key -> plain stored value
    (converted by the state's serializer when the state is registered)."""

    __slots__ = ("data", "kind", "layout", "shared")

    def __init__(self, layout: list[Any], kind: str) -> None:
        self.layout = layout
        self.kind = kind
        self.data: dict[Any, Any] = {}
        self.shared = 0  # asynchronous snapshots still writing ``data`` (carried over)


def _changelog_blob(meta: StateMeta, view: dict[Any, Any], keys: Iterable[Any], max_parallelism: int,
                    pace: Callable[[], None] | None) -> tuple[dict[int, list[int]], bytes] | None:
    """One state's changes, key-grouped and indexed: per key group ``[puts' keys, puts' values,
    removed keys]``.  None when nothing changed."""
    key_ser = meta.key_serializer.serialize
    val_ser = meta.stored_serializer.serialize
    drop = meta.ttl.drop_expired if meta.ttl is not None and meta.ttl.cleanup_full_snapshot else None
    now = meta.ttl.clock() if drop is not None else 0  # type: ignore[union-attr]
    chunks: dict[int, tuple[list[bytes], list[bytes], list[bytes]]] = {}
    for n, key in enumerate(keys, 1):
        if pace is not None and n % _SLICE == 0:
            pace()
        kb = key_ser(key)
        kg = key_group_for_bytes(kb, max_parallelism)
        chunk = chunks.get(kg)
        if chunk is None:
            chunk = chunks[kg] = ([], [], [])
        stored = view.get(key)
        if stored is not None and drop is not None:
            stored = drop(meta.kind, stored, now)
        if stored is None:
            chunk[2].append(kb)
        else:
            chunk[0].append(kb)
            chunk[1].append(val_ser(stored))
    if not chunks:
        return None
    return _indexed_blob(chunks)


def _indexed_blob(chunks: dict[int, Any]) -> tuple[dict[int, list[int]], bytes]:
    """Pack key-group chunks into one blob with an index of ``[offset, length, crc]`` per group."""
    import zlib

    parts: list[bytes] = []
    index: dict[int, list[int]] = {}
    offset = 0
    for kg in sorted(chunks):
        blob = packb(list(chunks[kg]))
        index[kg] = [offset, len(blob), zlib.crc32(blob)]
        parts.append(blob)
        offset += len(blob)
    return index, b"".join(parts)


# one state as written by a snapshot: (name, kind, layout, encoding, payload), the payload being
# ``(index, blob)`` for an indexed entry and an iterable of packed parts for a plain one
_Part = tuple[str, str, list[Any], str, Any]


def _fork_serialize(produce: Callable[[], list[_Part]]) -> tuple[int, int]:
    """Fork a child that runs ``produce`` on its frozen copy of memory and streams the result
    into a pipe; returns ``(pid, read fd)``.  The parent never holds the GIL for serialization."""
    import os

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(read_fd)
            rows = []
            for name, kind, layout, encoding, payload in produce():
                if encoding == "plain":
                    rows.append([name, kind, layout, encoding, list(payload)])
                else:
                    index, blob = payload
                    rows.append([name, kind, layout, encoding,
                                 [[[kg, *loc] for kg, loc in index.items()], blob]])
            view = memoryview(packb(rows))
            while view:
                view = view[os.write(write_fd, view):]
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def _fork_collect(pid: int, read_fd: int) -> list[_Part]:
    """Read the child's serialized states and reap it."""
    import os

    from statekit.serde.types import unpackb

    chunks = []
    try:
        while True:
            data = os.read(read_fd, 1 << 20)
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
    if status != 0:
        raise CheckpointError(f"the snapshot child process failed (wait status {status})")
    parts: list[_Part] = []
    for name, kind, layout, encoding, payload in unpackb(b"".join(chunks)):
        if encoding != "plain":
            rows, blob = payload
            payload = ({int(row[0]): list(row[1:]) for row in rows}, blob)
        parts.append((name, kind, layout, encoding, payload))
    return parts


def _fork_kill(pid: int, read_fd: int) -> None:
    import os
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.close(read_fd)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


SNAPSHOT_MODES = ("thread", "fork")
DEFAULT_SNAPSHOT_MODE = "thread"


def _check_mode(mode: str, key: str = "state.backend.heap.snapshot-mode") -> str:
    """``thread`` (copy-on-write view written by a transfer thread) or ``fork`` (a child process
    serializes its frozen copy of memory); ``fork`` falls back to ``thread`` where unavailable."""
    import os

    mode = str(mode).strip().lower()
    if mode not in SNAPSHOT_MODES:
        raise ConfigError(key, f"expected one of {', '.join(SNAPSHOT_MODES)}, got {mode!r}")
    if mode == "fork" and not hasattr(os, "fork"):
        return "thread"
    return mode


def _entry_size(entry: dict[str, Any]) -> int:
    return int(entry["data"].get("size", 0))


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
                 pace_ratio: float = 1.0, snapshot_mode: str = "thread") -> None:
        super().__init__(key_serializer, key_group_range, max_parallelism, clock,
                         using_asynchronous_snapshots)
        self.tables: dict[str, HeapTable] = {}
        # restored, still serialized chunks of states not registered yet
        self._restored: dict[str, _Restored] = {}
        self.incremental = incremental
        self.materialization_interval = materialization_interval
        self.max_log_ratio = max_log_ratio
        self.pace_ratio = pace_ratio
        self.snapshot_mode = _check_mode(snapshot_mode)
        # the handle of the last confirmed (complete) incremental checkpoint: a valid base
        self._confirmed: dict[str, Any] | None = None
        # in-flight incremental attempts: dirty keys each captured, and its handle once written
        self._attempts: dict[int, dict[str, Any]] = {}

    def _create_state(self, meta: StateMeta) -> State:
        table = HeapTable(meta, track_dirty=self.incremental)
        self.tables[meta.name] = table
        stored = meta.stored_serializer
        restored = self._restored.pop(meta.name, None)
        if restored is not None:
            if stored.identity and not restored.shared:  # the restored dict becomes the table
                table.data = restored.data
            else:  # converted, and private copies while a snapshot still writes the originals
                from_plain, copy = stored.from_plain, stored.copy
                table.data = {key: copy(from_plain(plain)) if restored.shared else from_plain(plain)
                              for key, plain in restored.data.items()}
        if meta.kind == "value":
            return HeapValueState(self, table, stored)
        if meta.kind == "list":
            return HeapListState(self, table, stored.element)  # type: ignore[attr-defined]
        return HeapMapState(self, table, stored.value, stored.key)  # type: ignore[attr-defined]

    # --- snapshots ---------------------------------------------------------------------------------

    def _must_materialize(self) -> bool:
        base = self._confirmed
        if base is None:
            return True
        if len(base["logs"]) >= self.materialization_interval:
            return True
        return base["log_bytes"] > self.max_log_ratio * max(1, base["base_bytes"])

    def snapshot(self, checkpoint_id: int, streams: CheckpointStreams, *,
                 savepoint: bool = False) -> SnapshotRun:
        """Capture now (a dict copy per table with copy-on-write, or a fork), write later.

        Full snapshots and savepoints are ``KV_FORMAT``; incremental checkpoints are
        ``HEAP_CHANGELOG_FORMAT`` handles referencing a shared base and shared changelogs.
        """
        start = time.perf_counter()
        asynchronous = self.asynchronous
        use_fork = asynchronous and self.snapshot_mode == "fork"
        tables = list(self.tables.values())
        if asynchronous and not use_fork:
            views = [(t, t.capture()) for t in tables]
        else:  # synchronous, or a forked child that sees memory frozen at fork time
            views = [(t, t.data) for t in tables]
        restored = dict(self._restored)
        incremental = self.incremental and not savepoint
        materialize = True
        changed: dict[str, set[Any]] = {}
        base = self._confirmed
        if incremental:
            materialize = self._must_materialize()
            own = {t.meta.name: t.take_dirty() for t in tables}
            if not materialize:
                for table in tables:  # changes since the confirmed base, in-flight ones included
                    keys = set(own[table.meta.name])
                    for attempt in self._attempts.values():
                        keys |= attempt["dirty"].get(table.meta.name, set())
                    changed[table.meta.name] = keys
            self._attempts[checkpoint_id] = {"dirty": own, "handle": None}
            while len(self._attempts) > _MAX_UNCONFIRMED:  # never notified: stop tracking it
                self._fold_back(self._attempts.pop(min(self._attempts)))
        maxp = self.max_parallelism
        key_ser = self.key_serializer

        def produce(pace: Callable[[], None] | None) -> list[_Part]:
            """What this snapshot writes: savepoints as key-grouped (indexed) entries, checkpoints
            and incremental bases as plain parts (packed lazily, while writing), changelogs."""
            out: list[_Part] = []
            for table, view in views:
                meta = table.meta
                if savepoint:
                    payload = _indexed_blob(_group_view(view, meta, maxp, pace).chunks)
                    out.append((meta.name, meta.kind, meta.layout, "index", payload))
                elif materialize:
                    out.append((meta.name, meta.kind, meta.layout, "plain",
                                _table_parts(view, meta, pace)))
                else:
                    log = _changelog_blob(meta, view, changed[meta.name], maxp, pace)
                    if log is not None:
                        out.append((meta.name, meta.kind, meta.layout, "index", log))
            if not materialize:
                return out
            for name, data in restored.items():  # restored but not registered: carry over
                keys = list(data.data)
                if savepoint:
                    groups = KvStateData(data.layout, data.kind)
                    for key, plain in zip(keys, data.data.values(), strict=True):
                        kb = key_ser.serialize(key)
                        groups.add(key_group_for_bytes(kb, maxp), kb, packb(plain))
                    out.append((name, data.kind, data.layout, "index", _indexed_blob(groups.chunks)))
                else:
                    parts = plain_parts(keys, list(data.data.values()), pace=pace,
                                        key_plain=None if key_ser.identity else key_ser.to_plain)
                    out.append((name, data.kind, data.layout, "plain", parts))
            return out

        def finish(parts: list[_Part]) -> dict[str, Any]:
            """Upload the serialized parts and build the task handle."""
            suffix = "-base" if materialize else "-log"
            entries = {}
            for name, kind, layout, encoding, payload in parts:
                shared = name + suffix if incremental else None
                if encoding == "plain":
                    entries[name] = write_plain_entry(streams, name, layout, kind, payload,
                                                      shared_name=shared)
                else:
                    index, blob = payload
                    entries[name] = {"layout": layout, "kind": kind, "index": index,
                                     "data": streams.write(blob, state_name=name,
                                                           shared_name=shared)}
            if not incremental:
                return kv_handle(self, entries)
            if materialize:
                states, logs = entries, []
                base_bytes, log_bytes = sum(_entry_size(e) for e in entries.values()), 0
            else:
                assert base is not None
                states = base["base"]
                logs = [*base["logs"], entries] if entries else list(base["logs"])
                base_bytes = base["base_bytes"]
                log_bytes = base["log_bytes"] + sum(_entry_size(e) for e in entries.values())
            handle = {
                "format": HEAP_CHANGELOG_FORMAT,
                "backend": self.backend_name,
                "key_group_range": self.key_group_range.to_list(),
                "max_parallelism": self.max_parallelism,
                "incremental": not materialize,
                "base": states,
                "logs": logs,
                "base_bytes": base_bytes,
                "log_bytes": log_bytes,
            }
            attempt = self._attempts.get(checkpoint_id)
            if attempt is not None:
                attempt["handle"] = handle
            return handle

        if not asynchronous:
            handle = finish(produce(None))
            return SnapshotRun(lambda: handle, time.perf_counter() - start)

        if use_fork:
            pid, fd = _fork_serialize(lambda: produce(None))
            state = {"open": True}

            def run_fork() -> dict[str, Any]:
                state["open"] = False
                return finish(_fork_collect(pid, fd))

            def kill() -> None:
                if state["open"]:
                    state["open"] = False
                    _fork_kill(pid, fd)

            return SnapshotRun(run_fork, time.perf_counter() - start, cancel=kill)

        released = False

        for data in restored.values():
            data.shared += 1

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                for table, _ in views:
                    table.release()
                for data in restored.values():
                    data.shared -= 1

        def run_thread() -> dict[str, Any]:
            try:
                pace = (_Pacer(self.pace_ratio, lambda: self.current_key)
                        if self.pace_ratio > 0 else None)
                return finish(produce(pace))
            finally:
                release()

        return SnapshotRun(run_thread, time.perf_counter() - start, cancel=release)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """The checkpoint is durable: its handle becomes the base of later incremental ones."""
        attempt = self._attempts.get(checkpoint_id)
        if attempt is None or attempt["handle"] is None:
            return
        self._confirmed = attempt["handle"]
        for cid in [c for c in self._attempts if c <= checkpoint_id]:
            del self._attempts[cid]  # their changes are part of the confirmed checkpoint

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

    def restore(self, handles: list[dict[str, Any]], reader: StateReader) -> None:
        """Load this range's entries of full (``KV_FORMATS``) and incremental handles; the values
        stay in plain form until their state is registered (its serializer is known then)."""
        mine = self.key_group_range
        for handle in handles:
            incremental = handle.get("format") == HEAP_CHANGELOG_FORMAT
            if incremental:
                handle = {**handle, "format": KV_FORMAT}  # the same range and parallelism checks
            theirs = check_kv_handle(handle, self.max_parallelism)
            if not len(theirs.intersection(mine)):
                continue
            whole = mine.start <= theirs.start and theirs.end <= mine.end
            if not incremental:
                for name, entry in handle["states"].items():
                    self._load_entry(name, entry, reader, whole)
                continue
            for name, entry in handle.get("base", {}).items():
                self._load_entry(name, entry, reader, whole)
            for log in handle.get("logs", []):  # replayed in order over the base
                for name, entry in log.items():
                    self._replay_log(name, entry, reader)

    def _restored_data(self, name: str, entry: dict[str, Any]) -> dict[Any, Any]:
        """The restored (key -> plain value) dict of state ``name``, created on first use."""
        if name in self.tables:
            raise StateError("restore must happen before the state is registered", name)
        self._restored_layouts[name] = entry["layout"]
        restored = self._restored.get(name)
        if restored is None:
            restored = self._restored[name] = _Restored(entry["layout"], entry["kind"])
        return restored.data

    def _load_entry(self, name: str, entry: dict[str, Any], reader: StateReader,
                    whole: bool) -> None:
        """Add one state entry's in-range entries; ``whole``: the writer's range is inside ours."""
        data = self._restored_data(name, entry)
        key_ser, rng = self.key_serializer, self.key_group_range
        if entry.get("encoding") == "plain":
            key_from = None if key_ser.identity else key_ser.from_plain
            for keys, values in read_plain_entry(name, entry, reader):
                if not whole:
                    keys, values = plain_in_range(keys, values, rng, self.max_parallelism)
                data.update(zip(keys if key_from is None else map(key_from, keys), values,
                                strict=True))
            return
        for kg, parts in read_kv_entry(name, entry, reader, rng):
            if len(parts) != 2:
                raise CorruptCheckpointError(f"state '{name}' key group {kg}: malformed chunk")
            data.update(zip(map(key_ser.deserialize, parts[0]), map(unpackb, parts[1]),
                            strict=True))

    def _replay_log(self, name: str, entry: dict[str, Any], reader: StateReader) -> None:
        """Apply one changelog entry (per key group: puts' keys, puts' values, removed keys)."""
        data = self._restored_data(name, entry)
        key_de = self.key_serializer.deserialize
        for kg, parts in read_kv_entry(name, entry, reader, self.key_group_range):
            if len(parts) != 3:
                raise CorruptCheckpointError(f"state '{name}' key group {kg}: malformed log")
            puts_k, puts_v, removes = parts
            data.update(zip(map(key_de, puts_k), map(unpackb, puts_v), strict=True))
            for kb in removes:
                data.pop(key_de(kb), None)

    def bulk_get(self, descriptor: StateDescriptor, keys: Sequence[Any]) -> list[Any]:
        """Values of a (TTL-less) value state for many keys: one dict lookup each, no key switch."""
        self.get_partitioned_state(descriptor)
        table = self.tables[descriptor.name]
        if table.cow and not table.meta.stored_serializer.immutable:
            state = self._states[descriptor.name][1]
            out = []
            for key in keys:  # hand out private copies while a snapshot shares the values
                self.current_key = key
                out.append(state.value())  # type: ignore[attr-defined]
            return out
        get = table.data.get
        if table.dirty is not None and not table.meta.stored_serializer.immutable:
            table.dirty.update(keys)  # mutable values handed out may be changed in place
        return [get(key) for key in keys]

    def bulk_put(self, descriptor: StateDescriptor, keys: Sequence[Any],
                 values: Sequence[Any]) -> None:
        """Set a (TTL-less) value state for many keys; None clears a key."""
        self.get_partitioned_state(descriptor)
        table = self.tables[descriptor.name]
        serializer = table.meta.stored_serializer
        data = table.data
        for key, value in zip(keys, values, strict=True):
            if value is None:
                data.pop(key, None)
            else:
                check_value(serializer, value, descriptor.name)
                data[key] = value
        if table.dirty is not None:
            table.dirty.update(keys)

    def dispose(self) -> None:
        self.tables.clear()
        self._restored.clear()
        self._states.clear()
        self._attempts.clear()
        self._confirmed = None


#: the heap backend's numeric settings: flat key -> (attribute, parser, rule, its wording)
_NUMERIC_SETTINGS: dict[str, tuple[str, Callable[[str, Any], Any], Callable[[Any], bool], str]] = {
    "state.backend.heap.materialization-interval":
        ("_interval", parse_int, lambda v: v >= 1, "must be at least 1"),
    "state.backend.heap.max-log-ratio": ("_ratio", parse_float, lambda v: v > 0, "must be positive"),
    "state.backend.heap.snapshot-pace":
        ("_pace", parse_float, lambda v: v >= 0, "must not be negative"),
}


def _setting(key: str, value: Any) -> Any:
    """``value`` of the numeric setting ``key``, parsed and checked (ConfigError naming the key)."""
    _, parse, rule, wording = _NUMERIC_SETTINGS[key]
    parsed = parse(key, value)
    if not rule(parsed):
        raise ConfigError(key, wording)
    return parsed


class HashMapStateBackend(StateBackend):
    """Working state on the Python heap; fast, bounded by memory; snapshots asynchronous by default.

    ``incremental=True`` writes changelog checkpoints (only keys changed since the last confirmed
    checkpoint) and a full base every ``materialization_interval`` checkpoints or once the log
    exceeds ``max_log_ratio`` of the base.  Flat keys: ``state.backend.heap.incremental`` (or
    ``state.backend.incremental``), ``state.backend.heap.materialization-interval``,
    ``state.backend.heap.max-log-ratio``, ``state.backend.heap.snapshot-mode`` (thread|fork),
    ``state.backend.heap.snapshot-pace``, ``state.backend.async``.
    """

    name = "hashmap"
    # set from ``_NUMERIC_SETTINGS`` (None: not set, the getter's default applies)
    _interval: int | None
    _ratio: float | None
    _pace: float | None

    def __init__(self, using_asynchronous_snapshots: bool | None = None, *,
                 incremental: bool | None = None, materialization_interval: int | None = None,
                 max_log_ratio: float | None = None,
                 number_of_transfering_threads: int | None = None,
                 snapshot_mode: str | None = None, snapshot_pace: float | None = None) -> None:
        super().__init__(using_asynchronous_snapshots)
        self._explicit_async = using_asynchronous_snapshots is not None
        self._incremental = incremental
        self._threads: int | None = None
        if number_of_transfering_threads is not None:
            self.set_number_of_transfering_threads(number_of_transfering_threads)
        self._mode = None if snapshot_mode is None else _check_mode(snapshot_mode)
        for key, value in (("state.backend.heap.materialization-interval", materialization_interval),
                           ("state.backend.heap.max-log-ratio", max_log_ratio),
                           ("state.backend.heap.snapshot-pace", snapshot_pace)):
            setattr(self, _NUMERIC_SETTINGS[key][0], None if value is None else _setting(key, value))

    def is_incremental_checkpoints_enabled(self) -> bool:
        return bool(self._incremental)

    def get_materialization_interval(self) -> int:
        return int(self._interval or 10)

    def get_max_log_ratio(self) -> float:
        return float(self._ratio or 0.5)

    def get_snapshot_mode(self) -> str:
        """How asynchronous snapshots serialize: ``fork`` (default where available) or ``thread``."""
        return self._mode or _check_mode(DEFAULT_SNAPSHOT_MODE)

    def get_snapshot_pace(self) -> float:
        """Seconds the transfer thread sleeps per second of serialization (thread mode, default 1):
        higher keeps more GIL for processing and makes the asynchronous part longer."""
        return 1.0 if self._pace is None else float(self._pace)

    def get_number_of_transfering_threads(self) -> int:
        return int(self._threads or 1)

    def set_number_of_transfering_threads(self, number_of_transfering_threads: int) -> None:
        if int(number_of_transfering_threads) < 1:
            raise ConfigError("state.backend.heap.transfer.thread.num", "must be at least 1")
        self._threads = int(number_of_transfering_threads)

    def configure(self, config: dict[str, Any]) -> HashMapStateBackend:
        """A copy with flat configuration keys applied; settings made in code take precedence."""
        import copy

        new = copy.copy(self)
        for key in ("state.backend.heap.incremental", "state.backend.incremental",
                    "execution.checkpointing.incremental"):
            if config.get(key) is not None and self._incremental is None:
                new._incremental = parse_bool(key, config[key])
                break
        for key, (attribute, *_) in _NUMERIC_SETTINGS.items():
            if config.get(key) is not None and getattr(self, attribute) is None:
                setattr(new, attribute, _setting(key, config[key]))
        key = "state.backend.heap.snapshot-mode"
        if config.get(key) is not None and self._mode is None:
            new._mode = _check_mode(config[key], key)
        for key in ("state.backend.async", "execution.checkpointing.async"):
            if config.get(key) is not None and not self._explicit_async:
                new._async = parse_bool(key, config[key])
                break
        return new

    def create_keyed_state_backend(self, *, key_serializer: TypeSerializer,
                                   key_group_range: KeyGroupRange, max_parallelism: int,
                                   operator_id: str = "op",
                                   clock: Callable[[], int] | None = None) -> HeapKeyedStateBackend:
        return HeapKeyedStateBackend(
            key_serializer, key_group_range, max_parallelism, clock,
            self.is_using_asynchronous_snapshots(), incremental=bool(self._incremental),
            materialization_interval=self.get_materialization_interval(),
            max_log_ratio=self.get_max_log_ratio(), snapshot_mode=self.get_snapshot_mode(),
            pace_ratio=self.get_snapshot_pace(),
        )

    def __repr__(self) -> str:
        return (f"HashMapStateBackend(using_asynchronous_snapshots={self._async}, "
                f"incremental={bool(self._incremental)})")
