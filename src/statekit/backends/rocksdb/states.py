"""The RocksDB backend's value, list and map states over one column family per state.

List elements are stored under ``prefix + 8-byte sequence number`` (appends never rewrite the
list) and map entries under ``prefix + serialized user key`` (iteration is a prefix scan).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from rocksdict import Rdict, WriteBatch

from statekit.backends.base import StateMeta
from statekit.backends.rocksdb.encoding import SEQ_MAX, check_scan_end, raise_stopped
from statekit.errors import StateError
from statekit.serde.msgpack import packb, unpackb
from statekit.serde.serializers import TypeSerializer
from statekit.state.api import (
    NULL_LIST,
    ListState,
    MapState,
    ValueState,
    check_user_key,
    check_value,
)


class StateOwner(Protocol):
    """What a RocksDB state uses of its backend: the open database and the current key's prefix
    (key group + serialized key, None without a current key).  The backend imports this module."""

    db: Any
    current_prefix: bytes | None

    def no_key(self, state_name: str) -> Exception:
        """The error to raise for an access to ``state_name`` without a current key."""
        ...

    def key_prefixes(self, keys: Sequence[Any]) -> list[bytes]:
        """Each key's prefix (bulk access; moves the current key)."""
        ...


#: no user key was used or checked yet (None is a key a check refuses, so it cannot mark that)
_UNCHECKED: Any = object()


class RocksState:
    """What the RocksDB states share: the column family, the current key's prefix, scans."""

    __slots__ = ("_b", "_cf", "_check", "_de", "_del", "_get", "_handle", "_name", "_put",
                 "_ser", "_valid")

    def __init__(self, backend: StateOwner, cf: Rdict, meta: StateMeta,
                 element: TypeSerializer) -> None:
        self._b = backend
        self._cf: Any = cf
        self._name = meta.name
        self._check = element
        self._ser = packb if element.identity else element.serialize
        self._de = unpackb if element.identity else element.deserialize
        self._valid = element.check
        self.bind(cf, backend.db.get_column_family_handle(meta.name))

    def bind(self, cf: Any, handle: Any) -> None:
        """Use ``cf`` / ``handle`` from now on (the backend swaps in a checking wrapper while a
        lazy restore's files are checked, or an unusable one once the database is gone)."""
        # bound methods of the column family, cached: the hot path is one C call per operation
        self._cf = cf
        self._handle = handle
        self._get = cf.get
        self._put = cf.put
        self._del = cf.delete

    @property
    def native(self) -> tuple[Any, Any]:
        """The column family and its handle this state uses now."""
        return self._cf, self._handle

    def get_many(self, prefixes: list[bytes]) -> list[Any]:
        """The values under many full keys (key-group prefix + key), one multi-get."""
        de = self._de
        return [None if v is None else de(v) for v in self._cf.get(prefixes)]

    def write_many(self, prefixes: list[bytes], values: Sequence[Any]) -> WriteBatch:
        """A write batch setting each full key to its value, None deleting it (each value checked
        as :meth:`update` checks it)."""
        batch = WriteBatch(raw_mode=True)
        handle, ser, valid = self._handle, self._ser, self._valid
        for prefix, value in zip(prefixes, values, strict=True):
            if value is None:
                batch.delete(prefix, handle)
            else:
                if valid(value) is not None:
                    check_value(self._check, value, self._name)
                batch.put(prefix, ser(value), handle)
        return batch

    def _prefix(self) -> bytes:
        prefix = self._b.current_prefix
        if prefix is None:
            raise self._b.no_key(self._name)
        return prefix

    def _scan(self, prefix: bytes, it: Any = None) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) of every entry under ``prefix``, in key order (``it``: an iterator of the
        column family to reuse)."""
        if it is None:
            it = self._cf.iter()
        it.seek(prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                return
            yield key, it.value()
            it.next()
        raise_stopped(it)

    def _delete_prefix(self, prefix: bytes) -> None:
        batch = WriteBatch(raw_mode=True)
        self._delete_prefix_into(batch, prefix)
        if len(batch):
            self._b.db.write(batch)

    def _delete_prefix_into(self, batch: WriteBatch, prefix: bytes) -> None:
        """Add deletes of every entry under ``prefix`` to ``batch``."""
        handle = self._handle
        for key in self._cf.keys(from_key=prefix):
            if not key.startswith(prefix):
                break
            batch.delete(key, handle)


class RocksDBValueState(RocksState, ValueState):
    """Value state: one entry under the key's prefix."""

    __slots__ = ()

    def value(self) -> Any:
        prefix = self._b.current_prefix
        if prefix is None:
            raise self._b.no_key(self._name)
        data = self._get(prefix)
        return None if data is None else self._de(data)

    def update(self, value: Any) -> None:
        prefix = self._b.current_prefix
        if prefix is None:
            raise self._b.no_key(self._name)
        if value is None:
            self._del(prefix)
            return
        if self._valid(value) is not None:
            check_value(self._check, value, self._name)
        self._put(prefix, self._ser(value))

    def clear(self) -> None:
        self._del(self._prefix())


class RocksDBListState(RocksState, ListState):
    """List state: one entry per element, keyed by an 8-byte sequence number, so appends are puts."""

    __slots__ = ()

    def _next_seq(self, prefix: bytes, it: Any = None) -> int:
        if it is None:
            it = self._cf.iter()
        it.seek_for_prev(prefix + SEQ_MAX)
        if it.valid():
            key = it.key()
            if key.startswith(prefix) and len(key) == len(prefix) + 8:
                return int.from_bytes(key[-8:], "big") + 1
        else:
            raise_stopped(it)  # (no entry before, or an unreadable block)
        return 0

    def get(self) -> list[Any]:
        de = self._de
        return [de(v) for _, v in self._scan(self._prefix())]

    def add(self, value: Any) -> None:
        prefix = self._prefix()
        if value is None:
            raise StateError("cannot add None to a list state", self._name)
        check_value(self._check, value, self._name)
        seq = self._next_seq(prefix)
        self._put(prefix + seq.to_bytes(8, "big"), self._ser(value))

    def _validated(self, values: Iterable[Any]) -> list[Any]:
        if values is None:
            raise StateError(NULL_LIST, self._name)
        values = list(values)
        for v in values:
            if v is None:
                raise StateError("cannot add None to a list state", self._name)
            check_value(self._check, v, self._name)
        return values

    def _append(self, batch: WriteBatch, prefix: bytes, seq: int, values: list[Any]) -> None:
        ser, handle = self._ser, self._handle
        for i, v in enumerate(values, seq):
            batch.put(prefix + i.to_bytes(8, "big"), ser(v), handle)

    def add_all(self, values: Iterable[Any]) -> None:
        prefix = self._prefix()
        values = self._validated(values)
        if not values:
            return
        batch = WriteBatch(raw_mode=True)
        self._append(batch, prefix, self._next_seq(prefix), values)
        self._b.db.write(batch)

    def update(self, values: Iterable[Any]) -> None:
        prefix = self._prefix()
        values = self._validated(values)
        batch = WriteBatch(raw_mode=True)
        self._delete_prefix_into(batch, prefix)
        self._append(batch, prefix, 0, values)
        if len(batch):
            self._b.db.write(batch)

    def clear(self) -> None:
        self._delete_prefix(self._prefix())

    # bulk access (statekit.backends.bulk.BulkState): keys and elements are checked there

    def bulk_get(self, keys: list[Any]) -> list[list[Any]]:
        de, it = self._de, self._cf.iter()
        return [[de(v) for _, v in self._scan(prefix, it)] for prefix in self._b.key_prefixes(keys)]

    def bulk_add(self, keys: list[Any], values: list[Any]) -> None:
        self.bulk_append(keys, [[v] for v in values])

    def bulk_append(self, keys: list[Any], lists: list[list[Any]]) -> None:
        """One write batch; each key's next sequence number read through one iterator."""
        batch, it, following = WriteBatch(raw_mode=True), self._cf.iter(), {}
        for prefix, values in zip(self._b.key_prefixes(keys), lists, strict=True):
            if values:
                seq = following.get(prefix)
                if seq is None:  # the key's first append of the call
                    seq = self._next_seq(prefix, it)
                self._append(batch, prefix, seq, values)
                following[prefix] = seq + len(values)
        if len(batch):
            self._b.db.write(batch)


class RocksDBMapState(RocksState, MapState):
    """Map state: one entry per user key under the key's prefix; iteration is a prefix scan."""

    __slots__ = ("_kchecked", "_kde", "_kexact", "_khigh", "_klast", "_klow", "_kser", "_ukey",
                 "_vexact", "_vhigh", "_vlow")

    def __init__(self, backend: StateOwner, cf: Rdict, meta: StateMeta,
                 element: TypeSerializer, user_key: TypeSerializer) -> None:
        super().__init__(backend, cf, meta, element)
        self._ukey = user_key
        self._kser = packb if user_key.identity else user_key.serialize
        self._kde = unpackb if user_key.identity else user_key.deserialize
        # user keys and values of exactly these types (within the bounds) need no check call
        self._kexact, self._klow, self._khigh = user_key.exact_type()
        self._vexact, self._vlow, self._vhigh = element.exact_type()
        # the user key object used last and its bytes, and the one checked last: a namespace
        # (a map state's user key under namespaced state) is read and put again and again
        self._klast: tuple[Any, bytes] = (_UNCHECKED, b"")
        self._kchecked: Any = _UNCHECKED

    def _key_bytes(self, key: Any) -> bytes:
        last, kb = self._klast
        if key is not last:
            kb = self._kser(key)
            self._klast = (key, kb)
        return kb

    def _value_bytes(self, value: Any) -> bytes:
        return b"" if value is None else self._ser(value)

    def get(self, key: Any) -> Any:
        data = self._get(self._prefix() + self._key_bytes(key))
        return None if not data else self._de(data)

    def put(self, key: Any, value: Any) -> None:
        prefix = self._b.current_prefix  # inlined checks: this is the hot path of map writes
        if prefix is None:
            raise self._b.no_key(self._name)
        if key is not self._kchecked and (type(key) is not self._kexact or (
                self._klow is not None and not self._klow <= key <= self._khigh)):
            check_user_key(self._ukey, key, self._name)
            self._kchecked = key
        if value is None:
            self._put(prefix + self._key_bytes(key), b"")
            return
        if type(value) is not self._vexact or (
                self._vlow is not None and not self._vlow <= value <= self._vhigh):
            check_value(self._check, value, self._name)
        self._put(prefix + self._key_bytes(key), self._ser(value))

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        prefix = self._prefix()
        batch = WriteBatch(raw_mode=True)
        handle = self._handle
        for k, v in dict_value.items():
            check_user_key(self._ukey, k, self._name)
            if v is not None:
                check_value(self._check, v, self._name)
            batch.put(prefix + self._kser(k), self._value_bytes(v), handle)
        if len(batch):
            self._b.db.write(batch)

    def remove(self, key: Any) -> None:
        self._del(self._prefix() + self._key_bytes(key))

    def contains(self, key: Any) -> bool:
        return self._get(self._prefix() + self._key_bytes(key)) is not None

    def items(self) -> list[tuple[Any, Any]]:
        prefix = self._prefix()
        n = len(prefix)
        kde, de = self._kde, self._de
        return [(kde(k[n:]), de(v) if v else None) for k, v in self._scan(prefix)]

    def keys(self) -> list[Any]:
        prefix = self._prefix()
        n = len(prefix)
        kde = self._kde
        out, last = [], None
        for key in self._cf.keys(from_key=prefix):
            if not key.startswith(prefix):
                break
            out.append(kde(key[n:]))
            last = key
        else:
            check_scan_end(self._cf, last, prefix)
        return out

    def values(self) -> list[Any]:
        de = self._de
        return [de(v) if v else None for _, v in self._scan(self._prefix())]

    def is_empty(self) -> bool:
        for _ in self._scan(self._prefix()):
            return False
        return True

    def clear(self) -> None:
        self._delete_prefix(self._prefix())

    # bulk access (statekit.backends.bulk.BulkState): keys, user keys and values are checked there

    def bulk_get_entries(self, keys: list[Any], user_keys: list[Any]) -> list[Any]:
        """One multi-get."""
        kb, de = self._key_bytes, self._de
        found = self._cf.get([prefix + kb(user_key) for prefix, user_key
                              in zip(self._b.key_prefixes(keys), user_keys, strict=True)])
        return [None if not data else de(data) for data in found]

    def bulk_items(self, keys: list[Any]) -> list[dict[Any, Any]]:
        kde, de, it = self._kde, self._de, self._cf.iter()
        out = []
        for prefix in self._b.key_prefixes(keys):
            n = len(prefix)
            out.append({kde(k[n:]): de(v) if v else None for k, v in self._scan(prefix, it)})
        return out

    def bulk_put_entries(self, keys: list[Any], user_keys: list[Any], values: list[Any]) -> None:
        """One write batch (applied in order: a pair given twice keeps its last value)."""
        batch, handle, kb, value = WriteBatch(raw_mode=True), self._handle, self._key_bytes, \
            self._value_bytes
        for prefix, user_key, v in zip(self._b.key_prefixes(keys), user_keys, values, strict=True):
            batch.put(prefix + kb(user_key), value(v), handle)
        if len(batch):
            self._b.db.write(batch)

    def bulk_remove_entries(self, keys: list[Any], user_keys: list[Any]) -> None:
        """One write batch."""
        batch, handle, kb = WriteBatch(raw_mode=True), self._handle, self._key_bytes
        for prefix, user_key in zip(self._b.key_prefixes(keys), user_keys, strict=True):
            batch.delete(prefix + kb(user_key), handle)
        if len(batch):
            self._b.db.write(batch)
