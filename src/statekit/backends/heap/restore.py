"""Restoring heap state: one source's entries into the backend's restored states.

A plain entry restores lazily by default (:mod:`statekit.backends.heap.lazy`): its parts are read
and checked, their keys decoded and indexed, their values left serialized until first needed.
Indexed entries and changelogs decode at once; entries restored later override earlier ones.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from statekit.backends.heap.lazy import LazyPart, LazyValues, read_head
from statekit.backends.heap.table import Restored
from statekit.backends.kvformat import (
    indexed_chunks,
    kept_indices,
    log_chunks,
    plain_chunks,
    plain_kept,
    read_plain_parts,
    value_check,
)
from statekit.backends.plaingroups import meeting, part_ranges
from statekit.backends.plainheads import plain_heads, read_head_keys
from statekit.backends.timers import TIMERS_KIND
from statekit.checkpoint.reader import StateReader
from statekit.errors import CorruptCheckpointError, StatekitError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.keytypes import RestoreCheck
from statekit.serde.serializers import TypeSerializer


class RestoreTarget(Protocol):
    """What a restore uses of the heap backend."""

    key_serializer: TypeSerializer
    key_group_range: KeyGroupRange
    max_parallelism: int
    lazy_restore: bool

    def restored_entry(self, name: str, entry: dict[str, Any]) -> Restored: ...


class SourceLoad:
    """Loads one source's entries into a heap backend's restored states (range, key filter),
    checking that every key lies in the key groups the source records (``recorded``)."""

    def __init__(self, backend: RestoreTarget, reader: StateReader, recorded: KeyGroupRange,
                 key_filter: Callable[[Any], bool] | None, skip_states: frozenset[str],
                 key_check: RestoreCheck | None) -> None:
        self.backend, self.reader, self.recorded = backend, reader, recorded
        self.key_filter, self.skip_states, self.key_check = key_filter, skip_states, key_check

    def _own(self, keys: list[Any]) -> list[int] | None:
        """The indices of the keys the key filter keeps (None: all of them), after checking the
        keys' type when the snapshot's key type asks for it (generic keys restored under a
        declared key type)."""
        if self.key_check is not None:
            self.key_check(keys)
        keep = self.key_filter
        if keep is None:
            return None
        own = kept_indices(keep, keys)
        return None if len(own) == len(keys) else own

    def _keep(self, keys: list[Any], values: list[Any]) -> tuple[list[Any], list[Any]]:
        """The entries the key filter keeps (see :meth:`_own`)."""
        own = self._own(keys)
        if own is None:
            return keys, values
        return [keys[i] for i in own], [values[i] for i in own]

    def entry(self, name: str, entry: dict[str, Any]) -> None:
        """Add one state entry's entries inside this backend's key groups."""
        if name in self.skip_states:
            return
        backend = self.backend
        restored = backend.restored_entry(name, entry)
        key_ser, rng, maxp = backend.key_serializer, backend.key_group_range, backend.max_parallelism
        if entry.get("encoding") == "plain":
            if backend.lazy_restore and entry.get("kind") != TIMERS_KIND:  # (queues need all)
                self._lazy(name, entry, restored)
                return
            key_from = None if key_ser.identity else key_ser.from_plain
            for keys, values in plain_chunks(name, entry, self.reader, self.recorded, rng, maxp):
                with _malformed_keys(name):
                    if key_from is not None:
                        keys = list(map(key_from, keys))
                    keys, values = self._keep(keys, values)
                    _put(restored, keys, values)
            return
        for _, keys, _, values in indexed_chunks(name, entry, self.reader, rng, maxp):
            with _malformed_keys(name):
                _put(restored, *self._keep(list(map(key_ser.deserialize, keys)), values))

    def _lazy(self, name: str, entry: dict[str, Any], restored: Restored) -> None:
        """Index a plain entry's parts by key, values left serialized (:class:`LazyPart`): only
        the parts' heads are read when the entry records them, else each part whole."""
        check = value_check(name, entry)
        if restored.lazy is None:
            restored.lazy = LazyValues()
        ranges = part_ranges(name, entry, self.recorded)
        wanted = meeting(ranges, self.backend.key_group_range)  # the others are not read
        heads = plain_heads(name, entry)
        if heads is None:
            for n, raw in zip(wanted, read_plain_parts(name, entry, self.reader, owned=True,
                                                       only=wanted), strict=True):
                keys, at, count = read_head(name, raw)
                self._add(name, restored, LazyPart(name, raw, keys, at, count, None, check),
                          ranges[n])
            return
        data, reader = entry["data"], self.reader
        for n, (location, (size, crc), keys) in zip(
                wanted, read_head_keys(name, entry, reader, wanted), strict=True):
            self._add(name, restored, LazyPart(name, None, keys, size, len(keys), None, check,
                                                source=(reader, data, location), head_crc=crc),
                      ranges[n])

    def _add(self, name: str, restored: Restored, part: LazyPart,
             recorded: KeyGroupRange) -> None:
        """Index the part's keys that this backend keeps (range, key filter), converted; every
        key must lie in the key groups its part ``recorded``."""
        backend = self.backend
        key_ser, rng, maxp = backend.key_serializer, backend.key_group_range, backend.max_parallelism
        keys = part.keys
        part.groups = (max(recorded.start, rng.start), min(recorded.end, rng.end))
        if key_ser.identity and rng.start <= recorded.start and recorded.end <= rng.end:
            # every key is kept: their key groups are checked before any is used or written
            kept = None
            part.unverified = functools.partial(plain_kept, name, recorded=recorded,
                                                mine=recorded, max_parallelism=maxp)
        else:
            kept = plain_kept(name, keys, recorded, rng, maxp)
        with _malformed_keys(name):
            if kept is not None:
                keys = [keys[i] for i in kept]
            if not key_ser.identity:
                keys = list(map(key_ser.from_plain, keys))
            own = self._own(keys)
            if own is not None:
                keys = [keys[i] for i in own]
                kept = own if kept is None else [kept[i] for i in own]
            if keys:
                part.keys, part.keep = keys, kept
                restored.data_drop(keys)
                assert restored.lazy is not None
                restored.lazy.add(part)

    def log(self, name: str, entry: dict[str, Any]) -> None:
        """Apply one changelog entry (per key group: puts' keys, puts' values, removed keys)."""
        if name in self.skip_states:
            return
        backend = self.backend
        restored = backend.restored_entry(name, entry)
        key_de, maxp = backend.key_serializer.deserialize, backend.max_parallelism
        for _, puts_k, puts_v, removes in log_chunks(name, entry, self.reader,
                                                     backend.key_group_range, maxp):
            with _malformed_keys(name):
                keys, values = self._keep(list(map(key_de, puts_k)), puts_v)
                _put(restored, keys, values)
                removed = list(map(key_de, removes))
                if restored.lazy is not None:
                    restored.lazy.drop(removed)
                data = restored.data
                for key in removed:
                    data.pop(key, None)


def _put(restored: Restored, keys: list[Any], values: list[Any]) -> None:
    """Decoded entries override whatever pending part held their keys."""
    if restored.lazy is not None:
        restored.lazy.drop(keys)
    restored.data.update(zip(keys, values, strict=True))


@contextlib.contextmanager
def _malformed_keys(name: str) -> Iterator[None]:
    """Restored keys that are no keys (unhashable, not of the key type) or entries that do not
    pair up: CorruptCheckpointError."""
    try:
        yield
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        if isinstance(exc, StatekitError):
            raise
        raise CorruptCheckpointError(f"state '{name}': malformed keys ({exc})") from None
