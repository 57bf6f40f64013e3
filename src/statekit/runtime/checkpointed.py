"""Operator state for user functions (Flink's ``CheckpointedFunction``): a function that also
implements :class:`CheckpointedFunction` gets ``initialize_state(context)`` once per subtask,
before ``open``, with the subtask's operator state store, and ``snapshot_state(context)``
before each checkpoint or savepoint takes its state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from statekit.backends.operator import OperatorStateBackend
from statekit.errors import StateError


class FunctionInitializationContext:
    """What ``initialize_state`` gets: the operator state store, the keyed state store (keyed
    operators), and whether the subtask is restored from a checkpoint or savepoint."""

    def __init__(self, operator_state: OperatorStateBackend, keyed_state: Any,
                 restored_checkpoint_id: int | None) -> None:
        self._operator_state = operator_state
        self._keyed_state = keyed_state
        self._restored_checkpoint_id = restored_checkpoint_id

    def get_operator_state_store(self) -> OperatorStateBackend:
        return self._operator_state

    def get_keyed_state_store(self) -> Any:
        """The runtime context's keyed state (``get_state``, ...), for keyed operators."""
        return self._keyed_state

    def is_restored(self) -> bool:
        """Whether the job restores a checkpoint or savepoint (also for a subtask given no
        operator state of it)."""
        return self._restored_checkpoint_id is not None

    def get_restored_checkpoint_id(self) -> int | None:
        return self._restored_checkpoint_id


class FunctionSnapshotContext:
    """What ``snapshot_state`` gets: the checkpoint's id and timestamp (ms)."""

    __slots__ = ("_checkpoint_id", "_timestamp")

    def __init__(self, checkpoint_id: int, timestamp: int) -> None:
        self._checkpoint_id = checkpoint_id
        self._timestamp = timestamp

    def get_checkpoint_id(self) -> int:
        return self._checkpoint_id

    def get_checkpoint_timestamp(self) -> int:
        return self._timestamp


class CheckpointedFunction(ABC):
    """Mix into a user function to keep operator state: register states in
    ``initialize_state`` (restored ones come back there), bring them up to date in
    ``snapshot_state``."""

    @abstractmethod
    def initialize_state(self, context: FunctionInitializationContext) -> None: ...

    @abstractmethod
    def snapshot_state(self, context: FunctionSnapshotContext) -> None: ...


def checkpointed_part(function: Any) -> CheckpointedFunction | None:
    """The user's CheckpointedFunction in ``function``: itself, or the user function a
    statekit adapter (map, filter, connected, broadcast) runs."""
    while True:
        if isinstance(function, CheckpointedFunction):
            return function
        inner = getattr(function, "func", None)
        if inner is None or not type(function).__module__.startswith("statekit."):
            return None
        function = inner


def refuse_operator_state(function: Any, engine: str) -> None:
    """StateError when ``function`` keeps operator state (a CheckpointedFunction, a broadcast
    function) on an engine that neither snapshots nor restores it: refused, never lost."""
    if callable(getattr(function, "process_broadcast_element", None)):
        raise StateError(f"{type(function).__name__} is a broadcast process function: broadcast "
                         f"streams run on the local runner only, not in {engine}")
    part = checkpointed_part(function)
    if part is not None:
        raise StateError(f"{type(part).__name__} is a CheckpointedFunction: operator state runs "
                         f"on the local runner only, not in {engine}; keep the state in keyed "
                         "state (runtime_context.get_state, ...)")
