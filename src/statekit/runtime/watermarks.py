"""Event time on the local runner: PyFlink's ``WatermarkStrategy`` and ``TimestampAssigner``.

A strategy assigns each element its event-time timestamp and generates watermarks from them:
``for_bounded_out_of_orderness(d)`` emits ``max timestamp - d - 1`` (Flink's
``BoundedOutOfOrdernessWatermarks``), ``for_monotonous_timestamps()`` the same with ``d = 0``,
``no_watermarks()`` none.  The local runner emits the watermark after every element (Flink emits
it periodically, by default every 200 ms of wall time), so a job's results do not depend on how
fast the machine runs; at the end of bounded input the watermark jumps to the maximum.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from statekit.durations import Duration, to_millis
from statekit.errors import ConfigError, ConfigTypeError, StateTypeError
from statekit.runtime.timers import MIN_WATERMARK


class TimestampAssigner(ABC):
    """Extracts an element's event-time timestamp in epoch milliseconds."""

    @abstractmethod
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        """The timestamp of ``value``; ``record_timestamp`` is the one it had (``MIN`` if none)."""


@dataclass(frozen=True)
class WatermarkStrategy:
    """How a stream gets timestamps and watermarks (PyFlink's ``WatermarkStrategy``)."""

    out_of_orderness: int | None  # ms; None: no watermarks
    assigner: Callable[[Any, int], int] | None = None
    idle_timeout: int | None = None

    @staticmethod
    def for_bounded_out_of_orderness(max_out_of_orderness: Duration | Any) -> WatermarkStrategy:
        """Watermarks trail the largest timestamp seen by ``max_out_of_orderness`` (+ 1 ms)."""
        return WatermarkStrategy(to_millis(max_out_of_orderness, "max_out_of_orderness",
                                           minimum=0))

    @staticmethod
    def for_monotonous_timestamps() -> WatermarkStrategy:
        """Timestamps never decrease: the watermark is the largest timestamp seen, minus 1 ms."""
        return WatermarkStrategy(0)

    @staticmethod
    def no_watermarks() -> WatermarkStrategy:
        """Timestamps only; the watermark reaches the maximum only at the end of bounded input."""
        return WatermarkStrategy(None)

    def with_timestamp_assigner(self, timestamp_assigner: TimestampAssigner | Callable[[Any, int], int]
                                ) -> WatermarkStrategy:
        """Take each element's timestamp from ``timestamp_assigner`` (a ``TimestampAssigner`` or
        a function ``(value, record_timestamp) -> int``)."""
        if isinstance(timestamp_assigner, TimestampAssigner):
            extract = timestamp_assigner.extract_timestamp
        elif callable(timestamp_assigner):
            extract = timestamp_assigner
        else:
            raise ConfigTypeError("timestamp_assigner", "expected a TimestampAssigner or a "
                                  f"function, got {type(timestamp_assigner).__name__}")
        return replace(self, assigner=extract)

    def with_idleness(self, idle_timeout: Duration | Any) -> WatermarkStrategy:
        """Mark the input idle after ``idle_timeout`` of processing time without elements, so an
        operator with several inputs stops waiting for its watermark (a single input's watermark
        then simply stays where it is)."""
        return replace(self, idle_timeout=to_millis(idle_timeout, "idle_timeout", minimum=1))

    def create_generator(self) -> WatermarkGenerator:
        return WatermarkGenerator(self)


class WatermarkGenerator:
    """One input's timestamps and watermark: the largest timestamp seen and when it last moved."""

    def __init__(self, strategy: WatermarkStrategy) -> None:
        if strategy.assigner is None:
            raise ConfigError(
                "watermark_strategy", "the elements of this stream carry no timestamps: give the "
                "WatermarkStrategy a timestamp assigner (with_timestamp_assigner)")
        self.strategy = strategy
        self.extract = strategy.assigner
        self.max_timestamp = MIN_WATERMARK
        self.last_event_time: int | None = None  # processing time of the last element

    def on_event(self, value: Any, record_timestamp: int | None, now: int | None = None) -> int:
        """Assign ``value`` its timestamp and account for it in the watermark."""
        timestamp = self.extract(value, MIN_WATERMARK if record_timestamp is None
                                 else record_timestamp)
        if type(timestamp) is not int:
            if isinstance(timestamp, bool) or not hasattr(timestamp, "__index__"):
                raise StateTypeError(f"the timestamp assigner returned {timestamp!r}, not an int "
                                     "(epoch milliseconds)")
            timestamp = timestamp.__index__()
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp
        self.last_event_time = now
        return timestamp

    def current_watermark(self) -> int:
        """The watermark after the elements seen so far."""
        delay = self.strategy.out_of_orderness
        if delay is None or self.max_timestamp == MIN_WATERMARK:
            return MIN_WATERMARK
        return max(MIN_WATERMARK, self.max_timestamp - delay - 1)

    def is_idle(self, now: int) -> bool:
        """Whether the input has been idle for the strategy's idle timeout (never without one)."""
        timeout = self.strategy.idle_timeout
        return (timeout is not None and self.last_event_time is not None
                and now - self.last_event_time >= timeout)
