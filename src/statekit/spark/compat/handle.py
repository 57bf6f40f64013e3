"""Spark's ``StatefulProcessorHandle`` and state variables over statekit keyed state.

Values are kept as Spark's internal form of their schema (``StructType.toInternal``: plain
numbers, strings and bytes, no pickle) and handed back as Spark's Python API gives them (tuples of
external values: datetimes, dates, nested ``Row``s).  ``ttlDurationMs`` is statekit's TTL on the
micro-batch's processing time: an update sets an entry's expiry to the batch timestamp plus the
duration, and an entry is gone once a batch's timestamp reaches it (Spark's semantics).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator
from typing import Any

from statekit.backends.base import NO_KEY
from statekit.errors import StateError, StateTypeError
from statekit.runtime.timers import TimeDomain
from statekit.spark.compat.errors import spark_message_error
from statekit.spark.compat.query import QueryInfo
from statekit.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from statekit.state.ttl import StateTtlConfig

_SCALARS = (bool, int, float, str, bytes, datetime.datetime, datetime.date, type(None))


def normalize(value: Any) -> Any:
    """NumPy and pandas values as the Python values Spark converts them to (as PySpark does)."""
    if type(value) in _SCALARS:
        return value
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # Row, NamedTuple
        return type(value)(*map(normalize, value))
    if isinstance(value, list | tuple):
        return type(value)(map(normalize, value))
    if isinstance(value, dict):
        return {normalize(k): normalize(v) for k, v in value.items()}
    for method in ("to_pytimedelta", "to_pydatetime"):
        if hasattr(value, method):
            return getattr(value, method)()
    return value


class Schema:
    """A state variable's schema: checks values at the call and converts them both ways."""

    def __init__(self, schema: Any, what: str, state_name: str,
                 parsed: dict[str, Any] | None = None) -> None:
        from pyspark.sql.types import StructType, _make_type_verifier, _parse_datatype_string

        if isinstance(schema, str):
            if parsed is not None and schema in parsed:  # parsed in the driver (a worker has
                schema = parsed[schema]                   # no JVM to parse DDL with)
            else:
                try:
                    text, schema = schema, _parse_datatype_string(schema)
                except Exception as exc:
                    raise StateTypeError(f"{what}: not a Spark schema: {schema!r} ({exc})",
                                         state_name) from None
                if parsed is not None:
                    parsed[text] = schema
        if not isinstance(schema, StructType):
            raise StateTypeError(f"{what}: expected a StructType or a DDL string, got "
                                 f"{type(schema).__name__}", state_name)
        self.struct = schema
        self.name = state_name
        self._verify = _make_type_verifier(schema, name=state_name)

    def internal(self, value: Any) -> tuple[Any, ...]:
        """A user's value (a tuple or Row) as stored; a value the schema refuses raises."""
        if value is None or isinstance(value, str | bytes) or not isinstance(value, Iterable):
            raise StateTypeError(f"expected a tuple of {self.struct.simpleString()}, got "
                                 f"{value!r}", self.name)
        value = tuple(normalize(v) for v in value)
        try:
            self._verify(value)
        except (TypeError, ValueError) as exc:
            raise StateTypeError(str(exc), self.name) from None
        return tuple(self.struct.toInternal(value))

    def external(self, stored: Any) -> tuple[Any, ...]:
        """A stored value as the tuple Spark's API returns."""
        return tuple(self.struct.fromInternal(tuple(stored)))


def _descriptor(descriptor: StateDescriptor, ttl: int | None) -> StateDescriptor:
    if ttl is not None:
        descriptor.enable_time_to_live(StateTtlConfig.new_builder(ttl).build())
    return descriptor


class _Variable:
    """What every state variable shares: its name, and Spark's error once it was deleted."""

    kind = ""
    deleted = False

    def __init__(self, handle: Handle, name: str) -> None:
        self._name = name
        handle.variables[name] = self

    def _live(self, action: str) -> None:
        if self.deleted:  # Spark's client reports a deleted variable with these words
            raise spark_message_error(
                "RuntimeError", f"Error {action.format(kind=self.kind)}: state variable "
                                f"{self._name!r} was deleted by deleteIfExists")


class ValueState(_Variable):
    """Spark's ``ValueState`` on statekit state."""

    kind = "value"

    def __init__(self, handle: Handle, name: str, schema: Any, ttl: int | None) -> None:
        super().__init__(handle, name)
        self._schema = Schema(schema, "schema", name, handle.parsed)
        self._state = handle.state(_descriptor(ValueStateDescriptor(name), ttl), name)

    def exists(self) -> bool:
        self._live("checking {kind} state exists")
        return self._state.value() is not None

    def get(self) -> tuple[Any, ...] | None:
        self._live("getting {kind} state")
        stored = self._state.value()
        return None if stored is None else self._schema.external(stored)

    def update(self, newValue: tuple[Any, ...]) -> None:
        self._live("updating {kind} state")
        self._state.update(self._schema.internal(newValue))

    def clear(self) -> None:
        self._live("clearing {kind} state")
        self._state.clear()


class ListState(_Variable):
    """Spark's ``ListState`` on statekit state (each element with its own TTL)."""

    kind = "list"

    def __init__(self, handle: Handle, name: str, schema: Any, ttl: int | None) -> None:
        super().__init__(handle, name)
        self._schema = Schema(schema, "schema", name, handle.parsed)
        self._state = handle.state(_descriptor(ListStateDescriptor(name), ttl), name)

    def exists(self) -> bool:
        self._live("checking {kind} state exists")
        return bool(self._state.get())

    def get(self) -> Iterator[tuple[Any, ...]]:
        self._live("getting {kind} state")
        return iter([self._schema.external(v) for v in self._state.get() or ()])

    def put(self, newState: list[tuple[Any, ...]]) -> None:
        self._live("updating {kind} state")
        self._state.update([self._schema.internal(v) for v in newState])

    def appendValue(self, newState: tuple[Any, ...]) -> None:
        self._live("appending {kind} state")
        self._state.add(self._schema.internal(newState))

    def appendList(self, newState: list[tuple[Any, ...]]) -> None:
        self._live("appending {kind} state")
        self._state.add_all([self._schema.internal(v) for v in newState])

    def clear(self) -> None:
        self._live("clearing {kind} state")
        self._state.clear()


class MapState(_Variable):
    """Spark's ``MapState`` on statekit state (each entry with its own TTL)."""

    kind = "map"

    def __init__(self, handle: Handle, name: str, key_schema: Any, value_schema: Any,
                 ttl: int | None) -> None:
        super().__init__(handle, name)
        self._keys = Schema(key_schema, "userKeySchema", name, handle.parsed)
        self._values = Schema(value_schema, "valueSchema", name, handle.parsed)
        self._state = handle.state(_descriptor(MapStateDescriptor(name), ttl), name)

    def exists(self) -> bool:
        self._live("checking {kind} state exists")
        return not self._state.is_empty()

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        self._live("getting {kind} state")
        stored = self._state.get(self._keys.internal(key))
        return None if stored is None else self._values.external(stored)

    def containsKey(self, key: tuple[Any, ...]) -> bool:
        self._live("checking {kind} state contains key")
        return bool(self._state.contains(self._keys.internal(key)))

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        self._live("updating {kind} state")
        self._state.put(self._keys.internal(key), self._values.internal(value))

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        self._live("getting {kind} state")
        return iter([(self._keys.external(k), self._values.external(v))
                     for k, v in self._state.items()])

    def keys(self) -> Iterator[tuple[Any, ...]]:
        self._live("getting {kind} state")
        return iter([self._keys.external(k) for k in self._state])

    def values(self) -> Iterator[tuple[Any, ...]]:
        self._live("getting {kind} state")
        return iter([self._values.external(v) for v in self._state.values()])

    def removeKey(self, key: tuple[Any, ...]) -> None:
        self._live("removing from {kind} state")
        self._state.remove(self._keys.internal(key))

    def clear(self) -> None:
        self._live("clearing {kind} state")
        self._state.clear()


class Handle:
    """Spark's ``StatefulProcessorHandle`` with statekit holding the state and timers.

    State variables are declared in ``init`` (as Spark requires); timers are registered in the
    time domain of the query's ``timeMode``.  Without a backend (``backend=None``) it only checks
    the declarations: statekit runs the user's ``init`` that way at the call, in the driver.
    """

    def __init__(self, time_mode: str, context: Any = None, timers: Any = None,
                 parsed: dict[str, Any] | None = None, batch_id: int | None = None) -> None:
        self.time_mode = time_mode
        #: the task's micro-batch (None: the check run of ``init`` in the driver)
        self.batch_id = batch_id
        self._query_info: QueryInfo | None = None
        #: DDL schema strings -> StructType, parsed in the driver
        self.parsed = {} if parsed is None else parsed
        self.context = context
        self.timers = timers
        self.in_init = True
        self.declared: dict[str, str] = {}
        self.variables: dict[str, _Variable] = {}

    # --- state variables ---------------------------------------------------------------------

    def state(self, descriptor: StateDescriptor, name: str) -> Any:
        if self.context is None:
            return None
        return self.context._backend.get_partitioned_state(descriptor)

    def _declare(self, name: str, kind: str, ttl: int | None) -> int | None:
        if not self.in_init:
            raise StateError(f"get{kind}State is only possible in init() (as on Spark)", name)
        if not isinstance(name, str) or not name:
            raise StateError(f"a state variable needs a name, got {name!r}")
        if name in self.declared and self.declared[name] != kind:
            raise StateError(f"declared as {self.declared[name]} state and as {kind} state", name)
        self.declared[name] = kind
        if ttl is None:
            return None
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0:
            raise StateError(f"ttlDurationMs must be a positive number of milliseconds, got "
                             f"{ttl!r}", name)
        if self.time_mode == "None":
            raise StateError("ttlDurationMs needs timeMode 'ProcessingTime' or 'EventTime' "
                             "(TTL runs on the batch's processing time; Spark refuses it "
                             "with timeMode 'None' too)", name)
        return ttl

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None
                      ) -> ValueState:
        ttl = self._declare(stateName, "Value", ttlDurationMs)
        return ValueState(self, stateName, schema, ttl)

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None
                     ) -> ListState:
        ttl = self._declare(stateName, "List", ttlDurationMs)
        return ListState(self, stateName, schema, ttl)

    def getMapState(self, stateName: str, userKeySchema: Any, valueSchema: Any,
                    ttlDurationMs: int | None = None) -> MapState:
        ttl = self._declare(stateName, "Map", ttlDurationMs)
        return MapState(self, stateName, userKeySchema, valueSchema, ttl)

    def deleteIfExists(self, stateName: str) -> None:
        """Delete the variable: its stored values are removed (every key of this partition that
        holds it), and using it raises Spark's error from now on.  A name not declared in this
        ``init`` is forgotten; values it holds from earlier batches stay until it is declared
        and deleted again (statekit cannot know their kind without a declaration)."""
        variable = self.variables.get(stateName)
        if variable is not None:
            self._purge(variable)
            variable.deleted = True
        self.declared.pop(stateName, None)

    def _purge(self, variable: _Variable) -> None:
        """Clear ``variable``'s state for every key holding it (the current key kept)."""
        state = getattr(variable, "_state", None)
        if self.context is None or state is None:
            return
        backend = self.context._backend
        previous = backend.current_key
        try:
            for key in list(backend.get_keys(variable._name)):
                backend.set_current_key(key)
                state.clear()
        finally:
            if previous is not NO_KEY:
                backend.set_current_key(previous)

    def getQueryInfo(self) -> QueryInfo:
        """The running query's id, run id and micro-batch id (Spark's values; in the driver's
        check run of ``init``, new ids and batch 0, as Spark's driver-side handle gives)."""
        if self._query_info is None:
            self._query_info = (QueryInfo.on_driver() if self.batch_id is None
                                else QueryInfo.of_task(self.batch_id))
        return self._query_info

    # --- timers ----------------------------------------------------------------------------------

    def _domain(self, operation: str) -> TimeDomain:
        if self.time_mode == "None":
            raise StateError(f"{operation} needs timeMode 'ProcessingTime' or 'EventTime' "
                             "(Spark refuses timers with timeMode 'None' too)")
        if self.in_init:
            raise StateError(f"{operation} is not possible in init(): there is no key yet")
        return (TimeDomain.PROCESSING_TIME if self.time_mode == "ProcessingTime"
                else TimeDomain.EVENT_TIME)

    def registerTimer(self, expiryTimestampMs: int) -> None:
        domain = self._domain("registerTimer")
        self.timers.register(domain, int(expiryTimestampMs))

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        domain = self._domain("deleteTimer")
        self.timers.delete(domain, int(expiryTimestampMs))

    def listTimers(self) -> Iterator[int]:
        domain = self._domain("listTimers")
        return iter(self.timers.timers_of_current_key(domain))
