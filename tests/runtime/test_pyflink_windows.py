"""PyFlink's test_window.py cases (statekit.testing.conformance), on the local runner with the
heap backend (asynchronous and incremental snapshots) and RocksDB (full and incremental
checkpoints)."""

from statekit.testing.conformance import WindowConformance
from tests.runtime.test_pyflink_datastream import Backends


class TestWindows(Backends, WindowConformance):
    pass
