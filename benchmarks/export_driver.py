"""Writes the export benchmark's checkpoint in its own process (the heap state it builds never
counts against the export's memory): ``python -m benchmarks.export_driver DIR KEYS VALUE_BYTES``.

One heap value state ``v`` of ``KEYS`` keys with ``VALUE_BYTES`` random bytes each, one full
checkpoint under ``DIR/job/chk-1``; prints the bytes written.
"""

from __future__ import annotations

import os
import sys


def write(directory: str, keys: int, value_bytes: int) -> int:
    from statekit import FileSystemCheckpointStorage, HashMapStateBackend, Types, ValueStateDescriptor
    from statekit.serde.keygroups import KeyGroupRange
    from statekit.serde.types import GenericSerializer

    pool = os.urandom(8 * 1024 * 1024)
    access = FileSystemCheckpointStorage(directory).create_access("job")
    backend = HashMapStateBackend(False).create_keyed_state_backend(
        key_serializer=GenericSerializer(), key_group_range=KeyGroupRange.all(128), max_parallelism=128)
    state = backend.get_partitioned_state(ValueStateDescriptor("v", Types.PRIMITIVE_ARRAY(Types.BYTE())))
    span = len(pool) - value_bytes
    for k in range(keys):
        backend.set_current_key(k)
        off = (k * 7919) % span
        state.update(pool[off:off + value_bytes])
    streams = access.streams(1, "task")
    handle = backend.snapshot(1, streams).run()
    access.commit(1, {"tasks": {"task": handle}, "max_parallelism": 128, "backend": "hashmap"})
    backend.dispose()
    return streams.bytes_written


if __name__ == "__main__":
    print(write(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
