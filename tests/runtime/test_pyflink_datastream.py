"""PyFlink's test_data_stream.py keyed and connected cases (statekit.testing.conformance), on the
local runner with the heap backend (asynchronous and incremental snapshots) and RocksDB (full and
incremental checkpoints)."""

import pytest

from statekit.testing.conformance import ConnectedStreamConformance, DataStreamConformance
from tests.backends.test_flink_state_backend import BACKENDS


class Backends:
    @pytest.fixture(params=list(BACKENDS))
    def state_backend(self, request):
        return BACKENDS[request.param]()


class TestKeyed(Backends, DataStreamConformance):
    pass


class TestConnected(Backends, ConnectedStreamConformance):
    pass
