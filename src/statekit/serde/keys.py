"""One key semantics on every backend: keys Python's ``==`` calls equal are one key.

The heap backend keeps keys in a dict, RocksDB (and key-group routing) by their serialized
bytes.  Keys are therefore serialized in a canonical form that makes equal keys equal bytes:
``True`` and ``1.0`` as ``1``, integral Decimals as ints, other Decimals without trailing zeros
(or as the float they equal), aware datetimes in UTC, frozenset items in sorted order,
recursively inside tuples.  Keys no backend can hold consistently (NaN, which is not equal to
itself; unhashable values; aware times, which compare by UTC offset without wrapping; values
nested deeper than :data:`MAX_KEY_NESTING`; values without a serialized form) raise
:class:`~statekit.errors.StateTypeError` on every backend.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import reprlib
from typing import Any

from statekit.errors import SerializationError, StateTypeError
from statekit.serde.keygroups import key_groups_for_bytes, key_groups_for_crcs
from statekit.serde.msgpack import MAX_EXT_NESTING, check_nesting, ext_set, packb, packed_crcs
from statekit.serde.serializers import TypeSerializer

#: key types whose values are canonical as they are (the heap's hot path checks nothing more)
PLAIN_KEY_TYPES = frozenset({str, int, bytes})
#: containers in a key nest at most this deep (the format's limit for tuples and sets)
MAX_KEY_NESTING = MAX_EXT_NESTING
#: Decimal keys within this many digits of 1 (beyond, ``int()`` and comparisons run for minutes)
_DECIMAL_EXPONENT = 4300
_UTC = _dt.UTC


class _BadKey(Exception):
    """Why a key cannot be a key (turned into StateTypeError or CorruptCheckpointError)."""


def _canonical(plain: Any, depth: int) -> Any:
    """``plain`` in the canonical form whose bytes are equal exactly when the keys are equal."""
    t = type(plain)
    if t is str or t is int or t is bytes or plain is None:
        return plain
    if depth > MAX_KEY_NESTING:
        raise _BadKey(f"it nests more than {MAX_KEY_NESTING} levels deep")
    if t is bool:
        return int(plain)
    if t is float:
        return _float(plain)
    if t is tuple:
        return tuple(_canonical(item, depth + 1) for item in plain)
    if t is list:
        return [_canonical(item, depth + 1) for item in plain]
    if t is frozenset or t is set:
        items = sorted(packb(_canonical(item, depth + 1)) for item in plain)
        return ext_set(items, frozen=t is frozenset)
    if t is decimal.Decimal:
        return _decimal(plain)
    if t is _dt.datetime:
        return plain.astimezone(_UTC) if plain.utcoffset() is not None else plain
    if t is _dt.time and plain.utcoffset() is not None:
        raise _BadKey("aware times compare by their UTC offset; use a naive time or a datetime")
    for base in (bool, int, float, str, bytes):  # subclasses (IntEnum, ...) are their base value
        if isinstance(plain, base):
            return _canonical(base(plain), depth)
    return plain


def _float(value: float) -> Any:
    if value != value:
        raise _BadKey("NaN is not equal to itself, so it cannot be a key")
    return int(value) if value.is_integer() else value


def _decimal(value: decimal.Decimal) -> Any:
    if value.is_nan():
        raise _BadKey("NaN is not equal to itself, so it cannot be a key")
    if value.is_infinite():
        return float(value)
    if abs(value.adjusted()) > _DECIMAL_EXPONENT:
        raise _BadKey(f"Decimal keys have at most {_DECIMAL_EXPONENT} digits")
    if value == value.to_integral_value():
        return int(value)
    as_float = float(value)
    if as_float == value:
        return as_float
    sign, digits, exponent = value.as_tuple()
    while digits and digits[-1] == 0 and isinstance(exponent, int) and exponent < 0:
        digits, exponent = digits[:-1], exponent + 1
    return decimal.Decimal((sign, digits, exponent))


def _checked(key: Any) -> None:
    """_BadKey unless ``key`` (an object, not a plain form) nests within the limit and hashes."""
    try:
        check_nesting(key, MAX_KEY_NESTING)  # before hash(): hashing a deep tuple overflows C
    except SerializationError as exc:
        raise _BadKey(str(exc)) from None
    try:
        hash(key)
    except TypeError:
        raise _BadKey(f"a {type(key).__name__} is not hashable") from None


def _key_error(key: Any, why: object) -> StateTypeError:
    return StateTypeError(f"invalid key {reprlib.repr(key)}: {why}")


def check_key(key: Any) -> None:
    """StateTypeError unless ``key`` can be a key on every backend (hashable, no NaN, nesting
    within the limit, a serialized form): what the heap checks where RocksDB serializes."""
    t = type(key)
    if t in PLAIN_KEY_TYPES or (t is tuple and set(map(type, key)) <= PLAIN_KEY_TYPES):
        return
    try:
        _checked(key)
        packb(_canonical(key, 1))
    except (_BadKey, SerializationError) as exc:
        raise _key_error(key, exc) from None


def plain_key_bytes(plain: Any) -> bytes:
    """The canonical serialized key of a plain form read from a snapshot; SerializationError
    when it cannot be a key (the caller reports the checkpoint as corrupt)."""
    if type(plain) in PLAIN_KEY_TYPES:
        return packb(plain)
    try:
        return packb(_canonical(plain, 1))
    except _BadKey as exc:
        raise SerializationError(f"invalid key {reprlib.repr(plain)}: {exc}") from None


def plain_key_groups(keys: list[Any], max_parallelism: int) -> Any:
    """The key group of each plain key read from a snapshot (a numpy array; one C-level pass
    when every key is a str, int or bytes); SerializationError for a value that is no key."""
    if set(map(type, keys)) <= PLAIN_KEY_TYPES:
        return key_groups_for_crcs(packed_crcs(keys), max_parallelism)
    return key_groups_for_bytes(map(plain_key_bytes, keys), max_parallelism)


class KeySerializer(TypeSerializer):
    """The key type's serializer, serializing canonically (see the module docstring); every
    other operation is the wrapped serializer's."""

    def __init__(self, inner: TypeSerializer) -> None:
        self.inner = inner
        self.identity = inner.identity
        self.immutable = inner.immutable
        self.uses_pickle = inner.uses_pickle

    def serialize(self, value: Any) -> bytes:
        if self.identity and type(value) in PLAIN_KEY_TYPES:
            return packb(value)
        try:
            _checked(value)
            return packb(_canonical(self.inner.to_plain(value), 1))
        except (_BadKey, SerializationError) as exc:
            raise _key_error(value, exc) from None

    def deserialize(self, data: bytes) -> Any:
        return self.inner.deserialize(data)

    def to_plain(self, value: Any) -> Any:
        return self.inner.to_plain(value)

    def from_plain(self, plain: Any) -> Any:
        return self.inner.from_plain(plain)

    def copy(self, value: Any) -> Any:
        return self.inner.copy(value)

    def check(self, value: Any) -> str | None:
        return self.inner.check(value)

    def exact_type(self) -> tuple[type | None, Any, Any]:
        return self.inner.exact_type()

    def config(self) -> Any:
        return self.inner.config()


def as_key_serializer(serializer: TypeSerializer) -> KeySerializer:
    """``serializer`` as a :class:`KeySerializer` (unchanged when it is one already)."""
    return serializer if isinstance(serializer, KeySerializer) else KeySerializer(serializer)
