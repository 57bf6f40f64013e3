"""A small harness that runs several keyed backends as one job's partitions, for tests.

It routes keys to partitions by key group, checkpoints all partitions through a real checkpoint
storage, restores them (also at another parallelism) and reads every key's state back, so the
same cases run against any backend and any storage.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from statekit.backends.base import KeyedStateBackend, StateBackend
from statekit.backends.transfer import restore_into
from statekit.checkpoint.base import CheckpointStorage
from statekit.serde.keygroups import (
    DEFAULT_MAX_PARALLELISM,
    KeyGroupRange,
    key_group_for_bytes,
    key_group_range_for_operator,
)
from statekit.serde.keys import as_key_serializer
from statekit.serde.types import GenericSerializer, TypeSerializer
from statekit.state.api import State
from statekit.state.descriptors import StateDescriptor


class KeyedCluster:
    """``parallelism`` keyed backends of one backend kind, checkpointed into one storage."""

    def __init__(self, backend: StateBackend, storage: CheckpointStorage, parallelism: int,
                 max_parallelism: int = DEFAULT_MAX_PARALLELISM,
                 key_serializer: TypeSerializer | None = None,
                 clock: Callable[[], int] | None = None) -> None:
        self.backend_factory = backend
        self.storage = storage
        self.access = storage.create_access(uuid.uuid4().hex)
        self.max_parallelism = max_parallelism
        self.key_serializer = as_key_serializer(key_serializer or GenericSerializer())
        self.clock = clock
        self.next_checkpoint = 1
        self.completed: list[int] = []
        self.partitions: list[KeyedStateBackend] = []
        self._build(parallelism, None)

    @property
    def parallelism(self) -> int:
        return len(self.partitions)

    def _build(self, parallelism: int, checkpoint_id: int | None) -> None:
        self._built = parallelism
        for backend in self.partitions:
            backend.dispose()
        handles: dict[str, Any] = {}
        if checkpoint_id is not None:
            handles = self.access.load(checkpoint_id)["tasks"]
        self.partitions = []
        for index in range(parallelism):
            rng = key_group_range_for_operator(self.max_parallelism, parallelism, index)
            backend = self.backend_factory.create_keyed_state_backend(
                key_serializer=self.key_serializer, key_group_range=rng,
                max_parallelism=self.max_parallelism, operator_id="test", clock=self.clock,
            )
            wanted = [h for h in handles.values()
                      if len(KeyGroupRange.of(h["key_group_range"]).intersection(rng))]
            try:
                if wanted:  # any snapshot into any backend (a backend flip included)
                    reader = self.access.reader()
                    restore_into(backend, [(handle, reader) for handle in wanted])
            except BaseException:
                backend.dispose()
                self.close()
                raise
            self.partitions.append(backend)

    def partition_of(self, key: Any) -> KeyedStateBackend:
        kg = key_group_for_bytes(self.key_serializer.serialize(key), self.max_parallelism)
        return self.partitions[kg * self.parallelism // self.max_parallelism]

    def state(self, key: Any, descriptor: StateDescriptor) -> State:
        """The state of ``descriptor`` with ``key`` as the current key."""
        backend = self.partition_of(key)
        backend.set_current_key(key)
        return backend.get_partitioned_state(descriptor)

    def checkpoint(self) -> int:
        """Snapshot every partition (both phases) and commit; returns the checkpoint id."""
        cid = self.next_checkpoint
        self.next_checkpoint += 1
        runs = {f"p{i}": b.snapshot(cid, self.access.streams(cid, f"p{i}"))
                for i, b in enumerate(self.partitions)}
        handles = {name: run.run() for name, run in runs.items()}
        self.access.commit(cid, {"tasks": handles, "max_parallelism": self.max_parallelism})
        for backend in self.partitions:
            backend.notify_checkpoint_complete(cid)
        self.completed.append(cid)
        return cid

    def restore(self, checkpoint_id: int | None = None, parallelism: int | None = None,
                key_serializer: TypeSerializer | None = None) -> None:
        """Replace every partition by fresh ones restored from a checkpoint (latest by default),
        with another key serializer when given (a restore that fails leaves no partitions)."""
        cid = checkpoint_id if checkpoint_id is not None else self.completed[-1]
        if key_serializer is not None:
            self.key_serializer = as_key_serializer(key_serializer)
        self._build(parallelism or self._built, cid)

    def close(self) -> None:
        for backend in self.partitions:
            backend.dispose()
        self.partitions = []
