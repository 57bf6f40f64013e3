"""Output held across keys on Spark's transformWithState operator: PySpark turns every frame a
key's call yields into an Arrow batch of its own, so the adapters hand it many keys' output at
once.  Every row still arrives exactly once, with its exact value, in every time mode; a frame
joins only frames of its own dtypes; output that PySpark did not take fails the task."""

import pickle

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

import statekit.spark.held as held_module
from statekit.errors import StatekitError
from statekit.spark.compat import disable, enable
from statekit.spark.held import HeldOutput, HoldingProcessor, flushing_operator, holds
from tests.spark import jobs
from tests.spark.compat.test_switch import Counter

pytestmark = pytest.mark.spark
BIG = 2**60 + 1  # an int64 a float64 cannot hold exactly


def frame(key, value):
    return pd.DataFrame({"key": [key], "v": [value]})


def test_frames_of_one_kind_go_out_as_one():
    held = HeldOutput(rows_api=False, limit=100)
    assert list(held.add([frame("a", 1), frame("b", 2)])) == []
    assert list(held.add([frame("c", 3)])) == []
    assert held
    out = list(held.drain())
    assert len(out) == 1 and out[0].to_dict("list") == {"key": ["a", "b", "c"], "v": [1, 2, 3]}
    assert not held and list(held.drain()) == []


def test_frames_of_other_dtypes_stay_apart_and_exact():
    held = HeldOutput(rows_api=False, limit=100)
    assert list(held.add([frame("a", BIG), frame("b", float("nan")), frame("c", BIG - 2)])) == []
    out = list(held.drain())
    assert len(out) == 2
    ints = next(f for f in out if f["v"].dtype == np.int64)
    assert ints["v"].tolist() == [BIG, BIG - 2]  # joined with pandas' concat of mixed dtypes,
    assert float(BIG) != BIG                     # they would have become floats


def test_pieces_at_the_limit_and_large_frames_at_once():
    held = HeldOutput(rows_api=False, limit=3)
    large = pd.DataFrame({"key": list("xyz"), "v": [1, 2, 3]})
    out = list(held.add([large]))
    assert len(out) == 1 and out[0] is large and not held
    assert list(held.add([frame("a", 1), frame("b", 2)])) == []
    pieces = list(held.add([frame("c", 3)]))
    assert [len(p) for p in pieces] == [3] and not held


def test_empty_frames_vanish_and_frames_pandas_cannot_join_go_out_at_once():
    held = HeldOutput(rows_api=False, limit=10)
    twice = pd.DataFrame([[1, 2]], columns=["v", "v"])
    out = list(held.add([frame("a", 1).iloc[:0], twice]))
    assert len(out) == 1 and out[0] is twice and not held


def test_rows_api_holds_rows_and_the_pandas_api_passes_what_is_not_a_frame():
    from pyspark.sql import Row

    rows = HeldOutput(rows_api=True, limit=10)
    assert list(rows.add([Row(key="a", v=1), Row(key="b", v=2)])) == []
    assert list(rows.drain()) == [Row(key="a", v=1), Row(key="b", v=2)]
    pandas = HeldOutput(rows_api=False, limit=10)
    odd = ("not", "a frame")
    assert list(pandas.add([odd])) == [odd]  # PySpark refuses it at its key, as without statekit
    assert not pandas


def test_output_still_held_at_the_end_fails_the_task():
    held = HeldOutput(rows_api=False)
    list(held.add([frame("a", 1)]))
    with pytest.raises(StatekitError, match="held past"):
        held.check_drained()
    list(held.drain())
    held.check_drained()


class TwoKinds(Counter):
    """Spark's API: the running count of ``Counter``, one frame per call, of two dtypes."""

    def handleInputRows(self, key, rows, timerValues):
        for out in super().handleInputRows(key, rows, timerValues):
            n = int(out["n"].iloc[0])
            if key[0].endswith("7"):
                yield pd.DataFrame({"key": [key[0]], "c": [float(n)], "t": [float("nan")]})
            else:
                yield pd.DataFrame({"key": [key[0]], "c": [n], "t": [BIG + n]})


def test_pyspark_builds_the_operator_with_the_flushing_driver(spark):
    from pyspark.sql.streaming import stateful_processor_util as util

    original = util.TransformWithStateInPandasUdfUtils
    grouped = spark.readStream.format("rate").load().groupBy("value")

    class Holding(TwoKinds, HoldingProcessor):
        pass

    marked = Holding()
    with flushing_operator():
        grouped.transformWithStateInPandas(marked, "value long", "Update", "None")
    assert holds(marked)
    plain = Holding()
    grouped.transformWithStateInPandas(plain, "value long", "Update", "None")
    assert not holds(plain)  # Spark's own operator: nothing held, nothing changed
    assert util.TransformWithStateInPandasUdfUtils is original
    cls = held_module.HeldOutputUdfUtils  # pickled by name: it resolves on the executors
    assert pickle.loads(cloudpickle.dumps(cls)) is cls


@pytest.mark.parametrize("api", ["transform_with_state", "compat"])
def test_every_row_arrives_once_and_exact_across_the_limit(spark, tmp_path, api):
    """About 31k keys over 2 partitions: each partition passes the limit in keys and in rows (a
    piece mid-way, the rest in its timer phase)."""
    data = jobs.write_inputs(str(tmp_path / "in"), 0, 1, rows=60_000, keys=40_000)
    sink = jobs.Outputs()
    if api == "transform_with_state":
        jobs.run_until_done(spark, api, jobs.RunningCount(), str(tmp_path / "in"),
                            str(tmp_path / "cp"), sink)
        rows = sink.by_batch[0]
        assert len(rows) == len(data)  # one row per element, none lost, none twice
        assert sink.final() == jobs.expected(data)
        return
    enable(spark)
    spark.conf.set("spark.statekit.state.backend.type", "rocksdb")
    try:
        source = spark.readStream.schema("key string, v long").parquet(str(tmp_path / "in"))
        (source.groupBy("key").transformWithStateInPandas(TwoKinds(), jobs.OUTPUT, "Update", "None")
         .writeStream.foreachBatch(sink).outputMode("update")
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True)
         .start().awaitTermination())
    finally:
        disable(spark)
        spark.conf.unset("spark.statekit.state.backend.type")
    counts = data.groupby("key").size()
    want = sorted((k, int(n), None if k.endswith("7") else BIG + int(n)) for k, n in counts.items())
    assert sorted(sink.by_batch[0]) == want
