"""One phase of the growth benchmark in its own process (so its peak RSS is its own).

``build``: writes ``keys`` values of ``value_bytes`` into one ValueState, takes a checkpoint (the
first of an incremental backend: everything), changes 1 % of the keys and takes the next
(incremental) checkpoint.  ``restore``: a fresh backend restores the newest checkpoint and reads
one key (restart -> first element), then finishes the restore (every value installed, every file
checked; its peak RSS is then the restored state's).  ``floor`` (no statekit): what any heap
state held as Python objects costs at this size, the baseline of the heap's restore targets: the
peak RSS of a plain dict of the same keys and values, and the time to decode the keys from
packed arrays as a checkpoint's parts hold them and index them in a dict (the least a restore
that indexes every key does before its first element).  Prints one JSON line of figures.

Run: ``python -m benchmarks.growth_driver build|restore|floor <backend> <keys> <value bytes> <dir>``.
"""

from __future__ import annotations

import json
import random
import resource
import sys
import time
from itertools import repeat
from pathlib import Path
from typing import Any

BATCH = 10_000
MEMORY_BUDGET = "1 gb"  # RocksDB's shared memory budget (state.backend.rocksdb.memory.fixed-per-slot)


def _backend(kind: str, work: Path) -> Any:
    from benchmarks._common import MAXP, long_serializer
    from statekit import HashMapStateBackend
    from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
    from statekit.serde.keygroups import KeyGroupRange

    if kind == "heap":
        factory: Any = HashMapStateBackend(incremental=True)
    else:
        factory = EmbeddedRocksDBStateBackend(True)
        factory.set_db_storage_paths(str(work))
        factory.set_memory_configuration(fixed_per_slot=MEMORY_BUDGET)
    return factory.create_keyed_state_backend(
        key_serializer=long_serializer(), key_group_range=KeyGroupRange.all(MAXP),
        max_parallelism=MAXP)


def _desc() -> Any:
    from statekit import Types, ValueStateDescriptor

    return ValueStateDescriptor("v", Types.PRIMITIVE_ARRAY(Types.BYTE()))


def _values(start: int, count: int, value_bytes: int, version: int) -> list[bytes]:
    pool = _POOL
    span = len(pool) - value_bytes
    offsets = ((k * 7919 + version * 104729) % span for k in range(start, start + count))
    return [pool[o:o + value_bytes] for o in offsets]


_POOL = random.Random(42).randbytes(8 << 20)  # the same in every phase's process


def _checkpoint(backend: Any, access: Any, cid: int, keep: list[Any] | None = None
                ) -> dict[str, Any]:
    """One checkpoint, committed and confirmed: its figures (its handle appended to ``keep``)."""
    streams = access.streams(cid, "task")
    t0 = time.perf_counter()
    run = backend.snapshot(cid, streams)
    handle = run.run()
    if keep is not None:
        keep.append(handle)
    access.commit(cid, {"tasks": {"task": handle}})
    seconds = time.perf_counter() - t0
    backend.notify_checkpoint_complete(cid)
    return {"seconds": round(seconds, 3), "bytes": streams.bytes_written,
            "stall_s": round(run.sync_seconds, 4),
            "write_mb_s": round(streams.bytes_written / seconds / 1e6, 1)}


def load(backend: Any, root: Path, keys: int, value_bytes: int) -> tuple[Any, Any, Any, float]:
    """Checkpoint storage under ``root`` and ``keys`` values written to ``backend``: the access,
    the bulk state, its descriptor and the seconds the writes took."""
    from statekit import FileSystemCheckpointStorage
    from statekit.backends.bulk import BulkState

    access = FileSystemCheckpointStorage(str(root / "checkpoints")).create_access("job")
    bulk, desc = BulkState(backend), _desc()
    t0 = time.perf_counter()
    for start in range(0, keys, BATCH):
        count = min(BATCH, keys - start)
        bulk.put(desc, range(start, start + count), _values(start, count, value_bytes, 0))
    return access, bulk, desc, time.perf_counter() - t0


def build(kind: str, keys: int, value_bytes: int, root: Path) -> dict[str, Any]:
    backend = _backend(kind, root / "work")
    access, bulk, desc, seconds = load(backend, root, keys, value_bytes)
    out: dict[str, Any] = {"build_s": round(seconds, 2)}
    out["full"] = _checkpoint(backend, access, 1)
    changed = list(range(0, keys, 100))  # 1 % of the keys
    for start in range(0, len(changed), BATCH):
        part = changed[start:start + BATCH]
        bulk.put(desc, part, [v[::-1] for v in _values(0, len(part), value_bytes, 1)])
    out["incremental"] = _checkpoint(backend, access, 2)
    out["incremental"]["share_of_full"] = round(out["incremental"]["bytes"] / out["full"]["bytes"], 4)
    backend.dispose()
    return out


def restore(kind: str, keys: int, value_bytes: int, root: Path) -> dict[str, Any]:
    from statekit import FileSystemCheckpointStorage
    from statekit.backends.transfer import restore_into

    t0 = time.perf_counter()
    access = FileSystemCheckpointStorage(str(root / "checkpoints")).create_access("job")
    handle = access.load(2)["tasks"]["task"]
    backend = _backend(kind, root / "work")
    restore_into(backend, [(handle, access.reader())])
    state = backend.get_partitioned_state(_desc())
    backend.set_current_key(keys - 1)
    first = state.value()
    seconds = time.perf_counter() - t0
    assert first is not None and len(first) == value_bytes
    backend.set_current_key(0)  # a changed key holds its new value
    assert state.value() == _values(0, 1, value_bytes, 1)[0][::-1]
    backend.finish_restore()  # every value installed (heap) / every file checked (RocksDB)
    everything = time.perf_counter() - t0
    backend.dispose()
    return {"restart_to_first_element_s": round(seconds, 3), "restore_all_s": round(everything, 3)}


#: keys per packed array in :func:`floor` (a 1 MiB part of 100-byte values holds about as many)
FLOOR_PART_KEYS = 9_800


def floor(kind: str, keys: int, value_bytes: int, root: Path) -> dict[str, Any]:
    import msgpack

    table: dict[int, bytes] = {}
    for start in range(0, keys, BATCH):
        count = min(BATCH, keys - start)
        table.update(zip(range(start, start + count), _values(start, count, value_bytes, 0),
                         strict=True))
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    table.clear()
    parts = [msgpack.packb(list(range(start, min(start + FLOOR_PART_KEYS, keys))))
             for start in range(0, keys, FLOOR_PART_KEYS)]
    t0 = time.perf_counter()
    index: dict[int, int] = {}
    for slot, packed in enumerate(parts):
        index.update(zip(msgpack.unpackb(packed), repeat(slot)))
    seconds = time.perf_counter() - t0
    assert len(index) == keys
    return {"dict_peak_rss_mb": round(rss_mb, 1), "key_index_s": round(seconds, 3)}


def main() -> None:
    phase, kind, keys, value_bytes, root = sys.argv[1:6]
    out = {"build": build, "restore": restore, "floor": floor}[phase](
        kind, int(keys), int(value_bytes), Path(root))
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
