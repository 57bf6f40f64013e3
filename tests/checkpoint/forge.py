"""Real checkpoints to tamper with, and the restore a job does, for the hostile-input tests and
the fuzz worker: write a job's checkpoints with either backend, rewrite ``_metadata`` with a
valid checksum, restore every partition the way the local runner does and read the state back.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from statekit.backends.base import KeyedStateBackend, StateBackend
from statekit.backends.heap import HashMapStateBackend
from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
from statekit.backends.structure import reusing_native_dbs
from statekit.backends.transfer import restore_into
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.metadata import encode_metadata
from statekit.checkpoint.savepoint import open_external
from statekit.checkpoint.schema import recorded_key_groups
from statekit.inspection import convert_savepoint, open_checkpoint
from statekit.inspection.arrow import to_json
from statekit.serde.keygroups import key_group_range_for_operator
from statekit.serde.msgpack import unpackb
from statekit.serde.types import GenericSerializer, Types
from statekit.state.descriptors import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statekit.testing.cluster import KeyedCluster
from tests.tmpfs import rocksdb_dir

MAXP = 128
DESCRIPTORS = (ValueStateDescriptor("count", Types.LONG()),
               ListStateDescriptor("events", Types.STRING()),
               MapStateDescriptor("totals", Types.STRING(), Types.LONG()),
               ValueStateDescriptor("anything", None))
KEYS = [f"user-{i}" for i in range(40)] + list(range(20)) + [(i, "pair") for i in range(10)]

#: the backends a checkpoint is written with: (kind, incremental)
KINDS = {"hashmap": ("hashmap", False), "hashmap-incremental": ("hashmap", True),
         "rocksdb": ("rocksdb", False), "rocksdb-incremental": ("rocksdb", True)}


def backend_factory(kind: str, incremental: bool = False) -> StateBackend:
    if kind == "hashmap":
        return HashMapStateBackend(incremental=incremental)
    backend = EmbeddedRocksDBStateBackend(incremental)
    if rocksdb_dir():  # tmpfs: RocksDB fsyncs on every open
        backend.set_db_storage_paths(rocksdb_dir())
    return backend


def _write(cluster: KeyedCluster, round_: int) -> None:
    count, events, totals, anything = DESCRIPTORS
    for n, key in enumerate(KEYS):
        cluster.state(key, count).update(n * 10 + round_)
        cluster.state(key, events).add(f"e{round_}-{n}")
        cluster.state(key, totals).put(f"t{round_}", n)
        cluster.state(key, anything).update((n, f"v{round_}", [round_, {"n": n}]))


def expected_state(rounds: int) -> dict[Any, Any]:
    """What every key holds after ``rounds`` rounds of writes."""
    out = {}
    for n, key in enumerate(KEYS):
        last = rounds - 1
        out[key] = (n * 10 + last, [f"e{r}-{n}" for r in range(rounds)],
                    {f"t{r}": n for r in range(rounds)}, (n, f"v{last}", [last, {"n": n}]))
    return out


def write_job(kind: str, root: str, parallelism: int = 2, checkpoints: int = 2) -> str:
    """A job's checkpoints ``chk-1`` .. ``chk-<checkpoints>`` under ``root`` (one round of
    writes each, small files so that state lives in files); the job directory."""
    backend, incremental = KINDS[kind]
    storage = FileSystemCheckpointStorage(root, file_state_size_threshold=64)
    cluster = KeyedCluster(backend_factory(backend, incremental), storage, parallelism, MAXP)
    try:
        for round_ in range(checkpoints):
            _write(cluster, round_)
            cid = cluster.checkpoint()
            # the local runner's fields around the tasks, as a job's checkpoint holds them
            fields = {"job_id": "forged", "job_name": "forged", "source": {"offset": 100 * cid},
                      "parallelism": parallelism, "backend": backend,
                      "timestamp": 1_700_000_000_000 + cid}
            rewrite_metadata(f"{cluster.access.location}/chk-{cid}/_metadata",
                             lambda body, fields=fields: body.update(fields))
    finally:
        cluster.close()
    return cluster.access.location


def restore(kind: str, path: str | list[str], parallelism: int = 2) -> list[KeyedStateBackend]:
    """Partitions of backend ``kind`` restored from the checkpoint at ``path``, as the local
    runner restores a job started from it (``execution.savepoint.path``); several paths (the
    savepoints of one checkpoint's operators) restore together."""
    opened = [open_external(p) for p in ([path] if isinstance(path, str) else path)]
    factory = backend_factory(kind)
    partitions: list[KeyedStateBackend] = []
    try:
        for index in range(parallelism):
            rng = key_group_range_for_operator(MAXP, parallelism, index)
            backend = factory.create_keyed_state_backend(
                key_serializer=GenericSerializer(), key_group_range=rng, max_parallelism=MAXP)
            partitions.append(backend)
            restore_into(backend, [(h, reader) for metadata, reader in opened
                                   for h in metadata.get("tasks", {}).values()
                                   if len(recorded_key_groups(h).intersection(rng))])
    except BaseException:
        for backend in partitions:
            backend.dispose()
        raise
    return partitions


def read_state(partitions: list[KeyedStateBackend]) -> dict[Any, Any]:
    """Every key's state (of :data:`KEYS`), read from the partition that owns it."""
    out = {}
    for key in KEYS:
        backend = next(b for b in partitions if b.key_group_of(key) in b.key_group_range)
        backend.set_current_key(key)
        count, events, totals, anything = (backend.get_partitioned_state(d) for d in DESCRIPTORS)
        out[key] = (count.value(), list(events.get()), dict(totals.items()), anything.value())
    return out


def restore_and_read(kind: str, path: str | list[str], parallelism: int = 2) -> dict[Any, Any]:
    partitions = restore(kind, path, parallelism)
    try:
        return read_state(partitions)
    finally:
        for backend in partitions:
            backend.dispose()


# --- the tools: inspection and conversion --------------------------------------------------------


def expected_rows(rounds: int) -> dict[str, Any]:
    """What :func:`inspect_state` reads after ``rounds`` rounds of writes (untyped keys and
    values as the JSON text the inspection path gives them)."""
    return {to_json(key): (to_json(count), [to_json(e) for e in events],
                           {k: to_json(v) for k, v in totals.items()}, to_json(anything))
            for key, (count, events, totals, anything) in expected_state(rounds).items()}


def inspect_state(path: str) -> dict[str, Any]:
    """Every key's state as the inspection path reads it (``open_checkpoint``, then each state's
    record batches of every operator, keys and values as JSON text), in the shape of
    :func:`expected_rows`."""
    view = open_checkpoint(path)
    found: dict[str, list[Any]] = {}
    with reusing_native_dbs():
        for state in view.states(include_internal=True):
            slot = [d.name for d in DESCRIPTORS].index(state.name)
            for batch in state.read_batches(key_type="json", value_type="json"):
                for row in batch.to_pylist():
                    entry = found.setdefault(row["key"], [None, [], {}, None])
                    if "index" in row:
                        entry[slot].append((row["index"], row["value"]))
                    elif "user_key" in row:
                        entry[slot][row["user_key"]] = row["value"]
                    else:
                        entry[slot] = row["value"]
    return {key: (c, [v for _, v in sorted(e)], t, a) for key, (c, e, t, a) in found.items()}


def convert_and_read(kind: str, path: str, target: str) -> dict[Any, Any]:
    """Every key's state after ``savepoint convert`` of the checkpoint at ``path`` (one
    savepoint per operator, under ``target``), restored into backend ``kind``."""
    view = open_checkpoint(path)
    return restore_and_read(kind, [convert_savepoint(view, target, operator=op)
                                   for op in view.operators])


# --- tampering ---------------------------------------------------------------------------------------


def raw_body(data: bytes) -> dict[str, Any]:
    """The body of a ``_metadata`` file, decoded without any checks."""
    (length,) = struct.unpack_from(">Q", data, 10)
    return unpackb(data[18:18 + length])


def rewrite_metadata(path: str, change: Callable[[dict[str, Any]], Any]) -> None:
    """Change the body of the ``_metadata`` file at ``path`` in place, with a valid checksum."""
    with open(path, "rb") as fh:
        body = raw_body(fh.read())
    change(body)
    with open(path, "wb") as fh:
        fh.write(encode_metadata(body))
