"""The checkpoint tools' costs: listing many Spark partition directories, and what checking
every restored value against its state's kind and types adds to a heap restore.

* ``list_checkpoints`` over N and 2N partition directories without an operator manifest: the
  time per directory and the ratio of the two times (2 for a listing linear in directories; it
  was quadratic: 2,000 directories took 20 s).
* A heap restore of value, list and map states with the stored-value check and, interleaved
  round by round, with the check replaced by a no-op: the check's share of the restore.
"""

from __future__ import annotations

import gc
import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks._common import QUICK, loadavg, scratch_dir
from statekit import (
    FileSystemCheckpointStorage,
    HashMapStateBackend,
    ListStateDescriptor,
    MapStateDescriptor,
    Types,
    ValueStateDescriptor,
)
from statekit.backends import kvformat
from statekit.inspection import list_checkpoints
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import GenericSerializer

DIRECTORIES = 500 if QUICK else 2000
KEYS = 20_000 if QUICK else 300_000
ROUNDS = 3 if QUICK else 5


def _partitions(root: Path, count: int) -> Path:
    """``count`` partition directories of one manifest-less operator, one version each."""
    for n in range(count):
        chk = root / "query" / "op" / f"p{n}" / "chk-1"
        chk.mkdir(parents=True)
        (chk / "p0-count-0123456789ab").write_bytes(b"x")
    return root


def test_listing_partition_directories(benchmark: Any) -> None:
    benchmark.group = "inspection"
    root = scratch_dir("listing")
    try:
        small, large = _partitions(root / "n", DIRECTORIES), _partitions(root / "2n", 2 * DIRECTORIES)
        seconds: dict[str, float] = {}

        def once() -> None:
            for name, where in (("n", small), ("2n", large)):
                t0 = time.perf_counter()
                assert len(list_checkpoints(str(where))) == (DIRECTORIES if name == "n" else 2 * DIRECTORIES)
                seconds[name] = min(seconds.get(name, 1e9), time.perf_counter() - t0)

        benchmark.pedantic(once, rounds=ROUNDS, iterations=1)
        info = {"directories": DIRECTORIES, "list_s": round(seconds["n"], 4),
                "list_2n_s": round(seconds["2n"], 4),
                "ms_per_directory": round(seconds["n"] / DIRECTORIES * 1000, 4),
                "ratio_2n_to_n": round(seconds["2n"] / seconds["n"], 2), "loadavg": loadavg()}
        benchmark.extra_info.update(info)
        print(f"\nlist: {DIRECTORIES} partition directories in {info['list_s']} s, "
              f"{2 * DIRECTORIES} in {info['list_2n_s']} s (x{info['ratio_2n_to_n']})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


DESCRIPTORS = {"value": ValueStateDescriptor("value", Types.LONG()),
               "list": ListStateDescriptor("list", Types.STRING()),
               "map": MapStateDescriptor("map", Types.STRING(), Types.LONG())}


def _backend() -> Any:
    return HashMapStateBackend(False).create_keyed_state_backend(
        key_serializer=GenericSerializer(), key_group_range=KeyGroupRange(0, 127),
        max_parallelism=128)


def test_restore_cost_of_the_stored_value_check(benchmark: Any, monkeypatch: Any) -> None:
    benchmark.group = "inspection"
    root = scratch_dir("kindcheck")
    try:
        access = FileSystemCheckpointStorage(str(root)).create_access("job")
        backend = _backend()
        states = {name: backend.get_partitioned_state(d) for name, d in DESCRIPTORS.items()}
        for i in range(KEYS):
            backend.set_current_key(f"key-{i}")
            states["value"].update(i)
            states["list"].add_all([f"a{i}", f"b{i}"])
            states["map"].put_all({"x": i, "y": -i})
        handle = backend.snapshot(1, access.streams(1, "task")).run()
        backend.dispose()
        checked = kvformat.value_check
        best: dict[tuple[str, bool], float] = {}

        def restore(name: str) -> float:
            fresh = _backend()
            gc.collect()  # no collection of an earlier restore's garbage inside the timing
            t0 = time.perf_counter()
            fresh.restore([{**handle, "states": {name: handle["states"][name]}, "state_count": 1}],
                          access.reader())
            fresh.get_partitioned_state(DESCRIPTORS[name])
            seconds = time.perf_counter() - t0
            fresh.dispose()
            return seconds

        order = [True, False]

        def once() -> None:
            order.reverse()
            for name in DESCRIPTORS:
                for check in order:  # interleaved, in turns: the machine is shared
                    monkeypatch.setattr(kvformat, "value_check",
                                        checked if check else (lambda *_: lambda values: None))
                    seconds = restore(name)
                    best[(name, check)] = min(best.get((name, check), 1e9), seconds)
            monkeypatch.setattr(kvformat, "value_check", checked)

        benchmark.pedantic(once, rounds=ROUNDS, iterations=1)
        info: dict[str, Any] = {"keys": KEYS, "loadavg": loadavg()}
        for name in DESCRIPTORS:
            with_check, without = best[(name, True)], best[(name, False)]
            info[name] = {"restore_s": round(with_check, 4), "unchecked_s": round(without, 4),
                          "check_share": round(with_check / without - 1, 4)}
        benchmark.extra_info.update(info)
        print(f"\nstored-value check, {KEYS} keys: " + ", ".join(
            f"{n} {info[n]['restore_s']} s vs {info[n]['unchecked_s']} s "
            f"({info[n]['check_share']:+.1%})" for n in DESCRIPTORS))
    finally:
        shutil.rmtree(root, ignore_errors=True)
