"""PyFlink's ``KeyedStream`` operators beyond ``process``/``map``/``flat_map``: ``reduce``,
``filter`` and the rolling aggregations ``sum``, ``min``, ``max``, ``min_by``, ``max_by``.

Each is a keyed function; the rolling ones keep the key's running value in a value state named
``_reduce_state`` (so a savepoint of a job using one restores into the same job) and emit it after
every element, as PyFlink's streaming mode does.  Positions follow PyFlink: an index into a tuple,
list or Row, a field name of a dict (``Types.ROW_NAMED``), and 0 for a basic value (the whole
value); ``min``/``max`` change only that field of the first element, ``min_by``/``max_by`` keep
the whole element holding the extreme (the first one on ties).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any

from statekit.runtime.functions import FilterFunction, Function, KeyedProcessFunction, RuntimeContext
from statekit.runtime.timers import MAX_WATERMARK
from statekit.state.api import ReduceFunction
from statekit.state.descriptors import ValueStateDescriptor

REDUCE_STATE = "_reduce_state"


class Accumulate(enum.Enum):
    """The rolling aggregations of a keyed stream."""

    SUM = "sum"
    MIN = "min"
    MAX = "max"
    MIN_BY = "min_by"
    MAX_BY = "max_by"


def accumulator(position: int | str, kind: Accumulate) -> Callable[[Any, Any], Any]:
    """The reduce function of a rolling aggregation at ``position``."""
    if not isinstance(position, int | str) or isinstance(position, bool):
        raise TypeError("the position must be a field index (int) or a field name (str), got "
                        f"{position!r}")

    def reduce(acc: Any, value: Any) -> Any:
        if type(acc) is tuple and hasattr(value, "_fields") and len(acc) == len(value):
            # a NamedTuple stored by a serializing backend (RocksDB, or any after a restore)
            # reads back as a plain tuple: the element's type gives it its field names again
            acc = type(value)(*acc)
        if isinstance(value, dict | tuple | list):
            old, new = _field(acc, position), _field(value, position)
        else:
            if position != 0:
                raise TypeError(f"field {position!r} selected on a basic value ({value!r}): only "
                                "position 0, the value itself, can be")
            old, new = acc, value
        if kind is Accumulate.MIN_BY:
            return value if new < old else acc
        if kind is Accumulate.MAX_BY:
            return value if new > old else acc
        result = (old + new if kind is Accumulate.SUM else
                  min(old, new) if kind is Accumulate.MIN else max(old, new))
        return result if not isinstance(value, dict | tuple | list) else _with(acc, position, result)

    return reduce


def _field(value: Any, position: int | str) -> Any:
    if isinstance(value, dict):
        if position not in value:
            raise TypeError(f"no field {position!r} in {value!r}")
        return value[position]
    names = getattr(value, "_fields", None)  # a NamedTuple by field name
    if isinstance(position, str):
        if names is None or position not in names:
            raise TypeError(f"field {position!r} named on a value without field names: {value!r}")
        position = names.index(position)
    if not -len(value) <= position < len(value):
        raise TypeError(f"field {position} out of range for {value!r}")
    return value[position]


def _with(value: Any, position: int | str, field: Any) -> Any:
    """``value`` with one field replaced, of the same type (tuple, NamedTuple, list, dict)."""
    if isinstance(value, dict):
        return {**value, position: field}
    if isinstance(position, str):
        position = value._fields.index(position)
    items = list(value)
    items[position] = field
    if isinstance(value, list):
        return items
    return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)


class ReduceAdapter(KeyedProcessFunction):
    """Runs a reduce function (a :class:`ReduceFunction` or a callable) as a keyed function."""

    def __init__(self, func: ReduceFunction | Callable[[Any, Any], Any]) -> None:
        if not isinstance(func, ReduceFunction) and not callable(func):
            raise TypeError("reduce() takes a ReduceFunction or a callable")
        self.func = func
        self._reduce = func.reduce if isinstance(func, ReduceFunction) else func

    def _rich(self, name: str) -> Callable[..., None] | None:
        """The function's ``open``/``close``: a ReduceFunction is a rich function in PyFlink,
        whose ``open`` may create keyed state of its own."""
        if isinstance(self.func, Function | ReduceFunction):
            return getattr(self.func, name, None)
        return None

    def open(self, runtime_context: RuntimeContext) -> None:
        if (opener := self._rich("open")) is not None:
            opener(runtime_context)
        self.state = runtime_context.get_state(ValueStateDescriptor(REDUCE_STATE))
        # BATCH execution emits each key's final value only, from a timer at the key's end
        self.batch = runtime_context.get_job_parameter("execution.runtime-mode") == "BATCH"

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterable[Any]:
        acc = self.state.value()
        if acc is None and self.batch:
            ctx.timer_service().register_event_time_timer(MAX_WATERMARK)
        acc = value if acc is None else self._reduce(acc, value)
        self.state.update(acc)
        return () if self.batch else (acc,)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext
                 ) -> Iterable[Any]:
        acc = self.state.value()
        return () if acc is None else (acc,)

    def close(self) -> None:
        if (closer := self._rich("close")) is not None:
            closer()


class FilterAdapter(KeyedProcessFunction):
    """Runs a filter (a :class:`FilterFunction` or a predicate) on a keyed stream."""

    def __init__(self, func: FilterFunction | Callable[[Any], bool]) -> None:
        if not isinstance(func, FilterFunction) and not callable(func):
            raise TypeError("filter() takes a FilterFunction or a callable")
        self.func = func
        self._keep = func.filter if isinstance(func, FilterFunction) else func

    def open(self, runtime_context: RuntimeContext) -> None:
        if isinstance(self.func, Function):
            self.func.open(runtime_context)

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterable[Any]:
        return (value,) if self._keep(value) else ()

    def close(self) -> None:
        if isinstance(self.func, Function):
            self.func.close()
