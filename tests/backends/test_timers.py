"""Timer conformance (Flink's timer service tests) on every built-in backend."""

import pytest

from statekit.backends.heap import HashMapStateBackend
from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
from statekit.testing.conformance.timers import TimerConformance


class TestHeapTimers(TimerConformance):
    @pytest.fixture
    def state_backend(self):
        return HashMapStateBackend()

    @pytest.fixture
    def other_backend(self):
        return EmbeddedRocksDBStateBackend()


class TestHeapIncrementalTimers(TimerConformance):
    @pytest.fixture
    def state_backend(self):
        return HashMapStateBackend(incremental=True)


class TestRocksDBTimers(TimerConformance):
    @pytest.fixture
    def state_backend(self):
        return EmbeddedRocksDBStateBackend()


class TestRocksDBIncrementalTimers(TimerConformance):
    @pytest.fixture
    def state_backend(self):
        return EmbeddedRocksDBStateBackend(True)


class TestRocksDBChangelogTimers(TimerConformance):
    """Timers written through the write-ahead log of changelog checkpoints."""

    @pytest.fixture
    def state_backend(self):
        return EmbeddedRocksDBStateBackend(True).configure({
            "state.changelog.enabled": True, "state.changelog.periodic-materialize.interval": "1 ms"})


def _heap_timers(incremental=None):
    backend = EmbeddedRocksDBStateBackend(incremental)
    backend.set_priority_queue_state_type("HEAP")
    return backend


class TestRocksDBHeapTimers(TimerConformance):
    """``state.backend.rocksdb.timer-service.factory: HEAP``; restores cross into RocksDB-kept
    timers and back."""

    @pytest.fixture
    def state_backend(self):
        return _heap_timers()

    @pytest.fixture
    def other_backend(self):
        return EmbeddedRocksDBStateBackend()


class TestRocksDBIncrementalHeapTimers(TimerConformance):
    @pytest.fixture
    def state_backend(self):
        return _heap_timers(True)


class TestRocksDBTimersIntoHeapTimers(TimerConformance):
    @pytest.fixture
    def state_backend(self):
        return EmbeddedRocksDBStateBackend()

    @pytest.fixture
    def other_backend(self):
        return _heap_timers()


def test_timer_factory_key():
    from statekit.errors import ConfigError

    backend = EmbeddedRocksDBStateBackend.from_config(
        {"state.backend.rocksdb.timer-service.factory": "heap"})
    assert backend.get_priority_queue_state_type() == "HEAP"
    assert EmbeddedRocksDBStateBackend().get_priority_queue_state_type() == "ROCKSDB"
    with pytest.raises(ConfigError, match=r"timer-service\.factory"):
        EmbeddedRocksDBStateBackend.from_config({"state.backend.rocksdb.timer-service.factory": "x"})
