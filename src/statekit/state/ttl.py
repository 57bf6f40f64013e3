"""State time-to-live: PyFlink's :class:`StateTtlConfig` and the TTL layer over any backend's states.

As Flink's ``TtlStateFactory``, TTL wraps the backend's value/list/map state and stores
``(value, last-access-ms)``; a serialized TTL value is the msgpack array ``[value, timestamp]``
(:func:`stamp_of` reads the timestamp from those bytes for backends that work on bytes).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

from statekit.durations import Time, to_millis
from statekit.serde.msgpack import unpackb
from statekit.serde.serializers import TypeSerializer
from statekit.state.api import ListState, MapState, ValueState

#: Flink's default periodic compaction time of the RocksDB TTL filter: 30 days
DEFAULT_PERIODIC_COMPACTION_MS = 30 * 24 * 3_600_000


class StateTtlConfig:
    """Time-to-live of state entries, by processing time (PyFlink's builder API)."""

    class UpdateType(Enum):
        Disabled = 0
        OnCreateAndWrite = 1
        OnReadAndWrite = 2

    class StateVisibility(Enum):
        ReturnExpiredIfNotCleanedUp = 0
        NeverReturnExpired = 1

    class TtlTimeCharacteristic(Enum):
        ProcessingTime = 0

    class CleanupStrategies:
        """Which background cleanups run; full-snapshot cleanup drops expired entries on snapshot."""

        def __init__(self, full_snapshot: bool, incremental: tuple[int, bool] | None,
                     compaction_filter: int | None, in_background: bool,
                     periodic_compaction_ms: int = DEFAULT_PERIODIC_COMPACTION_MS) -> None:
            self._full_snapshot = full_snapshot
            self._incremental = incremental
            self._compaction_filter = compaction_filter
            self._in_background = in_background
            self._periodic = periodic_compaction_ms

        def is_cleanup_in_background(self) -> bool:
            return self._in_background

        def in_full_snapshot(self) -> bool:
            return self._full_snapshot

        def get_incremental_cleanup_strategy(self) -> tuple[int, bool] | None:
            """(cleanup size, run for every record) or None."""
            if self._incremental is not None:
                return self._incremental
            return (5, False) if self._in_background else None

        def get_rocksdb_compact_filter_cleanup_strategy(self) -> int | None:
            """Entries processed between reads of the current time, or None."""
            if self._compaction_filter is not None:
                return self._compaction_filter
            return 1000 if self._in_background else None

        def get_periodic_compaction_time(self) -> int:
            """Milliseconds within which RocksDB's cleanup visits every entry once."""
            return self._periodic

    def __init__(self, update_type: StateTtlConfig.UpdateType,
                 state_visibility: StateTtlConfig.StateVisibility, ttl: int,
                 cleanup_strategies: StateTtlConfig.CleanupStrategies) -> None:
        self._update_type = update_type
        self._visibility = state_visibility
        self._ttl = ttl
        self._cleanup = cleanup_strategies

    @staticmethod
    def new_builder(ttl: Time | _dt.timedelta | int) -> StateTtlConfig.Builder:
        return StateTtlConfig.Builder(ttl)

    def get_update_type(self) -> StateTtlConfig.UpdateType:
        return self._update_type

    def get_state_visibility(self) -> StateTtlConfig.StateVisibility:
        return self._visibility

    def get_ttl(self) -> Time:
        return Time(self._ttl)

    def get_ttl_millis(self) -> int:
        return self._ttl

    def get_ttl_time_characteristic(self) -> StateTtlConfig.TtlTimeCharacteristic:
        return StateTtlConfig.TtlTimeCharacteristic.ProcessingTime

    def is_enabled(self) -> bool:
        return self._update_type != StateTtlConfig.UpdateType.Disabled

    def get_cleanup_strategies(self) -> StateTtlConfig.CleanupStrategies:
        return self._cleanup

    class Builder:
        """Builds a :class:`StateTtlConfig`; every setter returns the builder."""

        def __init__(self, ttl: Time | _dt.timedelta | int) -> None:
            self._ttl = to_millis(ttl, "ttl", minimum=1)
            self._update_type = StateTtlConfig.UpdateType.OnCreateAndWrite
            self._visibility = StateTtlConfig.StateVisibility.NeverReturnExpired
            self._full_snapshot = False
            self._incremental: tuple[int, bool] | None = None
            self._compaction_filter: int | None = None
            self._periodic = DEFAULT_PERIODIC_COMPACTION_MS
            self._in_background = True

        def set_update_type(self, update_type: StateTtlConfig.UpdateType) -> StateTtlConfig.Builder:
            self._update_type = update_type
            return self

        def update_ttl_on_create_and_write(self) -> StateTtlConfig.Builder:
            return self.set_update_type(StateTtlConfig.UpdateType.OnCreateAndWrite)

        def update_ttl_on_read_and_write(self) -> StateTtlConfig.Builder:
            return self.set_update_type(StateTtlConfig.UpdateType.OnReadAndWrite)

        def set_state_visibility(
            self, visibility: StateTtlConfig.StateVisibility
        ) -> StateTtlConfig.Builder:
            self._visibility = visibility
            return self

        def return_expired_if_not_cleaned_up(self) -> StateTtlConfig.Builder:
            return self.set_state_visibility(
                StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp
            )

        def never_return_expired(self) -> StateTtlConfig.Builder:
            return self.set_state_visibility(StateTtlConfig.StateVisibility.NeverReturnExpired)

        def set_ttl_time_characteristic(
            self, characteristic: StateTtlConfig.TtlTimeCharacteristic
        ) -> StateTtlConfig.Builder:
            if characteristic != StateTtlConfig.TtlTimeCharacteristic.ProcessingTime:
                raise ValueError("only processing time is supported for state TTL")
            return self

        def use_processing_time(self) -> StateTtlConfig.Builder:
            return self

        def cleanup_full_snapshot(self) -> StateTtlConfig.Builder:
            self._full_snapshot = True
            return self

        def cleanup_incrementally(
            self, cleanup_size: int = 5, run_cleanup_for_every_record: bool = False
        ) -> StateTtlConfig.Builder:
            self._incremental = (cleanup_size, run_cleanup_for_every_record)
            return self

        def cleanup_in_rocksdb_compact_filter(
            self, query_time_after_num_entries: int = 1000,
            periodic_compaction_time: Time | _dt.timedelta | int | None = None,
        ) -> StateTtlConfig.Builder:
            """Clean up expired entries in RocksDB's background: at each checkpoint statekit
            examines the next ``query_time_after_num_entries`` entries of the state (reading the
            clock once for them, as Flink's filter does), and completes a pass over every entry
            at least once per ``periodic_compaction_time`` (default 30 days, as Flink's)."""
            if isinstance(query_time_after_num_entries, bool) or int(
                    query_time_after_num_entries) < 1:
                raise ValueError("query_time_after_num_entries must be a positive number")
            self._compaction_filter = int(query_time_after_num_entries)
            self._periodic = (DEFAULT_PERIODIC_COMPACTION_MS if periodic_compaction_time is None
                              else to_millis(periodic_compaction_time, "periodic_compaction_time",
                                             minimum=0))
            return self

        def disable_cleanup_in_background(self) -> StateTtlConfig.Builder:
            self._in_background = False
            return self

        def set_ttl(self, ttl: Time | _dt.timedelta | int) -> StateTtlConfig.Builder:
            self._ttl = to_millis(ttl, "ttl", minimum=1)
            return self

        def build(self) -> StateTtlConfig:
            strategies = StateTtlConfig.CleanupStrategies(
                self._full_snapshot, self._incremental, self._compaction_filter, self._in_background,
                self._periodic)
            return StateTtlConfig(self._update_type, self._visibility, self._ttl, strategies)


# --- the TTL layer: values are stored as (value, last access timestamp in ms) ---------------------


class TtlSerializer(TypeSerializer):
    """Stores ``(value, timestamp_ms)``; wraps a state's serializer when TTL is enabled.  The
    value may be None (a map state's entry value, as without TTL: Flink's ``TtlValue`` of null)."""

    identity = False

    def __init__(self, inner: TypeSerializer) -> None:
        self.inner = inner
        self.immutable = inner.immutable
        self.uses_pickle = inner.uses_pickle

    def to_plain(self, value: Any) -> Any:
        return [None if value[0] is None else self.inner.to_plain(value[0]), value[1]]

    def from_plain(self, plain: Any) -> Any:
        return (None if plain[0] is None else self.inner.from_plain(plain[0]), plain[1])

    def copy(self, value: Any) -> Any:
        return (None if value[0] is None else self.inner.copy(value[0]), value[1])

    def check(self, value: Any) -> str | None:
        return None if value[0] is None else self.inner.check(value[0])

    def config(self) -> Any:
        return ["ttl", self.inner.config()]


class TtlPolicy:
    """Expiry arithmetic for one TTL config and clock, shared by all TTL state kinds."""

    def __init__(self, config: StateTtlConfig, clock: Callable[[], int]) -> None:
        self.ttl = config.get_ttl_millis()
        self.clock = clock
        self.update_on_read = config.get_update_type() == StateTtlConfig.UpdateType.OnReadAndWrite
        self.return_expired = (
            config.get_state_visibility()
            == StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp
        )
        self.cleanup_full_snapshot = config.get_cleanup_strategies().in_full_snapshot()

    def expired(self, stamped: tuple[Any, int], now: int) -> bool:
        return stamped[1] + self.ttl <= now

    def drop_expired(self, kind: str, stored: Any, now: int) -> Any:
        """``stored`` without expired entries (None when nothing is left): snapshot-time cleanup."""
        if kind == "value":
            return None if self.expired(stored, now) else stored
        if kind == "list":
            kept = [e for e in stored if not self.expired(e, now)]
            return kept or None
        kept_map = {k: e for k, e in stored.items() if not self.expired(e, now)}
        return kept_map or None

    def snapshot_filter(self, kind: str, now: int | None = None) -> Callable[[Any], Any] | None:
        """What a full snapshot applies to each stored value of a ``kind`` state: drops expired
        entries (None when nothing is left) if full-snapshot cleanup is on, else None.  ``now``
        (default: the clock, read once here) is fixed for the whole snapshot."""
        if not self.cleanup_full_snapshot:
            return None
        at = self.clock() if now is None else now
        drop = self.drop_expired
        return lambda stored: drop(kind, stored, at)

    def snapshot_limit(self) -> int | None:
        """For backends that filter serialized values: a full snapshot drops entries stamped at
        or before this time (the clock, read now, minus the TTL); None when it drops nothing."""
        return self.clock() - self.ttl if self.cleanup_full_snapshot else None


def stamp_of(data: bytes) -> Any:
    """The last-access timestamp of a serialized TTL value (the msgpack array ``[value, ts]``)."""
    return unpackb(data)[1]


class TtlValueState(ValueState):
    """Value state with expiry; wraps a backend value state holding ``(value, ts)``."""

    def __init__(self, inner: ValueState, policy: TtlPolicy) -> None:
        self._inner = inner
        self._p = policy

    def value(self) -> Any:
        stamped = self._inner.value()
        if stamped is None:
            return None
        now = self._p.clock()
        if self._p.expired(stamped, now):
            if not self._p.return_expired:
                self._inner.clear()
                return None
        elif self._p.update_on_read:
            self._inner.update((stamped[0], now))
        return stamped[0]

    def update(self, value: Any) -> None:
        if value is None:
            self._inner.clear()
        else:
            self._inner.update((value, self._p.clock()))

    def clear(self) -> None:
        self._inner.clear()


class TtlListState(ListState):
    """List state with per-element expiry."""

    def __init__(self, inner: ListState, policy: TtlPolicy) -> None:
        self._inner = inner
        self._p = policy

    def get(self) -> list[Any]:
        stored = self._inner.get()
        if not stored:
            return []
        now = self._p.clock()
        live = [e for e in stored if not self._p.expired(e, now)]
        if len(live) != len(stored) and not self._p.return_expired:
            self._inner.update(live)
        elif self._p.update_on_read:
            self._inner.update([(e[0], now) for e in (stored if self._p.return_expired else live)])
        return [e[0] for e in (stored if self._p.return_expired else live)]

    def add(self, value: Any) -> None:
        self._inner.add((value, self._p.clock()))

    def add_all(self, values: Iterable[Any]) -> None:
        now = self._p.clock()
        self._inner.add_all(None if values is None else [(v, now) for v in values])  # type: ignore[arg-type]

    def update(self, values: Iterable[Any]) -> None:
        now = self._p.clock()
        self._inner.update(None if values is None else [(v, now) for v in values])  # type: ignore[arg-type]

    def clear(self) -> None:
        self._inner.clear()


class TtlMapState(MapState):
    """Map state with per-entry expiry."""

    def __init__(self, inner: MapState, policy: TtlPolicy) -> None:
        self._inner = inner
        self._p = policy

    def _live(self, key: Any, stamped: Any, now: int) -> Any:
        """The entry's value after the expiry check, or a miss marker."""
        if stamped is None:
            return _MISS
        if self._p.expired(stamped, now):
            if not self._p.return_expired:
                self._inner.remove(key)
                return _MISS
        elif self._p.update_on_read:
            self._inner.put(key, (stamped[0], now))
        return stamped[0]

    def get(self, key: Any) -> Any:
        value = self._live(key, self._inner.get(key), self._p.clock())
        return None if value is _MISS else value

    def put(self, key: Any, value: Any) -> None:
        self._inner.put(key, (value, self._p.clock()))

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        now = self._p.clock()
        self._inner.put_all({k: (v, now) for k, v in dict_value.items()})

    def remove(self, key: Any) -> None:
        self._inner.remove(key)

    def contains(self, key: Any) -> bool:
        return self._live(key, self._inner.get(key), self._p.clock()) is not _MISS

    def items(self) -> list[tuple[Any, Any]]:
        now = self._p.clock()
        out = []
        for k, stamped in list(self._inner.items()):
            value = self._live(k, stamped, now)
            if value is not _MISS:
                out.append((k, value))
        return out

    def is_empty(self) -> bool:
        return not self.items()

    def clear(self) -> None:
        self._inner.clear()


_MISS = object()
