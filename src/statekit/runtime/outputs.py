"""What a local job emits: outputs held until the checkpoint that covers them completes (so a
restored job never emits an element twice), side outputs split from them on release, and the
:class:`CollectResult` a caller gets back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from statekit.runtime.coordinator import CheckpointStats
from statekit.runtime.functions import OutputTag, side_output_of


class CollectResult(list):  # type: ignore[type-arg]
    """Outputs of a job, plus what a caller needs to resume or inspect it."""

    job_id: str
    restarts: int
    checkpoint_stats: list[CheckpointStats]
    retained_checkpoints: list[str]
    savepoint_path: str | None
    #: committed side outputs by tag id (``(tag, value)`` outputs of the function)
    side_outputs: dict[str, list[Any]]
    #: per restore within the job, where each task's state came from (``local``: its local
    #: copy, ``remote``: checkpoint storage, ``mixed``)
    restore_sources: list[dict[str, str]]

    def get_side_output(self, tag: OutputTag) -> list[Any]:
        """The committed values sent to the side output ``tag`` (empty when none were)."""
        return list(self.side_outputs.get(tag.tag_id, ()))

    @property
    def latest_checkpoint(self) -> str | None:
        """Path of the newest retained checkpoint (for ``execution.savepoint.path``), if any."""
        return self.retained_checkpoints[-1] if self.retained_checkpoints else None


@dataclass
class Outputs:
    """Outputs waiting for the checkpoint that covers them, and those already committed."""

    committed: list[Any] = field(default_factory=list)
    open: list[Any] = field(default_factory=list)
    by_checkpoint: dict[int, list[Any]] = field(default_factory=dict)
    sink: Callable[[Any], None] | None = None
    #: committed side outputs by tag id, and the sinks some of them go to
    side: dict[str, list[Any]] = field(default_factory=dict)
    side_sinks: dict[str, Callable[[Any], None]] = field(default_factory=dict)

    def barrier(self, checkpoint_id: int) -> None:
        self.by_checkpoint[checkpoint_id] = self.open
        self.open = []

    def commit_through(self, checkpoint_id: int) -> None:
        for cid in sorted(c for c in self.by_checkpoint if c <= checkpoint_id):
            self.release(self.by_checkpoint.pop(cid))

    def release(self, items: list[Any]) -> None:
        if any(side_output_of(item) is not None for item in items):
            main = []
            for item in items:
                tag = side_output_of(item)
                if tag is None:
                    main.append(item)
                    continue
                self.side.setdefault(tag.tag_id, []).append(item[1])
                side_sink = self.side_sinks.get(tag.tag_id)
                if side_sink is not None:
                    side_sink(item[1])
            items = main
        if self.sink is not None:
            for item in items:
                self.sink(item)
        self.committed.extend(items)

    def discard_uncommitted(self) -> None:
        self.open = []
        self.by_checkpoint.clear()
