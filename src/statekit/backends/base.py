"""The state backend ABCs.

A :class:`StateBackend` is a small picklable configuration (a factory); it creates one
:class:`KeyedStateBackend` per partition, which holds the working state of the key-group range
it owns, snapshots it in two phases and restores it, possibly from differently partitioned
snapshots (rescaling).  The format every backend can read is in :mod:`statekit.backends.kvformat`.
"""

from __future__ import annotations

import gc
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statekit.backends.namespaces import NamespacedStates
from statekit.configurable import Configurable
from statekit.errors import (
    NoKeyContextError,
    PickleNotAllowedError,
    StateError,
    StateNameClashError,
)
from statekit.serde.keygroups import KeyGroupRange, key_group_for_bytes
from statekit.serde.keys import as_key_serializer
from statekit.serde.keytypes import KeyCheck, RestoreCheck, restore_key_check
from statekit.serde.serializers import ListSerializer, MapSerializer, TypeSerializer
from statekit.state.api import (
    MapState,
    State,
    ValueBackedAggregatingState,
    ValueBackedReducingState,
)
from statekit.state.descriptors import (
    AggregatingStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateKind,
    check_state_name,
)
from statekit.state.limits import DEFAULT_MAX_SIZE, limit_state
from statekit.state.ttl import TtlListState, TtlMapState, TtlPolicy, TtlSerializer, TtlValueState

if TYPE_CHECKING:
    from statekit.backends.timers import TimerQueue
    from statekit.checkpoint.base import CheckpointStorage
    from statekit.checkpoint.reader import StateReader
from statekit.checkpoint.streams import CheckpointStreams

#: a snapshot handle and the reader of the store it lives in
RestoreSource = tuple[dict[str, Any], "StateReader"]

NO_KEY: Any = type("NoKey", (), {"__repr__": lambda self: "<no current key>"})()


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

    def snapshot_filter(self, now: int | None = None) -> Callable[[Any], Any] | None:
        """Drops a stored value's expired TTL entries in a full snapshot (None: nothing to drop)."""
        return None if self.ttl is None else self.ttl.snapshot_filter(self.kind, now)


class SnapshotRun:
    """The asynchronous part of a snapshot: ``run()`` writes the data and returns the task handle.

    ``sync_seconds`` is how long the synchronous part held the processing thread.  Pass the
    callables, or subclass and override :meth:`run` (and :meth:`cancel`).
    """

    def __init__(self, run: Callable[[], dict[str, Any]] | None = None, sync_seconds: float = 0.0,
                 cancel: Callable[[], None] | None = None) -> None:
        self._run = run
        self._cancel = cancel
        self.sync_seconds = sync_seconds

    def run(self) -> dict[str, Any]:
        if self._run is None:
            raise NotImplementedError("pass run= or override SnapshotRun.run")
        return self._run()

    def cancel(self) -> None:
        """Release what the synchronous part captured (called when the checkpoint is aborted)."""
        if self._cancel is not None:
            self._cancel()


class StateBackend(Configurable, ABC):
    """Where working state lives; a picklable factory of per-partition keyed backends.

    Built from flat keys by :meth:`from_config` (``state.backend.type`` names the class in the
    registry) and configured by :meth:`configure`, which returns a configured copy.
    """

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


class KeyedStateBackend(NamespacedStates, ABC):
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
        # canonical key bytes: keys Python calls equal are one key on every backend
        self.key_serializer = as_key_serializer(key_serializer)
        #: the declared key type, checked on every key and recorded in snapshots (``key_type``)
        self.key_check = KeyCheck(self.key_serializer)
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.clock = clock or wall_clock_ms
        self.asynchronous = using_asynchronous_snapshots
        self.current_key: Any = NO_KEY
        #: wraps each backend-level value/list/map state before TTL and the other layers, e.g.
        #: to record changes (the applyInPandasWithState adapter carries them in GroupState)
        self.state_interceptor: Callable[[StateMeta, State], State] | None = None
        #: wraps each timer queue when it is created, as ``state_interceptor`` wraps states
        self.timer_interceptor: Callable[[TimerQueue], TimerQueue] | None = None
        self._states: dict[str, tuple[StateDescriptor, State]] = {}
        #: namespaced states: name -> (carrier map state, namespaced view, carrier layout)
        self._namespaced: dict[str, tuple[MapState, State, list[Any]]] = {}
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
        """Set the current key; StateTypeError unless it is a key of the declared key type."""
        if key is not NO_KEY and not self.key_check.passes(key):
            self.key_check.check(key)
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
            if descriptor.name in self._namespaced:
                raise StateNameClashError("already registered as a namespaced state "
                                          "(get_namespaced_state)", descriptor.name)
            if previous.kind != descriptor.kind or previous.layout() != descriptor.layout():
                raise StateNameClashError(
                    f"already registered as a {previous.kind.value} state with another type",
                    descriptor.name,
                )
            return state
        check_state_name(descriptor.name)
        self._check_restored_layout(descriptor.name, descriptor.layout())
        meta = self.state_meta(descriptor)
        state = self._wrap(descriptor, self._raw_state(meta), meta)
        self._states[descriptor.name] = (descriptor, state)
        return state

    def _raw_state(self, meta: StateMeta) -> State:
        """The backend's state for ``meta``, size-limited and intercepted."""
        raw = limit_state(self._create_state(meta), meta, self)
        if self.state_interceptor is not None:
            raw = self.state_interceptor(meta, raw)
        return raw

    def _check_restored_layout(self, name: str, layout: list[Any]) -> None:
        check_restored_layout(name, self._restored_layouts.get(name), layout)

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

    # --- timers ------------------------------------------------------------------------------------

    def timer_queue(self, name: str, create: bool = True) -> TimerQueue | None:
        """The timer queue ``name``: a set of ``(key, timestamp)`` timers ordered by time,
        snapshotted with the keyed state.  Created on first use (after any restore) when
        ``create``; otherwise None unless it exists or was restored."""
        raise StateError(f"the {self.backend_name} backend keeps no timers")

    # --- snapshots ---------------------------------------------------------------------------------

    @abstractmethod
    def snapshot(self, checkpoint_id: int, streams: CheckpointStreams, *,
                 savepoint: bool = False) -> SnapshotRun:
        """Run the synchronous part now; the returned run writes the data.

        ``savepoint=True`` asks for the self-contained backend-neutral format (``KV_FORMAT``).
        """

    #: snapshot formats :meth:`restore_sources` reads itself, and those of them it can also
    #: filter by key (others go through :func:`statekit.backends.transfer.restore_into`)
    native_formats: tuple[str, ...] = ()
    filterable_formats: tuple[str, ...] = ()

    def filters(self, handle: dict[str, Any]) -> bool:
        """Whether :meth:`restore_sources` keeps only some keys of ``handle`` itself (its format
        is in ``filterable_formats``, or the backend reads it key by key natively)."""
        return handle.get("format") in self.filterable_formats

    def restore_key_check(self, handle: dict[str, Any]) -> RestoreCheck | None:
        """How the keys of ``handle`` restore here, by the key type it records (see
        :func:`statekit.serde.keytypes.restore_key_check`): None, a check of each restored key,
        or StateTypeError naming both key types."""
        return restore_key_check(handle.get("key_type"), self.key_check)

    def restore(self, handles: list[dict[str, Any]], reader: StateReader) -> None:
        """Load the key groups of this backend's range from task handles of any partitioning."""
        self.restore_sources([(handle, reader) for handle in handles])

    @abstractmethod
    def restore_sources(self, sources: list[RestoreSource], *,
                        key_filter: Callable[[Any], bool] | None = None,
                        skip_states: frozenset[str] = frozenset()) -> None:
        """Load this range's entries from ``(handle, reader)`` pairs of native formats, keeping
        only keys ``key_filter`` accepts (formats in ``filterable_formats``) and leaving out the
        states named in ``skip_states``; called once, before any state is registered."""

    def prepare_snapshot(self) -> bool:
        """One short step of the work a snapshot's synchronous part would otherwise do at once;
        True when none is left, so a snapshot taken now does not pause processing."""
        return True

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """The checkpoint is durable; incremental backends may now use it as a base."""

    def adopt_restored_base(self, handle: dict[str, Any]) -> None:
        """``handle``, just restored whole and of this backend's own checkpoints, may serve as
        the base of its next incremental checkpoint (its files stay referenced)."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """The checkpoint will never complete."""

    def dispose(self) -> None:
        """Release resources (files, handles, threads)."""


def check_restored_layout(name: str, restored: list[Any] | None, layout: list[Any]) -> None:
    """Refuse a descriptor ``layout`` that differs from the one state ``name`` was checkpointed
    with (``restored``; None: not restored): PickleNotAllowedError when the checkpoint used
    pickle and the descriptor does not opt in, else StateNameClashError."""
    if restored is None or restored == layout:
        return
    if "pickle" in repr(restored) and "pickle" not in repr(layout):
        raise PickleNotAllowedError(
            f"state '{name}' was checkpointed with pickle, but its descriptor "
            "does not opt into Types.PICKLED_BYTE_ARRAY()"
        )
    raise StateNameClashError(
        f"incompatible with the restored checkpoint (checkpoint layout {restored}, "
        f"descriptor layout {layout})",
        name,
    )


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a restore builds millions of acyclic objects
    (it would walk them again and again: a fifth to half of a heap restore), on again after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
