"""Bounded (BATCH) execution of the local runner, as Flink runs a keyed operator on bounded input
in ``RuntimeExecutionMode.BATCH``: every element is read first and grouped by key; each key's
elements are processed together (keys in key-group order, elements in input order), then the
key's timers fire, event and processing time alike, as at the end of input; the watermark is at
its minimum while a key's elements run.  No checkpoints: a failure restarts from the start.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from statekit.errors import ConfigError
from statekit.runtime.timers import MAX_WATERMARK, MIN_WATERMARK
from statekit.serde.keygroups import key_group_for_bytes

if TYPE_CHECKING:
    from statekit.runtime.job import LocalJob, _Task

MODE_KEY = "execution.runtime-mode"


class RuntimeExecutionMode(enum.Enum):
    """PyFlink's execution modes; the local runner's input is bounded, so AUTOMATIC is BATCH."""

    STREAMING = 0
    BATCH = 1
    AUTOMATIC = 2


def is_batch(mode: RuntimeExecutionMode | str | None) -> bool:
    """Whether ``mode`` runs bounded: BATCH, and AUTOMATIC on the local runner's bounded input."""
    name = mode.name if isinstance(mode, RuntimeExecutionMode) else str(mode or "STREAMING")
    return name.upper() in ("BATCH", "AUTOMATIC")


def check_batch_job(job: LocalJob, savepoint_dir: str | None) -> None:
    """Refuse what BATCH execution cannot do, naming the setting: checkpoints, savepoints."""
    if job.checkpoint_config.is_checkpointing_enabled():
        raise ConfigError(MODE_KEY, "BATCH execution runs without checkpoints (a failure "
                                    "restarts from the start): disable checkpointing, or run "
                                    "STREAMING")
    if getattr(job.func, "broadcast", False):
        raise ConfigError(MODE_KEY, "the local runner runs broadcast-connected streams in "
                                    "STREAMING mode only")
    if savepoint_dir is not None or job.env.get_configuration().get("execution.savepoint.path"):
        raise ConfigError(MODE_KEY, "BATCH execution neither takes nor restores savepoints: "
                                    "run STREAMING for that")


def process_bounded(job: LocalJob, tasks: list[_Task]) -> int:
    """Run the whole input the BATCH way; outputs land in ``job.outputs.open``; the position."""
    records = job.time.records()
    serialize, selector = job.key_serializer.serialize, job.selector
    maxp, p = job.max_parallelism, job.parallelism
    by_key: dict[bytes, tuple[Any, list[tuple[Any, int | None]]]] = {}
    for element in job.source:
        for value, timestamp in records(element):
            key = selector(value)
            by_key.setdefault(serialize(key), (key, []))[1].append((value, timestamp))
    out = job.outputs.open
    groups = {kb: key_group_for_bytes(kb, maxp) for kb in by_key}
    for kb in sorted(by_key, key=lambda kb: (groups[kb], kb)):
        key, items = by_key[kb]
        op = tasks[groups[kb] * p // maxp].op
        for value, timestamp in items:
            produced = op.process_element(key, value, timestamp)
            if produced is not None:
                out.extend(produced)
        op.fire_due(MAX_WATERMARK, MAX_WATERMARK, out)  # the key's end: every timer is due
        op.timers.watermark = MIN_WATERMARK  # no watermark while the next key runs
    return len(job.source)
