"""Crash-test writer: a checkpointing job killed (SIGKILL) before its k-th file operation.

Run as ``python crash_writer.py <checkpoint-root-url> [endpoint]`` with ``STATEKIT_FAULT_KILL_AT=k``
(0: never kill; the number of file operations is printed at the end).  Shared with the verifying
test: ``data()``, ``sentinels()``, ``Counter`` and ``config()``.
"""

from __future__ import annotations

import sys
import time

from statekit.checkpoint.config import ExternalizedCheckpointCleanup
from statekit.runtime.environment import StreamExecutionEnvironment
from statekit.runtime.functions import KeyedProcessFunction
from statekit.serde.types import Types
from statekit.state.descriptors import ListStateDescriptor, ValueStateDescriptor
from statekit.testing.faults import install_kill_hook_from_env
from statekit.testing.s3 import ACCESS_KEY, SECRET_KEY

KEYS = 5
ITEMS = 240


def data() -> list[tuple[str, int]]:
    return [(f"k{i % KEYS}", i) for i in range(ITEMS)]


def sentinels() -> list[tuple[str, int]]:
    return [(f"k{k}", -1) for k in range(KEYS)]


class Counter(KeyedProcessFunction):
    """Per key: count, sum and every id seen (so a lost or duplicated update is visible)."""

    def __init__(self, pause: float = 0.0) -> None:
        self.pause = pause

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.total = ctx.get_state(ValueStateDescriptor("sum", Types.LONG()))
        self.ids = ctx.get_list_state(ListStateDescriptor("ids", Types.LONG()))

    def process_element(self, value, ctx):
        key, i = value
        if i < 0:  # sentinel: report the state
            yield key, self.count.value() or 0, self.total.value() or 0, sorted(self.ids.get() or [])
            return
        if self.pause:
            time.sleep(self.pause)
        self.count.update((self.count.value() or 0) + 1)
        self.total.update((self.total.value() or 0) + i)
        self.ids.add(i)


def config(root: str, endpoint: str | None) -> dict[str, str]:
    conf = {
        "state.checkpoints.dir": root,
        "state.storage.fs.memory-threshold": "0",  # every task state is a file
        "state.checkpoints.num-retained": "2",
        "state.storage.fs.retries": "2",
        "state.storage.fs.retry-backoff": "10 ms",
    }
    if endpoint:
        conf.update({"s3.endpoint": endpoint, "s3.access-key": ACCESS_KEY, "s3.secret-key": SECRET_KEY})
    return conf


def main() -> None:
    root = sys.argv[1]
    endpoint = sys.argv[2] if len(sys.argv) > 2 else None
    switch = install_kill_hook_from_env()
    env = StreamExecutionEnvironment.get_execution_environment(
        {**config(root, endpoint), "execution.checkpointing.interval": "10 ms"})
    env.set_parallelism(2)
    env.get_checkpoint_config().enable_externalized_checkpoints(
        ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION)
    result = (env.from_collection(data()).key_by(lambda v: v[0]).process(Counter(pause=0.001))
              .execute_and_collect())
    ops = switch.count if switch is not None else -1
    print(f"ops={ops} checkpoints={len(result.checkpoint_stats)} latest={result.latest_checkpoint}",
          flush=True)


if __name__ == "__main__":
    main()
