"""Spark's own stateful APIs on statekit state: one session for the module, the switch on, and the
statekit backend chosen per test (``backend`` fixture: heap "hashmap" and "rocksdb")."""

import pytest

from statekit.spark.compat import disable, enable, enabled

BACKENDS = ["hashmap", "rocksdb"]


@pytest.fixture(params=["rocksdb", pytest.param("hashmap", marks=pytest.mark.heavy)])
def backend(request, spark):
    """The switch on and ``spark.statekit.state.backend.type`` set: all a user changes.  The
    default run has each case on RocksDB; on the heap they are marked heavy (make test-heavy)."""
    enable(spark)
    spark.conf.set("spark.statekit.state.backend.type", request.param)
    assert enabled(spark)
    yield request.param
    for q in spark.streams.active:
        q.stop()
    disable(spark)
    spark.conf.unset("spark.statekit.state.backend.type")
