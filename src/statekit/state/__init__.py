"""Keyed state as users see it: descriptors, the state interfaces, TTL and size limits, with
PyFlink's names.  Backends implement value, list and map state; the rest is layered here."""

from statekit.state.api import (
    AggregateFunction,
    AggregatingState,
    AppendingState,
    ListState,
    MapState,
    ReduceFunction,
    ReducingState,
    State,
    ValueState,
)
from statekit.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateKind,
    ValueStateDescriptor,
)
from statekit.state.ttl import StateTtlConfig

__all__ = [
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "AppendingState",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "ReduceFunction",
    "ReducingState",
    "ReducingStateDescriptor",
    "State",
    "StateDescriptor",
    "StateKind",
    "StateTtlConfig",
    "ValueState",
    "ValueStateDescriptor",
]
