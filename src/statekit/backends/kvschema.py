"""The schema pass over ``statekit-kv`` state entries (run on every ``_metadata`` body before it
is used; see :mod:`statekit.checkpoint.schema`): each entry's kind and layout, its data handle,
and its key-group index or plain parts inside the data's size.  Incremental heap and native
RocksDB handles check their entries with the same functions.
"""

from __future__ import annotations

from typing import Any

from statekit.backends.kinds import KINDS, known_type
from statekit.checkpoint import schema
from statekit.serde.keygroups import KeyGroupRange

#: the kinds an entry may record (the table is :data:`statekit.backends.kinds.KINDS`)
STATE_KINDS = tuple(KINDS)


def check_kind(entry: dict[str, Any], path: str) -> None:
    """An entry's kind and layout: a known kind, and the layout a descriptor of that kind
    records (``[kind, value type, user key type or None, ttl]``, of known types), since a
    restore compares it with the descriptor's and every reader types values by it."""
    kind = entry.get("kind")
    if type(kind) is not str or kind not in KINDS:
        raise schema.fail(f"{path}.kind", f"expected one of {', '.join(KINDS)}")
    layout = entry.get("layout")
    where = f"{path}.layout"
    if type(layout) is not list or len(layout) != 4:
        raise schema.fail(where, "expected [kind, value type, user key type, ttl]")
    if layout[0] != kind:
        raise schema.fail(where, f"does not describe a {kind} state")
    schema.boolean(layout[3], f"{where}[3]")
    if (layout[2] is None) == (kind == "map"):
        raise schema.fail(f"{where}[2]", "a user key type is recorded by map states only")
    if not known_type(layout[1]):  # every descriptor records its value type (generic at least)
        raise schema.fail(f"{where}[1]", f"unknown value type {layout[1]!r}")
    if layout[2] is not None and not known_type(layout[2]):
        raise schema.fail(f"{where}[2]", f"unknown type {layout[2]!r}")


def check_entry(entry: Any, path: str, recorded: KeyGroupRange, *, plain: bool = True) -> None:
    """Check one state entry of a handle (layout, kind, data, and its index or parts inside the
    data's size); ``plain``: whether the plain encoding may occur here."""
    entry = schema.mapping(entry, path)
    check_kind(entry, path)
    size = schema.handle(entry.get("data"), f"{path}.data")
    if "encoding" in entry:
        if not plain or entry["encoding"] != "plain":
            raise schema.fail(f"{path}.encoding", f"unexpected encoding {entry['encoding']!r}")
        parts = schema.locations(entry.get("parts"), f"{path}.parts", size)
        schema.tiling(parts, f"{path}.parts", size)
        if "heads" in entry:
            _check_heads(entry["heads"], parts, f"{path}.heads")
        if "groups" in entry:
            check_part_groups(entry["groups"], parts, f"{path}.groups", recorded)
        return
    index = schema.mapping(entry.get("index"), f"{path}.index")
    for kg, loc in index.items():
        schema.integer(kg, f"{path}.index", recorded.start, recorded.end)
        schema.location(loc, f"{path}.index[{kg}]", size)
    schema.tiling(sorted(index.values()), f"{path}.index", size)


def _check_heads(heads: Any, parts: list[list[int]], path: str) -> None:
    """``[length, crc]`` of each part's head: one per part, inside the part."""
    if len(schema.sequence(heads, path)) != len(parts):
        raise schema.fail(path, f"{len(heads)} heads for {len(parts)} parts")
    for n, (head, part) in enumerate(zip(heads, parts, strict=True)):
        where = f"{path}[{n}]"
        if type(head) not in (list, tuple) or len(head) != 2:
            raise schema.fail(where, "expected [length, crc]")
        schema.integer(head[0], where, 2, max(2, part[1]))
        schema.integer(head[1], where, 0, (1 << 32) - 1)


def check_part_groups(groups: Any, parts: list[list[int]], path: str,
                      recorded: KeyGroupRange) -> None:
    """``[first, last]`` key group of each part: one per part, inside the recorded range (a
    restore skips the parts whose range misses its own)."""
    if len(schema.sequence(groups, path)) != len(parts):
        raise schema.fail(path, f"{len(groups)} key-group ranges for {len(parts)} parts")
    for n, pair in enumerate(groups):
        where = f"{path}[{n}]"
        if type(pair) not in (list, tuple) or len(pair) != 2:
            raise schema.fail(where, "expected [first, last]")
        first = schema.integer(pair[0], where, recorded.start, recorded.end)
        schema.integer(pair[1], where, first, recorded.end)


def check_states(states: Any, path: str, recorded: KeyGroupRange, *, plain: bool = True) -> None:
    """Check a map of state name to entry."""
    for name, entry in schema.mapping(states, path).items():
        check_entry(entry, f"{path}.{schema.state_name(name, path)}", recorded, plain=plain)


def check_state_count(task: dict[str, Any], states: Any, path: str) -> None:
    """A handle records how many states it holds (``state_count``, absent in handles of older
    versions): an emptied or shortened ``states`` map fails here instead of restoring as less."""
    if "state_count" in task:
        count = schema.integer(task["state_count"], f"{path}.state_count", 0)
        if count != len(schema.mapping(states, f"{path}.states")):
            raise schema.fail(f"{path}.states", f"{len(states)} states, but the handle "
                                                f"records {count}")


def check_kv_states(task: dict[str, Any], path: str, recorded: KeyGroupRange) -> None:
    """The schema pass over a ``statekit-kv`` task handle: its states and their count."""
    check_states(task.get("states"), f"{path}.states", recorded)
    check_state_count(task, task.get("states"), path)
