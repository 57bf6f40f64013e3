"""Namespaced keyed state (window state) through the shared conformance suite, both backends."""

import pytest

from statekit.backends.heap import HashMapStateBackend
from statekit.testing.conformance import NamespaceConformance
from tests.backends.test_rocksdb_conformance import rocks


class TestHeapNamespaces(NamespaceConformance):
    @pytest.fixture
    def state_backend(self):
        return HashMapStateBackend()


class TestHeapIncrementalNamespaces(NamespaceConformance):
    @pytest.fixture
    def state_backend(self):
        return HashMapStateBackend(incremental=True)


class TestRocksDBNamespaces(NamespaceConformance):
    @pytest.fixture
    def state_backend(self):
        return rocks(True)
