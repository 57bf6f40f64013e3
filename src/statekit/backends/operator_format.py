"""The snapshot format of operator state and its redistribution on rescale (Flink's
``RoundRobinOperatorStateRepartitioner``).

One subtask's operator state is one msgpack map ``{"format": "operator-state", "version": 1,
"states": {name: {"mode", "layout", "entries"}}}``: ``mode`` is how the state is redistributed
(``split``: even split, ``union``, ``broadcast``), ``layout`` the descriptor's layout (kind and
serializer configs, checked against the descriptor that restores it), ``entries`` the plain
elements of a list state or the ``[key, value]`` pairs of a broadcast state.  Redistribution
moves plain entries, never deserializing them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from statekit.errors import CorruptCheckpointError, SerializationError
from statekit.serde.types import packb, unpackb

FORMAT = "operator-state"
VERSION = 1


class DistributionMode(StrEnum):
    """How a state's entries go to the subtasks of a rescaled job (Flink's ``OperatorStateHandle
    .Mode``): ``SPLIT_DISTRIBUTE`` splits the list evenly, ``UNION`` gives every subtask the
    whole union, ``BROADCAST`` gives every subtask a copy of one (identical) map."""

    SPLIT_DISTRIBUTE = "split"
    UNION = "union"
    BROADCAST = "broadcast"


@dataclass
class StateEntries:
    """One named state of a snapshot: its mode, recorded layout and plain entries."""

    mode: DistributionMode
    layout: list[Any]
    entries: list[Any] = field(default_factory=list)

    @property
    def is_broadcast(self) -> bool:
        return self.mode is DistributionMode.BROADCAST


#: one subtask's operator state: state name -> entries
Snapshot = dict[str, StateEntries]


def encode(states: Snapshot) -> bytes:
    """The bytes of one subtask's operator state (states in name order)."""
    return packb({"format": FORMAT, "version": VERSION, "states": {
        name: {"mode": s.mode.value, "layout": s.layout, "entries": s.entries}
        for name, s in sorted(states.items())}})


def decode(data: bytes, where: str = "operator state") -> Snapshot:
    """One subtask's operator state; CorruptCheckpointError for every way it can be damaged."""
    try:
        body = unpackb(data)
    except SerializationError as exc:
        raise CorruptCheckpointError(f"{where}: undecodable: {exc}") from None
    if type(body) is not dict or body.get("format") != FORMAT:
        raise CorruptCheckpointError(f"{where}: not statekit operator state")
    if body.get("version") != VERSION:
        raise CorruptCheckpointError(f"{where}: format version {body.get('version')!r}; this "
                                     f"statekit reads version {VERSION}")
    states = body.get("states")
    if type(states) is not dict:
        raise CorruptCheckpointError(f"{where}: 'states' is not a map")
    return {_name(name, where): _state(name, raw, where) for name, raw in states.items()}


def _name(name: Any, where: str) -> str:
    if type(name) is not str or not name:
        raise CorruptCheckpointError(f"{where}: a state name is not a non-empty string")
    return name


def _state(name: str, raw: Any, where: str) -> StateEntries:
    here = f"{where}: state {name!r}"
    if type(raw) is not dict:
        raise CorruptCheckpointError(f"{here}: not a map")
    try:
        mode = DistributionMode(raw.get("mode"))
    except ValueError:
        raise CorruptCheckpointError(f"{here}: unknown distribution mode {raw.get('mode')!r}"
                                     ) from None
    layout, entries = raw.get("layout"), raw.get("entries")
    if type(layout) is not list or len(layout) != 4:
        raise CorruptCheckpointError(f"{here}: layout is not [kind, value type, key type, ttl]")
    kind = "map" if mode is DistributionMode.BROADCAST else "list"
    if layout[0] != kind:
        raise CorruptCheckpointError(f"{here}: a {mode.value} state with layout kind "
                                     f"{layout[0]!r} (expected {kind!r})")
    if type(entries) is not list:
        raise CorruptCheckpointError(f"{here}: entries are not a list")
    if kind == "map" and not all(type(e) is list and len(e) == 2 for e in entries):
        raise CorruptCheckpointError(f"{here}: a broadcast entry is not a [key, value] pair")
    return StateEntries(mode, layout, entries)


# --- redistribution ------------------------------------------------------------------------------


def repartition(previous: list[Snapshot | None], new_parallelism: int) -> list[Snapshot]:
    """Each new subtask's operator state from the old subtasks' (in subtask order), as Flink's
    round-robin repartitioner assigns it.

    Same parallelism: every subtask keeps its split and broadcast states, union states become
    the union.  Otherwise split states are cut into contiguous runs of the concatenated lists
    (the first ``total % new`` subtasks of a round take one more element, and the next state's
    round starts where this one's odd elements ended), union states are given whole to every
    subtask, and new subtask ``i`` gets old subtask ``i % old``'s copy of each broadcast state.
    States are taken in name order (Flink iterates a hash map)."""
    if new_parallelism < 1:
        raise ValueError(f"parallelism must be at least 1, not {new_parallelism}")
    old = [p or {} for p in previous]
    names = sorted({name for p in old for name in p})
    modes = {name: _mode_of(name, old) for name in names}
    result: list[Snapshot] = [{} for _ in range(new_parallelism)]
    same = len(old) == new_parallelism
    start = 0
    for name in names:
        holders = [p[name] for p in old if name in p]
        layout = holders[0].layout
        mode = modes[name]
        if mode is DistributionMode.UNION:
            union = [e for h in holders for e in h.entries]
            for target in result:
                target[name] = StateEntries(mode, layout, list(union))
        elif same:
            for target, part in zip(result, old, strict=True):
                if name in part:
                    target[name] = StateEntries(mode, part[name].layout, list(part[name].entries))
        elif mode is DistributionMode.BROADCAST:
            for i, target in enumerate(result):
                copy = holders[i % len(holders)]
                target[name] = StateEntries(mode, copy.layout, list(copy.entries))
        else:
            start = _split(name, layout, [e for h in holders for e in h.entries], result, start)
    return result


def _mode_of(name: str, old: list[Snapshot]) -> DistributionMode:
    modes = {p[name].mode for p in old if name in p}
    if len(modes) != 1:
        raise CorruptCheckpointError(f"operator state {name!r} is recorded with different "
                                     f"distribution modes by different subtasks ({sorted(modes)})")
    return modes.pop()


def _split(name: str, layout: list[Any], elements: list[Any], result: list[Snapshot],
           start: int) -> int:
    """Flink's split of one state's elements; the next state's starting subtask."""
    count = len(result)
    base, remainder = divmod(len(elements), count)
    next_start, offset = start, 0
    for i in range(count):
        index = (i + start) % count
        take = base
        if remainder > 0:
            take += 1
            remainder -= 1
        elif remainder == 0:
            next_start = index
            remainder -= 1
        if take:  # a subtask given no element holds no partition of the state (as in Flink)
            result[index][name] = StateEntries(DistributionMode.SPLIT_DISTRIBUTE, layout,
                                               elements[offset:offset + take])
        offset += take
    return next_start
