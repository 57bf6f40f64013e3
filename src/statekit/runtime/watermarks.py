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


class SourceTime:
    """The local runner's source side of event time: the stateless stages with the watermark
    strategies among them, each element's timestamp, and the watermark the last strategy makes
    (Flink: a later strategy replaces an earlier one's watermarks)."""

    def __init__(self, stages: list[Any], clock: Callable[[], int]) -> None:
        self.stages = stages
        self.clock = clock
        strategies = [s for s in stages if isinstance(s, WatermarkStrategy)]
        self.last = strategies[-1] if strategies else None
        self.generator = self.last.create_generator() if self.last is not None else None
        self.watermark = MIN_WATERMARK

    def restore(self, recorded: Any) -> None:
        """Go on from the time a checkpoint recorded (``{"watermark", "max_timestamp"}``)."""
        if not isinstance(recorded, dict):
            return
        self.watermark = _int_or(recorded.get("watermark"), MIN_WATERMARK)
        if self.generator is not None:
            self.generator.max_timestamp = _int_or(recorded.get("max_timestamp"), MIN_WATERMARK)

    def recorded(self) -> dict[str, int]:
        """What a checkpoint records of the source's time."""
        return {"watermark": self.watermark,
                "max_timestamp": (self.generator.max_timestamp if self.generator is not None
                                  else MIN_WATERMARK)}

    def next_watermark(self) -> int | None:
        """The watermark after the elements so far, if it moved forward."""
        if self.generator is None:
            return None
        watermark = self.generator.current_watermark()
        return watermark if watermark > self.watermark else None

    def records(self) -> Callable[[Any], list[tuple[Any, int | None]]]:
        """``records(element)``: what one source element becomes after the stages, as
        ``(value, timestamp)`` pairs (timestamps from the watermark strategies, else None)."""
        stages = self.stages
        if self.last is None:
            def untimed(element: Any) -> list[tuple[Any, int | None]]:
                elements: list[Any] = [element]
                for stage in stages:
                    elements = [out for e in elements for out in stage(e)]
                return [(e, None) for e in elements]

            return untimed
        generators = [self.generator if s is self.last else
                      s.create_generator() if isinstance(s, WatermarkStrategy) else None
                      for s in stages]
        clock = self.clock

        def timed(element: Any) -> list[tuple[Any, int | None]]:
            recs: list[tuple[Any, int | None]] = [(element, None)]
            for stage, gen in zip(stages, generators, strict=True):
                if gen is None:
                    recs = [(out, ts) for v, ts in recs for out in stage(v)]
                    continue
                now = clock() if stage.idle_timeout is not None else None
                recs = [(v, gen.on_event(v, ts, now)) for v, ts in recs]
            return recs

        return timed


def _int_or(value: Any, default: int) -> int:
    return value if type(value) is int else default
