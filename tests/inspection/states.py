"""Real checkpoints for the inspection tests, written by the real backends through the real
checkpoint storage (local disk or the S3 server), and the state they must hold.

A job of two partitions (key-group ranges 0-63 and 64-127) keeps five states per key:
``count`` (LONG value), ``seen`` (INT list), ``bymod`` (INT -> STRING map), ``last`` (STRING
value with TTL) and ``anything`` (an untyped value).  Checkpoint 1 holds the first round of
updates; checkpoint 2 changes a few keys and removes others, so an incremental heap checkpoint
is a base plus a changelog and an incremental RocksDB one re-references shared SST files.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from statekit import (
    FileSystemCheckpointStorage,
    HashMapStateBackend,
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    Time,
    Types,
    ValueStateDescriptor,
)
from statekit.serde.keygroups import key_group_for_bytes, key_group_range_for_operator
from statekit.serde.types import GenericSerializer, packb

MAXP = 128
KEYS = [f"k{i:03d}" for i in range(60)]
CHANGED = KEYS[:6]
REMOVED = KEYS[50:53]


def descriptors() -> dict[str, Any]:
    last = ValueStateDescriptor("last", Types.STRING())
    last.enable_time_to_live(StateTtlConfig.new_builder(Time.hours(1)).build())
    return {"count": ValueStateDescriptor("count", Types.LONG()),
            "seen": ListStateDescriptor("seen", Types.INT()),
            "bymod": MapStateDescriptor("bymod", Types.INT(), Types.STRING()),
            "last": last, "anything": ValueStateDescriptor("anything")}


def model(rounds: int = 2) -> dict[str, dict[str, Any]]:
    """What the states hold after ``rounds`` rounds: per state, key -> value (list, dict)."""
    out: dict[str, dict[str, Any]] = {n: {} for n in ("count", "seen", "bymod", "last", "anything")}
    for r in range(rounds):
        for i, key in enumerate(KEYS if r == 0 else CHANGED):
            out["count"][key] = out["count"].get(key, 0) + i + 1
            out["seen"].setdefault(key, []).append(i * 10 + r)
            out["bymod"].setdefault(key, {})[(i + r) % 3] = f"v{i}-{r}"
            out["last"][key] = f"x{i}-{r}"
            out["anything"][key] = {"i": i, "r": r}
        if r > 0:
            for key in REMOVED:
                for state in out.values():
                    state.pop(key, None)
    return out


def _apply(backend: Any, states: dict[str, Any], r: int) -> None:
    for i, key in enumerate(KEYS if r == 0 else CHANGED):
        if key_group_for_bytes(packb(key), MAXP) not in backend.key_group_range:
            continue
        backend.set_current_key(key)
        states["count"].update((states["count"].value() or 0) + i + 1)
        states["seen"].add(i * 10 + r)
        states["bymod"].put((i + r) % 3, f"v{i}-{r}")
        states["last"].update(f"x{i}-{r}")
        states["anything"].update({"i": i, "r": r})
    if r > 0:
        for key in REMOVED:
            if key_group_for_bytes(packb(key), MAXP) in backend.key_group_range:
                backend.set_current_key(key)
                for state in states.values():
                    state.clear()


@dataclass
class Written:
    """A job directory with checkpoints 1 and 2 (and what they hold)."""

    root: str
    job: str
    storage_options: dict[str, Any]

    @property
    def path(self) -> str:
        return f"{self.root}/{self.job}"

    def chk(self, n: int) -> str:
        return f"{self.path}/chk-{n}"


def factory(kind: str, incremental: bool, workdir: str) -> Any:
    if kind == "hashmap":
        return HashMapStateBackend(False, incremental=incremental)
    from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend

    rocks = EmbeddedRocksDBStateBackend(incremental)
    rocks.set_db_storage_paths(workdir)
    return rocks


def write_job(root: str, kind: str, incremental: bool, workdir: str,
              storage_options: dict[str, Any] | None = None, rounds: int = 2,
              threshold: int = 0) -> Written:
    """Run two partitions of ``kind`` for ``rounds`` rounds, checkpointing after each."""
    storage = FileSystemCheckpointStorage(root, file_state_size_threshold=threshold,
                                          storage_options=storage_options)
    job = uuid.uuid4().hex
    access = storage.create_access(job)
    made = factory(kind, incremental, workdir)
    backends = [made.create_keyed_state_backend(
        key_serializer=GenericSerializer(), key_group_range=key_group_range_for_operator(MAXP, 2, i),
        max_parallelism=MAXP, operator_id="keyed-process") for i in range(2)]
    try:
        states = [{n: b.get_partitioned_state(d) for n, d in descriptors().items()} for b in backends]
        for r in range(rounds):
            for backend, st in zip(backends, states, strict=True):
                _apply(backend, st, r)
            cid = r + 1
            handles = {f"keyed-process-{i}": b.snapshot(cid, access.streams(cid, f"keyed-process-{i}")).run()
                       for i, b in enumerate(backends)}
            access.commit(cid, {"tasks": handles, "job_id": job, "source": {"offset": cid * 100},
                                "max_parallelism": MAXP, "parallelism": 2, "backend": kind,
                                "timestamp": 1_700_000_000_000 + cid})
            for b in backends:
                b.notify_checkpoint_complete(cid)
    finally:
        for b in backends:
            b.dispose()
    return Written(root, job, dict(storage_options or {}))


def as_model(frame: Any, kind: str) -> dict[str, Any]:
    """A state read back (a DataFrame of rows) in the shape of :func:`model`."""
    out: dict[str, Any] = {}
    for row in frame.to_dict("records"):
        key = row["key"]
        if kind == "list":
            out.setdefault(key, []).append((row["index"], row["value"]))
        elif kind == "map":
            out.setdefault(key, {})[row["user_key"]] = row["value"]
        else:
            out[key] = row["value"]
    if kind == "list":
        out = {k: [v for _, v in sorted(items)] for k, items in out.items()}
    return out
