"""One RocksDB workload under one disk profile and one ``PredefinedOptions`` profile (a subprocess).

Run by ``test_disk_profiles.py`` under ``subprocess_env(profile, [workdir, ckptdir])`` so the iodelay
shim slows every read, write and fsync under those directories.  Phases, all through the statekit
API: load ``--keys`` values of ``--value-bytes`` (bigger than any profile's block cache), a timed
point-lookup + write mix (``--read-fraction`` reads) over uniformly random keys, a full checkpoint to
``FileSystemCheckpointStorage`` in ``ckptdir`` and a restore from it.  Prints one JSON line.

    python -m benchmarks.rocksdb_profile_driver --workdir W --ckptdir C --options FLASH_SSD_OPTIMIZED
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--ckptdir", required=True)
    parser.add_argument("--options", default="DEFAULT")
    parser.add_argument("--keys", type=int, default=300_000)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--mix-seconds", type=float, default=6.0)
    parser.add_argument("--mix-max-ops", type=int, default=200_000)
    parser.add_argument("--read-fraction", type=float, default=0.5)
    args = parser.parse_args(argv)

    from statekit import FileSystemCheckpointStorage, Types, ValueStateDescriptor
    from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend, PredefinedOptions
    from statekit.serde.keygroups import KeyGroupRange

    predefined = PredefinedOptions.parse(args.options)
    workdir, ckptdir = Path(args.workdir), Path(args.ckptdir)

    def backend(sub: str) -> object:
        factory = EmbeddedRocksDBStateBackend(False)
        factory.set_db_storage_paths(str(workdir / sub))
        factory.set_predefined_options(predefined)
        return factory.create_keyed_state_backend(
            key_serializer=Types.LONG().get_serializer(), key_group_range=KeyGroupRange.all(128),
            max_parallelism=128)

    desc = ValueStateDescriptor("v", Types.PRIMITIVE_ARRAY(Types.BYTE()))
    pool = os.urandom(8 << 20)
    size = args.value_bytes

    def value(k: int, version: int) -> bytes:
        off = (k * 7919 + version * 104729) % (len(pool) - size)
        return pool[off:off + size]

    out: dict[str, object] = {"options": predefined.name, "keys": args.keys, "value_bytes": size,
                              "profile": os.environ.get("STATEKIT_DISK_PROFILE", "nvme")}
    b = backend("db")
    state = b.get_partitioned_state(desc)
    sk, upd, get = b.set_current_key, state.update, state.value
    t0 = time.perf_counter()
    for k in range(args.keys):
        sk(k)
        upd(value(k, 0))
    load_s = time.perf_counter() - t0
    out["load_s"] = round(load_s, 3)
    out["load_ops_s"] = round(args.keys / load_s)

    rng = random.Random(11)
    reads: list[float] = []
    writes = 0
    ops = 0
    t0 = time.perf_counter()
    deadline = t0 + args.mix_seconds
    while ops < args.mix_max_ops:
        k = rng.randrange(args.keys)
        if rng.random() < args.read_fraction:
            r0 = time.perf_counter()
            sk(k)
            if get() is None:
                raise SystemExit(f"key {k} missing")
            reads.append(time.perf_counter() - r0)
        else:
            sk(k)
            upd(value(k, 1))
            writes += 1
        ops += 1
        if ops % 64 == 0 and time.perf_counter() >= deadline:
            break
    mix_s = time.perf_counter() - t0
    reads.sort()
    out.update({"mix_s": round(mix_s, 3), "mix_ops": ops, "mix_ops_s": round(ops / mix_s, 1),
                "mix_reads": len(reads), "mix_writes": writes,
                "read_p50_us": round(statistics.median(reads) * 1e6, 1) if reads else None,
                "read_p99_us": round(reads[int(len(reads) * 0.99)] * 1e6, 1) if reads else None})

    access = FileSystemCheckpointStorage(str(ckptdir)).create_access("job")
    streams = access.streams(1, "task")
    t0 = time.perf_counter()
    run = b.snapshot(1, streams)  # type: ignore[attr-defined]
    t1 = time.perf_counter()
    handle = run.run()
    access.commit(1, {"tasks": {"task": handle}})
    ck_s = time.perf_counter() - t0
    out.update({"checkpoint_stall_s": round(t1 - t0, 4), "checkpoint_s": round(ck_s, 4),
                "checkpoint_bytes": streams.bytes_written,
                "checkpoint_mb_s": round(streams.bytes_written / ck_s / 1e6, 1)})
    b.dispose()  # type: ignore[attr-defined]

    r = backend("restore")
    t0 = time.perf_counter()
    r.restore([handle], access.reader())  # type: ignore[attr-defined]
    rs = r.get_partitioned_state(desc)  # type: ignore[attr-defined]
    r.set_current_key(args.keys - 1)  # type: ignore[attr-defined]
    if rs.value() is None:
        raise SystemExit("restore lost data")
    restore_s = time.perf_counter() - t0
    out.update({"restore_s": round(restore_s, 4),
                "restore_mb_s": round(streams.bytes_written / restore_s / 1e6, 1)})
    r.dispose()  # type: ignore[attr-defined]
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
