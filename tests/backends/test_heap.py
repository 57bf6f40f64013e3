"""The heap backend through the shared conformance suite."""

import pytest

from statekit.backends.heap import HashMapStateBackend
from statekit.testing.conformance import BackendConformance


class TestHeapAsync(BackendConformance):
    @pytest.fixture
    def state_backend(self):
        return HashMapStateBackend()


class TestHeapSync(BackendConformance):
    @pytest.fixture
    def state_backend(self):
        return HashMapStateBackend(using_asynchronous_snapshots=False)
