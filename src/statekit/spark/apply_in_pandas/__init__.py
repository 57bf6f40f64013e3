"""The ``applyInPandasWithState`` adapter: exactly-once without an end-of-partition hook.

Spark calls the function once per key and commits each key's ``GroupState`` atomically with the
micro-batch, but tells Python nothing when a task ends, so there is no moment to commit a
partition's state.  Instead each key carries its recent changes in its ``GroupState``
(:mod:`~statekit.spark.apply_in_pandas.partition`: the per-key call), and the partition's state is
snapshotted now and then along one chain of snapshots that no discarded attempt's changes reach
(:mod:`~statekit.spark.apply_in_pandas.lineage`); a key's carried log is cut only up to what a
trusted snapshot holds.  This module is the adapter that wires both into a streaming query.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from statekit import config as cfg
from statekit.errors import ConfigError
from statekit.runtime import localrecovery
from statekit.serde.types import packb, unpackb
from statekit.spark.adapters import build_spec
from statekit.spark.apply_in_pandas.lineage import (
    DEFAULT_MATERIALIZE_EVERY,
    DEFAULT_MID_TASK_CALLS,
    MATERIALIZE_KEY,
    MAX_LOG_KEY,
    MID_TASK_KEY,
    Lineage,
    Marker,
    PartitionLineage,
    PendingSnapshot,
    SnapshotId,
)
from statekit.spark.apply_in_pandas.partition import APPLIED, PartitionRuntime
from statekit.spark.clock import has_watermark
from statekit.spark.session import statekit_workers
from statekit.spark.task import AdapterSpec, TaskInfo

STATE_SCHEMA = "seq long, tseq long, tatt string, log binary"

_RUNTIMES: dict[tuple[str, str, int], PartitionRuntime] = {}
_RUNTIMES_LOCK = threading.Lock()
_RUNNING: dict[tuple[str, str, int], PartitionRuntime] = {}  # begun in this process's running task


def _runtime(spec: AdapterSpec, info: TaskInfo, materialize_every: int,
             timeout_conf: str, mid_task_calls: int, watermark: bool) -> PartitionRuntime:
    """This process's runtime of the task's partition (kept across tasks), begun for the task."""
    slot = (info.query_id, spec.operator_id, info.partition)
    with _RUNTIMES_LOCK:
        runtime = _RUNTIMES.get(slot)
        if runtime is None:
            runtime = _RUNTIMES[slot] = PartitionRuntime(spec, info.query_id, info.partition,
                                                         materialize_every, timeout_conf,
                                                         mid_task_calls, watermark)
    runtime.task_end_hook = _hook_task_end()
    runtime.begin_task(info)
    _RUNNING[slot] = runtime
    return runtime


def _end_running_tasks() -> None:
    """The worker finished its task's last call: let each partition runtime it ran end it."""
    while _RUNNING:
        _, runtime = _RUNNING.popitem()
        runtime.end_task()


@functools.cache
def _hook_task_end() -> bool:
    """Call :func:`_end_running_tasks` when this worker process ends a task, still inside it.

    PySpark's worker clears its ``TaskContext`` once the task's output is written and before it
    reports the task done (a guard for reused workers); Spark commits the micro-batch only
    after that report, so work done there belongs to the task.  Only a successful task gets
    there: a failed one raises first.  True when the hook is in place."""
    from pyspark.taskcontext import TaskContext

    original = TaskContext.__dict__.get("_setTaskContext")
    if not isinstance(original, classmethod):
        return False
    setter = original.__func__

    def set_task_context(cls: Any, context: Any) -> None:
        if cls is TaskContext:
            if context is None:
                _end_running_tasks()
            else:
                _RUNNING.clear()  # a new task: nothing of an earlier one is left to end
        setter(cls, context)

    TaskContext._setTaskContext = classmethod(set_task_context)  # type: ignore[method-assign,assignment]
    return True


@functools.cache
def _quiet_padding_warning() -> None:
    """PySpark's applyInPandasWithState worker pads its output with all-NA rows and concatenates
    them (pandas 2.x warns about that, every batch); statekit's calls trigger exactly that
    warning in this worker process, so exactly that warning is ignored here (once per process)."""
    warnings.filterwarnings(
        "ignore", message="The behavior of DataFrame concatenation with empty or all-NA entries",
        category=FutureWarning, module="pyspark.worker")


def _plain(value: Any) -> Any:
    """A NumPy scalar as the Python value it holds (keys must serialize without pickle, and
    equal what Spark's rows hold when the tools read the state back)."""
    item = getattr(value, "item", None)
    return item() if item is not None and type(value).__module__ == "numpy" else value


def apply_in_pandas_with_state(grouped_df: Any, function: Any, output_schema: Any, *,
                               output_mode: str = "update", timeout_conf: str = "NoTimeout",
                               event_time_column: str | None = None,
                               operator_id: str | None = None,
                               conf: Mapping[str, Any] | None = None) -> Any:
    """Run ``function`` per key over ``applyInPandasWithState``; a streaming DataFrame.

    The function is the same :class:`~statekit.KeyedProcessFunction` (or vectorized function)
    the other adapters run; its state lives in the backend chosen by ``spark.statekit.*`` conf.
    Timers need a ``timeout_conf`` that calls keys back: ``ProcessingTimeTimeout`` delivers both
    domains, ``EventTimeTimeout`` event-time timers; ``event_time_column`` names the input column
    ``ctx.timestamp()`` reads.
    """
    spark = grouped_df._df.sparkSession
    spec, schema = build_spec(spark, function, [], output_schema, operator_id, conf, grouped_df,
                              event_time_column=event_time_column)
    if localrecovery.enabled(spec.conf):  # its snapshot chain is read from checkpoint storage
        raise ConfigError(localrecovery.ENABLED_KEY, "cannot take effect on "
                          "apply_in_pandas_with_state, which restores its snapshots and the changes "
                          "carried in Spark's state store from checkpoint storage; use "
                          "foreach_batch or transform_with_state for local recovery")
    watermark = has_watermark(grouped_df._df)
    every = cfg.read(spec.conf, MATERIALIZE_KEY)
    mid_task = cfg.read(spec.conf, MID_TASK_KEY)
    timeout = str(getattr(timeout_conf, "value", timeout_conf))
    if timeout not in ("NoTimeout", "ProcessingTimeTimeout", "EventTimeTimeout"):
        raise ConfigError("timeout_conf", f"unknown GroupStateTimeout {timeout_conf!r}")

    def call(key: tuple[Any, ...], frames: Iterator[Any], group_state: Any) -> Iterator[Any]:
        _quiet_padding_warning()
        runtime = _runtime(spec, TaskInfo.current(), every, timeout, mid_task, watermark)
        key = tuple(_plain(v) for v in key)  # pandas hands over NumPy scalars (np.int64, ...)
        k = key[0] if len(key) == 1 else key
        yield from runtime.call(k, frames, group_state)

    with statekit_workers(spark, spec.worker_python):
        # Spark's own method, past the compat switch (see statekit.spark.compat)
        from pyspark.sql.pandas.group_ops import PandasGroupedOpsMixin as Spark

        return Spark.applyInPandasWithState(grouped_df, call, schema, STATE_SCHEMA, output_mode,
                                            timeout)


__all__ = [
    "APPLIED",
    "DEFAULT_MATERIALIZE_EVERY",
    "DEFAULT_MID_TASK_CALLS",
    "MATERIALIZE_KEY",
    "MAX_LOG_KEY",
    "MID_TASK_KEY",
    "STATE_SCHEMA",
    "AdapterSpec",
    "Lineage",
    "Marker",
    "PartitionLineage",
    "PartitionRuntime",
    "PendingSnapshot",
    "SnapshotId",
    "TaskInfo",
    "apply_in_pandas_with_state",
    "packb",
    "unpackb",
]
