"""Incremental RocksDB checkpoints over many rounds, per compaction style, in its own process.

Builds ``keys`` values of 1 KiB in one ValueState (incremental checkpoints, a 1 GiB memory
budget), takes a full checkpoint right away, lets the compactions the build started finish and
takes another (what those compactions rewrote), then runs ``rounds`` rounds: 1 % of the keys
changed, the compactions that started finished (a checkpoint interval longer than they take),
an incremental checkpoint.  Then restores the last checkpoint into a new instance and reads
20,000 random keys.  Prints one JSON line.  ``CHANGELOG`` is LEVEL with changelog checkpoints
(``state.changelog.enabled``; materialization interval ``STATEKIT_BENCH_MATERIALIZE``, Flink's
10 min by default): a round uploads the write-ahead log written since the last one.

Run: ``python -m benchmarks.compaction_driver <LEVEL|UNIVERSAL|CHANGELOG> <keys> <rounds> <dir>``.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.growth_driver import BATCH, _checkpoint, _desc, _values, load

VALUE_BYTES = 1024
READS = 20_000


def _backend(style: str, work: Path) -> Any:
    from benchmarks._common import MAXP, long_serializer
    from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
    from statekit.serde.keygroups import KeyGroupRange

    changelog = style == "CHANGELOG"
    factory = EmbeddedRocksDBStateBackend(True).configure({
        "state.backend.rocksdb.compaction.style": "LEVEL" if changelog else style,
        "state.changelog.enabled": changelog,
        "state.changelog.periodic-materialize.interval":
            os.environ.get("STATEKIT_BENCH_MATERIALIZE", "10 min")})
    factory.set_db_storage_paths(str(work))
    factory.set_memory_configuration(fixed_per_slot="1 gb")
    return factory.create_keyed_state_backend(
        key_serializer=long_serializer(), key_group_range=KeyGroupRange.all(MAXP),
        max_parallelism=MAXP)


def settle(db: Any) -> float:
    """Wait until no flush or compaction runs or is pending; the seconds waited."""
    started = time.perf_counter()
    while any(db.property_int_value(p) for p in (
            "rocksdb.num-running-compactions", "rocksdb.compaction-pending",
            "rocksdb.num-running-flushes", "rocksdb.mem-table-flush-pending")):
        time.sleep(0.02)
    return time.perf_counter() - started


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _restore_seconds(style: str, root: Path, handle: dict[str, Any], access: Any) -> float:
    """Seconds to restore ``handle`` into a new instance and read one key."""
    target = _backend(style, root / "restore")
    t0 = time.perf_counter()
    target.restore([handle], access.reader())
    target.set_current_key(0)
    target.get_partitioned_state(_desc()).value()
    seconds = time.perf_counter() - t0
    target.dispose()
    return round(seconds, 2)


def run(style: str, keys: int, rounds: int, root: Path) -> dict[str, Any]:
    backend = _backend(style, root / "work")
    access, bulk, desc, seconds = load(backend, root, keys, VALUE_BYTES)
    out: dict[str, Any] = {"style": style, "keys": keys, "build_s": round(seconds, 2)}
    full = _checkpoint(backend, access, 1)
    out["full"] = full
    out["build_settle_s"] = round(settle(backend.db), 2)
    after_build = _checkpoint(backend, access, 2)
    out["after_build_share"] = round(after_build["bytes"] / full["bytes"], 4)
    shares, settles, seconds, writes, handles = [], [], [], [], []
    for r in range(rounds):
        changed = list(range(r + 1, keys, 100))  # 1 % of the keys, other ones each round
        t0 = time.perf_counter()
        for start in range(0, len(changed), BATCH):
            part = changed[start:start + BATCH]
            bulk.put(desc, part, [v[::-1] for v in _values(start, len(part), VALUE_BYTES, r + 1)])
        writes.append(time.perf_counter() - t0)
        settles.append(round(settle(backend.db), 2))
        inc = _checkpoint(backend, access, r + 3, handles)
        access.discard(r + 2, [r + 3])  # only the newest is kept (its shared files stay)
        shares.append(round(inc["bytes"] / full["bytes"], 4))
        seconds.append(inc["seconds"])
    out.update(round_shares=shares, round_settle_s=settles, round_checkpoint_s=seconds,
               mean_share=round(sum(shares) / len(shares), 4), max_share=max(shares),
               write_s=round(sum(writes), 2),
               materializations=sum(not h.get("changelog", {}).get("segments", [1])
                                    for h in handles))
    out["restore_s"] = _restore_seconds(style, root, handles[-1], access)
    out["db_bytes_vs_full"] = round(_tree_bytes(Path(backend.db_path)) / full["bytes"], 3)
    state = backend.get_partitioned_state(desc)
    rng = random.Random(7)
    probe = [rng.randrange(keys) for _ in range(READS)]
    t0 = time.perf_counter()
    for key in probe:
        backend.set_current_key(key)
        state.value()
    out["reads_per_s"] = round(READS / (time.perf_counter() - t0))
    backend.dispose()
    return out


def main() -> None:
    style, keys, rounds, root = sys.argv[1:5]
    print(json.dumps(run(style.upper(), int(keys), int(rounds), Path(root))))


if __name__ == "__main__":
    main()
