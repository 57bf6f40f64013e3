"""The window operator (Flink's ``WindowOperator``), run as the keyed function of a job.

Each element goes to the windows its assigner gives; a window's contents live in the keyed
backend under the window as namespace (a reducing, aggregating or list state), so they are
checkpointed, restored at any parallelism and carried between backends like all keyed state.
Merging (session) windows keep Flink's merging window set in keyed state and merge namespaces
with ``merge_namespaces``.  The trigger decides when a window fires; its timers, and the cleanup
timer at ``max_timestamp + allowed_lateness`` that drops a window's state, are timers of the
operator's timer service.  Those are ``(key, timestamp)`` only, so the windows waiting on each
timestamp are kept in a keyed map state per time domain (``window-timers/event``,
``window-timers/processing``).  Elements whose every window is past its lateness go to the
late-data side output, or are dropped.
"""

from __future__ import annotations

from typing import Any

from statekit.backends.timers import MAX_TIMESTAMP
from statekit.errors import StateError, StateTypeError
from statekit.runtime.functions import KeyedProcessFunction, OutputTag, RuntimeContext
from statekit.runtime.timers import TimeDomain, TimerService
from statekit.runtime.windows.assigners import MergingWindowAssigner, WindowAssigner
from statekit.runtime.windows.functions import (
    InternalWindowFunction,
    KeyedStateStore,
    ProcessWindowFunction,
)
from statekit.runtime.windows.merging import MergingWindowSet, merging_set_descriptor
from statekit.runtime.windows.triggers import Trigger, TriggerResult
from statekit.serde.types import Types
from statekit.state.api import State
from statekit.state.descriptors import ListStateDescriptor, MapStateDescriptor, StateDescriptor

#: the keyed map states from a timer's timestamp to the windows waiting on it
TIMER_INDEX = {TimeDomain.EVENT_TIME: "window-timers/event",
               TimeDomain.PROCESSING_TIME: "window-timers/processing"}
EVENT = TimeDomain.EVENT_TIME
#: how many registered timers the operator remembers (then it forgets them all and reads again)
KNOWN_TIMERS = 1 << 16


class WindowOperator(KeyedProcessFunction):
    """Windows of a keyed stream: assigner, trigger, contents state and window function."""

    def __init__(self, assigner: WindowAssigner, trigger: Trigger, contents: StateDescriptor,
                 function: InternalWindowFunction, allowed_lateness: int = 0,
                 late_data_tag: OutputTag | None = None) -> None:
        self.assigner = assigner
        self.trigger = trigger
        self.contents_descriptor = contents
        self.function = function
        self.allowed_lateness = allowed_lateness
        self.late_data_tag = late_data_tag
        self.event_time = assigner.is_event_time()
        self.merging = isinstance(assigner, MergingWindowAssigner)
        self.list_contents = isinstance(contents, ListStateDescriptor)

    # --- lifecycle ------------------------------------------------------------------------------

    def open(self, runtime_context: RuntimeContext) -> None:
        backend = runtime_context._backend
        self.backend = backend
        self.runtime_context = runtime_context
        self.namespace_type = self.assigner.get_window_serializer()
        self.namespaced: dict[str, State] = {}
        self.contents: Any = self.namespaced_state(self.contents_descriptor)
        self.namespace_set = False
        index_type = Types.LIST(self.assigner.get_window_type())
        self.index = {domain: backend.get_partitioned_state(
            MapStateDescriptor(name, Types.LONG(), index_type))
            for domain, name in TIMER_INDEX.items()}
        self.event_index = self.index[TimeDomain.EVENT_TIME]
        self.merging_state = (backend.get_partitioned_state(merging_set_descriptor())
                              if self.merging else None)
        self.ctx = WindowContext(self)
        # timers known to be in the index, so that the trigger's and the cleanup's registration
        # of an open window (on every element) read no state; only register/delete/on_timer
        # change the index, and they keep this a subset of it
        self.known: dict[tuple[Any, ...], None] = {}
        self.function.open(runtime_context)

    def close(self) -> None:
        self.function.close()

    def namespaced_state(self, descriptor: StateDescriptor) -> Any:
        """The window-namespaced state of ``descriptor`` (created once)."""
        state = self.namespaced.get(descriptor.name)
        if state is None:
            state = self.backend.get_namespaced_state(descriptor, self.namespace_type)
            self.namespaced[descriptor.name] = state
        return state

    # --- elements -------------------------------------------------------------------------------

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> list[Any]:
        c = self.ctx
        c.timers = ctx.timer_service()
        timestamp = ctx.timestamp()
        windows = self.assigner.assign_windows(value, timestamp, c)
        contents, trigger = self.contents, self.trigger
        out: list[Any] = []
        skipped = True
        merging_set = self._merging_set() if self.merging else None
        for assigned in windows:
            window = assigned
            if merging_set is not None:
                window = merging_set.add_window(assigned, self._merge)
            if self._window_late(window):
                if merging_set is not None:
                    merging_set.retire_window(window)
                continue
            skipped = False
            state_window = window
            if merging_set is not None:
                state_window = merging_set.get_state_window(window)
                if state_window is None:
                    raise StateError(f"window {window!r} has no state window")
            self._use(state_window)
            contents.add(value)
            c.current = window
            result = trigger.on_element(value, timestamp, window, c)
            if type(result) is not TriggerResult:
                raise _not_a_result(trigger, "on_element", result)
            if result.value[0]:  # fire
                found = contents.get()
                if found is None or (self.list_contents and not found):
                    continue
                out.extend(self.function.process(ctx.get_current_key(), window, c, found))
            if result.value[1]:  # purge
                contents.clear()
            self._register_cleanup(window)
        if merging_set is not None:
            merging_set.persist()
        if skipped and self._element_late(timestamp) and self.late_data_tag is not None:
            out.append((self.late_data_tag, value))
        return out

    def _use(self, namespace: Any) -> None:
        """Point the contents state at ``namespace`` (unless it is there: consecutive elements
        of different keys are mostly in the same window, and each setting checks its type)."""
        contents = self.contents
        if not self.namespace_set or contents.get_current_namespace() != namespace:
            contents.set_current_namespace(namespace)
            self.namespace_set = True

    def _merge(self, result: Any, merged: list[Any], state_result: Any,
               merged_states: list[Any]) -> None:
        """Windows merged into ``result``: the trigger moves its timers and state, the merged
        windows' cleanup timers go, and their contents are merged into ``state_result``."""
        c = self.ctx
        if self.event_time and result.max_timestamp() + self.allowed_lateness <= \
                c.current_watermark():
            raise StateError(f"merging into {result!r} would end an event-time window before "
                             f"the current watermark {c.current_watermark()}: the session "
                             "assigner must not shrink windows")
        if not self.event_time and result.max_timestamp() <= c.current_processing_time():
            raise StateError(f"merging into {result!r} would end a processing-time window "
                             "before the current processing time")
        c.current, c.merged = result, merged
        self.trigger.on_merge(result, c)
        for window in merged:
            c.current = window
            self.trigger.clear(window, c)
            self._delete_cleanup(window)
        c.merged = []
        if merged_states:
            self.contents.merge_namespaces(state_result, merged_states)

    # --- timers ---------------------------------------------------------------------------------

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> list[Any]:
        """A timer of the current key fired: each window waiting on it, one at a time (a window
        may delete another's timer on the way)."""
        self.ctx.timers = ctx.timer_service()
        domain = ctx.time_domain()
        index = self.index[domain]
        out: list[Any] = []
        while True:
            windows = index.get(timestamp)
            if not windows:
                return out
            if len(windows) == 1:
                index.remove(timestamp)
            else:
                index.put(timestamp, windows[1:])
            key = ctx.get_current_key()
            self.known.pop((key, domain is EVENT, timestamp, windows[0]), None)
            self._on_time(self.assigner.window_of(windows[0]), timestamp, domain, key, out)

    def _on_time(self, window: Any, timestamp: int, domain: TimeDomain, key: Any,
                 out: list[Any]) -> None:
        c = self.ctx
        c.current = window
        contents = self.contents
        merging_set = None
        if self.merging:
            merging_set = self._merging_set()
            state_window = merging_set.get_state_window(window)
            if state_window is None:  # merged into another window, or purged meanwhile
                return
            self._use(state_window)
        else:
            self._use(window)
        event = domain is TimeDomain.EVENT_TIME
        result = (self.trigger.on_event_time(timestamp, window, c) if event
                  else self.trigger.on_processing_time(timestamp, window, c))
        if type(result) is not TriggerResult:
            raise _not_a_result(self.trigger, "on_event_time" if event else "on_processing_time",
                                result)
        if result.is_fire():
            found = contents.get()
            if found is not None and not (self.list_contents and not found):
                out.extend(self.function.process(key, window, c, found))
        if result.is_purge():
            contents.clear()
        if event == self.event_time and timestamp == self._cleanup_time(window):
            contents.clear()
            c.current = window
            self.trigger.clear(window, c)
            self.function.clear(c)
            if merging_set is not None:
                merging_set.retire_window(window)
        if merging_set is not None:
            merging_set.persist()

    def register(self, domain: TimeDomain, window: Any, timestamp: int) -> None:
        """A timer for ``window`` at ``timestamp`` (one per key, window, time and domain)."""
        event = domain is EVENT
        known = (self.backend.get_current_key(), event, timestamp, window)
        if known in self.known:
            return
        if len(self.known) >= KNOWN_TIMERS:
            self.known.clear()
        self.known[known] = None
        entry = tuple(window)
        index = self.event_index if event else self.index[domain]
        windows = index.get(timestamp)
        if windows is None:
            index.put(timestamp, [entry])
        elif entry in windows:
            return
        else:
            index.put(timestamp, [*windows, entry])
            return
        timers = self.ctx.timers
        if event:
            timers.register_event_time_timer(timestamp)
        else:
            timers.register_processing_time_timer(timestamp)

    def delete(self, domain: TimeDomain, window: Any, timestamp: int) -> None:
        """Delete ``window``'s timer at ``timestamp`` (nothing happens when there is none)."""
        index = self.index[domain]
        windows = index.get(timestamp)
        entry = tuple(window)
        self.known.pop((self.backend.get_current_key(), domain is EVENT, timestamp, entry), None)
        if not windows or entry not in windows:
            return
        rest = [w for w in windows if w != entry]
        if rest:
            index.put(timestamp, rest)
            return
        index.remove(timestamp)
        timers = self.ctx.timers
        if domain is TimeDomain.EVENT_TIME:
            timers.delete_event_time_timer(timestamp)
        else:
            timers.delete_processing_time_timer(timestamp)

    # --- lateness and cleanup ---------------------------------------------------------------------

    def _cleanup_time(self, window: Any) -> int:
        if not self.event_time:
            return int(window.max_timestamp())
        cleanup = window.max_timestamp() + self.allowed_lateness
        return cleanup if cleanup <= MAX_TIMESTAMP else MAX_TIMESTAMP

    def _window_late(self, window: Any) -> bool:
        return self.event_time and self._cleanup_time(window) <= self.ctx.current_watermark()

    def _element_late(self, timestamp: int | None) -> bool:
        return (self.event_time and timestamp is not None
                and timestamp + self.allowed_lateness <= self.ctx.current_watermark())

    def _register_cleanup(self, window: Any) -> None:
        cleanup = self._cleanup_time(window)
        if cleanup == MAX_TIMESTAMP:  # no cleanup at the end of time
            return
        self.register(TimeDomain.EVENT_TIME if self.event_time else TimeDomain.PROCESSING_TIME,
                      window, cleanup)

    def _delete_cleanup(self, window: Any) -> None:
        cleanup = self._cleanup_time(window)
        if cleanup == MAX_TIMESTAMP:
            return
        self.delete(TimeDomain.EVENT_TIME if self.event_time else TimeDomain.PROCESSING_TIME,
                    window, cleanup)

    def _merging_set(self) -> MergingWindowSet:
        return MergingWindowSet(self.assigner, self.merging_state)  # type: ignore[arg-type]


class WindowContext(Trigger.OnMergeContext, ProcessWindowFunction.Context,
                    WindowAssigner.WindowAssignerContext):
    """The one context of the operator's current key and window, seen by the assigner, the
    trigger (timers, window state, merging) and the window function."""

    def __init__(self, operator: WindowOperator) -> None:
        self.operator = operator
        self.current: Any = None
        self.merged: list[Any] = []
        self.timers: TimerService | None = None
        self._window_store = KeyedStateStore(self.get_partitioned_state)
        self._global_store = KeyedStateStore(operator.backend.get_partitioned_state)

    def window(self) -> Any:
        """The window being evaluated (PyFlink's ``context.window()``)."""
        return self.current

    def get_runtime_context(self) -> RuntimeContext:
        """The operator's runtime context (count window assigners keep their count there)."""
        return self.operator.runtime_context

    def _service(self) -> TimerService:
        if self.timers is None:
            raise StateError("no timer service: the window operator is not running")
        return self.timers

    def get_current_processing_time(self) -> int:
        return self._service().current_processing_time()

    def get_current_watermark(self) -> int:
        return self._service().current_watermark()

    current_processing_time = get_current_processing_time
    current_watermark = get_current_watermark

    def register_processing_time_timer(self, time: int) -> None:
        self.operator.register(TimeDomain.PROCESSING_TIME, self.current, time)

    def register_event_time_timer(self, time: int) -> None:
        self.operator.register(TimeDomain.EVENT_TIME, self.current, time)

    def delete_processing_time_timer(self, time: int) -> None:
        self.operator.delete(TimeDomain.PROCESSING_TIME, self.current, time)

    def delete_event_time_timer(self, time: int) -> None:
        self.operator.delete(TimeDomain.EVENT_TIME, self.current, time)

    def get_partitioned_state(self, state_descriptor: StateDescriptor) -> Any:
        """``state_descriptor``'s state in the current key and window."""
        state = self.operator.namespaced_state(state_descriptor)
        state.set_current_namespace(self.current)
        return state

    def merge_partitioned_state(self, state_descriptor: StateDescriptor) -> None:
        if not self.merged:
            return
        state = self.operator.namespaced_state(state_descriptor)
        merge = getattr(state, "merge_namespaces", None)
        if merge is None:
            raise StateError("merge_partitioned_state needs a list, reducing or aggregating "
                             "state (a mergeable state)", state_descriptor.name)
        merge(self.current, list(self.merged))

    def window_state(self) -> KeyedStateStore:
        return self._window_store

    def global_state(self) -> KeyedStateStore:
        return self._global_store


def _not_a_result(trigger: Trigger, method: str, result: Any) -> StateTypeError:
    return StateTypeError(f"{type(trigger).__name__}.{method} returned {result!r}, not a "
                          "TriggerResult (CONTINUE, FIRE, PURGE or FIRE_AND_PURGE)")
