"""Serialization layer: type information, safe serializers and key-group hashing."""

from statekit.serde.keygroups import (
    DEFAULT_MAX_PARALLELISM,
    KeyGroupRange,
    key_group_for_bytes,
    key_group_range_for_operator,
    operator_index_for_key_group,
)
from statekit.serde.types import (
    GenericSerializer,
    TypeInformation,
    Types,
    TypeSerializer,
    packb,
    serializer_for,
    unpackb,
)

__all__ = [
    "DEFAULT_MAX_PARALLELISM",
    "GenericSerializer",
    "KeyGroupRange",
    "TypeInformation",
    "TypeSerializer",
    "Types",
    "key_group_for_bytes",
    "key_group_range_for_operator",
    "operator_index_for_key_group",
    "packb",
    "serializer_for",
    "unpackb",
]
