"""Operator and broadcast state through the shipped conformance suite (Flink's
OperatorStateBackendTest and PyFlink's broadcast cases), with each keyed backend under the jobs."""

import pytest

from statekit.backends.heap import HashMapStateBackend
from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
from statekit.testing.conformance.operator import OperatorStateConformance


class TestWithHeap(OperatorStateConformance):
    @pytest.fixture
    def state_backend(self):
        return HashMapStateBackend()


class TestWithRocksDB(OperatorStateConformance):
    @pytest.fixture
    def state_backend(self):
        return EmbeddedRocksDBStateBackend()
