"""Changelog checkpoints of the RocksDB backend (Flink's ``state.backend.changelog.enabled``).

Between two materializations (native checkpoints) a checkpoint uploads only the write-ahead
log written since the last one, so its size follows what changed, not what compactions
rewrote.  A restore places the materialization's files and the logs after it, and RocksDB
replays the logs when it opens the database.  RocksDB archives a log it no longer needs
(``WAL_ttl_seconds``) instead of deleting it; this module deletes an archived log once a
completed checkpoint holds all of it.
"""

from __future__ import annotations

import math
import os
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from statekit.backends.base import StateMeta
from statekit.backends.rocksdb.ahead import Ahead, joined
from statekit.checkpoint import schema
from statekit.checkpoint.reader import StateReader
from statekit.checkpoint.streams import CheckpointStreams
from statekit.errors import (
    CheckpointError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    StateError,
)

__all__ = ["WAL_TTL_SECONDS", "WalChangelog", "append_logs", "check_changelog", "check_pieces",
           "join_pieces", "log_files"]

#: obsolete logs go to ``archive/`` and stay there this long (RocksDB's own purge never comes
#: first: the changelog deletes what completed checkpoints hold)
WAL_TTL_SECONDS = 10**9

#: what a changelog handle's segment is: ``(log number, offset, end, hard link)``
Segment = tuple[int, int, int, Path]


def _number(name: str) -> int | None:
    stem, dot, ext = name.partition(".")
    return int(stem) if ext == "log" and dot and stem.isdigit() else None


def log_files(db_path: Path) -> dict[int, Path]:
    """The database's write-ahead logs, live and archived, by log number."""
    found: dict[int, Path] = {}
    for folder in (db_path / "archive", db_path):  # live last: a log moving meanwhile is live
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            continue
        for name in names:
            number = _number(name)
            if number is not None:
                found[number] = folder / name
    return found


def _ends(log: dict[str, Any]) -> dict[int, int]:
    """Where each log ends in a changelog handle: the materialization's copies, then segments."""
    ends = {int(n): size for n, size in log["starts"].items()}
    for seg in log["segments"]:
        ends[seg["log"]] = seg["offset"] + seg["size"]
    return ends


def _link(number: int, path: Path, db_path: Path, target: Path) -> Path:
    """Hard-link log ``number`` into ``target`` (RocksDB may archive it while we look)."""
    link = target / f"{number:06d}.log"
    for source in (path, db_path / "archive" / path.name, db_path / path.name):
        try:
            os.link(source, link)
            return link
        except FileNotFoundError:
            continue
    raise CheckpointError(f"write-ahead log {path.name} vanished before the checkpoint held it")


class WalChangelog:
    """One backend's changelog: the completed checkpoint the next one extends, and when the
    last materialization was taken (``interval_ms`` after it, or once the logs exceed
    ``max_log_ratio`` of the materialization's bytes, the next checkpoint materializes)."""

    def __init__(self, interval_ms: int, max_log_ratio: float = 0.5) -> None:
        self.interval = interval_ms / 1000.0 if interval_ms > 0 else math.inf  # -1: never by time
        self.max_log_ratio = max_log_ratio
        self._lock = threading.Lock()
        self._chain: tuple[dict[str, Any], float] | None = None
        self._chain_from = -1  # the checkpoint that established the chain's materialization
        self._pending: dict[int, tuple[dict[str, Any], float]] = {}
        #: the next materialization, uploaded a share per checkpoint (:mod:`~.ahead`)
        self.ahead: Ahead | None = None

    @staticmethod
    def check_state(meta: StateMeta) -> None:
        """Refuse a state whose TTL asks for full-snapshot cleanup: it would rewrite the
        materialization's files and logs (Flink does not apply it to incremental RocksDB
        checkpoints either)."""
        if meta.ttl is not None and meta.ttl.cleanup_full_snapshot:
            raise StateError(f"state '{meta.name}': cleanup_full_snapshot does not apply to "
                             "changelog checkpoints; use cleanup_in_rocksdb_compact_filter")

    def plan(self, checkpoint_id: int, families: set[str]
             ) -> tuple[tuple[dict[str, Any], float] | None, bool]:
        """What checkpoint ``checkpoint_id`` does: ``(chain, start)``.  ``chain``: the handle it
        extends with logs (and when its materialization was taken), switched to the
        materialization uploaded meanwhile once it is; None when it must materialize itself
        (none yet, or a column family in ``families`` its materialization lacks: a log entry
        of a column family the restored database would not know).  ``start``: whether it also
        takes the next materialization, to be uploaded by the checkpoints after it (the
        interval passed, or the logs outgrew their share: a restore replays them)."""
        with self._lock:
            chain, ahead = self._chain, self.ahead
        if chain is not None and ahead is not None and ahead.done:
            chain = (ahead.chain(chain[0]), ahead.taken)
            ahead.discard()
            with self._lock:
                self._chain, self._chain_from, self.ahead = chain, checkpoint_id, None
            ahead = None
        if chain is None or not families <= set(chain[0]["changelog"]["families"]):
            if ahead is not None:
                ahead.discard()
                self.ahead = None
            return None, False
        handle = chain[0]
        base = sum(int(h.get("size", 0)) for group in ("sst", "misc", "pieces")
                   for h in handle.get(group, {}).values())
        due = (time.monotonic() - chain[1] >= self.interval
               or handle["changelog"]["log_bytes"] > self.max_log_ratio * base)
        return chain, due and ahead is None

    @staticmethod
    def position(target: Path, db_path: Path, families: list[str]) -> dict[str, Any]:
        """Synchronous part of a materialization (after the native checkpoint): the live log
        later checkpoints start from, the size of each log the checkpoint copied, and the open
        column families (later checkpoints may log writes to these only)."""
        copies = log_files(target)
        live = [n for n, p in log_files(db_path).items() if p.parent == db_path]
        base = min(live) if live else max(copies, default=0)
        return {"base_log": base, "families": sorted(families),
                "starts": {str(n): p.stat().st_size for n, p in copies.items() if n >= base},
                "segments": [], "log_bytes": 0}

    def materialized(self, checkpoint_id: int, handle: dict[str, Any], position: dict[str, Any],
                     taken: float) -> None:
        """A materialization was written: later checkpoints extend it once it completes."""
        handle["changelog"] = position
        with self._lock:
            self._pending[checkpoint_id] = (handle, taken)

    def capture(self, db: Any, db_path: Path, chain: dict[str, Any], target: Path
                ) -> list[Segment]:
        """The synchronous part of a changelog checkpoint: every log written since ``chain``,
        hard-linked into ``target`` with the byte range to upload."""
        db.flush_wal(False)
        log = chain["changelog"]
        ends = _ends(log)
        target.mkdir(parents=True)
        segments: list[Segment] = []
        for number, path in sorted(log_files(db_path).items()):
            if number < log["base_log"]:
                continue
            begin = ends.get(number, 0)
            link = _link(number, path, db_path, target)
            end = link.stat().st_size
            if end < begin:
                raise CheckpointError(f"write-ahead log {number} shrank below what a checkpoint "
                                      "holds; the next checkpoint materializes")
            if end > begin:
                segments.append((number, begin, end, link))
        return segments

    def write(self, checkpoint_id: int, chain: dict[str, Any], segments: list[Segment],
              streams: CheckpointStreams, info: dict[str, Any], taken: float,
              upcoming: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """Upload the captured log ranges; the handle is ``chain``'s materialization with them,
        and ``upcoming``: the next materialization's files uploaded so far (referenced, so that
        retention, aborts and local copies treat them as this checkpoint's)."""
        written = []
        for number, begin, end, link in segments:
            with open(link, "rb") as f:
                f.seek(begin)
                data = f.read(end - begin)
            if len(data) != end - begin:
                raise CheckpointError(f"write-ahead log {number} is shorter than captured")
            name = f"wal-{number:06d}"
            written.append({"log": number, "offset": begin, "size": len(data),
                            "data": streams.write(data, state_name=name, shared_name=name)})
        log = chain["changelog"]
        handle = {key: value for key, value in chain.items() if key != "heap_timers"}
        handle.update(states=info, state_count=len(info), reused_sst=len(chain["sst"]))
        handle["changelog"] = {**{k: v for k, v in log.items() if k != "next"},
                               "segments": [*log["segments"], *written],
                               "log_bytes": log["log_bytes"] + sum(s["size"] for s in written)}
        if upcoming:
            handle["changelog"]["next"] = upcoming
        with self._lock:
            self._pending[checkpoint_id] = (handle, taken)
        return handle

    def complete(self, checkpoint_id: int, db_path: Path) -> None:
        """A checkpoint completed: the next one extends it; archived logs it holds go."""
        with self._lock:
            done = self._pending.pop(checkpoint_id, None)
            for cid in [c for c in self._pending if c < checkpoint_id]:
                del self._pending[cid]
            ahead = self.ahead
        if ahead is not None:
            ahead.complete(checkpoint_id)
        with self._lock:
            if done is None or checkpoint_id < self._chain_from:
                return  # (a checkpoint of the chain before a switch: not extended again)
            self._chain = done
        log = done[0]["changelog"]
        ends = _ends(log)
        for number, path in log_files(db_path).items():
            if path.parent.name != "archive":
                continue
            if number < log["base_log"] or ends.get(number, -1) == path.stat().st_size:
                path.unlink(missing_ok=True)

    def aborted(self, checkpoint_id: int) -> None:
        with self._lock:
            self._pending.pop(checkpoint_id, None)
            ahead = self.ahead
        if ahead is not None:
            ahead.aborted(checkpoint_id)


def check_changelog(task: dict[str, Any], path: str) -> None:
    """The schema pass over a changelog handle's log positions and segments."""
    if "changelog" not in task:
        return
    where = f"{path}.changelog"
    log = schema.mapping(task["changelog"], where)
    schema.integer(log.get("base_log"), f"{where}.base_log", 0)
    schema.integer(log.get("log_bytes"), f"{where}.log_bytes", 0)
    for n, family in enumerate(schema.sequence(log.get("families"), f"{where}.families")):
        schema.text(family, f"{where}.families[{n}]")
    for number, size in schema.mapping(log.get("starts"), f"{where}.starts").items():
        if not isinstance(number, str) or not number.isdigit():
            raise schema.fail(f"{where}.starts", f"not a log number: {number!r}")
        schema.integer(size, f"{where}.starts.{number}", 0)
    for n, seg in enumerate(schema.sequence(log.get("segments"), f"{where}.segments")):
        at = f"{where}.segments[{n}]"
        seg = schema.mapping(seg, at)
        for key in ("log", "offset", "size"):
            schema.integer(seg.get(key), f"{at}.{key}", 0)
        if schema.handle(seg.get("data"), f"{at}.data") != seg["size"]:
            raise schema.fail(f"{at}.size", "differs from the size of its data")
    schema.files(log.get("next", {}), f"{where}.next")


def check_pieces(task: dict[str, Any], path: str) -> None:
    """The schema pass over a materialization's SSTs uploaded in pieces: plain ``.sst`` names,
    each with its size and CRC-32, which its pieces' recorded ones must make up in order."""
    where = f"{path}.pieces"
    for name, entry in schema.mapping(task.get("pieces", {}), where).items():
        if not schema.file_name(name, where).endswith(".sst") or name in task.get("sst", {}):
            raise schema.fail(where, f"not an SST file of its own: {name!r}")
        at = f"{where}.{name}"
        entry = schema.mapping(entry, at)
        size = schema.integer(entry.get("size"), f"{at}.size", 0)
        crc = schema.integer(entry.get("crc"), f"{at}.crc", 0, 0xFFFFFFFF)
        parts = schema.sequence(entry.get("parts"), f"{at}.parts")
        if not parts:
            raise schema.fail(f"{at}.parts", "no pieces")
        for n, piece in enumerate(parts):
            schema.handle(piece, f"{at}.parts[{n}]")
        whole = joined(parts)
        if whole["size"] != size or whole["crc"] != crc:
            raise schema.fail(at, "its pieces do not make up the file (missing, repeated or "
                                  "out of order)")


def join_pieces(name: str, entry: dict[str, Any], reader: StateReader, dest: Path) -> None:
    """Restore side: write the SST file ``name`` (a plain name, checked by the caller) into
    ``dest`` from its pieces, each read and checked (size, CRC-32), and the file checked whole."""
    parts = entry.get("parts") if isinstance(entry, dict) else None
    if not isinstance(parts, list) or not parts or not all(isinstance(p, dict) for p in parts):
        raise CorruptCheckpointError(f"malformed pieces of {name} in a RocksDB checkpoint")
    size = crc = 0
    with open(dest / name, "wb") as out:
        for piece in parts:
            data = reader.read(piece)
            out.write(data)
            size, crc = size + len(data), zlib.crc32(data, crc)
    if (size, crc) != (entry.get("size"), entry.get("crc")):
        raise ChecksumMismatchError(f"{name}: its pieces do not make up the file the checkpoint "
                                    "records (missing, repeated or out of order)")


def append_logs(handle: dict[str, Any], reader: StateReader, dest: Path) -> None:
    """Restore side: append a changelog handle's log segments to the logs in ``dest`` (each
    must continue its log exactly where the files before it end)."""
    log = handle.get("changelog")
    if not log:
        return
    segments = log.get("segments") if isinstance(log, dict) else None
    if not isinstance(segments, list):
        raise CorruptCheckpointError("malformed changelog in a RocksDB checkpoint")
    for seg in segments:
        number, offset, size = (seg.get(k) if isinstance(seg, dict) else None
                                for k in ("log", "offset", "size"))
        if not all(type(v) is int and v >= 0 for v in (number, offset, size)):
            raise CorruptCheckpointError(f"malformed changelog segment {seg!r}")
        path = dest / f"{number:06d}.log"
        have = path.stat().st_size if path.exists() else 0
        if have != offset:
            raise CorruptCheckpointError(
                f"changelog segment of log {number} starts at {offset}, the log holds {have} "
                "bytes: a segment is missing")
        data = reader.read(seg["data"])
        if len(data) != size:
            raise CorruptCheckpointError(f"changelog segment of log {number}: {len(data)} "
                                         f"bytes, the checkpoint records {size}")
        with open(path, "ab") as f:
            f.write(data)
