"""Flink's StateBackendTestBase, ported (statekit.testing.conformance), on the heap backend
(asynchronous full and incremental snapshots) and RocksDB (full, incremental and changelog
checkpoints)."""

import pytest

from statekit.backends.heap import HashMapStateBackend
from statekit.testing.conformance import (
    KeyEnumerationConformance,
    SnapshotConformance,
    StateKindConformance,
)
from tests.backends.test_rocksdb_conformance import rocks

BACKENDS = {
    "heap": lambda: HashMapStateBackend(),
    "heap-incremental": lambda: HashMapStateBackend(incremental=True),
    "rocksdb-full": lambda: rocks(False),
    "rocksdb-incremental": lambda: rocks(True, threads=2),
    "rocksdb-changelog": lambda: rocks(True).configure({
        "state.changelog.enabled": True, "state.changelog.periodic-materialize.interval": "1 ms"}),
}


class FlinkBackends:
    @pytest.fixture(params=list(BACKENDS))
    def state_backend(self, request):
        return BACKENDS[request.param]()


class TestStateKinds(FlinkBackends, StateKindConformance):
    pass


class TestSnapshots(FlinkBackends, SnapshotConformance):
    pass


class TestKeys(FlinkBackends, KeyEnumerationConformance):
    pass
