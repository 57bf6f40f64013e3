"""Hypothesis model test: a backend behaves like a plain dict across checkpoints, failures and rescales.

``model_test(backend_factory, storage_factory)`` returns a ``unittest.TestCase`` class that drives
random writes, checkpoints, failures (restore the last checkpoint, the model rolls back with it)
and rescales (4 → 2 → 3 ...) against a :class:`KeyedCluster`, checking every key after each step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from statekit.backends.base import StateBackend
from statekit.checkpoint.base import CheckpointStorage
from statekit.serde.types import Types
from statekit.state.descriptors import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statekit.testing.cluster import KeyedCluster

KEYS = st.sampled_from([f"k{i}" for i in range(12)] + [i for i in range(6)] + [("t", 1)])
VALUE = ValueStateDescriptor("value", Types.LONG())
LIST = ListStateDescriptor("list", Types.STRING())
MAP = MapStateDescriptor("map", Types.STRING(), Types.LONG())


def model_test(backend_factory: Callable[[], StateBackend],
               storage_factory: Callable[[], CheckpointStorage],
               max_examples: int = 25) -> type:
    """A TestCase class running the model machine against the given backend and storage."""

    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.cluster = KeyedCluster(backend_factory(), storage_factory(), parallelism=4)
            self.model: dict[str, dict[Any, Any]] = {"value": {}, "list": {}, "map": {}}
            self.checkpointed: dict[str, dict[Any, Any]] | None = None

        @rule(key=KEYS, value=st.integers(-(2**63), 2**63 - 1))
        def put_value(self, key: Any, value: int) -> None:
            self.cluster.state(key, VALUE).update(value)
            self.model["value"][key] = value

        @rule(key=KEYS)
        def clear_value(self, key: Any) -> None:
            self.cluster.state(key, VALUE).clear()
            self.model["value"].pop(key, None)

        @rule(key=KEYS, item=st.text(max_size=5))
        def add_list(self, key: Any, item: str) -> None:
            self.cluster.state(key, LIST).add(item)
            self.model["list"].setdefault(key, []).append(item)

        @rule(key=KEYS, user_key=st.sampled_from("abcd"), value=st.integers(0, 100))
        def put_map(self, key: Any, user_key: str, value: int) -> None:
            self.cluster.state(key, MAP).put(user_key, value)
            self.model["map"].setdefault(key, {})[user_key] = value

        @rule(key=KEYS, user_key=st.sampled_from("abcd"))
        def remove_map(self, key: Any, user_key: str) -> None:
            self.cluster.state(key, MAP).remove(user_key)
            entry = self.model["map"].get(key)
            if entry is not None:
                entry.pop(user_key, None)
                if not entry:
                    del self.model["map"][key]

        @rule()
        def checkpoint(self) -> None:
            self.cluster.checkpoint()
            self.checkpointed = copy.deepcopy(self.model)

        @precondition(lambda self: self.checkpointed is not None)
        @rule()
        def fail_and_recover(self) -> None:
            self.cluster.restore()
            self.model = copy.deepcopy(self.checkpointed)  # type: ignore[arg-type]

        @rule(parallelism=st.sampled_from([1, 2, 3, 4, 5]))
        def rescale(self, parallelism: int) -> None:
            self.cluster.checkpoint()
            self.checkpointed = copy.deepcopy(self.model)
            self.cluster.restore(parallelism=parallelism)

        @invariant()
        def matches_model(self) -> None:
            keys = set().union(*(m.keys() for m in self.model.values()))
            for key in keys:
                assert self.cluster.state(key, VALUE).value() == self.model["value"].get(key)
                assert list(self.cluster.state(key, LIST).get()) == self.model["list"].get(key, [])
                assert dict(self.cluster.state(key, MAP).items()) == self.model["map"].get(key, {})

        def teardown(self) -> None:
            self.cluster.close()

    Machine.TestCase.settings = settings(max_examples=max_examples, stateful_step_count=30,
                                         deadline=None)
    return Machine.TestCase
