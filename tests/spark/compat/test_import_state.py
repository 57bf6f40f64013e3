"""Bringing a native query's state along: a query runs natively on Spark's state store for five
micro-batches, its state is imported, and the same unchanged processor or function, switched to
statekit, runs five more from the new location; every key's output equals a native run over all
ten batches (both APIs, both backends).  And what the import refuses."""

import os

import pytest

from statekit.errors import CheckpointNotFoundError, ConfigError, ConfigTypeError, StateTypeError
from statekit.spark.compat import disable, enable, import_state
from statekit.spark.compat.bridge import PROVIDER_KEY
from tests.spark.compat import import_jobs as jobs

pytestmark = pytest.mark.spark

HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
NATIVE_PROVIDER = {"pandas": ROCKSDB, "apply": HDFS}  # Spark's defaults for each API


def native(spark, api):
    disable(spark)
    spark.conf.set(PROVIDER_KEY, NATIVE_PROVIDER[api])


def import_args(api):
    if api == "pandas":
        return (jobs.Sessions(),), {}
    return (jobs.visits,), {"stateStructType": jobs.VISITS_STATE, "outputMode": "update",
                            "timeoutConf": "EventTimeTimeout"}


@pytest.mark.parametrize("api", ["pandas", "apply"])
def test_switched_query_continues_from_imported_state(spark, backend, tmp_path, api):
    # the reference: natively over all ten batches
    native(spark, api)
    jobs.write_batches(tmp_path / "all", range(10))
    expected = jobs.run(spark, api, str(tmp_path / "all"), str(tmp_path / "reference"))
    # five batches natively, stopped
    jobs.write_batches(tmp_path / "in", range(5))
    first = jobs.run(spark, api, str(tmp_path / "in"), str(tmp_path / "native"))
    args, kwargs = import_args(api)
    result = import_state(spark, str(tmp_path / "native"), str(tmp_path / "moved"), *args,
                          **kwargs)
    assert result.batch_id >= 4 and result.keys == 6 and result.backend == backend
    # the same code, switched, from the new location over five more batches
    enable(spark)
    jobs.write_batches(tmp_path / "in", range(5, 10))
    rest = jobs.run(spark, api, str(tmp_path / "in"), str(tmp_path / "moved"))
    assert sorted(first + rest) == sorted(expected)
    assert any(row[1] == -1 and row[0] == "k4" for row in rest)  # imported timer fired
    moved = os.listdir(tmp_path / "moved" / "statekit")
    assert moved == [result.query_id]


def test_refusals(spark, backend, tmp_path):
    native(spark, "pandas")
    with pytest.raises(CheckpointNotFoundError, match="no committed batch"):
        import_state(spark, str(tmp_path / "nothing"), str(tmp_path / "t0"), jobs.Sessions())
    jobs.write_batches(tmp_path / "in", range(2))
    jobs.run(spark, "pandas", str(tmp_path / "in"), str(tmp_path / "native"))
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "metadata").write_text("{}")
    with pytest.raises(ConfigError, match="already holds"):
        import_state(spark, str(tmp_path / "native"), str(tmp_path / "used"), jobs.Sessions())
    with pytest.raises(ConfigTypeError, match="StatefulProcessor"):
        import_state(spark, str(tmp_path / "native"), str(tmp_path / "t1"), jobs.visits)

    class Narrower(jobs.Sessions):
        def init(self, handle):
            super().init(handle)
            self.count = handle.getValueState("count", "n string")

    with pytest.raises(StateTypeError, match="count"):
        import_state(spark, str(tmp_path / "native"), str(tmp_path / "t2"), Narrower())
    for name in ("t0", "t1", "t2"):
        assert not (tmp_path / name).exists() or not os.listdir(tmp_path / name)
    # not a Python stateful operator: a streaming aggregation
    agg = (jobs.events(spark, str(tmp_path / "in")).groupBy("user").count().writeStream
           .outputMode("update").format("noop").option("checkpointLocation",
                                                       str(tmp_path / "agg"))
           .trigger(availableNow=True).start())
    agg.awaitTermination()
    with pytest.raises(ConfigError, match="operator"):
        import_state(spark, str(tmp_path / "agg"), str(tmp_path / "t3"), jobs.Sessions())
