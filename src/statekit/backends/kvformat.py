"""The backend-neutral snapshot format ``statekit-kv/2``: what every backend can write and read.

A task handle holds one entry per state.  An entry is *indexed* (one chunk per key group with an
``index`` of ``kg -> [offset, length, crc]``, so a restore reads only the key groups it owns:
savepoints, heap changelogs) or *plain* (parts of ``packb([plain keys, plain values])`` in any
key-group order with ``[offset, length, crc]`` per part: heap checkpoints).  Version 1, indexed
entries only, is still read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Required, TypedDict

from statekit.backends.kinds import stored_check
from statekit.backends.kvschema import check_kv_states
from statekit.backends.plaingroups import meeting, part_ranges
from statekit.backends.plainheads import check_head, headed, part_index, plain_heads
from statekit.backends.plainparts import PACE_SLICE
from statekit.checkpoint import schema
from statekit.checkpoint.checksum import part_locations
from statekit.errors import CorruptCheckpointError, SerializationError
from statekit.serde.keygroups import KeyGroupRange, key_group_for_bytes, key_groups_for_bytes
from statekit.serde.keys import plain_key_bytes, plain_key_groups
from statekit.serde.msgpack import packb, unpack_each, unpackb

if TYPE_CHECKING:
    from statekit.backends.base import KeyedStateBackend, StateMeta
    from statekit.checkpoint.reader import StateReader
from statekit.checkpoint.streams import CheckpointStreams

KV_FORMAT = "statekit-kv/2"
KV_FORMATS = ("statekit-kv/1", KV_FORMAT)

class HandleHeader(TypedDict, total=False):
    """What every task handle starts with, whatever its format: who wrote which key groups, and
    the key type of its keys (``key_type``, a serializer config; absent in older handles)."""

    format: Required[str]
    backend: Required[str]
    key_group_range: Required[list[int]]
    max_parallelism: Required[int]
    key_type: Any


class KvHandle(HandleHeader):
    """A ``statekit-kv`` task handle: the header plus one entry per state name."""

    states: dict[str, dict[str, Any]]
    state_count: int


class IndexedEntry(TypedDict):
    """One state as key-group chunks: ``index[kg] = [offset, length, crc]`` into ``data``."""

    layout: list[Any]
    kind: str
    data: dict[str, Any]
    index: dict[int, list[int]]


class PlainEntry(TypedDict, total=False):
    """One state as plain parts: ``parts[n] = [offset, length, crc]`` into ``data``, and
    ``heads[n] = [length, crc]`` of each part's head (its array header and keys), so a lazy
    restore reads and checks the keys alone; ``groups[n] = [first, last]`` key group of each
    part's keys (:mod:`statekit.backends.plaingroups`)."""

    layout: Required[list[Any]]
    kind: Required[str]
    encoding: Required[str]  # "plain"
    data: Required[dict[str, Any]]
    parts: Required[list[list[int]]]
    heads: list[list[int]]
    groups: list[list[int]]


def handle_header(backend: KeyedStateBackend, fmt: str) -> HandleHeader:
    """The common header of a task handle of ``backend`` in format ``fmt``."""
    header: HandleHeader = {
        "format": fmt,
        "backend": backend.backend_name,
        "key_group_range": backend.key_group_range.to_list(),
        "max_parallelism": backend.max_parallelism,
    }
    if backend.key_check.config is not None:
        header["key_type"] = backend.key_check.config
    return header


def kv_handle(backend: KeyedStateBackend, states: dict[str, dict[str, Any]]) -> KvHandle:
    """The task handle of a ``KV_FORMAT`` snapshot."""
    return {**handle_header(backend, KV_FORMAT),  # type: ignore[typeddict-item]
            "states": states, "state_count": len(states)}


# --- the schema pass over handles (statekit.backends.kvschema) -------------------------------------

for _fmt in KV_FORMATS:
    schema.register_format(_fmt, check_kv_states)


# --- indexed entries -------------------------------------------------------------------------------


@dataclass
class KvStateData:
    """One state's entries grouped by key group: ``chunks[kg] = (key_bytes, value_bytes)`` lists."""

    meta_layout: list[Any]
    kind: str
    chunks: dict[int, tuple[list[bytes], list[bytes]]] = field(default_factory=dict)

    def add(self, key_group: int, key: bytes, value: bytes) -> None:
        chunk = self.chunks.get(key_group)
        if chunk is None:
            self.chunks[key_group] = ([key], [value])
        else:
            chunk[0].append(key)
            chunk[1].append(value)


def group_entries(
    items: Iterable[tuple[Any, Any]],
    meta: StateMeta,
    max_parallelism: int,
    now: int | None = None,
    pace: Callable[[], None] | None = None,
) -> KvStateData:
    """Serialize a state's (key, stored value) pairs into per-key-group chunks.

    Expired TTL entries are dropped when the state's TTL config asks for full-snapshot cleanup;
    ``pace`` runs every :data:`PACE_SLICE` entries (GIL sharing with the processing thread).
    """
    data = KvStateData(meta.layout, meta.kind)
    key_ser = meta.key_serializer.serialize
    val_ser = meta.stored_serializer.serialize
    drop = meta.snapshot_filter(now)
    add = data.add
    for n, (key, stored) in enumerate(items, 1):
        if pace is not None and n % PACE_SLICE == 0:
            pace()
        if drop is not None:
            stored = drop(stored)
            if stored is None:
                continue
        kb = key_ser(key)
        add(key_group_for_bytes(kb, max_parallelism), kb, val_ser(stored))
    return data


def indexed_blob(chunks: dict[int, Any]) -> tuple[dict[int, list[int]], bytes]:
    """Pack key-group chunks into one blob with an index of ``[offset, length, crc]`` per group."""
    order = sorted(chunks)
    parts = [packb(list(chunks[kg])) for kg in order]
    return dict(zip(order, part_locations(parts), strict=True)), b"".join(parts)


def write_kv_state(streams: CheckpointStreams, name: str, data: KvStateData, *,
                   shared_name: str | None = None) -> IndexedEntry:
    """Write one state's chunks as one blob with a per-key-group index of offset, length, crc.

    ``shared_name`` writes the blob as a shared file that later checkpoints may reference.
    """
    index, blob = indexed_blob(data.chunks)
    handle = streams.write(blob, state_name=name, shared_name=shared_name)
    return {"layout": data.meta_layout, "kind": data.kind, "data": handle, "index": index}


def read_kv_entry(
    name: str, entry: dict[str, Any], reader: StateReader, key_group_range: KeyGroupRange
) -> Iterator[tuple[int, list[Any]]]:
    """Yield ``(key group, unpacked chunk)`` for one indexed state entry, inside the range only."""
    try:
        index = entry["index"]
        wanted = [(int(kg), loc) for kg, loc in index.items() if int(kg) in key_group_range]
    except (KeyError, AttributeError, TypeError, ValueError) as exc:
        raise CorruptCheckpointError(f"state '{name}': malformed key-group index") from exc
    for kg, (offset, length, crc) in sorted(wanted):
        chunk = reader.read(entry["data"], offset, length, crc)
        try:
            parts = unpackb(chunk)
        except (ValueError, TypeError) as exc:
            raise CorruptCheckpointError(f"state '{name}' key group {kg}: malformed chunk") from exc
        if not isinstance(parts, list):
            raise CorruptCheckpointError(f"state '{name}' key group {kg}: malformed chunk")
        yield kg, parts


def value_check(name: str, entry: dict[str, Any]) -> Callable[[list[Any]], None]:
    """``check(values)``: CorruptCheckpointError unless a part's stored plain values fit the
    entry's kind and recorded types (:mod:`statekit.backends.kinds`): an entry given another
    state's bytes fails here, whichever reader reads it."""
    problem_of = stored_check(entry.get("kind"), list(entry.get("layout") or ()))  # type: ignore[arg-type]

    def check(values: list[Any]) -> None:
        problem = problem_of(values)
        if problem:
            raise CorruptCheckpointError(f"state '{name}' ({entry.get('kind')}): {problem} "
                                         "(damaged, or another state's data)")

    return check


def _unpacked(name: str, kg: int, encoded: Any) -> list[Any]:
    if not isinstance(encoded, list) or not all(type(v) is bytes for v in encoded):
        raise CorruptCheckpointError(f"state '{name}' key group {kg}: malformed chunk")
    try:
        return unpack_each(encoded)
    except (SerializationError, TypeError, ValueError) as exc:
        raise CorruptCheckpointError(f"state '{name}' key group {kg}: malformed values") from exc


def indexed_chunks(name: str, entry: dict[str, Any], reader: StateReader,
                   key_group_range: KeyGroupRange, max_parallelism: int
                   ) -> Iterator[tuple[int, list[bytes], list[bytes], list[Any]]]:
    """``(key group, serialized keys, serialized values, plain values)`` of an indexed entry
    inside the range, each chunk checked as every restore checks it: a pair of lists, every key
    of the chunk's key group, the values of the entry's kind and types."""
    check = value_check(name, entry)
    for kg, parts in read_kv_entry(name, entry, reader, key_group_range):
        if len(parts) != 2:
            raise CorruptCheckpointError(f"state '{name}' key group {kg}: malformed chunk")
        keys, values = parts
        check_chunk_keys(name, kg, keys, max_parallelism)
        plain = _unpacked(name, kg, values)
        if len(plain) != len(keys):
            raise CorruptCheckpointError(f"state '{name}' key group {kg}: malformed chunk")
        check(plain)
        yield kg, keys, values, plain


def log_chunks(name: str, entry: dict[str, Any], reader: StateReader,
               key_group_range: KeyGroupRange, max_parallelism: int
               ) -> Iterator[tuple[int, list[bytes], list[Any], list[bytes]]]:
    """``(key group, serialized keys put, their plain values, serialized keys removed)`` of a
    changelog entry inside the range, each chunk checked as :func:`indexed_chunks` does."""
    check = value_check(name, entry)
    for kg, parts in read_kv_entry(name, entry, reader, key_group_range):
        if len(parts) != 3:
            raise CorruptCheckpointError(f"state '{name}' key group {kg}: malformed log")
        puts_k, puts_v, removes = parts
        check_chunk_keys(name, kg, puts_k, max_parallelism)
        check_chunk_keys(name, kg, removes, max_parallelism)
        plain = _unpacked(name, kg, puts_v)
        if len(plain) != len(puts_k):
            raise CorruptCheckpointError(f"state '{name}' key group {kg}: malformed log")
        check(plain)
        yield kg, puts_k, plain, removes


# --- plain entries ---------------------------------------------------------------------------------


def write_plain_entry(streams: CheckpointStreams, name: str, layout: list[Any], kind: str,
                      parts: Iterable[bytes | memoryview], *, shared_name: str | None = None,
                      beside: bool = False) -> PlainEntry:
    """Write the parts of one plain state entry as they are produced (``beside``: see
    :meth:`CheckpointStreams.write_parts`), with the length and checksum of each part's head."""
    heads: list[list[int]] = []
    handle, locations = streams.write_parts(headed(parts, heads), state_name=name,
                                            shared_name=shared_name, beside=beside)
    return {"layout": layout, "kind": kind, "encoding": "plain", "data": handle,
            "parts": locations, "heads": heads}


def read_plain_parts(name: str, entry: dict[str, Any], reader: StateReader, *,
                     owned: bool = False, only: list[int] | None = None
                     ) -> Iterator[bytes | memoryview]:
    """The parts of a plain state entry (``only``: these parts), each verified against its
    checksum (a ``memoryview`` is valid until the next part is requested, or for as long as it
    is kept with ``owned``)."""
    locations = part_index(name, entry)
    if only is not None:
        locations = [locations[n] for n in only]
    return reader.read_parts(entry["data"], locations, owned=owned)


def read_plain_entry(name: str, entry: dict[str, Any], reader: StateReader,
                     only: list[int] | None = None) -> Iterator[tuple[list[Any], list[Any]]]:
    """Yield ``(plain keys, plain values)`` per part of a plain state entry (``only``: of these
    parts), each part verified."""
    heads = plain_heads(name, entry)
    picked = range(len(part_index(name, entry))) if only is None else only
    for n, part in zip(picked, read_plain_parts(name, entry, reader, only=only), strict=True):
        if heads is not None:
            check_head(name, n, part, heads[n])
        try:
            keys, values = unpackb(part)
        except (SerializationError, TypeError, ValueError) as exc:
            raise CorruptCheckpointError(f"state '{name}' part {n}: malformed") from exc
        if not isinstance(keys, list) or not isinstance(values, list) or len(keys) != len(values):
            raise CorruptCheckpointError(f"state '{name}' part {n}: malformed")
        yield keys, values


def plain_kept(name: str, keys: list[Any], recorded: KeyGroupRange, mine: KeyGroupRange,
               max_parallelism: int) -> list[int] | None:
    """The indices of a plain part's keys that fall into ``mine`` (None: all of them), after
    checking that every key lies in the range its snapshot ``recorded`` (CorruptCheckpointError
    otherwise: a handle relabelled with another partition's range would restore keys no routing
    reaches)."""
    try:
        groups = plain_key_groups(keys, max_parallelism)
    except SerializationError as exc:
        raise CorruptCheckpointError(f"state '{name}': {exc}") from None
    _check_groups(name, groups, recorded)
    if mine.start <= recorded.start and recorded.end <= mine.end:
        return None
    return ((groups >= mine.start) & (groups <= mine.end)).nonzero()[0].tolist()


def plain_in_range(name: str, keys: list[Any], values: list[Any], recorded: KeyGroupRange,
                   mine: KeyGroupRange, max_parallelism: int) -> tuple[list[Any], list[Any]]:
    """The entries of a plain part whose keys fall into ``mine`` (see :func:`plain_kept`)."""
    kept = plain_kept(name, keys, recorded, mine, max_parallelism)
    if kept is None:
        return keys, values
    return [keys[i] for i in kept], [values[i] for i in kept]


def plain_chunks(name: str, entry: dict[str, Any], reader: StateReader, recorded: KeyGroupRange,
                 mine: KeyGroupRange, max_parallelism: int
                 ) -> Iterator[tuple[list[Any], list[Any]]]:
    """``(plain keys, plain values)`` of a plain entry's parts, the entries inside ``mine`` only
    (parts whose recorded key groups miss ``mine`` are not read), each part checked as every
    restore checks it: every key inside the key groups its part (or snapshot) ``recorded``, the
    values of the entry's kind and types."""
    check = value_check(name, entry)
    ranges = part_ranges(name, entry, recorded)
    wanted = meeting(ranges, mine)
    for n, (keys, values) in zip(wanted, read_plain_entry(name, entry, reader, wanted),
                                 strict=True):
        check(values)
        yield plain_in_range(name, keys, values, ranges[n], mine, max_parallelism)


def check_chunk_keys(name: str, key_group: int, keys: Any, max_parallelism: int) -> None:
    """CorruptCheckpointError unless every serialized key of an indexed chunk belongs to the
    chunk's key group."""
    if not isinstance(keys, list) or not all(type(k) is bytes for k in keys):
        raise CorruptCheckpointError(f"state '{name}' key group {key_group}: malformed chunk")
    _check_groups(name, key_groups_for_bytes(keys, max_parallelism),
                  KeyGroupRange(key_group, key_group))


def _check_groups(name: str, groups: Any, recorded: KeyGroupRange) -> None:
    if len(groups) and (int(groups.min()) < recorded.start or int(groups.max()) > recorded.end):
        outside = next(int(g) for g in groups if int(g) not in recorded)
        raise CorruptCheckpointError(
            f"state '{name}': a key of key group {outside} lies outside the key groups "
            f"{recorded.start}..{recorded.end} its snapshot records")


# --- whole handles ---------------------------------------------------------------------------------


def check_kv_handle(handle: dict[str, Any], max_parallelism: int) -> KeyGroupRange:
    """The key-group range of a readable ``KV_FORMATS`` handle taken with ``max_parallelism``."""
    if handle.get("format") not in KV_FORMATS:
        raise CorruptCheckpointError(
            f"expected a {KV_FORMAT} snapshot, got format {handle.get('format')!r}"
        )
    recorded = handle.get("max_parallelism", max_parallelism)
    if recorded != max_parallelism:
        raise CorruptCheckpointError(
            f"snapshot was taken with max_parallelism {recorded}, this job uses {max_parallelism}"
        )
    try:
        return KeyGroupRange.of(handle["key_group_range"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptCheckpointError("snapshot without a valid key_group_range") from exc


def kept_indices(key_filter: Callable[[Any], bool], keys: list[Any]) -> list[int]:
    """The indices of the keys ``key_filter`` keeps: decided at once when the filter offers
    ``mask(keys)`` (a rescale's Spark partition filter hashes many keys in one go), else key by
    key."""
    mask = getattr(key_filter, "mask", None)
    flags = mask(keys) if mask is not None else map(key_filter, keys)
    return [i for i, keep in enumerate(flags) if keep]


def read_kv_states(
    handles: Iterable[dict[str, Any]], reader: StateReader, key_group_range: KeyGroupRange,
    max_parallelism: int, key_filter: Callable[[Any], bool] | None = None,
) -> Iterator[tuple[str, dict[str, Any], int, list[bytes], list[bytes]]]:
    """Yield ``(state name, entry, key group, keys, values)``, serialized, for every entry inside
    the range (and, with ``key_filter``, whose plain key it accepts); plain entries are
    serialized and grouped here (restoring into a bytes backend).  Every part is checked by the
    readers every restore uses (:func:`indexed_chunks`, :func:`plain_chunks`)."""
    for handle in handles:
        recorded = check_kv_handle(handle, max_parallelism)
        for name, entry in handle["states"].items():
            if entry.get("encoding") != "plain":
                for kg, keys, values, _ in indexed_chunks(name, entry, reader, key_group_range,
                                                          max_parallelism):
                    if key_filter is not None:
                        kept = kept_indices(key_filter, [unpackb(kb) for kb in keys])
                        keys, values = [keys[i] for i in kept], [values[i] for i in kept]
                    yield name, entry, kg, keys, values
                continue
            for keys, values in plain_chunks(name, entry, reader, recorded,
                                             recorded.intersection(key_group_range),
                                             max_parallelism):
                try:
                    kbs = list(map(plain_key_bytes, keys))
                except SerializationError as exc:
                    raise CorruptCheckpointError(f"state '{name}': {exc}") from None
                groups = key_groups_for_bytes(kbs, max_parallelism)
                chunks: dict[int, tuple[list[bytes], list[bytes]]] = {}
                owned = None if key_filter is None else set(kept_indices(key_filter, keys))
                for i, (kb, kg, value) in enumerate(zip(kbs, groups.tolist(), values, strict=True)):
                    if kg not in key_group_range or (owned is not None and i not in owned):
                        continue
                    chunk = chunks.setdefault(kg, ([], []))
                    chunk[0].append(kb)
                    chunk[1].append(packb(value))
                for kg, (chunk_keys, chunk_values) in sorted(chunks.items()):
                    yield name, entry, kg, chunk_keys, chunk_values
