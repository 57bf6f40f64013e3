"""Parsers of configuration values (durations, sizes, booleans, numbers, enums), and of the
options with rules of their own (RocksDB's compaction style, open files, refused Flink keys).

Shared by every layer that reads flat keys; malformed values raise :class:`ConfigError` naming
the key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from statekit.errors import ConfigError

_DURATION_UNITS = {
    "ms": 1, "milli": 1, "millis": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "min": 60_000, "mins": 60_000, "minute": 60_000, "minutes": 60_000, "m": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
}
_SIZE_UNITS = {
    "b": 1, "bytes": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1 << 20, "mb": 1 << 20,
    "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
}


#: the largest magnitude of an integer setting (sizes, durations in ms, counts): a signed 64-bit
#: value, as Flink's; larger values were accepted and overflowed where they met native code
MAX_INT = (1 << 63) - 1


def bounded(key: str, number: int) -> int:
    """``number`` when its magnitude fits :data:`MAX_INT`, else a :class:`ConfigError`."""
    if not -MAX_INT <= number <= MAX_INT:
        raise ConfigError(key, f"{number} is out of range (at most {MAX_INT})")
    return number


def _number_with_unit(key: str, value: Any, units: dict[str, int], what: str, example: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(key, f"expected a {what}, got {value!r}")
    if isinstance(value, int):
        return bounded(key, value)
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) > MAX_INT:
            raise ConfigError(key, f"expected a finite {what} in range, got {value!r}")
        return int(value)
    match = re.fullmatch(r"\s*(-\s*)?(\d{1,30}(?:\.\d{1,30})?)\s*([A-Za-z]*)\s*", str(value))
    if not match or match.group(3).lower() not in ({""} | set(units)):
        raise ConfigError(key, f"expected a {what} such as {example}, got {value!r}")
    if match.group(1):
        raise ConfigError(key, f"a {what} cannot be negative, got {value!r}")
    factor = units.get(match.group(3).lower(), 1)
    return bounded(key, int(float(match.group(2)) * factor))


def parse_duration_ms(key: str, value: Any) -> int:
    return _number_with_unit(key, value, _DURATION_UNITS, "duration", "'10 s' or '500 ms'")


def parse_size(key: str, value: Any) -> int:
    return _number_with_unit(key, value, _SIZE_UNITS, "memory size", "'20 kb' or '64 mb'")


def _parse_number(key: str, value: Any, convert: Callable[[str], Any], what: str) -> Any:
    if isinstance(value, bool):
        raise ConfigError(key, f"expected {what}, got {value!r}")
    try:
        number = convert(str(value).strip())
    except ValueError as exc:
        raise ConfigError(key, f"expected {what}, got {value!r}") from exc
    if isinstance(number, float) and not math.isfinite(number):
        raise ConfigError(key, f"expected a finite number, got {value!r}")
    return number


def parse_int(key: str, value: Any) -> int:
    """An integer (an integral finite float too, as ``int()`` took it), within :data:`MAX_INT`."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return bounded(key, int(_parse_number(key, value, int, "an integer")))


def checked_int(key: str, value: Any, minimum: int, maximum: int = MAX_INT) -> int:
    """An integer argument of the programmatic API, checked as its flat key ``key`` is: a
    :class:`ConfigError` for NaN, infinities, non-numbers and values outside the range."""
    return int(at_least(parse_int, minimum, maximum)(key, value))


def parse_float(key: str, value: Any) -> float:
    return float(_parse_number(key, value, float, "a number"))


def parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ConfigError(key, f"expected true or false, got {value!r}")


def parse_enum(key: str, value: Any, choices: Mapping[str, Any]) -> Any:
    text = str(getattr(value, "name", value)).strip().upper().replace("-", "_")
    if text not in choices:
        raise ConfigError(key, f"expected one of {', '.join(sorted(choices))}, got {value!r}")
    return choices[text]


def get(config: Mapping[str, Any], key: str, parse: Callable[[str, Any], Any],
        default: Any = None) -> Any:
    """``parse(key, config[key])`` or ``default`` when the key is absent."""
    if key not in config or config[key] is None:
        return default
    return parse(key, config[key])


def at_least(parse: Callable[[str, Any], Any], minimum: float, maximum: float | None = None
             ) -> Callable[[str, Any], Any]:
    """``parse`` followed by a range check (``minimum`` ≤ value ≤ ``maximum``), naming the key."""

    def parse_in_range(key: str, value: Any) -> Any:
        parsed = parse(key, value)
        if parsed < minimum or (maximum is not None and parsed > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            raise ConfigError(key, f"must be {bound}, got {value!r}")
        return parsed

    return parse_in_range


def parse_str(key: str, value: Any) -> str:
    """A non-empty string (paths, names, endpoints)."""
    text = str(value).strip()
    if not text:
        raise ConfigError(key, "must not be empty")
    return text


# --- parsers of particular options -----------------------------------------------------------


def choice(*names: str) -> Callable[[str, Any], str]:
    """A parser accepting one of ``names`` (case-insensitive, ``_`` for ``-`` accepted)."""
    allowed = {n.lower().replace("_", "-"): n for n in names}

    def parse(key: str, value: Any) -> str:
        text = str(getattr(value, "name", value)).strip().lower().replace("_", "-")
        if text not in allowed:
            raise ConfigError(key, f"expected one of {', '.join(names)}, got {value!r}")
        return allowed[text]

    return parse


def open_ratio(key: str, value: Any) -> float:
    """A fraction strictly between 0 and 1 (Flink's rule for memory ratios)."""
    ratio = parse_float(key, value)
    if not 0 < ratio < 1:
        raise ConfigError(key, f"{ratio} is not strictly between 0 and 1")
    return ratio


def refused(why: str) -> Callable[[str, Any], Any]:
    """The parser of a Flink key that cannot take effect here: setting it is a ConfigError."""
    def parse(key: str, value: Any) -> Any:
        raise ConfigError(key, f"cannot take effect: {why}")
    return parse


def materialize_interval(key: str, value: Any) -> int:
    """A positive duration in ms, or -1 for a negative one (Flink: no periodic materialization)."""
    text = str(value).strip()
    if text.startswith("-") and text[1:].strip()[:1].isdigit():
        return -1
    return int(at_least(parse_duration_ms, 1)(key, value))


def compaction_style(key: str, value: Any) -> str:
    """LEVEL or UNIVERSAL; FIFO (Flink accepts it) deletes the oldest files, state included."""
    if str(getattr(value, "name", value)).strip().upper() == "FIFO":
        raise ConfigError(key, "FIFO compaction deletes the oldest SST files once the database "
                          "outgrows its limit, which would drop keyed state; use LEVEL or UNIVERSAL")
    return choice("LEVEL", "UNIVERSAL")(key, value)


def open_files(key: str, value: Any) -> int:
    """-1 (no limit) or at least 20 (RocksDB would raise 1..19 to 20 silently)."""
    if (count := parse_int(key, value)) != -1 and count < 20:
        raise ConfigError(key, f"must be -1 (no limit) or at least 20, got {value!r}")
    return count
