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
from tests.spark.compat.conftest import BACKENDS

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
def test_switched_query_continues_from_imported_state(spark, tmp_path, api):
    # the reference: natively over all ten batches
    native(spark, api)
    jobs.write_batches(tmp_path / "all", range(10))
    expected = jobs.run(spark, api, str(tmp_path / "all"), str(tmp_path / "reference"))
    # five batches natively, stopped; then imported into each backend
    jobs.write_batches(tmp_path / "in", range(5))
    first = jobs.run(spark, api, str(tmp_path / "in"), str(tmp_path / "native"))
    args, kwargs = import_args(api)
    try:
        for backend in BACKENDS:
            native(spark, api)
            spark.conf.set("spark.statekit.state.backend.type", backend)
            moved = tmp_path / f"moved-{backend}"
            result = import_state(spark, str(tmp_path / "native"), str(moved), *args, **kwargs)
            assert result.keys == 6 and result.backend == backend and result.timers in (0, 6)
            assert os.listdir(moved / "statekit") == [result.query_id]
            # the same code, switched, from the new location over five more batches
            enable(spark)
            jobs.write_batches(tmp_path / "in", range(5, 10))
            rest = jobs.run(spark, api, str(tmp_path / "in"), str(moved))
            assert sorted(first + rest) == sorted(expected), backend
            assert ("k4", -1) in {row[:2] for row in rest}  # its imported timer fired
    finally:
        disable(spark)
        spark.conf.unset("spark.statekit.state.backend.type")


def test_refusals(spark, tmp_path):
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
