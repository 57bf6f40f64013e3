"""Operator state (Flink's ``DefaultOperatorStateBackend``): state of one parallel subtask of an
operator, not of a key, with both keyed backends alike.

A subtask's :class:`OperatorStateBackend` (PyFlink's ``OperatorStateStore``) holds list states
(``get_list_state``: split evenly on rescale; ``get_union_list_state``: every new subtask gets
the whole union) and broadcast states (``get_broadcast_state``: a map every subtask holds the
same copy of).  It lives in memory, as Flink's does for every keyed backend; a snapshot is its
plain entries, taken synchronously (later changes never reach it) and written with the keyed
state of the same checkpoint (:mod:`statekit.backends.operator_format`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from statekit.backends.base import check_restored_layout
from statekit.backends.operator_format import (
    DistributionMode,
    Snapshot,
    StateEntries,
    decode,
    encode,
    repartition,
)
from statekit.checkpoint.reader import StateReader
from statekit.checkpoint.streams import CheckpointStreams
from statekit.errors import (
    CorruptCheckpointError,
    ReadOnlyStateError,
    SerializationError,
    StateError,
    StateNameClashError,
)
from statekit.serde.serializers import TypeSerializer
from statekit.state.api import NULL_LIST, ListState, State, check_value
from statekit.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptor,
    check_state_name,
)

__all__ = [
    "BroadcastState",
    "DistributionMode",
    "OperatorListState",
    "OperatorStateBackend",
    "ReadOnlyBroadcastState",
    "repartition",
]


class OperatorListState(ListState):
    """A list of elements of one subtask (Flink's ``PartitionableListState``)."""

    def __init__(self, name: str, serializer: TypeSerializer, mode: DistributionMode,
                 elements: list[Any]) -> None:
        self.name = name
        self.mode = mode
        self._ser = serializer
        self._elements = elements

    def get(self) -> list[Any]:
        """The elements, in the order they were added (a copy of the list)."""
        return list(self._elements)

    def add(self, value: Any) -> None:
        if value is None:
            raise StateError("cannot add None to a list state", self.name)
        check_value(self._ser, value, self.name)
        self._elements.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        self._elements.extend(self._checked(values))

    def update(self, values: Iterable[Any]) -> None:
        self._elements[:] = self._checked(values)

    def clear(self) -> None:
        self._elements.clear()

    def _checked(self, values: Iterable[Any] | None) -> list[Any]:
        if values is None:
            raise StateError(NULL_LIST, self.name)
        values = list(values)
        for value in values:
            if value is None:
                raise StateError("a list state cannot hold None", self.name)
            check_value(self._ser, value, self.name)
        return values

    def plain(self) -> list[Any]:
        to_plain = self._ser.to_plain
        return [to_plain(v) for v in self._elements]


class ReadOnlyBroadcastState(State):
    """A read-only view of a broadcast state (the non-broadcast side's): reads return copies,
    and every write raises :class:`~statekit.errors.ReadOnlyStateError`."""

    def __init__(self, name: str, key_serializer: TypeSerializer,
                 value_serializer: TypeSerializer, entries: dict[Any, Any]) -> None:
        self.name = name
        self._key_ser = key_serializer
        self._value_ser = value_serializer
        self._entries = entries

    def get(self, key: Any) -> Any:
        """The value of ``key``, or None."""
        value = self._entries.get(key)
        return None if value is None else self._value_ser.copy(value)

    def contains(self, key: Any) -> bool:
        return key in self._entries

    def items(self) -> Iterable[tuple[Any, Any]]:
        copy = self._value_ser.copy
        return [(k, copy(v)) for k, v in self._entries.items()]

    def keys(self) -> Iterable[Any]:
        return list(self._entries)

    def values(self) -> Iterable[Any]:
        return [v for _, v in self.items()]

    def is_empty(self) -> bool:
        return not self._entries

    def __getitem__(self, key: Any) -> Any:
        return self.get(key)

    def __contains__(self, key: Any) -> bool:
        return self.contains(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._entries)

    def _read_only(self, *args: Any) -> None:
        raise ReadOnlyStateError("the broadcast state is read-only here: only "
                                 "process_broadcast_element may change it", self.name)

    put = put_all = remove = clear = __setitem__ = __delitem__ = _read_only


class BroadcastState(ReadOnlyBroadcastState):
    """A map every subtask holds the same copy of; written on the broadcast side only."""

    def get(self, key: Any) -> Any:
        return self._entries.get(key)

    def items(self) -> Iterable[tuple[Any, Any]]:
        return list(self._entries.items())

    def put(self, key: Any, value: Any) -> None:  # type: ignore[override]
        check_value(self._key_ser, key, self.name)
        check_value(self._value_ser, value, self.name)
        self._entries[key] = value

    def put_all(self, dict_value: dict[Any, Any]) -> None:  # type: ignore[override]
        for key, value in dict(dict_value).items():
            self.put(key, value)

    def remove(self, key: Any) -> None:  # type: ignore[override]
        self._entries.pop(key, None)

    def clear(self) -> None:  # type: ignore[override]
        self._entries.clear()

    def __setitem__(self, key: Any, value: Any) -> None:  # type: ignore[override]
        self.put(key, value)

    def __delitem__(self, key: Any) -> None:  # type: ignore[override]
        self.remove(key)

    def read_only(self) -> ReadOnlyBroadcastState:
        """The read-only view of the same entries."""
        return ReadOnlyBroadcastState(self.name, self._key_ser, self._value_ser, self._entries)

    def plain(self) -> list[list[Any]]:
        kp, vp = self._key_ser.to_plain, self._value_ser.to_plain
        return [[kp(k), vp(v)] for k, v in self._entries.items()]


class OperatorStateBackend:
    """One subtask's operator state (PyFlink's ``OperatorStateStore``), optionally restored.

    Restored states count as registered from the start and keep their recorded entries until a
    descriptor asks for them (then they are checked against it and decoded with its types: a
    state checkpointed with pickle needs a descriptor that opts into pickle)."""

    def __init__(self, restored: Snapshot | None = None) -> None:
        self._restored: Snapshot = dict(restored or {})
        self._lists: dict[str, tuple[ListStateDescriptor, OperatorListState]] = {}
        self._broadcast: dict[str, tuple[MapStateDescriptor, BroadcastState]] = {}
        self.restored = restored is not None

    # --- registration ---------------------------------------------------------------------------

    def get_list_state(self, state_descriptor: ListStateDescriptor) -> OperatorListState:
        """A list state split evenly among the subtasks on rescale."""
        return self._list(state_descriptor, DistributionMode.SPLIT_DISTRIBUTE)

    def get_union_list_state(self, state_descriptor: ListStateDescriptor) -> OperatorListState:
        """A list state every subtask gets the whole union of on restore."""
        return self._list(state_descriptor, DistributionMode.UNION)

    def get_broadcast_state(self, state_descriptor: MapStateDescriptor) -> BroadcastState:
        """A map state every subtask holds the same copy of."""
        if not isinstance(state_descriptor, MapStateDescriptor):
            raise StateNameClashError("broadcast state takes a MapStateDescriptor, not a "
                                      f"{type(state_descriptor).__name__}",
                                      getattr(state_descriptor, "name", None))
        name = state_descriptor.name
        known = self._broadcast.get(name)
        if known is not None:
            self._same_layout(known[0], state_descriptor)
            return known[1]
        self._free(name, DistributionMode.BROADCAST, state_descriptor)
        key_ser, value_ser = state_descriptor.user_key_serializer(), state_descriptor.value_serializer()
        entries: dict[Any, Any] = {}
        restored = self._restored.pop(name, None)
        if restored is not None:
            for k, v in restored.entries:
                key, value = self._decoded(key_ser, k, name), self._decoded(value_ser, v, name)
                try:
                    entries[key] = value
                except TypeError:
                    raise CorruptCheckpointError(f"broadcast state {name!r}: a restored key is "
                                                 "not hashable") from None
        state = BroadcastState(name, key_ser, value_ser, entries)
        self._broadcast[name] = (state_descriptor, state)
        return state

    def _list(self, descriptor: ListStateDescriptor, mode: DistributionMode) -> OperatorListState:
        if not isinstance(descriptor, ListStateDescriptor):
            raise StateNameClashError("operator list state takes a ListStateDescriptor, not a "
                                      f"{type(descriptor).__name__}",
                                      getattr(descriptor, "name", None))
        known = self._lists.get(descriptor.name)
        if known is not None:
            if known[1].mode is not mode:
                raise StateNameClashError(_clash(known[1].mode, mode), descriptor.name)
            self._same_layout(known[0], descriptor)
            return known[1]
        self._free(descriptor.name, mode, descriptor)
        serializer = descriptor.value_serializer()
        restored = self._restored.pop(descriptor.name, None)
        elements = [] if restored is None else [
            self._decoded(serializer, plain, descriptor.name) for plain in restored.entries]
        state = OperatorListState(descriptor.name, serializer, mode, elements)
        self._lists[descriptor.name] = (descriptor, state)
        return state

    def _free(self, name: str, mode: DistributionMode, descriptor: StateDescriptor) -> None:
        """Refuse a name taken by a state of another kind or mode, or restored with another
        layout; check descriptors' TTL (operator state has none, as in Flink)."""
        check_state_name(name)
        if descriptor.ttl_config is not None:
            raise StateError("operator state has no time-to-live (Flink's neither)", name)
        other = self._lists.get(name) or self._broadcast.get(name)
        if other is not None:
            held = other[1].mode if isinstance(other[1], OperatorListState) else \
                DistributionMode.BROADCAST
            raise StateNameClashError(_clash(held, mode), name)
        restored = self._restored.get(name)
        if restored is not None:
            if restored.mode is not mode:
                raise StateNameClashError(_clash(restored.mode, mode, restored=True), name)
            check_restored_layout(name, restored.layout, descriptor.layout())

    @staticmethod
    def _same_layout(known: StateDescriptor, descriptor: StateDescriptor) -> None:
        if known.layout() != descriptor.layout():
            raise StateNameClashError("already registered with another type", descriptor.name)

    @staticmethod
    def _decoded(serializer: TypeSerializer, plain: Any, name: str) -> Any:
        try:
            value = serializer.from_plain(plain)
        except (SerializationError, ValueError, TypeError, KeyError, IndexError) as exc:
            raise CorruptCheckpointError(f"operator state {name!r}: a restored entry does not "
                                         f"decode as its type: {exc}") from None
        problem = serializer.check(value)
        if problem is not None:
            raise CorruptCheckpointError(f"operator state {name!r}: a restored entry does not "
                                         f"fit its type: {problem}")
        return value

    def get_registered_state_names(self) -> set[str]:
        """Names of the list states (registered, or restored and not yet asked for)."""
        return set(self._lists) | {n for n, s in self._restored.items() if not s.is_broadcast}

    def get_registered_broadcast_state_names(self) -> set[str]:
        """Names of the broadcast states (registered, or restored and not yet asked for)."""
        return set(self._broadcast) | {n for n, s in self._restored.items() if s.is_broadcast}

    def is_empty(self) -> bool:
        return not (self._lists or self._broadcast or self._restored)

    # --- snapshots ------------------------------------------------------------------------------

    def snapshot_entries(self) -> Snapshot:
        """Every state's plain entries now (restored states never asked for included)."""
        states: Snapshot = dict(self._restored)
        for name, (descriptor, lst) in self._lists.items():
            states[name] = StateEntries(lst.mode, descriptor.layout(), lst.plain())
        for name, (descriptor, bst) in self._broadcast.items():
            states[name] = StateEntries(DistributionMode.BROADCAST, descriptor.layout(),
                                        bst.plain())
        return states

    def snapshot(self) -> bytes | None:
        """The encoded snapshot, taken now; None when there is no operator state (Flink
        writes no handle then)."""
        return None if self.is_empty() else encode(self.snapshot_entries())

    @staticmethod
    def write(data: bytes, streams: CheckpointStreams) -> dict[str, Any]:
        """Write an encoded snapshot with a checkpoint's streams; its handle."""
        return streams.write(data, state_name="operator-state")


def read_snapshots(handles: list[dict[str, Any] | None], reader: StateReader
                   ) -> list[Snapshot | None]:
    """The decoded snapshots of ``handles`` (each read and checked against its checksum)."""
    return [None if h is None else decode(reader.read(h), f"operator state of subtask {i}")
            for i, h in enumerate(handles)]


def _clash(held: DistributionMode, asked: DistributionMode, restored: bool = False) -> str:
    how = "restored" if restored else "registered"
    return (f"{how} as {_KIND[held]}, asked for as {_KIND[asked]} (one name, one kind of "
            "operator state)")


_KIND = {DistributionMode.SPLIT_DISTRIBUTE: "list state (get_list_state)",
         DistributionMode.UNION: "union list state (get_union_list_state)",
         DistributionMode.BROADCAST: "broadcast state (get_broadcast_state)"}


def shares(handles: list[dict[str, Any] | None] | None, reader: StateReader | None,
           parallelism: int) -> list[Snapshot | None]:
    """Each new subtask's share of a checkpoint's operator state (``handles`` in old subtask
    order; None: the checkpoint holds none), redistributed as Flink does."""
    if not handles or reader is None:
        return [None] * parallelism
    return list(repartition(read_snapshots(handles, reader), parallelism))
