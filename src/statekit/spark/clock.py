"""Time on Spark: each micro-batch's processing time and watermark for statekit's timers, event
timestamps read from a column, and which timers an adapter's setting can deliver.

Processing time is the micro-batch's timestamp (Spark's ``batchTimestampMs``) and event time the
query's watermark, both fixed for a batch, so a re-run of a batch sees the same time.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from typing import Any

from statekit.errors import ConfigError
from statekit.runtime.timers import MIN_WATERMARK, Refusal, TimeDomain

#: Spark's ``TimeMode`` names, as ``transformWithStateInPandas`` takes them
TIME_MODES = ("None", "ProcessingTime", "EventTime")


class BatchClock:
    """The processing time of the running micro-batch: what ``current_processing_time()`` reads."""

    __slots__ = ("now",)

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def time_mode(value: Any) -> str:
    """One of :data:`TIME_MODES` (case-insensitive, as Spark takes it)."""
    text = str(getattr(value, "value", value))
    for mode in TIME_MODES:
        if text.lower() == mode.lower():
            return mode
    raise ConfigError("time_mode", f"expected one of {', '.join(TIME_MODES)}, got {value!r}")


def epoch_ms(value: Any, tz: str = "UTC") -> int | None:
    """An event time as epoch milliseconds: a Spark timestamp (a datetime or pandas Timestamp;
    naive ones are wall times of the session time zone ``tz``, as PySpark hands them over) or a
    number of milliseconds; None (and NaT) stays None."""
    if value is None:
        return None
    if type(value) is int:
        return value
    if isinstance(value, bool):
        raise ConfigError("event_time_column",
                          f"expected a timestamp or epoch milliseconds, got {value!r}")
    import pandas as pd

    try:
        if isinstance(value, int | float) or (hasattr(value, "__index__")
                                              and not isinstance(value, _dt.datetime)):
            return None if pd.isna(value) else int(value)
        stamp = pd.Timestamp(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError("event_time_column",
                          f"expected a timestamp or epoch milliseconds, got {value!r}") from exc
    if pd.isna(stamp):
        return None
    if stamp.tzinfo is None:
        stamp = stamp.tz_localize(tz)
    return int(stamp.value) // 1_000_000


def column_index(columns: Sequence[str], column: str | None, what: str = "event_time_column"
                 ) -> int | None:
    """Where ``column`` is among ``columns`` (None when no column is named)."""
    if column is None:
        return None
    if column not in columns:
        raise ConfigError(what, f"column {column!r} is not among the input columns {list(columns)}")
    return list(columns).index(column)


def has_watermark(df: Any) -> bool:
    """Whether the streaming DataFrame's plan defines a watermark (``withWatermark``)."""
    try:
        plan = df._jdf.queryExecution().analyzed().treeString()
    except Exception:  # a DataFrame without a JVM plan (Spark Connect): Spark checks it itself
        return True
    return "EventTimeWatermark" in str(plan)


def watermark_of(value: Any) -> int:
    """Spark's watermark for a batch (its "none yet" values -1 and 0 are the minimum)."""
    value = int(value)
    return MIN_WATERMARK if value <= 0 else value


def refusal(adapter: str, *, processing: str | None, event: str | None) -> Refusal | None:
    """A :data:`~statekit.runtime.timers.Refusal` that names why ``adapter`` cannot deliver a
    domain (the setting to change); None when it delivers both."""
    if processing is None and event is None:
        return None

    def refuse(domain: TimeDomain) -> str | None:
        why = processing if domain is TimeDomain.PROCESSING_TIME else event
        return None if why is None else f"{adapter}: {why}"

    return refuse
