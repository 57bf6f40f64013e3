"""One local-runner job that fails after a checkpoint of all its state and restarts within the
job (run in a subprocess, so that a disk profile can slow its checkpoint directory down).

The job fills ``--keys`` keys with 1100-byte values, then handles marker elements that wait (5 ms
each) until a checkpoint taken after the fill has completed; the next marker fails the job.
After the restart the first marker processed records its time.  Prints one JSON line:
``failure_to_first_element_s`` (the failure raised → the first element processed after the
restore), the restore sources, the checkpoint's size.

``python -m benchmarks.local_recovery_driver --root DIR --keys N --backend hashmap --local 1``
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

VALUE_BYTES = 1100
_POOL = os.urandom(8 * 1024 * 1024)
#: the times recorded in this process (the function is deep-copied per task: not on ``self``)
MARKS: dict[str, float] = {}


def _id(path: Path) -> int:
    return int(path.name[len("chk-"):])


def _function(checkpoints: Path) -> Any:
    from statekit import KeyedProcessFunction, Types, ValueStateDescriptor
    from statekit.testing.files import walked

    class FillFailRestart(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.value = ctx.get_state(ValueStateDescriptor("v", Types.PRIMITIVE_ARRAY(Types.BYTE())))
            self.attempt = ctx.get_attempt_number()

        def process_element(self, element: Any, ctx: Any) -> Any:
            key, fill = element
            if fill:
                off = (key * 7919) % (len(_POOL) - VALUE_BYTES)
                self.value.update(_POOL[off:off + VALUE_BYTES])
                return ()
            if self.attempt > 0:  # after the restart
                MARKS.setdefault("first_element", time.perf_counter())
                MARKS.setdefault("restored", float(self.value.value() is not None))
                return ()
            if "filled" not in MARKS:  # the newest checkpoint begun so far
                MARKS["filled"] = walked(lambda: max(
                    (_id(p) for p in checkpoints.rglob("chk-*")), default=0))
            # checkpoint ``filled + 1`` may have begun before the fill ended; the one after it not
            done = walked(lambda: [m.parent for m in checkpoints.rglob("chk-*/_metadata")
                                  if _id(m.parent) >= MARKS["filled"] + 2])
            if done:
                newest = max(done, key=_id)
                MARKS["bytes"] = walked(lambda: sum(
                    f.stat().st_size for d in (newest, newest.parent / "shared")
                    for f in d.rglob("*") if f.is_file()))
                MARKS["failure"] = time.perf_counter()
                raise RuntimeError("injected failure")
            time.sleep(0.005)
            return ()

    return FillFailRestart()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--backend", default="hashmap")
    parser.add_argument("--local", type=int, default=1)
    parser.add_argument("--interval", default="1 s")
    parser.add_argument("--lazy", type=int, default=1, help="heap: state.backend.heap.lazy-restore")
    args = parser.parse_args()
    from statekit import RestartStrategies, StreamExecutionEnvironment

    root = Path(args.root)
    checkpoints = root / "remote"
    env = StreamExecutionEnvironment.get_execution_environment({
        "state.backend.type": args.backend, "state.checkpoint-storage": "filesystem",
        "state.checkpoints.dir": str(checkpoints),
        "execution.checkpointing.interval": args.interval, "parallelism.default": 1,
        "state.backend.local-recovery": bool(args.local),
        "taskmanager.state.local.root-dirs": str(root / "local"),
        **({"state.backend.heap.lazy-restore": bool(args.lazy)} if args.backend == "hashmap"
           else {"state.backend.rocksdb.localdir": str(root / "work")}),
    })
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(1, 0))
    elements = [(k, True) for k in range(args.keys)] + [(k, False) for k in range(100_000)]
    start = time.perf_counter()
    result = env.from_collection(elements).key_by(lambda e: e[0]) \
        .process(_function(checkpoints)).execute_and_collect("local recovery bench")
    done = [st for st in result.checkpoint_stats if st.status == "completed"]
    biggest = max((st.bytes_written for st in done), default=0)
    full = sorted(st.async_seconds for st in done if st.bytes_written >= 0.9 * biggest)
    print(json.dumps({
        "backend": args.backend, "local": bool(args.local), "keys": args.keys,
        "lazy": bool(args.lazy) and args.backend == "hashmap",
        "restarts": result.restarts, "restore_sources": result.restore_sources,
        "restored": bool(MARKS.get("restored")),
        "failure_to_first_element_s": MARKS["first_element"] - MARKS["failure"],
        "job_s": time.perf_counter() - start, "checkpoint_bytes": int(MARKS["bytes"]),
        "checkpoint_async_s": full[len(full) // 2] if full else None,
    }))


if __name__ == "__main__":
    main()
