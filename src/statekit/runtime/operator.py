"""One partition of a keyed user function: its opened instance, keyed backend, timers and contexts.

Every engine drives a :class:`KeyedOperator` the same way (Flink's ``KeyedProcessOperator``):
the local runner's tasks, the test harness and the Spark adapters.  It owns the function's
lifecycle (``open`` once, ``close`` once), sets the current key and the element's timestamp,
and fires due timers into ``on_timer`` (or, for a vectorized function, into ``on_timers`` as one
frame per call).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from statekit.backends.base import NO_KEY, KeyedStateBackend
from statekit.backends.bulk import BulkState
from statekit.backends.operator import OperatorStateBackend
from statekit.errors import NoKeyContextError
from statekit.runtime.checkpointed import (
    FunctionInitializationContext,
    FunctionSnapshotContext,
    checkpointed_part,
    refuse_operator_state,
)
from statekit.runtime.functions import (
    Function,
    KeyedProcessFunction,
    RuntimeContext,
    VectorizedKeyedFunction,
    open_function,
)
from statekit.runtime.timers import (
    InternalTimerService,
    Refusal,
    TimeDomain,
    TimerService,
    wall_clock_ms,
)


class KeyedOperator:
    """A user function opened on one partition's backend, with that partition's timers."""

    def __init__(self, function: Function, backend: KeyedStateBackend, *, task_name: str,
                 index: int, max_parallelism: int, parallelism: int = -1, attempt: int = 0,
                 job_parameters: Mapping[str, Any] | None = None,
                 clock: Callable[[], int] = wall_clock_ms, refusal: Refusal | None = None,
                 open_now: bool = True, operator_state: OperatorStateBackend | None = None,
                 restored_checkpoint_id: int | None = None) -> None:
        self.backend = backend
        if operator_state is None:  # an engine without operator state (Spark, the harness)
            refuse_operator_state(function, "this engine")
        #: the subtask's operator state (restored by the engine, or empty)
        self.operator_state = operator_state or OperatorStateBackend()
        self.restored_checkpoint_id = restored_checkpoint_id
        self.vectorized = isinstance(function, VectorizedKeyedFunction)
        if self.vectorized and type(function).on_timers is VectorizedKeyedFunction.on_timers:
            refusal = _without_timers(type(function).__name__)
        self.timers = InternalTimerService(backend, clock, refusal)
        self.timer_service = TimerService(self.timers)
        self.ctx = KeyedProcessFunction.Context(backend, self.timer_service)
        self.timer_ctx = KeyedProcessFunction.OnTimerContext(backend, self.timer_service)
        self.bulk = VectorizedState(backend, self.timers)
        self._template = function
        self.runtime_context = RuntimeContext(backend, task_name, index, parallelism,
                                              max_parallelism, attempt, dict(job_parameters or {}))
        self.runtime_context.operator_state = self.operator_state
        self.function: Any = None
        self.closed = False
        if open_now:
            self.open()

    def open(self) -> None:
        """A private copy of the user's function, opened (``open()`` runs once per operator)."""
        self.function = open_function(self._template, self.runtime_context, self._initialize)

    def _initialize(self, function: Function) -> None:
        """``initialize_state`` of a CheckpointedFunction, before its ``open`` (Flink's order)."""
        part = checkpointed_part(function)
        if part is not None:
            part.initialize_state(FunctionInitializationContext(
                self.operator_state, self.runtime_context, self.restored_checkpoint_id))

    def snapshot_operator_state(self, checkpoint_id: int, timestamp: int) -> bytes | None:
        """``snapshot_state`` of a CheckpointedFunction, then the operator state's snapshot
        (None: there is none), taken now."""
        part = checkpointed_part(self.function)
        if part is not None:
            part.snapshot_state(FunctionSnapshotContext(checkpoint_id, timestamp))
        return self.operator_state.snapshot()

    def close(self) -> None:
        """Close the function once (also after a failure); later calls do nothing."""
        if not self.closed and self.function is not None:
            self.closed = True
            self.function.close()

    # --- elements ---------------------------------------------------------------------------------

    def process_element(self, key: Any, value: Any, timestamp: int | None = None
                        ) -> Iterable[Any] | None:
        """Run ``process_element`` for one element of ``key`` (``timestamp``: its event time)."""
        self.backend.set_current_key(key)
        ctx = self.ctx
        ctx._timestamp = timestamp
        return self.function.process_element(value, ctx)  # type: ignore[no-any-return]

    def process_unkeyed(self, value: Any, timestamp: int | None = None) -> Iterable[Any] | None:
        """Run ``process_element`` for an element without a key (a non-keyed input)."""
        ctx = self.ctx
        ctx._timestamp = timestamp
        return self.function.process_element(value, ctx)  # type: ignore[no-any-return]

    def process_broadcast(self, value: Any, timestamp: int | None = None) -> Iterable[Any] | None:
        """Run the broadcast side of a broadcast function (no current key is set)."""
        self.backend.set_current_key(NO_KEY)
        ctx = self.ctx
        ctx._timestamp = timestamp
        return self.function.process_broadcast(value, ctx)  # type: ignore[no-any-return]

    def process_key_rows(self, key: Any, rows: Iterable[Any],
                         timestamp_of: Callable[[Any], int | None] | None = None) -> list[Any]:
        """Run ``process_element`` over several elements of one key (the key is set once);
        ``timestamp_of(row)`` gives each element's event time.  The outputs, in order."""
        self.backend.set_current_key(key)
        ctx, process = self.ctx, self.function.process_element
        out: list[Any] = []
        for row in rows:
            ctx._timestamp = None if timestamp_of is None else timestamp_of(row)
            produced = process(row, ctx)
            if produced is not None:
                out.extend(produced)
        return out

    def process_frame(self, frame: Any, key: Any = NO_KEY,
                      keys_of: Callable[[], list[Any]] | None = None) -> Any:
        """Run a vectorized function over a pandas DataFrame of rows: all of ``key`` (then the
        current key, as for ``process_element``), or of many keys, each row's key listed by
        ``keys_of()`` when asked."""
        bulk = self.bulk
        if key is not NO_KEY:
            self.backend.set_current_key(key)
        bulk.rows = _Rows(len(frame), key, keys_of)
        try:
            return self.function.process_batch(frame, bulk)
        finally:
            bulk.rows = None

    # --- timers -----------------------------------------------------------------------------------

    def on_timer(self, key: Any, timestamp: int, domain: TimeDomain) -> Iterable[Any] | None:
        """Run ``on_timer`` for one fired timer."""
        self.backend.set_current_key(key)
        ctx = self.timer_ctx
        ctx._timestamp = timestamp
        ctx._domain = domain
        return self.function.on_timer(timestamp, ctx)  # type: ignore[no-any-return]

    def advance_watermark(self, watermark: int, out: list[Any]) -> None:
        """Move the watermark forward (never back) and fire the event-time timers it passes,
        timers registered meanwhile included; outputs are appended to ``out``."""
        timers = self.timers
        if watermark <= timers.watermark:
            return
        timers.watermark = watermark
        if timers.next_event > watermark:
            return
        if self.vectorized:
            self._fire_frame(lambda: _tagged(timers.poll_event(), TimeDomain.EVENT_TIME), out)
            return
        while (timer := timers.poll_event()) is not None:
            produced = self.on_timer(timer[0], timer[1], TimeDomain.EVENT_TIME)
            if produced is not None:
                out.extend(produced)

    def advance_processing_time(self, now: int, out: list[Any]) -> None:
        """Fire the processing-time timers due at ``now``."""
        timers = self.timers
        if timers.next_processing > now:
            return
        if self.vectorized:
            self._fire_frame(lambda: _tagged(timers.poll_processing(now),
                                             TimeDomain.PROCESSING_TIME), out)
            return
        while (timer := timers.poll_processing(now)) is not None:
            produced = self.on_timer(timer[0], timer[1], TimeDomain.PROCESSING_TIME)
            if produced is not None:
                out.extend(produced)

    def fire_due(self, now: int, watermark: int | None, out: list[Any]) -> None:
        """Fire every timer due at processing time ``now`` and ``watermark`` (None: unchanged),
        both domains in timestamp order (a micro-batch's time)."""
        timers = self.timers
        if watermark is not None and watermark > timers.watermark:
            timers.watermark = watermark
        if timers.next_event > timers.watermark and timers.next_processing > now:
            return
        if self.vectorized:
            self._fire_frame(lambda: timers.poll(now), out)
            return
        while (timer := timers.poll(now)) is not None:
            produced = self.on_timer(*timer)
            if produced is not None:
                out.extend(produced)

    def fire(self, timers: list[tuple[Any, int, TimeDomain]], out: list[Any]) -> None:
        """Run the function for timers already removed from their queues."""
        if self.vectorized:
            self._call_on_timers(timers, out)
            return
        for timer in timers:
            produced = self.on_timer(*timer)
            if produced is not None:
                out.extend(produced)

    def _fire_frame(self, poll: Callable[[], tuple[Any, int, TimeDomain] | None],
                    out: list[Any]) -> None:
        """Vectorized functions get the due timers as frames of (key, timestamp, domain), one
        call per round: timers a call registers that are due already come in the next frame."""
        while True:
            fired = []
            while (timer := poll()) is not None:
                fired.append(timer)
            if not fired:
                return
            self._call_on_timers(fired, out)

    def _call_on_timers(self, fired: list[tuple[Any, int, TimeDomain]], out: list[Any]) -> None:
        import pandas as pd

        frame = pd.DataFrame([(k, t, d.name) for k, t, d in fired],
                             columns=["key", "timestamp", "domain"])
        result = self.function.on_timers(frame, self.bulk)
        if result is not None and len(result):
            out.append(result)


class VectorizedState(BulkState):
    """What a vectorized function gets as ``state``: bulk state access, plus the timers of many
    keys at once and the partition's time."""

    def __init__(self, backend: KeyedStateBackend, timers: InternalTimerService) -> None:
        super().__init__(backend)
        self.timers = timers
        #: the rows ``process_batch`` runs on (None outside it)
        self.rows: _Rows | None = None

    def get_current_key(self) -> Any:
        """The key of the rows ``process_batch`` has where the engine hands it one key's rows
        (``transform_with_state``, ``apply_in_pandas_with_state``, the test harness), as
        ``ctx.get_current_key()`` gives a KeyedProcessFunction; a tuple for several key columns.
        A NoKeyContextError where the rows are of many keys (``foreach_batch``: use
        :meth:`get_current_keys`) and in ``on_timers`` (the timers' ``key`` column)."""
        rows = self.rows
        if rows is None:
            raise NoKeyContextError("no current key outside process_batch (on_timers: the "
                                    "timers frame's key column)")
        if rows.key is NO_KEY:
            raise NoKeyContextError("the rows are of many keys (foreach_batch hands a "
                                    "partition's rows at once): get_current_keys() lists each "
                                    "row's key")
        return rows.key

    def get_current_keys(self) -> list[Any]:
        """Each row's key, in the rows' order, on every engine (the key as
        :meth:`get_current_key` and the per-element path give it)."""
        rows = self.rows
        if rows is None:
            raise NoKeyContextError("no current keys outside process_batch (on_timers: the "
                                    "timers frame's key column)")
        if rows.key is not NO_KEY:
            return [rows.key] * rows.count
        if rows.keys_of is None:
            raise NoKeyContextError("this engine does not tell the rows' keys")
        return rows.keys_of()

    def current_processing_time(self) -> int:
        return self.timers.current_processing_time()

    def current_watermark(self) -> int:
        return self.timers.current_watermark()

    def _each(self, domain: TimeDomain, keys: Iterable[Any], timestamps: Iterable[Any],
              delete: bool) -> None:
        keys, timestamps = list(keys), list(timestamps)
        if len(keys) != len(timestamps):
            raise ValueError("keys and timestamps differ in length")
        act = self.timers.delete if delete else self.timers.register
        with self._current_key_kept():
            self._per_key(keys, lambda t: act(domain, t), timestamps)

    def register_event_time_timers(self, keys: Iterable[Any], timestamps: Iterable[int]) -> None:
        """One event-time timer per (key, timestamp) pair; ``on_timers`` gets them when due."""
        self._each(TimeDomain.EVENT_TIME, keys, timestamps, delete=False)

    def register_processing_time_timers(self, keys: Iterable[Any], timestamps: Iterable[int]
                                        ) -> None:
        """One processing-time timer per (key, timestamp) pair."""
        self._each(TimeDomain.PROCESSING_TIME, keys, timestamps, delete=False)

    def delete_event_time_timers(self, keys: Iterable[Any], timestamps: Iterable[int]) -> None:
        self._each(TimeDomain.EVENT_TIME, keys, timestamps, delete=True)

    def delete_processing_time_timers(self, keys: Iterable[Any], timestamps: Iterable[int]
                                      ) -> None:
        self._each(TimeDomain.PROCESSING_TIME, keys, timestamps, delete=True)

    def timers_of(self, key: Any, domain: TimeDomain = TimeDomain.EVENT_TIME) -> list[int]:
        """``key``'s timers of ``domain``, earliest first."""
        with self._current_key_kept():
            self.backend.set_current_key(key)
            return self.timers.timers_of_current_key(domain)


class _Rows(NamedTuple):
    """The rows a vectorized function runs on: how many, their key (NO_KEY: many keys), and
    what lists each row's key."""

    count: int
    key: Any
    keys_of: Callable[[], list[Any]] | None


def _without_timers(name: str) -> Refusal:
    def refuse(domain: TimeDomain) -> str:
        return (f"{name} registers timers but defines no on_timers(timers, state) to receive "
                "them: define it")

    return refuse


def _tagged(timer: tuple[Any, int] | None, domain: TimeDomain
            ) -> tuple[Any, int, TimeDomain] | None:
    return None if timer is None else (timer[0], timer[1], domain)
