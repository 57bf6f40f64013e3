"""A changelog's materialization uploaded in the background, a share per checkpoint.

Flink materializes a changelog backend between checkpoints, so no checkpoint carries the upload.
Here the native checkpoint is taken at a checkpoint (hard links, as every RocksDB snapshot) and
its files are uploaded by the runs of the checkpoints that follow, ``AHEAD_SHARE`` of it each,
while those checkpoints still extend the previous materialization with logs.  A file counts as
uploaded once the checkpoint whose run wrote it completed; an aborted checkpoint's files are
uploaded again.  When every file is uploaded, the next checkpoint extends the new
materialization with the logs written since it.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

from statekit.checkpoint.streams import CheckpointStreams
from statekit.errors import CheckpointError

__all__ = ["AHEAD_SHARE", "Ahead", "reusable"]

#: the share of a materialization each following checkpoint uploads (at least one file)
AHEAD_SHARE = 0.05


def reusable(target: Path, base: dict[str, dict[str, Any]]
             ) -> tuple[dict[str, dict[str, Any]], list[Path]]:
    """A native checkpoint's files in ``target``: the SSTs ``base`` (the last confirmed
    checkpoint's) holds already, same name and size, by name; and the files to upload."""
    reused: dict[str, dict[str, Any]] = {}
    todo: list[Path] = []
    for path in sorted(p for p in target.iterdir() if p.is_file()):
        previous = base.get(path.name) if path.suffix == ".sst" else None
        if previous is not None and previous.get("size") == path.stat().st_size:
            reused[path.name] = previous
        else:
            todo.append(path)
    return reused, todo


class Ahead:
    """One materialization on its way: its native checkpoint in ``target``, its log position,
    its states, the SSTs it shares with the last materialization, and what is uploaded."""

    def __init__(self, target: Path, position: dict[str, Any], info: dict[str, Any],
                 header: dict[str, Any], incremental: bool, base: dict[str, dict[str, Any]],
                 taken: float) -> None:
        self.target, self.position, self.info, self.taken = target, position, info, taken
        self.header, self.incremental = header, incremental
        self.reused, self.todo = reusable(target, base)
        self.total = sum(p.stat().st_size for p in self.todo)
        self.uploaded: dict[str, dict[str, Any]] = {}
        self._assigned: dict[int, list[Path]] = {}
        self._staged: dict[int, dict[str, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def assign(self, checkpoint_id: int) -> list[Path]:
        """The files checkpoint ``checkpoint_id``'s run uploads: up to ``AHEAD_SHARE`` of the
        whole, at least one file while any is left."""
        budget, picked = AHEAD_SHARE * self.total, []
        with self._lock:
            while self.todo and (not picked or self.todo[0].stat().st_size <= budget):
                path = self.todo.pop(0)
                budget -= path.stat().st_size
                picked.append(path)
            if picked:
                self._assigned[checkpoint_id] = picked
        return picked

    def upload(self, checkpoint_id: int, files: list[Path], streams: CheckpointStreams,
               write: Any) -> None:
        """Upload ``files`` through checkpoint ``checkpoint_id``'s streams (``write(path,
        streams)`` gives ``(name, handle)``); they count once that checkpoint completes."""
        staged = dict(write(path, streams) for path in files)
        with self._lock:
            if checkpoint_id in self._assigned:
                self._staged[checkpoint_id] = staged

    def referenced(self, checkpoint_id: int) -> dict[str, dict[str, Any]]:
        """What checkpoint ``checkpoint_id`` references of this materialization: the files
        uploaded so far and its own share."""
        with self._lock:
            return {**self.uploaded, **self._staged.get(checkpoint_id, {})}

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
        sst = dict(self.reused)
        misc: dict[str, dict[str, Any]] = {}
        for name, handle in self.uploaded.items():
            (sst if name.endswith(".sst") else misc)[name] = handle
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
                "state_count": len(self.info), "sst": sst, "misc": misc,
                "reused_sst": len(self.reused),
                "changelog": {**self.position, "segments": since,
                              "log_bytes": sum(s["size"] for s in since)}}

    def discard(self) -> None:
        """Drop the native checkpoint (superseded, or the backend is disposed)."""
        shutil.rmtree(self.target, ignore_errors=True)
