"""The kinds of state entries a snapshot holds, in one table: what a stored value of each kind
looks like in plain form, and how a reader turns it into rows.

A snapshot's entry records its kind and layout (``[kind, value type, user key type, ttl]``), but
the bytes are only bound to the entry by metadata; an entry given another state's bytes (a map
state a list state's, a list state a map state's) must fail as corrupt, never restore as
something else.  Every reader of entries (restore into either backend, inspection, conversion)
checks each part's stored values here, right after decoding them: the shape of the kind, and
the recorded types where they are typed.  The checks run over whole parts with C-level passes
(``set(map(type, ...))``) and fall back to the serializer's own check only for values of other
types, so a restore of scalar or generic state pays a few percent.

A new kind is one :data:`KINDS` entry: its shape check and its row style.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from statekit.backends.timers import lists_rising
from statekit.serde.types import serializer_from_config

#: ``check(items)``: why a list of plain items does not fit a type, or None
ItemCheck = Callable[[list[Any]], "str | None"]
_first, _second = operator.itemgetter(0), operator.itemgetter(1)
_NONE = type(None)


def _lists(values: list[Any], what: str) -> str | None:
    return None if set(map(type, values)) <= {list} else f"a stored value is not a {what}"


def _value(values: list[Any], item: ItemCheck, user_key: ItemCheck) -> str | None:
    return item(values)


def _elements(values: list[Any], item: ItemCheck, user_key: ItemCheck) -> str | None:
    return _lists(values, "list") or item(list(itertools.chain.from_iterable(values)))


def _entries(values: list[Any], item: ItemCheck, user_key: ItemCheck) -> str | None:
    problem = _lists(values, "map (a list of [user key, value] pairs)")
    if problem:
        return problem
    pairs = list(itertools.chain.from_iterable(values))
    if not set(map(type, pairs)) <= {list} or not set(map(len, pairs)) <= {2}:
        return "a map entry is not a [user key, value] pair"
    return user_key(list(map(_first, pairs))) or item(list(map(_second, pairs)))


def _timers(values: list[Any], item: ItemCheck, user_key: ItemCheck) -> str | None:
    problem = _lists(values, "list of timestamps")
    if problem:
        return problem
    if not set(map(type, itertools.chain.from_iterable(values))) <= {int}:
        return "a timer is not an integer timestamp"
    if not lists_rising(values, strict=False):
        return "a key's timers are not in ascending order"
    return None


@dataclass(frozen=True)
class StateKind:
    """One kind of state entry.

    ``shape(values, item, user_key)`` says why a part's stored plain values are not of this kind
    (``item`` / ``user_key`` check the values / user keys inside them against the recorded
    types); ``rows`` is how a reader flattens a stored value: ``"value"`` (one row per key),
    ``"elements"`` (one per element, with its ``index``), ``"entries"`` (one per user key) or
    ``"timers"`` (one per timer: its ``timestamp`` and ``domain``).
    """

    name: str
    shape: Callable[[list[Any], ItemCheck, ItemCheck], str | None]
    rows: str


KINDS: dict[str, StateKind] = {kind.name: kind for kind in (
    StateKind("value", _value, "value"),
    StateKind("list", _elements, "elements"),
    StateKind("map", _entries, "entries"),
    StateKind("timers", _timers, "timers"),
)}


def _anything(items: list[Any]) -> str | None:
    return None


def known_type(config: Any) -> bool:
    """Whether ``config`` is a serializer config statekit writes: made of lists and strings
    (never tuples: a layout is compared with a descriptor's as written) and known."""
    def plain(value: Any) -> bool:
        return type(value) is str or (type(value) is list and all(map(plain, value)))

    if not plain(config):
        return False
    try:
        serializer_from_config(config)
    except (ValueError, TypeError):
        return False
    return True


def item_check(config: Any) -> ItemCheck:
    """A check of plain items against a recorded serializer config: one C-level pass when all
    items are of the type's exact Python type, the serializer's own check for others; untyped
    (and unknown) configs accept anything."""
    if config == "generic":
        return _anything
    try:
        serializer = serializer_from_config(config)
    except ValueError:
        return _anything
    exact, low, high = serializer.exact_type()
    if config == "pickle":  # pickled values are read as their pickle bytes, never unpickled
        return lambda items: (None if set(map(type, items)) <= {bytes, _NONE}
                              else "a pickled value is not bytes")

    def check(items: list[Any]) -> str | None:
        types = set(map(type, items))
        if _NONE in types:  # a map entry may hold None (a value or list state never stores one)
            types.discard(_NONE)
            items = [item for item in items if item is not None]
        if exact is not None and types <= {exact}:
            if low is not None and items and (min(items) < low or max(items) > high):
                return f"a value is out of range for {config}"
            return None
        for item in items:
            try:
                problem = serializer.check(serializer.from_plain(item))
            except Exception as exc:  # any failure to convert: the bytes are not of this type
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                return f"not of the recorded type {config}: {problem}"
        return None

    return check


def _stamped(inner: ItemCheck) -> ItemCheck:
    """Items of a TTL state: ``[value, last-access ms]`` pairs."""

    def check(items: list[Any]) -> str | None:
        if None in items:  # a map entry may hold None
            items = [item for item in items if item is not None]
        if not set(map(type, items)) <= {list} or not set(map(len, items)) <= {2}:
            return "a TTL value is not a [value, timestamp] pair"
        if not set(map(type, map(_second, items))) <= {int}:
            return "a TTL timestamp is not an integer"
        return inner(list(map(_first, items)))

    return check


def stored_check(kind: str, layout: list[Any]) -> Callable[[list[Any]], str | None]:
    """``check(values)``: why a part's stored plain values do not fit an entry of ``kind`` with
    ``layout`` (its bytes belong to another state, or are damaged), or None."""
    spec = KINDS.get(kind)
    if spec is None:
        return lambda values: f"unknown state kind {kind!r}"
    ttl = len(layout) > 3 and bool(layout[3])
    item = item_check(layout[1] if len(layout) > 1 else "generic")
    if ttl:
        item = _stamped(item)
    user_key = item_check(layout[2]) if len(layout) > 2 and layout[2] is not None else _anything
    return lambda values: spec.shape(values, item, user_key)
