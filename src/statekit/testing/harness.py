"""Unit-testing keyed functions without a job: Flink's ``KeyedOneInputStreamOperatorTestHarness``.

The harness runs one partition of a :class:`~statekit.KeyedProcessFunction` (or a vectorized
function) on a real keyed backend: feed elements with timestamps, move the watermark and the
processing time, read outputs, timers and state, take a snapshot and restore it into a new
harness (also at another parallelism, as Flink's ``repartitionOperatorState`` does)::

    harness = KeyedOneInputStreamOperatorTestHarness(MyFunction(), lambda v: v[0])
    harness.open()
    harness.process_element(("a", 1), timestamp=10)
    harness.process_watermark(100)          # fires event-time timers up to 100
    harness.set_processing_time(5_000)      # fires processing-time timers up to 5000
    assert harness.extract_output_values() == [...]
    snapshot = harness.snapshot()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from statekit.backends.base import KeyedStateBackend, StateBackend
from statekit.backends.transfer import restore_into
from statekit.checkpoint.blobstore.memory import MemoryBlobStore
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.checkpoint.schema import recorded_key_groups
from statekit.errors import StateError
from statekit.registry import backend_registry
from statekit.runtime.functions import Function
from statekit.runtime.operator import KeyedOperator
from statekit.runtime.timers import MIN_WATERMARK, TimeDomain
from statekit.serde.keygroups import DEFAULT_MAX_PARALLELISM, key_group_range_for_operator
from statekit.serde.keys import as_key_serializer
from statekit.serde.types import TypeInformation, serializer_for
from statekit.state.descriptors import StateDescriptor


class ManualClock:
    """A processing-time clock that only moves when told (epoch milliseconds)."""

    def __init__(self, start: int = 0) -> None:
        self.time = int(start)

    def __call__(self) -> int:
        return self.time

    def set(self, time: int) -> None:
        """Move the clock to ``time`` (never backwards)."""
        if time < self.time:
            raise ValueError(f"processing time cannot go back from {self.time} to {time}")
        self.time = int(time)

    def advance(self, millis: int) -> None:
        self.set(self.time + int(millis))


@dataclass
class OperatorSubtaskState:
    """A snapshot of one harness: its task handle, the blobs it references and its time."""

    handle: dict[str, Any]
    store: MemoryBlobStore
    watermark: int
    processing_time: int


class KeyedOneInputStreamOperatorTestHarness:
    """One partition of a keyed function on a real backend, driven by the test."""

    def __init__(self, function: Function, key_selector: Callable[[Any], Any],
                 key_type: TypeInformation | None = None, *,
                 backend: StateBackend | str = "hashmap",
                 max_parallelism: int = DEFAULT_MAX_PARALLELISM, parallelism: int = 1,
                 subtask_index: int = 0, processing_time: int = 0) -> None:
        if not 0 <= subtask_index < parallelism <= max_parallelism:
            raise StateError(f"subtask {subtask_index} of {parallelism} with max parallelism "
                             f"{max_parallelism} does not exist")
        self.function = function
        self.key_selector = key_selector
        self.key_serializer = as_key_serializer(serializer_for(key_type))
        factory = (backend_registry.create(backend, {}, StateBackend)
                   if isinstance(backend, str) else backend)
        self.backend_factory = factory
        self.max_parallelism = max_parallelism
        self.parallelism = parallelism
        self.subtask_index = subtask_index
        self.key_groups = key_group_range_for_operator(max_parallelism, parallelism, subtask_index)
        self.clock = ManualClock(processing_time)
        self.backend: KeyedStateBackend = factory.create_keyed_state_backend(
            key_serializer=self.key_serializer, key_group_range=self.key_groups,
            max_parallelism=max_parallelism, operator_id="harness")
        self.operator: KeyedOperator | None = None
        self.output: list[tuple[Any, int | None]] = []
        self._restored: list[OperatorSubtaskState] = []
        self._watermark = MIN_WATERMARK
        self._checkpoints = 0

    # --- lifecycle ------------------------------------------------------------------------------

    def initialize_state(self, snapshots: OperatorSubtaskState | Sequence[OperatorSubtaskState]
                         ) -> None:
        """Restore from snapshots of one or more harnesses (any parallelism); before ``open``."""
        if self.operator is not None:
            raise StateError("initialize_state() must come before open()")
        states = [snapshots] if isinstance(snapshots, OperatorSubtaskState) else list(snapshots)
        sources = [(state.handle, CheckpointStorageAccess(state.store, "memory://harness", 0)
                    .reader()) for state in states
                   if len(recorded_key_groups(state.handle).intersection(self.key_groups))]
        restore_into(self.backend, sources)
        self._restored = states
        if states:
            self._watermark = max(s.watermark for s in states)
            self.clock.time = max(self.clock.time, *(s.processing_time for s in states))

    def open(self) -> None:
        """Open the function (``open(runtime_context)`` runs here, once)."""
        if self.operator is not None:
            raise StateError("the harness is open already")
        self.operator = KeyedOperator(
            self.function, self.backend, task_name="harness", index=self.subtask_index,
            max_parallelism=self.max_parallelism, parallelism=self.parallelism,
            clock=self.clock)
        self.operator.timers.watermark = self._watermark

    def close(self) -> None:
        """Close the function and release the backend."""
        try:
            if self.operator is not None:
                self.operator.close()
        finally:
            self.backend.dispose()

    def __enter__(self) -> KeyedOneInputStreamOperatorTestHarness:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def _op(self) -> KeyedOperator:
        if self.operator is None:
            self.open()
        assert self.operator is not None
        return self.operator

    # --- driving --------------------------------------------------------------------------------

    def process_element(self, value: Any, timestamp: int | None = None) -> None:
        """Process one element (its event-time ``timestamp``, if any)."""
        op = self._op
        key = self.key_selector(value)
        kg = self.backend.key_group_of(key)
        if kg not in self.key_groups:
            raise StateError(f"key {key!r} (key group {kg}) does not belong to subtask "
                             f"{self.subtask_index} of {self.parallelism}")
        if op.vectorized:
            import pandas as pd

            produced = op.process_frame(pd.DataFrame([value]), key)
            self._collect([produced] if produced is not None and len(produced) else None,
                          timestamp)
            return
        self._collect(op.process_element(key, value, timestamp), timestamp)

    def process_watermark(self, watermark: int) -> None:
        """Move the watermark to ``watermark``, firing the event-time timers it passes."""
        op = self._op
        fired: list[Any] = []
        op.advance_watermark(watermark, fired)
        self._collect(fired, None)

    def set_processing_time(self, time: int) -> None:
        """Move processing time to ``time``, firing the processing-time timers it passes."""
        op = self._op
        self.clock.set(time)
        fired: list[Any] = []
        op.advance_processing_time(time, fired)
        self._collect(fired, None)

    def get_processing_time(self) -> int:
        return self.clock.time

    def current_watermark(self) -> int:
        return self._op.timers.watermark

    def _collect(self, produced: Any, timestamp: int | None) -> None:
        if produced is not None:
            self.output.extend((value, timestamp) for value in produced)

    # --- results ----------------------------------------------------------------------------------

    def get_output(self) -> list[tuple[Any, int | None]]:
        """Every output so far as ``(value, timestamp)`` (timestamp: the input element's)."""
        return list(self.output)

    def extract_output_values(self) -> list[Any]:
        """Every output value so far, in order."""
        return [value for value, _ in self.output]

    def clear_output(self) -> None:
        self.output.clear()

    def num_event_time_timers(self) -> int:
        return len(self._op.timers.event)

    def num_processing_time_timers(self) -> int:
        return len(self._op.timers.processing)

    def timers_of(self, key: Any, domain: TimeDomain = TimeDomain.EVENT_TIME) -> list[int]:
        """``key``'s registered timers of ``domain``, earliest first."""
        self.backend.set_current_key(key)
        return self._op.timers.timers_of_current_key(domain)

    def get_state(self, descriptor: StateDescriptor, key: Any) -> Any:
        """``key``'s state of ``descriptor`` (its state object, positioned on ``key``)."""
        op = self._op
        state = op.backend.get_partitioned_state(descriptor)
        op.backend.set_current_key(key)
        return state

    # --- snapshots --------------------------------------------------------------------------------

    def snapshot(self) -> OperatorSubtaskState:
        """A snapshot of the partition's state and timers (the full asynchronous path)."""
        op = self._op
        self._checkpoints += 1
        store = MemoryBlobStore()
        access = CheckpointStorageAccess(store, "memory://harness", 0)
        run = op.backend.snapshot(self._checkpoints, access.streams(self._checkpoints, "harness"))
        handle = run.run()
        op.backend.notify_checkpoint_complete(self._checkpoints)
        return OperatorSubtaskState(handle, store, op.timers.watermark, self.clock.time)
