"""``foreach_batch``'s time: each micro-batch's processing time and the watermark statekit keeps.

``foreachBatch`` hands a function the batch's rows and id, not its time.  The driver takes the
batch's processing time from the query's offset log (Spark's ``batchTimestampMs``, written before
the batch runs) and keeps a watermark of its own from the event-time column the adapter names:
Spark's rule, ``max event time of the earlier batches - allowed lateness``, never moving back.
Both are recorded per batch beside the operator's state (``<query>/<operator>/_time/b<N>``), so
a re-run of a batch (a failed attempt, a restarted query) gets exactly the same time.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from statekit.checkpoint.base import CheckpointStorage
from statekit.checkpoint.metadata import decode_metadata, encode_metadata
from statekit.errors import CheckpointNotFoundError
from statekit.runtime.timers import MIN_WATERMARK

TIME_PREFIX = "_time/"
_RECORD = re.compile(r"_time/b([0-9]{1,19})")


class BatchTimes:
    """The recorded time of one operator's micro-batches (driver side)."""

    def __init__(self, storage: CheckpointStorage, query_id: str, operator_id: str,
                 lateness: int, retained: int) -> None:
        self.store = storage.create_access(f"{query_id}/{operator_id}").store
        self.lateness = lateness
        self.retained = max(2, retained)

    def _batches(self) -> list[int]:
        return sorted(int(m.group(1)) for key in self.store.list(TIME_PREFIX)
                      if (m := _RECORD.fullmatch(key)))

    def _load(self, batch: int) -> dict[str, Any]:
        key = f"{TIME_PREFIX}b{batch}"
        return decode_metadata(self.store.get(key), key)

    def begin(self, batch_id: int, offsets_root: str | None) -> dict[str, Any]:
        """The time of batch ``batch_id``: as recorded when the batch ran before, else its
        processing time from the offset log and the watermark from the batches before it."""
        batches = self._batches()
        if batch_id in batches:
            try:
                return self._load(batch_id)
            except CheckpointNotFoundError:
                pass
        earlier = [b for b in batches if b < batch_id]
        watermark, max_event = MIN_WATERMARK, None
        if earlier:
            previous = self._load(earlier[-1])
            watermark, max_event = int(previous["watermark"]), previous.get("max_event_time")
            if max_event is not None:
                watermark = max(watermark, int(max_event) - self.lateness)
        return {"batch": batch_id, "processing_time": _batch_timestamp(offsets_root, batch_id),
                "watermark": watermark, "max_event_time": max_event}

    def commit(self, record: dict[str, Any], batch_max_event_time: int | None) -> None:
        """Record the batch's time with the largest event time seen through it (before Spark
        commits the batch), and forget records older than the retained ones."""
        max_event = record.get("max_event_time")
        if batch_max_event_time is not None:
            max_event = batch_max_event_time if max_event is None else max(max_event,
                                                                            batch_max_event_time)
        body = {**record, "layout": "batch-time", "max_event_time": max_event}
        self.store.put(f"{TIME_PREFIX}b{record['batch']}", encode_metadata(body))
        for old in self._batches()[:-self.retained]:
            self.store.delete(f"{TIME_PREFIX}b{old}")


def _batch_timestamp(offsets_root: str | None, batch_id: int) -> int:
    """Spark's ``batchTimestampMs`` of the batch (its offset log entry), else the clock now."""
    if offsets_root is not None:
        try:
            import fsspec

            with fsspec.open(f"{offsets_root}/offsets/{batch_id}", "rt") as f:
                f.readline()  # the log's version line
                return int(json.loads(f.readline())["batchTimestampMs"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return time.time_ns() // 1_000_000
