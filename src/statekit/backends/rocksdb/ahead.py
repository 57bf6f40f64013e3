"""A changelog's materialization uploaded in the background, a share per checkpoint.

Flink materializes a changelog backend between checkpoints, so no checkpoint carries the upload.
Here the native checkpoint is taken at a checkpoint (hard links, as every RocksDB snapshot) and
its files are uploaded by the runs of the checkpoints that follow, ``AHEAD_SHARE`` of it each,
while those checkpoints still extend the previous materialization with logs.  A file counts as
uploaded once the checkpoint whose run wrote it completed; an aborted checkpoint's files are
uploaded again.  When every file is uploaded, the next checkpoint extends the new
materialization with the logs written since it.  An SST file larger than 7.5 % of the
materialization is uploaded in pieces (the handle's ``pieces``), so that no checkpoint carries
one large file whole.
"""

from __future__ import annotations

import math
import shutil
import threading
from pathlib import Path
from typing import Any

from statekit.checkpoint.checksum import combined_crc
from statekit.checkpoint.streams import CheckpointStreams
from statekit.errors import CheckpointError

__all__ = ["AHEAD_SHARE", "Ahead", "by_kind", "joined", "reusable", "sst_files"]

#: the share of a materialization each following checkpoint uploads (at least one item)
AHEAD_SHARE = 0.05
#: an SST file larger than ``WHOLE_UP_TO`` of the whole materialization (uploaded whole, it
#: and a log would be over a tenth of the state) is uploaded in pieces of a share, of at least
#: ``MIN_PIECE`` and at most ``MAX_PIECE`` bytes (a restore copies pieces where it may hard-link
#: a whole file, and holds one piece per transfer thread in memory)
WHOLE_UP_TO, MIN_PIECE, MAX_PIECE = 0.075, 1 << 20, 64 << 20

#: one upload: ``(file, offset, end, piece index)``; index -1 is the whole file
Item = tuple[Path, int, int, int]


def reusable(target: Path, base: dict[str, Any]) -> tuple[dict[str, Any], list[Path]]:
    """A native checkpoint's files in ``target``: the SSTs ``base`` (the last confirmed
    checkpoint's: a handle, or pieces, each) holds already, same name and size, by name; and
    the files to upload."""
    reused: dict[str, Any] = {}
    todo: list[Path] = []
    for path in sorted(p for p in target.iterdir() if p.is_file()):
        previous = base.get(path.name) if path.suffix == ".sst" else None
        if previous is not None and previous.get("size") == path.stat().st_size:
            reused[path.name] = previous
        else:
            todo.append(path)
    return reused, todo


def by_kind(files: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A native checkpoint's files by handle group: ``sst``, ``misc`` (whole files) and, when
    any, ``pieces`` (SSTs uploaded in pieces: the file's size and CRC-32, its pieces' handles)."""
    groups: dict[str, dict[str, Any]] = {"sst": {}, "misc": {}, "pieces": {}}
    for name, handle in files.items():
        kind = "pieces" if "parts" in handle else "sst" if name.endswith(".sst") else "misc"
        groups[kind][name] = handle
    if not groups["pieces"]:
        del groups["pieces"]
    return groups


def sst_files(handle: dict[str, Any]) -> dict[str, Any]:
    """A native handle's SST files by name, whole or in pieces: what later checkpoints reuse."""
    return {**handle.get("sst", {}), **handle.get("pieces", {})}


def joined(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """A file uploaded in pieces: its size and CRC-32 (combined from the pieces' own, in order:
    a reader checks the order) and the pieces' handles."""
    return {"size": sum(int(p["size"]) for p in parts),
            "crc": combined_crc([[0, int(p["size"]), int(p["crc"])] for p in parts]),
            "parts": parts}


def _items(files: list[Path], total: int, whole: int) -> list[Item]:
    """The uploads of ``files`` (``total`` bytes of a materialization of ``whole`` bytes): each
    whole, or an SST larger than ``WHOLE_UP_TO`` of the materialization in pieces of a share."""
    limit = min(max(int(AHEAD_SHARE * total), MIN_PIECE), MAX_PIECE)
    items: list[Item] = []
    for path in files:
        size = path.stat().st_size
        if size <= max(WHOLE_UP_TO * whole, limit) or path.suffix != ".sst":
            items.append((path, 0, size, -1))
            continue
        step = math.ceil(size / math.ceil(size / limit))
        items.extend((path, begin, min(begin + step, size), n)
                     for n, begin in enumerate(range(0, size, step)))
    return items


def _write_piece(item: Item, streams: CheckpointStreams) -> dict[str, Any]:
    """Upload one piece of an SST file, streamed in chunks (shared: later checkpoints use it)."""
    path, begin, end, n = item

    def chunks() -> Any:
        with open(path, "rb") as f:
            f.seek(begin)
            left = end - begin
            while left:
                data = f.read(min(left, 4 << 20))
                if not data:
                    raise CheckpointError(f"{path.name} is shorter than captured")
                left -= len(data)
                yield data

    name = f"{path.name}.part{n}"
    return streams.write_parts(chunks(), state_name=name, shared_name=name)[0]


class Ahead:
    """One materialization on its way: its native checkpoint in ``target``, its log position,
    its states, the SSTs it shares with the last materialization, and what is uploaded."""

    def __init__(self, target: Path, position: dict[str, Any], info: dict[str, Any],
                 header: dict[str, Any], incremental: bool, base: dict[str, dict[str, Any]],
                 taken: float) -> None:
        self.target, self.position, self.info, self.taken = target, position, info, taken
        self.header, self.incremental = header, incremental
        self.reused, files = reusable(target, base)
        self.total = sum(p.stat().st_size for p in files)
        whole = self.total + sum(int(h["size"]) for h in self.reused.values())
        self.todo = _items(files, self.total, whole)
        self.uploaded: dict[tuple[str, int], dict[str, Any]] = {}
        self._assigned: dict[int, list[Item]] = {}
        self._staged: dict[int, dict[tuple[str, int], dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def assign(self, checkpoint_id: int) -> list[Item]:
        """What checkpoint ``checkpoint_id``'s run uploads: up to ``AHEAD_SHARE`` of the whole,
        at least one file or piece while any is left."""
        budget, picked = AHEAD_SHARE * self.total, []
        with self._lock:
            while self.todo and (not picked or self.todo[0][2] - self.todo[0][1] <= budget):
                item = self.todo.pop(0)
                budget -= item[2] - item[1]
                picked.append(item)
            if picked:
                self._assigned[checkpoint_id] = picked
        return picked

    def upload(self, checkpoint_id: int, items: list[Item], streams: CheckpointStreams,
               write: Any) -> None:
        """Upload ``items`` through checkpoint ``checkpoint_id``'s streams (``write(path,
        streams)`` gives a whole file's ``(name, handle)``); they count once that checkpoint
        completes."""
        staged = {(item[0].name, item[3]): (write(item[0], streams)[1] if item[3] < 0
                                            else _write_piece(item, streams))
                  for item in items}
        with self._lock:
            if checkpoint_id in self._assigned:
                self._staged[checkpoint_id] = staged

    def referenced(self, checkpoint_id: int) -> dict[str, dict[str, Any]]:
        """What checkpoint ``checkpoint_id`` references of this materialization: the files and
        pieces uploaded so far and its own share."""
        with self._lock:
            done = {**self.uploaded, **self._staged.get(checkpoint_id, {})}
        return {name if n < 0 else f"{name}.part{n}": handle for (name, n), handle in done.items()}

    def complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: its files are uploaded; earlier checkpoints
        that did not complete give theirs back."""
        with self._lock:
            self._assigned.pop(checkpoint_id, None)
            self.uploaded.update(self._staged.pop(checkpoint_id, {}))
            for cid in [c for c in self._assigned if c < checkpoint_id]:
                self._give_back(cid)

    def aborted(self, checkpoint_id: int) -> None:
        with self._lock:
            self._give_back(checkpoint_id)

    def _give_back(self, checkpoint_id: int) -> None:
        self.todo.extend(self._assigned.pop(checkpoint_id, []))
        self._staged.pop(checkpoint_id, None)
        self.todo.sort()

    @property
    def done(self) -> bool:
        with self._lock:
            return not self.todo and not self._assigned

    def chain(self, previous: dict[str, Any]) -> dict[str, Any]:
        """The materialization's handle, extended by ``previous``'s log segments written since
        it (a completed handle holds them, as the logs went on while the files were uploaded)."""
        files = dict(self.reused)
        pieces: dict[str, dict[int, dict[str, Any]]] = {}
        for (name, n), handle in self.uploaded.items():
            if n < 0:
                files[name] = handle
            else:
                pieces.setdefault(name, {})[n] = handle
        files.update({name: joined([got[n] for n in sorted(got)]) for name, got in pieces.items()})
        groups = by_kind(files)
        starts, base = self.position["starts"], self.position["base_log"]
        since = []
        for s in previous["changelog"]["segments"]:
            start = int(starts.get(str(s["log"]), 0))
            if s["log"] < base or s["offset"] + s["size"] <= start:
                continue  # in the materialization's files already
            if s["offset"] < start:  # cannot happen: the logs were captured right before it
                raise CheckpointError("a log segment straddles a materialization's log position")
            since.append(s)
        return {**self.header, "incremental": self.incremental, "states": self.info,
                "state_count": len(self.info), **groups, "reused_sst": len(self.reused),
                "changelog": {**self.position, "segments": since,
                              "log_bytes": sum(s["size"] for s in since)}}

    def discard(self) -> None:
        """Drop the native checkpoint (superseded, or the backend is disposed)."""
        shutil.rmtree(self.target, ignore_errors=True)
