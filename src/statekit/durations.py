"""Durations with PyFlink's names: :class:`Time`, :class:`Duration` and :func:`to_millis`.

Checkpoint settings, restart strategies and state TTL all take durations, so they live on the
ground floor where every layer can reach them.
"""

from __future__ import annotations

import datetime as _dt
import math
from typing import Any

from statekit.errors import ConfigError, ConfigTypeError

#: the longest duration in milliseconds (a signed 64-bit value, as Flink's)
_MAX_MS = (1 << 63) - 1


class Time:
    """A duration in milliseconds, built like PyFlink's ``Time.seconds(10)``."""

    def __init__(self, milliseconds: int) -> None:
        self._ms = to_millis(milliseconds, "Time", minimum=0)

    @staticmethod
    def milliseconds(n: float) -> Time:
        return Time(_finite(n, 'Time'))

    @staticmethod
    def seconds(n: float) -> Time:
        return Time(_finite(n, 'Time') * 1000)

    @staticmethod
    def minutes(n: float) -> Time:
        return Time(_finite(n, 'Time') * 60_000)

    @staticmethod
    def hours(n: float) -> Time:
        return Time(_finite(n, 'Time') * 3_600_000)

    @staticmethod
    def days(n: float) -> Time:
        return Time(_finite(n, 'Time') * 86_400_000)

    def to_milliseconds(self) -> int:
        return self._ms

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Time) and other._ms == self._ms

    def __hash__(self) -> int:
        return hash(self._ms)

    def __repr__(self) -> str:
        return f"Time.milliseconds({self._ms})"


class Duration:
    """A duration with PyFlink's ``pyflink.common.Duration`` names (``Duration.of_seconds(5)``)."""

    def __init__(self, milliseconds: int) -> None:
        self._ms = to_millis(milliseconds, "Duration", minimum=0)

    @staticmethod
    def of_millis(millis: float) -> Duration:
        return Duration(_finite(millis, "Duration"))

    @staticmethod
    def of_seconds(seconds: float) -> Duration:
        return Duration(_finite(seconds, "Duration") * 1000)

    @staticmethod
    def of_minutes(minutes: float) -> Duration:
        return Duration(_finite(minutes, "Duration") * 60_000)

    @staticmethod
    def of_hours(hours: float) -> Duration:
        return Duration(_finite(hours, "Duration") * 3_600_000)

    @staticmethod
    def of_days(days: float) -> Duration:
        return Duration(_finite(days, "Duration") * 86_400_000)

    @staticmethod
    def of_nanos(nanos: int) -> Duration:
        return Duration(_finite(nanos, "Duration") // 1_000_000)

    def to_milliseconds(self) -> int:
        return self._ms

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Duration) and other._ms == self._ms

    def __hash__(self) -> int:
        return hash(self._ms)

    def __repr__(self) -> str:
        return f"Duration.of_millis({self._ms})"


def _finite(n: Any, key: str) -> float:
    """``n`` as a finite number; a :class:`ConfigError` for NaN, infinities and non-numbers."""
    if isinstance(n, bool) or not isinstance(n, int | float):
        raise ConfigTypeError(key, f"expected a number, got {type(n).__name__}")
    if not math.isfinite(n):
        raise ConfigError(key, f"expected a finite duration, got {n!r}")
    return n


def to_millis(duration: Time | _dt.timedelta | int | float, key: str = "duration", *,
              minimum: int = -_MAX_MS) -> int:
    """Milliseconds of a ``Time``, ``timedelta`` or number of milliseconds; a
    :class:`ConfigError` naming ``key`` for NaN, infinities, values past a signed 64-bit number
    of milliseconds or below ``minimum``, and a :class:`ConfigTypeError` for non-durations."""
    if isinstance(duration, Time):
        ms: float = duration.to_milliseconds()
    elif isinstance(duration, _dt.timedelta):
        ms = duration.total_seconds() * 1000
    else:
        to_ms = getattr(duration, "to_milliseconds", None)  # pyflink.common.Duration and friends
        ms = _finite(to_ms() if callable(to_ms) else duration, key)
    if not minimum <= ms <= _MAX_MS:
        raise ConfigError(key, f"{duration!r} is outside {minimum}..{_MAX_MS} ms")
    return int(ms)
