"""Converting a checkpoint (any backend, full or incremental, or a Spark batch) into a
self-contained, backend-neutral savepoint that any backend restores at any parallelism, with
the same or another max parallelism (key groups recomputed from the serialized keys).

Savepoints are key-grouped (``statekit-kv`` indexed entries: one chunk per key group), while a
heap checkpoint's plain parts come in any key order: each state is spilled into key-group
buckets on local disk first, then written bucket by bucket, so memory holds one bucket (about
``_BUCKET_BYTES``), never the state.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack

from statekit import workdirs
from statekit.backends.kvformat import KV_FORMAT
from statekit.backends.structure import reusing_native_dbs
from statekit.checkpoint.checksum import locate
from statekit.checkpoint.reader import StateReader
from statekit.checkpoint.savepoint import Savepoint
from statekit.checkpoint.schema import OPERATOR_STATE
from statekit.checkpoint.streams import CheckpointStreams
from statekit.errors import ConfigError, StateError
from statekit.inspection.entries import iter_chunks
from statekit.inspection.stateview import StateView
from statekit.inspection.views import CheckpointView, open_checkpoint
from statekit.serde.keygroups import UPPER_BOUND_MAX_PARALLELISM, key_group_for_bytes
from statekit.serde.msgpack import packb

Progress = Callable[[int], None] | None
_BUCKET_BYTES = 32 * 1024 * 1024
_MAX_BUCKETS = 256
INLINE_THRESHOLD = 20 * 1024


def _backend_name(backend: str | None, fallback: str) -> str:
    if backend is None:
        return fallback
    from statekit.registry import backend_registry

    target = backend_registry.resolve(backend)
    return str(getattr(target, "name", backend)) if isinstance(target, type) else backend


def _spill(state: StateView, maxp: int, buckets: int, work: Path, progress: Progress) -> list[Path]:
    """Every entry of ``state`` as ``[kgs, keys, values]`` records (serialized), appended to the
    bucket file of its key group."""
    paths = [work / f"bucket-{i:04d}" for i in range(buckets)]
    files = [open(p, "wb") for p in paths]  # noqa: SIM115 - closed below
    try:
        for _, _, source in state._parts:
            for chunk in iter_chunks(source, state.name, progress=progress):
                out: dict[int, tuple[list[int], list[bytes], list[bytes]]] = {}
                for key, value in zip(chunk.keys, chunk.values, strict=True):
                    kb = packb(key)
                    kg = key_group_for_bytes(kb, maxp)
                    lists = out.setdefault(kg * buckets // maxp, ([], [], []))
                    lists[0].append(kg)
                    lists[1].append(kb)
                    lists[2].append(packb(value))
                for bucket, lists in out.items():
                    files[bucket].write(packb(list(lists)))
    finally:
        for fh in files:
            fh.close()
    return paths


def _chunks(paths: list[Path], order: list[int]) -> Iterator[bytes]:
    """Per key group, in order, ``packb([keys, values])``: the indexed entry's chunks."""
    for path in paths:
        groups: dict[int, tuple[list[bytes], list[bytes]]] = {}
        with open(path, "rb") as fh:
            for kgs, kbs, vbs in msgpack.Unpacker(fh, raw=False, max_buffer_size=1 << 31):
                for kg, kb, vb in zip(kgs, kbs, vbs, strict=True):
                    group = groups.setdefault(kg, ([], []))
                    group[0].append(kb)
                    group[1].append(vb)
        os.unlink(path)
        for kg in sorted(groups):
            order.append(kg)
            yield packb(list(groups.pop(kg)))


def _write_indexed(streams: CheckpointStreams, state: StateView, paths: list[Path], work: Path
                   ) -> dict[str, Any]:
    """Write one state's chunks as an indexed entry: streamed into the file on stores that take
    parts as they come, else through a local file uploaded in one (multipart) transfer."""
    order: list[int] = []
    if streams.store.supports_streamed_writes:
        handle, locations = streams.write_parts(_chunks(paths, order), state_name=state.name)
    else:
        local = work / "entry"
        locations, offset = [], 0
        with open(local, "wb") as fh:
            for chunk in _chunks(paths, order):
                fh.write(chunk)
                locations.append(locate(chunk, offset))
                offset += len(chunk)
        handle = streams.write_file(local, state_name=state.name)
        local.unlink()
    index = dict(zip(order, locations, strict=True))
    return {"layout": state.layout, "kind": state.kind, "data": handle, "index": index}


def convert_savepoint(source: str | CheckpointView, target_dir: str, *,
                      backend: str | None = None, max_parallelism: int | None = None,
                      operator: str | None = None, batch: int | None = None,
                      include_internal: bool = False, keep_operator_state: bool = True,
                      storage_options: dict[str, Any] | None = None,
                      target_options: dict[str, Any] | None = None,
                      progress: Progress = None) -> str:
    """Write a savepoint of ``source`` under ``target_dir``; its path.

    ``backend`` names the backend meant to restore it (recorded; every backend reads the
    format), ``max_parallelism`` the key groups it is cut into (default: the source's).
    statekit's internal states are left out unless ``include_internal``; the operator state
    (per subtask, backend-neutral) is copied unless not ``keep_operator_state``.  A target inside the
    checkpoint's own directory is refused (ConfigError).
    """
    view = source if isinstance(source, CheckpointView) else open_checkpoint(
        source, batch=batch, storage_options=storage_options)
    if not str(target_dir).strip():
        raise ConfigError("to", "an output directory is needed")
    view.check_outside(target_dir)
    operators = view.operators
    if operator is None and len(operators) > 1:
        raise StateError(f"{view.path} holds operators {', '.join(operators)}; name one")
    if operator is not None and operator not in operators:  # would write an empty savepoint
        raise StateError(f"{view.path} holds no operator {operator!r} (operators: "
                         f"{', '.join(operators) or 'none'})")
    op = operator or (operators[0] if operators else "")
    maxp = int(max_parallelism if max_parallelism is not None else (
        view.info.max_parallelism or next((s.max_parallelism for s in view.sources), 128)))
    if not 0 < maxp <= UPPER_BOUND_MAX_PARALLELISM:
        raise ConfigError("max_parallelism", f"must be in 1..{UPPER_BOUND_MAX_PARALLELISM}, got {maxp}")
    name = _backend_name(backend, view.info.backend or "hashmap")
    body = view.metadata
    job_id = str(body.get("job_id") or body.get("query_id") or "converted")
    savepoint = Savepoint(target_dir, job_id, target_options)
    try:
        return _convert(view, savepoint, op, maxp, name, include_internal, keep_operator_state,
                        progress)
    except BaseException:  # nothing partial is left behind (no listing or sweep would find it)
        with contextlib.suppress(Exception):
            savepoint.abort()
        raise


def _convert(view: CheckpointView, savepoint: Savepoint, op: str, maxp: int, name: str,
             include_internal: bool, keep_operator_state: bool, progress: Progress) -> str:
    """Write the savepoint's states and commit it; its path."""
    body = view.metadata
    streams = savepoint.streams("converted", INLINE_THRESHOLD)
    work = workdirs.create(tempfile.gettempdir(), "statekit-convert-")
    try:
        with reusing_native_dbs():  # every state of a partition from one download
            entries = {}
            for state in view.states(include_internal):
                if state.operator != op:
                    continue
                size = state.bytes or sum(p.bytes for p in state.partitions)
                buckets = max(1, min(maxp, _MAX_BUCKETS, size // _BUCKET_BYTES + 1))
                paths = _spill(state, maxp, buckets, work, progress)
                entries[state.name] = _write_indexed(streams, state, paths, work)
    finally:
        workdirs.remove(work)
    handle = {"format": KV_FORMAT, "backend": name, "key_group_range": [0, maxp - 1],
              "max_parallelism": maxp, "states": entries}
    recorded = [source.handle.get("key_type") for source in view.sources]
    if recorded and recorded[0] is not None and all(r == recorded[0] for r in recorded):
        handle["key_type"] = recorded[0]  # the keys are copied unchanged: so is their type
    kept = {k: v for k, v in body.items() if k in ("job_id", "job_name", "source", "parallelism",
                                                   "query_id", "operator_id", "batch", "time")}
    if keep_operator_state and body.get(OPERATOR_STATE) and view.sources:  # backend-neutral
        reader = StateReader(view.sources[0].store)
        kept[OPERATOR_STATE] = [None if h is None else streams.write(
            reader.read(h), state_name="operator-state") for h in body[OPERATOR_STATE]]
    return savepoint.commit({
        **kept, "tasks": {"converted": handle}, "max_parallelism": maxp, "backend": name,
        "checkpoint_id": view.info.id or 0, "timestamp": int(time.time() * 1000),
        "converted_from": {"path": view.path, "backend": view.info.backend,
                           "max_parallelism": view.info.max_parallelism, "operator": op}})
