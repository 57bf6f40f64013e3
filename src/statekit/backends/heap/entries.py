"""What a heap snapshot writes of one registered state: its table as plain parts (by key group
when the backend asks for it, each part with its key-group range), or its changes as a
key-grouped changelog.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from statekit.backends.base import StateMeta
from statekit.backends.heap.capture import dict_reader
from statekit.backends.kvformat import indexed_blob
from statekit.backends.plaingroups import Groups, grouped_parts, ranged
from statekit.backends.plainparts import PACE_SLICE, reader_parts
from statekit.serde.keygroups import KeyGroupRange, key_group_for_bytes


def _view_reader(view: Any) -> Any:
    return dict_reader(view) if isinstance(view, dict) else view.reader()


def table_parts(view: Any, meta: StateMeta, pace: Callable[[], None] | None,
                rng: KeyGroupRange, max_parallelism: int, ordered: bool
                ) -> Iterator[tuple[bytes, Groups]]:
    """A registered state's plain parts with their key-group ranges, read from the view slice by
    slice while writing (TTL full-snapshot cleanup drops expired entries); ``ordered``: by key
    group, else in table order, every part ranging over ``rng``."""
    key_ser, stored = meta.key_serializer, meta.stored_serializer
    args: dict[str, Any] = {
        "pace": pace, "drop": meta.snapshot_filter(),
        "key_plain": None if key_ser.identity else key_ser.to_plain,
        "value_plain": None if stored.identity else stored.to_plain}
    if ordered:
        return grouped_parts(_view_reader(view), rng, max_parallelism, **args)
    return ranged(reader_parts(_view_reader(view), **args), rng)


def changelog_blob(meta: StateMeta, view: Any, keys: Iterable[Any], max_parallelism: int,
                   pace: Callable[[], None] | None) -> tuple[dict[int, list[int]], bytes] | None:
    """One state's changes, key-grouped and indexed: per key group ``[puts' keys, puts' values,
    removed keys]``.  None when nothing changed."""
    key_ser = meta.key_serializer.serialize
    val_ser = meta.stored_serializer.serialize
    drop = meta.snapshot_filter()
    chunks: dict[int, tuple[list[bytes], list[bytes], list[bytes]]] = {}
    for n, key in enumerate(keys, 1):
        if pace is not None and n % PACE_SLICE == 0:
            pace()
        kb = key_ser(key)
        kg = key_group_for_bytes(kb, max_parallelism)
        chunk = chunks.get(kg)
        if chunk is None:
            chunk = chunks[kg] = ([], [], [])
        stored = view.get(key)
        if stored is not None and drop is not None:
            stored = drop(stored)
        if stored is None:
            chunk[2].append(kb)
        else:
            chunk[0].append(kb)
            chunk[1].append(val_ser(stored))
    if not chunks:
        return None
    return indexed_blob(chunks)
