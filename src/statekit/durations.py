"""Durations with PyFlink's names: :class:`Time` and :func:`to_millis`.

Checkpoint settings, restart strategies and state TTL all take durations, so they live on the
ground floor where every layer can reach them.
"""

from __future__ import annotations

import datetime as _dt


class Time:
    """A duration in milliseconds, built like PyFlink's ``Time.seconds(10)``."""

    def __init__(self, milliseconds: int) -> None:
        if milliseconds < 0:
            raise ValueError("a duration cannot be negative")
        self._ms = int(milliseconds)

    @staticmethod
    def milliseconds(n: float) -> Time:
        return Time(int(n))

    @staticmethod
    def seconds(n: float) -> Time:
        return Time(int(n * 1000))

    @staticmethod
    def minutes(n: float) -> Time:
        return Time(int(n * 60_000))

    @staticmethod
    def hours(n: float) -> Time:
        return Time(int(n * 3_600_000))

    @staticmethod
    def days(n: float) -> Time:
        return Time(int(n * 86_400_000))

    def to_milliseconds(self) -> int:
        return self._ms

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Time) and other._ms == self._ms

    def __hash__(self) -> int:
        return hash(self._ms)

    def __repr__(self) -> str:
        return f"Time.milliseconds({self._ms})"


def to_millis(duration: Time | _dt.timedelta | int | float) -> int:
    """Milliseconds of a ``Time``, ``timedelta`` or number of milliseconds."""
    if isinstance(duration, Time):
        return duration.to_milliseconds()
    if isinstance(duration, _dt.timedelta):
        return int(duration.total_seconds() * 1000)
    if isinstance(duration, int | float) and not isinstance(duration, bool):
        return int(duration)
    to_ms = getattr(duration, "to_milliseconds", None)  # pyflink.common.Duration and friends
    if callable(to_ms):
        return int(to_ms())
    raise TypeError(f"expected a duration, got {type(duration).__name__}")
