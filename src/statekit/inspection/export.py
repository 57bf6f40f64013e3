"""Exporting one state to Parquet, CSV or JSON Lines, streamed: record batches go to the file as
they are read (a local path or any fsspec URL, written as one streamed or multipart upload).

CSV has no nested or binary columns: lists, maps and structs are written as JSON text and bytes
as base64 there (and in JSON Lines).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import queue
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa

from statekit.checkpoint.blobstore.base import is_url
from statekit.errors import ConfigError
from statekit.inspection.arrow import TypeChoice, to_json
from statekit.inspection.model import _Record
from statekit.inspection.views import CheckpointView, open_checkpoint

FORMATS = ("parquet", "csv", "jsonl")
Progress = Callable[[int], None] | None


@dataclass(frozen=True)
class ExportResult(_Record):
    """What an export wrote: where, how many rows, how many bytes of state it read."""

    path: str
    format: str
    state: str
    rows: int
    bytes_read: int


@contextlib.contextmanager
def _sink(target: str, options: dict[str, Any] | None) -> Iterator[IO[bytes]]:
    """A binary file for ``target``: a local file, or an fsspec file (object stores upload in
    parts as it fills, completing on close; a failed export leaves no object behind)."""
    if not is_url(target) or target.startswith("file://"):
        path = target[len("file://"):] if target.startswith("file://") else target
        # written beside the target and renamed over it once complete: a failed export leaves
        # an existing file as it was, never a truncated or empty one in its place
        partial = f"{path}.partial-{uuid.uuid4().hex[:8]}"
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
            fh = open(partial, "wb")  # noqa: SIM115 - closed below, renamed only when complete
        except OSError as exc:
            raise ConfigError("to", f"cannot write {path}: {exc.strerror or exc}") from None
        try:
            with fh:
                yield fh
            os.replace(partial, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
        return
    import fsspec

    fh = fsspec.open(target, "wb", **(options or {})).open()
    try:
        yield fh
    except BaseException:
        discard = getattr(fh, "discard", None)
        if callable(discard):
            discard()
        fh.closed = True  # never complete a partial upload
        raise
    fh.close()


def _flat(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Nested columns as JSON text, binary as base64 (what CSV can hold)."""
    arrays, fields = [], []
    for fld, column in zip(batch.schema, batch.columns, strict=True):
        kind = fld.type
        if pa.types.is_nested(kind):
            column = pa.array([to_json(v) for v in column.to_pylist()], type=pa.string())
        elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            column = pa.array([None if v is None else base64.b64encode(v).decode()
                               for v in column.to_pylist()], type=pa.string())
        arrays.append(column)
        fields.append(pa.field(fld.name, column.type))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def _behind(batches: Iterator[pa.RecordBatch], write: Callable[[pa.RecordBatch], None]
            ) -> Iterator[pa.RecordBatch]:
    """Hand each batch to ``write`` on a writer thread while the next one is decoded (Parquet
    encoding and file writes release the GIL; decoding holds it); yields each batch once it
    is queued.  At most two batches wait, so memory stays bounded."""
    feed: queue.Queue[Any] = queue.Queue(maxsize=2)
    failed: list[BaseException] = []

    def drain() -> None:
        while (batch := feed.get()) is not None:
            if not failed:
                try:
                    write(batch)
                except BaseException as exc:  # re-raised on the reading thread
                    failed.append(exc)

    thread = threading.Thread(target=drain, name="statekit-export-writer", daemon=True)
    thread.start()
    try:
        for batch in batches:
            if failed:
                break
            feed.put(batch)
            yield batch
    finally:
        feed.put(None)
        thread.join()
    if failed:
        raise failed[0]


def write_batches(batches: Iterator[pa.RecordBatch], schema: pa.Schema, fh: IO[bytes], fmt: str,
                  compression: str | None = "snappy") -> int:
    """Write record batches to an open binary file in ``fmt``; the number of rows."""
    rows = 0
    if fmt == "parquet":
        import pyarrow.parquet as pq

        with pq.ParquetWriter(fh, schema, compression=compression or "none") as writer:
            for batch in _behind(batches, writer.write_batch):
                rows += batch.num_rows
    elif fmt == "csv":
        import pyarrow.csv as pcsv

        writer = None
        try:
            for batch in batches:
                flat = _flat(batch)
                if writer is None:
                    writer = pcsv.CSVWriter(fh, flat.schema)
                writer.write_batch(flat)
                rows += batch.num_rows
            if writer is None:  # an empty state still gets its header
                empty = _flat(pa.RecordBatch.from_pylist([], schema=schema))
                pcsv.CSVWriter(fh, empty.schema).close()
        finally:
            if writer is not None:
                writer.close()
    elif fmt == "jsonl":
        for batch in batches:
            lines = "".join(json.dumps(row, default=_json_default, ensure_ascii=False) + "\n"
                            for row in batch.to_pylist())
            fh.write(lines.encode())
            rows += batch.num_rows
    else:
        raise ValueError(f"unknown export format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return rows


def _codec(name: str) -> bool:
    """Whether pyarrow knows and has the compression codec ``name``."""
    try:
        return bool(pa.Codec.is_available(name))
    except (ValueError, pa.ArrowException):
        return False


def export_state(source: str | CheckpointView, state: str | None, to: str, *, fmt: str = "parquet",
                 operator: str | None = None, batch: int | None = None,
                 storage_options: dict[str, Any] | None = None,
                 target_options: dict[str, Any] | None = None, key_type: TypeChoice = "auto",
                 value_type: TypeChoice = "auto", compression: str | None = "snappy",
                 progress: Progress = None, timers: bool = False) -> ExportResult:
    """Write state ``state`` of a checkpoint (a path or an opened view) to ``to`` in ``fmt``
    (``parquet``, ``csv`` or ``jsonl``), streaming: memory holds about one record batch.  A
    target inside the checkpoint's own directory is refused (ConfigError).  ``timers`` (and no
    ``state``) exports the operator's timers instead: ``key``, ``timestamp``, ``domain``."""
    if (state is None) != timers:
        raise ValueError("name a state or ask for the timers (timers=True), not both")
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if not str(to).strip():
        raise ConfigError("to", "an output path is needed")
    if (not is_url(to) or to.startswith("file://")) and os.path.isdir(to.removeprefix("file://")):
        raise ConfigError("to", f"{to} is a directory: name the file to write")
    if fmt == "parquet" and compression not in (None, "none") and not _codec(str(compression)):
        raise ConfigError("compression", f"unknown or unavailable codec {compression!r}; "
                          "expected one of snappy, gzip, brotli, zstd, lz4, none")
    view = source if isinstance(source, CheckpointView) else open_checkpoint(
        source, batch=batch, storage_options=storage_options)
    view.check_outside(to)
    target = view.timers(operator) if timers else view.state(str(state), operator)
    schema = target.schema(key_type, value_type)
    read = [0]

    def seen(n: int) -> None:
        read[0] += n
        if progress is not None:
            progress(n)

    with _sink(to, target_options) as fh:
        rows = write_batches(target.read_batches(key_type=key_type, value_type=value_type,
                                                 progress=seen), schema, fh, fmt, compression)
    return ExportResult(path=to, format=fmt, state=target.name, rows=rows, bytes_read=read[0])
