"""statekit: Flink's keyed state backends and checkpoint storage for PySpark, with PyFlink's names."""

from statekit.backends.base import KeyedStateBackend, StateBackend
from statekit.backends.heap import HashMapStateBackend
from statekit.backends.legacy import CustomStateBackend, FsStateBackend, MemoryStateBackend
from statekit.backends.operator import BroadcastState, ReadOnlyBroadcastState
from statekit.checkpoint.base import CheckpointStorage, CustomCheckpointStorage
from statekit.checkpoint.config import (
    CheckpointConfig,
    CheckpointingMode,
    ExternalizedCheckpointCleanup,
)
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.jobmanager import JobManagerCheckpointStorage
from statekit.durations import Time
from statekit.runtime.batch import RuntimeExecutionMode
from statekit.runtime.broadcast import BroadcastProcessFunction, KeyedBroadcastProcessFunction
from statekit.runtime.checkpointed import (
    CheckpointedFunction,
    FunctionInitializationContext,
    FunctionSnapshotContext,
)
from statekit.runtime.connected import CoFlatMapFunction, CoMapFunction, KeyedCoProcessFunction
from statekit.runtime.environment import StreamExecutionEnvironment
from statekit.runtime.functions import (
    FilterFunction,
    FlatMapFunction,
    KeyedProcessFunction,
    MapFunction,
    OutputTag,
    RuntimeContext,
    VectorizedKeyedFunction,
)
from statekit.runtime.restart import RestartStrategies
from statekit.serde.types import TypeInformation, Types
from statekit.state.api import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from statekit.state.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReduceFunction,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """RocksDB names load lazily, so importing statekit does not load the RocksDB library."""
    if name in ("EmbeddedRocksDBStateBackend", "RocksDBStateBackend", "PredefinedOptions"):
        from statekit.backends import rocksdb

        return getattr(rocksdb, name)
    raise AttributeError(f"module 'statekit' has no attribute {name!r}")


__all__ = [
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "BroadcastProcessFunction",
    "BroadcastState",
    "CheckpointConfig",
    "CheckpointStorage",
    "CheckpointedFunction",
    "CheckpointingMode",
    "CoFlatMapFunction",
    "CoMapFunction",
    "CustomCheckpointStorage",
    "CustomStateBackend",
    "EmbeddedRocksDBStateBackend",
    "ExternalizedCheckpointCleanup",
    "FileSystemCheckpointStorage",
    "FilterFunction",
    "FlatMapFunction",
    "FsStateBackend",
    "FunctionInitializationContext",
    "FunctionSnapshotContext",
    "HashMapStateBackend",
    "JobManagerCheckpointStorage",
    "KeyedBroadcastProcessFunction",
    "KeyedCoProcessFunction",
    "KeyedProcessFunction",
    "KeyedStateBackend",
    "ListState",
    "ListStateDescriptor",
    "MapFunction",
    "MapState",
    "MapStateDescriptor",
    "MemoryStateBackend",
    "OutputTag",
    "PredefinedOptions",
    "ReadOnlyBroadcastState",
    "ReduceFunction",
    "ReducingState",
    "ReducingStateDescriptor",
    "RestartStrategies",
    "RocksDBStateBackend",
    "RuntimeContext",
    "RuntimeExecutionMode",
    "StateBackend",
    "StateTtlConfig",
    "StreamExecutionEnvironment",
    "Time",
    "TypeInformation",
    "Types",
    "ValueState",
    "ValueStateDescriptor",
    "VectorizedKeyedFunction",
]
