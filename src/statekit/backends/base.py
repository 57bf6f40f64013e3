"""The state backend ABCs and the backend-neutral snapshot format they share.

A :class:`StateBackend` is a small picklable configuration (a factory); it creates one
:class:`KeyedStateBackend` per partition, which holds the working state of the key-group range
it owns, snapshots it in two phases and restores it, possibly from differently partitioned
snapshots (rescaling).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from statekit.errors import (
    CorruptCheckpointError,
    NoKeyContextError,
    PickleNotAllowedError,
    SerializationError,
    StateNameClashError,
)
from statekit.serde.keygroups import KeyGroupRange, key_group_for_bytes
from statekit.serde.types import ListSerializer, MapSerializer, TypeSerializer, packb, unpackb
from statekit.state.api import (
    State,
    TtlListState,
    TtlMapState,
    TtlPolicy,
    TtlSerializer,
    TtlValueState,
    ValueBackedAggregatingState,
    ValueBackedReducingState,
)
from statekit.state.descriptors import (
    AggregatingStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateKind,
)
from statekit.state.limits import DEFAULT_MAX_SIZE, limit_state

if TYPE_CHECKING:
    from statekit.checkpoint.storage import CheckpointStorage
    from statekit.checkpoint.streams import CheckpointStreams, StateReader

NO_KEY: Any = type("NoKey", (), {"__repr__": lambda self: "<no current key>"})()

#: Format tag of the backend-neutral snapshot (heap checkpoints, every savepoint).  A state entry
#: is *indexed* (one chunk per key group: savepoints) or *plain* (parts of entries of any key
#: group: heap checkpoints); version 1, indexed entries only, is still read.
KV_FORMAT = "statekit-kv/2"
KV_FORMATS = ("statekit-kv/1", KV_FORMAT)
#: a plain state entry's parts (one C-level msgpack call each) aim at this many bytes: large
#: enough that the writer and reader threads hand the GIL over rarely, small enough to pace
PLAIN_PART_BYTES = 16 * 1024 * 1024
_FIRST_PART_ENTRIES, _MAX_PART_ENTRIES = 1024, 1 << 16


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class StateMeta:
    """What a snapshot records about one state: its name, stored kind and serializer layout."""

    name: str
    kind: str
    layout: list[Any]
    key_serializer: TypeSerializer
    stored_serializer: TypeSerializer  # serializer of everything one key holds (list/dict/value)
    ttl: TtlPolicy | None = None


class SnapshotRun:
    """The asynchronous part of a snapshot: ``run()`` writes the data and returns the task handle.

    ``sync_seconds`` is how long the synchronous part held the processing thread.
    """

    def __init__(self, run: Callable[[], dict[str, Any]], sync_seconds: float,
                 cancel: Callable[[], None] | None = None) -> None:
        self._run = run
        self._cancel = cancel
        self.sync_seconds = sync_seconds

    def run(self) -> dict[str, Any]:
        return self._run()

    def cancel(self) -> None:
        """Release what the synchronous part captured (called when the checkpoint is aborted)."""
        if self._cancel is not None:
            self._cancel()


class StateBackend(ABC):
    """Where working state lives; a picklable factory of per-partition keyed backends."""

    #: registry name, written into snapshots so restores know who wrote them
    name: str = "custom"

    def __init__(self, using_asynchronous_snapshots: bool | None = None) -> None:
        self._async = True if using_asynchronous_snapshots is None else bool(
            using_asynchronous_snapshots
        )

    def is_using_asynchronous_snapshots(self) -> bool:
        """Whether snapshots run their expensive part off the processing thread (default True)."""
        return self._async

    def default_checkpoint_storage(self) -> CheckpointStorage | None:
        """Checkpoint storage implied by a legacy facade (MemoryStateBackend...); None otherwise."""
        return None

    def configure(self, config: dict[str, Any]) -> StateBackend:
        """Apply flat configuration keys this backend understands (override to add some)."""
        return self

    @abstractmethod
    def create_keyed_state_backend(
        self,
        *,
        key_serializer: TypeSerializer,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        operator_id: str = "op",
        clock: Callable[[], int] | None = None,
    ) -> KeyedStateBackend:
        """A fresh, empty keyed backend for one partition."""


class KeyedStateBackend(ABC):
    """Working state of one partition: the current key, the registered states, snapshot/restore."""

    backend_name = "custom"

    def __init__(
        self,
        key_serializer: TypeSerializer,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        clock: Callable[[], int] | None = None,
        using_asynchronous_snapshots: bool = True,
    ) -> None:
        self.key_serializer = key_serializer
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.clock = clock or wall_clock_ms
        self.asynchronous = using_asynchronous_snapshots
        self.current_key: Any = NO_KEY
        #: wraps each backend-level value/list/map state before TTL and the other layers, e.g.
        #: to record changes (the applyInPandasWithState adapter carries them in GroupState)
        self.state_interceptor: Callable[[StateMeta, State], State] | None = None
        self._states: dict[str, tuple[StateDescriptor, State]] = {}
        self._restored_layouts: dict[str, list[Any]] = {}

    #: size limits in serialized bytes (see :mod:`statekit.state.limits`); lower them with
    #: :meth:`set_size_limits` or the keys ``state.backend.max-key-size`` / ``max-value-size``
    max_key_size: int = DEFAULT_MAX_SIZE
    max_value_size: int = DEFAULT_MAX_SIZE

    def set_size_limits(self, max_key_size: int | None = None, max_value_size: int | None = None
                        ) -> None:
        """Limit serialized keys and values of states registered from now on."""
        if max_key_size is not None:
            self.max_key_size = int(max_key_size)
        if max_value_size is not None:
            self.max_value_size = int(max_value_size)

    # --- keys -----------------------------------------------------------------------------------

    def set_current_key(self, key: Any) -> None:
        self.current_key = key

    def get_current_key(self) -> Any:
        if self.current_key is NO_KEY:
            raise NoKeyContextError("no current key: keyed state is only available per key")
        return self.current_key

    def key_group_of(self, key: Any) -> int:
        return key_group_for_bytes(self.key_serializer.serialize(key), self.max_parallelism)

    def no_key(self, state_name: str) -> NoKeyContextError:
        return NoKeyContextError(
            "used outside a keyed context (no current key is set)", state_name
        )

    # --- state registration ------------------------------------------------------------------------

    def get_partitioned_state(self, descriptor: StateDescriptor) -> State:
        """The state for ``descriptor``, created on first use; clashing re-registrations fail."""
        registered = self._states.get(descriptor.name)
        if registered is not None:
            previous, state = registered
            if previous.kind != descriptor.kind or previous.layout() != descriptor.layout():
                raise StateNameClashError(
                    f"already registered as a {previous.kind.value} state with another type",
                    descriptor.name,
                )
            return state
        self._check_restored_layout(descriptor)
        meta = self.state_meta(descriptor)
        raw = limit_state(self._create_state(meta), meta, self)
        if self.state_interceptor is not None:
            raw = self.state_interceptor(meta, raw)
        state = self._wrap(descriptor, raw, meta)
        self._states[descriptor.name] = (descriptor, state)
        return state

    def _check_restored_layout(self, descriptor: StateDescriptor) -> None:
        restored = self._restored_layouts.get(descriptor.name)
        if restored is None or restored == descriptor.layout():
            return
        if "pickle" in repr(restored) and "pickle" not in repr(descriptor.layout()):
            raise PickleNotAllowedError(
                f"state '{descriptor.name}' was checkpointed with pickle, but its descriptor "
                "does not opt into Types.PICKLED_BYTE_ARRAY()"
            )
        raise StateNameClashError(
            f"incompatible with the restored checkpoint (checkpoint layout {restored}, "
            f"descriptor layout {descriptor.layout()})",
            descriptor.name,
        )

    def state_meta(self, descriptor: StateDescriptor) -> StateMeta:
        """Serializers and stored kind for a descriptor (reducing/aggregating are stored as values)."""
        kind = descriptor.kind.value
        if descriptor.kind in (StateKind.REDUCING, StateKind.AGGREGATING):
            kind = StateKind.VALUE.value
        value_ser = descriptor.value_serializer()
        ttl = None
        if descriptor.ttl_config is not None:
            ttl = TtlPolicy(descriptor.ttl_config, self.clock)
            value_ser = TtlSerializer(value_ser)
        stored: TypeSerializer = value_ser
        if kind == StateKind.LIST.value:
            stored = ListSerializer(value_ser)
        elif kind == StateKind.MAP.value:
            stored = MapSerializer(descriptor.user_key_serializer(), value_ser)
        return StateMeta(descriptor.name, kind, descriptor.layout(), self.key_serializer, stored, ttl)

    @staticmethod
    def _wrap(descriptor: StateDescriptor, inner: State, meta: StateMeta) -> State:
        if meta.ttl is not None:
            wrapper = {"value": TtlValueState, "list": TtlListState, "map": TtlMapState}[meta.kind]
            inner = wrapper(inner, meta.ttl)  # type: ignore[operator]
        if isinstance(descriptor, ReducingStateDescriptor):
            return ValueBackedReducingState(inner, descriptor.reduce_function, descriptor.name)  # type: ignore[arg-type]
        if isinstance(descriptor, AggregatingStateDescriptor):
            return ValueBackedAggregatingState(inner, descriptor.agg_function)  # type: ignore[arg-type]
        return inner

    @abstractmethod
    def _create_state(self, meta: StateMeta) -> State:
        """A ValueState / ListState / MapState (by ``meta.kind``) over this backend's storage."""

    def registered_state_names(self) -> list[str]:
        return list(self._states)

    # --- snapshots ---------------------------------------------------------------------------------

    @abstractmethod
    def snapshot(self, checkpoint_id: int, streams: CheckpointStreams, *,
                 savepoint: bool = False) -> SnapshotRun:
        """Run the synchronous part now; the returned run writes the data.

        ``savepoint=True`` asks for the self-contained backend-neutral format (``KV_FORMAT``).
        """

    @abstractmethod
    def restore(self, handles: list[dict[str, Any]], reader: StateReader) -> None:
        """Load the key groups of this backend's range from task handles of any partitioning."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """The checkpoint is durable; incremental backends may now use it as a base."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """The checkpoint will never complete."""

    def dispose(self) -> None:
        """Release resources (files, handles, threads)."""


# --- the backend-neutral key-grouped format ------------------------------------------------------


@dataclass
class KvStateData:
    """One state's entries grouped by key group: ``chunks[kg] = (key_bytes, value_bytes)`` lists."""

    meta_layout: list[Any]
    kind: str
    chunks: dict[int, tuple[list[bytes], list[bytes]]] = field(default_factory=dict)

    def add(self, key_group: int, key: bytes, value: bytes) -> None:
        chunk = self.chunks.get(key_group)
        if chunk is None:
            self.chunks[key_group] = ([key], [value])
        else:
            chunk[0].append(key)
            chunk[1].append(value)


def group_entries(
    items: Iterable[tuple[Any, Any]],
    meta: StateMeta,
    max_parallelism: int,
    now: int | None = None,
) -> KvStateData:
    """Serialize a state's (key, stored value) pairs into per-key-group chunks.

    Expired TTL entries are dropped when the state's TTL config asks for full-snapshot cleanup.
    """
    data = KvStateData(meta.layout, meta.kind)
    key_ser = meta.key_serializer.serialize
    val_ser = meta.stored_serializer.serialize
    drop = meta.ttl.drop_expired if meta.ttl is not None and meta.ttl.cleanup_full_snapshot else None
    if drop is not None and now is None:
        now = meta.ttl.clock()  # type: ignore[union-attr]
    for key, stored in items:
        if drop is not None:
            stored = drop(meta.kind, stored, now)
            if stored is None:
                continue
        kb = key_ser(key)
        data.add(key_group_for_bytes(kb, max_parallelism), kb, val_ser(stored))
    return data


def write_kv_state(streams: CheckpointStreams, name: str, data: KvStateData, *,
                   shared_name: str | None = None) -> dict[str, Any]:
    """Write one state's chunks as one blob with a per-key-group index of offset, length, crc.

    ``shared_name`` writes the blob as a shared file that later checkpoints may reference.
    """
    import zlib

    parts: list[bytes] = []
    index: dict[int, list[int]] = {}
    offset = 0
    for kg in sorted(data.chunks):
        chunk = packb(list(data.chunks[kg]))
        index[kg] = [offset, len(chunk), zlib.crc32(chunk)]
        parts.append(chunk)
        offset += len(chunk)
    handle = streams.write(b"".join(parts), state_name=name, shared_name=shared_name)
    return {"layout": data.meta_layout, "kind": data.kind, "data": handle, "index": index}


def plain_parts(keys: Sequence[Any], values: Sequence[Any], *,
                key_plain: Callable[[Any], Any] | None = None,
                value_plain: Callable[[Any], Any] | None = None,
                pace: Callable[[], None] | None = None) -> Iterator[bytes]:
    """One state's entries as parts of ``packb([keys, values])`` in plain form, produced lazily.

    With identity serializers a part is one C-level msgpack call over the objects the table
    already holds; ``key_plain`` / ``value_plain`` convert other types part by part.  ``pace``
    runs before each part (GIL sharing with the processing thread).
    """
    start, count = 0, _FIRST_PART_ENTRIES
    while start < len(keys):
        if pace is not None:
            pace()
        ks = keys[start:start + count]
        vs = values[start:start + count]
        if key_plain is not None:
            ks = [key_plain(k) for k in ks]
        if value_plain is not None:
            vs = [value_plain(v) for v in vs]
        part = packb([ks, vs])
        yield part
        start += count
        count = max(1, min(_MAX_PART_ENTRIES, count * PLAIN_PART_BYTES // max(1, len(part))))


def write_plain_entry(streams: CheckpointStreams, name: str, layout: list[Any], kind: str,
                      parts: Iterable[bytes], *, shared_name: str | None = None) -> dict[str, Any]:
    """Write the parts of one plain state entry (each written while the next is produced)."""
    handle, locations = streams.write_parts(parts, state_name=name, shared_name=shared_name)
    return {"layout": layout, "kind": kind, "encoding": "plain", "data": handle,
            "parts": locations}


def read_plain_entry(name: str, entry: dict[str, Any], reader: StateReader
                     ) -> Iterator[tuple[list[Any], list[Any]]]:
    """Yield ``(plain keys, plain values)`` per part of a plain state entry, each part verified."""
    try:
        locations = [[int(offset), int(length), int(crc)] for offset, length, crc in entry["parts"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptCheckpointError(f"state '{name}': malformed part index") from exc
    for n, part in enumerate(reader.read_parts(entry["data"], locations)):
        try:
            keys, values = unpackb(part)
        except (SerializationError, TypeError, ValueError) as exc:
            raise CorruptCheckpointError(f"state '{name}' part {n}: malformed") from exc
        if not isinstance(keys, list) or not isinstance(values, list) or len(keys) != len(values):
            raise CorruptCheckpointError(f"state '{name}' part {n}: malformed")
        yield keys, values


def plain_in_range(keys: list[Any], values: list[Any], key_group_range: KeyGroupRange,
                   max_parallelism: int) -> tuple[list[Any], list[Any]]:
    """The entries of a plain part whose keys fall into ``key_group_range`` (rescaling)."""
    kept_k, kept_v = [], []
    for key, value in zip(keys, values, strict=True):
        if key_group_for_bytes(packb(key), max_parallelism) in key_group_range:
            kept_k.append(key)
            kept_v.append(value)
    return kept_k, kept_v


def read_kv_entry(
    name: str, entry: dict[str, Any], reader: StateReader, key_group_range: KeyGroupRange
) -> Iterator[tuple[int, list[Any]]]:
    """Yield ``(key group, unpacked chunk)`` for one indexed state entry, inside the range only."""
    try:
        index = entry["index"]
        wanted = [(int(kg), loc) for kg, loc in index.items() if int(kg) in key_group_range]
    except (KeyError, AttributeError, TypeError, ValueError) as exc:
        raise CorruptCheckpointError(f"state '{name}': malformed key-group index") from exc
    for kg, (offset, length, crc) in sorted(wanted):
        chunk = reader.read(entry["data"], offset, length, crc)
        try:
            parts = unpackb(chunk)
        except (ValueError, TypeError) as exc:
            raise CorruptCheckpointError(f"state '{name}' key group {kg}: malformed chunk") from exc
        if not isinstance(parts, list):
            raise CorruptCheckpointError(f"state '{name}' key group {kg}: malformed chunk")
        yield kg, parts


def check_kv_handle(handle: dict[str, Any], max_parallelism: int) -> KeyGroupRange:
    """The key-group range of a readable ``KV_FORMATS`` handle taken with ``max_parallelism``."""
    if handle.get("format") not in KV_FORMATS:
        raise CorruptCheckpointError(
            f"expected a {KV_FORMAT} snapshot, got format {handle.get('format')!r}"
        )
    recorded = handle.get("max_parallelism", max_parallelism)
    if recorded != max_parallelism:
        raise CorruptCheckpointError(
            f"snapshot was taken with max_parallelism {recorded}, this job uses {max_parallelism}"
        )
    try:
        return KeyGroupRange.of(handle["key_group_range"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptCheckpointError("snapshot without a valid key_group_range") from exc


def read_kv_states(
    handles: Iterable[dict[str, Any]], reader: StateReader, key_group_range: KeyGroupRange,
    max_parallelism: int,
) -> Iterator[tuple[str, dict[str, Any], int, list[bytes], list[bytes]]]:
    """Yield ``(state name, entry, key group, keys, values)``, serialized, for every entry inside
    the range; plain entries are serialized and grouped here (restoring into a bytes backend)."""
    for handle in handles:
        check_kv_handle(handle, max_parallelism)
        for name, entry in handle["states"].items():
            if entry.get("encoding") != "plain":
                for kg, parts in read_kv_entry(name, entry, reader, key_group_range):
                    try:
                        keys, values = parts
                    except ValueError as exc:
                        raise CorruptCheckpointError(
                            f"state '{name}' key group {kg}: malformed chunk"
                        ) from exc
                    yield name, entry, kg, keys, values
                continue
            for keys, values in read_plain_entry(name, entry, reader):
                groups: dict[int, tuple[list[bytes], list[bytes]]] = {}
                for key, value in zip(keys, values, strict=True):
                    kb = packb(key)
                    kg = key_group_for_bytes(kb, max_parallelism)
                    if kg in key_group_range:
                        group = groups.setdefault(kg, ([], []))
                        group[0].append(kb)
                        group[1].append(packb(value))
                for kg, (kbs, vbs) in sorted(groups.items()):
                    yield name, entry, kg, kbs, vbs


def kv_handle(backend: KeyedStateBackend, states: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The task handle of a ``KV_FORMAT`` snapshot."""
    return {
        "format": KV_FORMAT,
        "backend": backend.backend_name,
        "key_group_range": backend.key_group_range.to_list(),
        "max_parallelism": backend.max_parallelism,
        "states": states,
    }
