"""Key types: what a snapshot records about its keys, what a restore accepts, and the check of a
declared key type when a key is used.

A keyed backend is built with a key serializer (``key_by(..., key_type=Types.STRING())`` on the
local runner, generic keys on Spark).  Its snapshots record the serializer's config as the
handle's ``key_type``; a restore compares it with its own (:func:`restore_key_check`):

* the same type, or a declared type that holds every recorded key unchanged (BYTE < SHORT <
  INT < LONG < BIG_INT, CHAR < STRING, FLOAT < DOUBLE, and so per field of tuples and rows):
  restored as it is;
* generic keys declared, a scalar key type recorded: restored as it is (the keys are the same
  Python values);
* generic keys recorded, a scalar key type declared: every restored key is checked against it;
* anything else (INT keys into DOUBLE or STRING, tuples into generic keys, ...):
  :class:`~statekit.errors.StateTypeError` naming both types, before any state is loaded.

A snapshot without ``key_type`` (written before it was recorded) restores unchecked, as it
always did.
"""

from __future__ import annotations

import reprlib
from array import array
from collections.abc import Callable, Sequence
from typing import Any

from statekit.errors import CorruptCheckpointError, StateTypeError
from statekit.serde.keys import PLAIN_KEY_TYPES, check_key
from statekit.serde.serializers import TypeSerializer
from statekit.serde.types import describe_type, serializer_from_config

GENERIC = "generic"
#: scalar key types and the declared types that hold each of their keys unchanged
_WIDER: dict[str, tuple[str, ...]] = {
    "BYTE": ("SHORT", "INT", "LONG", "BIG_INT"), "SHORT": ("INT", "LONG", "BIG_INT"),
    "INT": ("LONG", "BIG_INT"), "LONG": ("BIG_INT",), "CHAR": ("STRING",), "FLOAT": ("DOUBLE",),
}

#: ``array`` type codes whose range is exactly an integer key type's (BYTE, SHORT, INT, LONG)
_WIDTHS = {(-(1 << (8 * array(code).itemsize - 1)), (1 << (8 * array(code).itemsize - 1)) - 1):
           code for code in ("b", "h", "i", "q")}
#: ``check(keys)``: StateTypeError unless every restored key is of the declared key type
RestoreCheck = Callable[[Sequence[Any]], None]


def key_type_of(serializer: TypeSerializer) -> Any:
    """The config a snapshot records for keys of ``serializer`` (None: a custom serializer
    without a config, whose keys are not recorded and so not checked at restore)."""
    try:
        return serializer.config()
    except NotImplementedError:
        return None


def _holds(declared: Any, recorded: Any) -> bool:
    """Whether every key of type ``recorded`` is a key of type ``declared``, in the same plain
    form (so with the same serialized bytes and key group)."""
    if declared == recorded:
        return True
    if isinstance(recorded, str):
        return isinstance(declared, str) and declared in _WIDER.get(recorded, ())
    if not (isinstance(recorded, list) and isinstance(declared, list) and recorded
            and len(recorded) == len(declared) and recorded[0] == declared[0]):
        return False
    if recorded[0] in ("tuple", "row") and len(recorded) == 2:
        fields = recorded[1], declared[1]
    elif recorded[0] == "row_named" and len(recorded) == 3 and recorded[1] == declared[1]:
        fields = recorded[2], declared[2]
    else:
        return False
    return (isinstance(fields[0], list) and isinstance(fields[1], list)
            and len(fields[0]) == len(fields[1])
            and all(_holds(d, r) for r, d in zip(*fields, strict=True)))


def _plain_scalar(config: Any) -> bool:
    """Whether keys of ``config`` are their own plain form (not pickle, not a container)."""
    if not isinstance(config, str) or config == "pickle":
        return False
    try:
        return serializer_from_config(config).identity
    except ValueError:
        return False


class KeyCheck:
    """The declared key type's check on every key a backend is given (``set_current_key``, bulk
    access): keys of exactly the declared type pass without a call (:attr:`fast`, and for
    integer types :attr:`bounds`), others are checked in full; generic keys only need to be keys
    (:func:`~statekit.serde.keys.check_key`)."""

    def __init__(self, serializer: TypeSerializer) -> None:
        self.serializer = serializer
        self.config = key_type_of(serializer)
        self.generic = self.config == GENERIC
        exact, low, high = (None, None, None) if self.generic else serializer.exact_type()
        #: key types that need no check at all (generic: str/int/bytes, which are canonical)
        self.fast: frozenset[type] = (PLAIN_KEY_TYPES if self.generic else
                                      frozenset({exact}) if exact is not None and low is None
                                      else frozenset())
        #: ``(low, high)`` of an integer key type: ints within them need no call either
        self.bounds: tuple[int, int] | None = (low, high) if exact is int and low is not None \
            else None
        self.name = describe_type(self.config) if self.config is not None else "custom"
        #: the ``array`` type code of exactly the integer key type's range (BYTE ... LONG)
        self._width = _WIDTHS.get(self.bounds) if self.bounds is not None else None

    def check(self, key: Any) -> None:
        """StateTypeError unless ``key`` is a key (hashable, no NaN, ...) of the declared type."""
        check_key(key)
        self.check_type(key)

    def check_type(self, key: Any) -> None:
        """StateTypeError unless ``key`` is of the declared type (where serializing the key
        checks the rest)."""
        if not self.generic:
            problem = self.serializer.check(key)
            if problem is not None:
                raise StateTypeError(f"key {reprlib.repr(key)} is not of the declared key type "
                                     f"{self.name}: {problem}")

    def passes(self, key: Any) -> bool:
        """Whether ``key`` passes without a call (its exact type, within the bounds)."""
        if type(key) in self.fast:
            return True
        bounds = self.bounds
        return bounds is not None and type(key) is int and bounds[0] <= key <= bounds[1]

    def check_all(self, keys: Sequence[Any]) -> None:
        """:meth:`check` of every key: one C-level pass over the types when every key is of
        exactly the declared type, and for BYTE/SHORT/INT/LONG one more over the range (packing
        the keys into an ``array`` of that width, which refuses any key outside it)."""
        types = set(map(type, keys))
        if types <= self.fast:
            return
        if self._width is not None and types == {int}:
            try:
                array(self._width, keys)
                return
            except OverflowError:
                pass
        for key in keys:
            self.check(key)


def restore_key_check(recorded: Any, check: KeyCheck) -> RestoreCheck | None:
    """How keys recorded as ``recorded`` restore into a backend checking ``check`` (see the
    module docstring): None when they restore as they are, a check of every restored key, or
    StateTypeError naming both types; CorruptCheckpointError for a ``key_type`` no serializer
    has."""
    declared = check.config
    if recorded is None or declared is None or _holds(declared, recorded):
        return None
    try:
        serializer_from_config(recorded)
    except (ValueError, TypeError, RecursionError) as exc:
        raise CorruptCheckpointError(
            f"a snapshot records an unknown key type {reprlib.repr(recorded)}") from exc
    if check.generic and _plain_scalar(recorded):
        return None
    if recorded == GENERIC and _plain_scalar(declared):
        def check_restored(keys: Sequence[Any]) -> None:
            try:
                check.check_all(keys)
            except StateTypeError as exc:
                raise StateTypeError(f"the snapshot's keys are {describe_type(GENERIC)} and one "
                                     f"is not a key of the declared type: {exc}") from None
        return check_restored
    raise StateTypeError(
        f"the snapshot's keys are {describe_type(recorded)}, but this backend's key type is "
        f"{describe_type(declared)}, which does not hold them unchanged: restore with the key "
        f"type {describe_type(recorded)} (or one that holds its keys, such as a wider integer "
        "type or generic keys)")
