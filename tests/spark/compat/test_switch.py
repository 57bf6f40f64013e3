"""The switch: one line in the driver (``enable(spark)``) or one configuration line
(``spark.statekit.compat.enabled``) routes Spark's grouped stateful calls to statekit; without
it Spark's own operators run.  Checked on the query plans (no query runs)."""

import pandas as pd
import pytest
from pyspark.sql.streaming import StatefulProcessor

from statekit.errors import ConfigError, ConfigTypeError, StateError
from statekit.spark.compat import ENABLED_KEY, disable, enable, enabled

pytestmark = pytest.mark.spark


def count(key, pdf_iter, state):
    n = (state.getOption or (0,))[0] + sum(len(pdf) for pdf in pdf_iter)
    state.update((n,))
    yield pd.DataFrame({"value": [key[0]], "n": [n]})


class Counter(StatefulProcessor):
    def init(self, handle):
        self.n = handle.getValueState("n", "n long")

    def handleInputRows(self, key, rows, timerValues):
        n = (self.n.get() or (0,))[0] + sum(len(pdf) for pdf in rows)
        self.n.update((n,))
        yield pd.DataFrame({"value": [key[0]], "n": [n]})


def plan(df):
    return df._jdf.queryExecution().logical().toString()


def grouped(spark):
    return spark.readStream.format("rate").load().groupBy("value")


def test_switch_routes_spark_calls(spark):
    native = plan(grouped(spark).applyInPandasWithState(count, "value long, n long", "n long",
                                                        "update", "NoTimeout"))
    assert "FlatMapGroupsInPandasWithState" in native
    enable(spark)
    try:
        assert enabled(spark)
        routed = plan(grouped(spark).applyInPandasWithState(count, "value long, n long",
                                                            "n long", "update", "NoTimeout"))
        assert "TransformWithStateInPySpark" in routed  # statekit's bridge, not Spark's state
        tws = plan(grouped(spark).transformWithStateInPandas(Counter(), "value long, n long",
                                                             "Update", "None"))
        assert "TransformWithStateInPySpark" in tws
    finally:
        disable(spark)
    assert not enabled(spark)


def test_configuration_line_switches_too(spark):
    spark.conf.set(ENABLED_KEY, "true")
    try:
        assert enabled(spark)
        spark.conf.set(ENABLED_KEY, "maybe")
        with pytest.raises(ConfigError, match=r"compat\.enabled"):
            grouped(spark).applyInPandasWithState(count, "value long, n long", "n long",
                                                  "update", "NoTimeout")
    finally:
        spark.conf.unset(ENABLED_KEY)
    assert not enabled(spark)


class UsesTimersInInit(Counter):
    def init(self, handle):
        handle.registerTimer(1)


class TtlWithoutTime(Counter):
    def init(self, handle):
        handle.getValueState("n", "n long", 1000)


class BadSchema(Counter):
    def init(self, handle):
        handle.getValueState("n", 42)


@pytest.mark.parametrize(("processor", "error"), [
    (UsesTimersInInit(), StateError), (TtlWithoutTime(), StateError), (BadSchema(), StateError),
    (object(), ConfigTypeError)])
def test_processor_misuse_is_refused_at_the_call(spark, processor, error):
    enable(spark)
    try:
        with pytest.raises(error):
            grouped(spark).transformWithStateInPandas(processor, "value long, n long", "Update",
                                                      "None")
    finally:
        disable(spark)


def test_spark_needs_its_rocksdb_provider_for_the_operator(spark):
    """statekit runs Spark's calls through Spark's transformWithState operator, which Spark
    allows only with its RocksDB provider: refused at the call without it, set by enable()."""
    key = "spark.sql.streaming.stateStore.providerClass"
    before = spark.conf.get(key)
    spark.conf.set(key, "org.apache.spark.sql.execution.streaming.state."
                        "HDFSBackedStateStoreProvider")
    spark.conf.set(ENABLED_KEY, "true")
    try:
        with pytest.raises(ConfigError, match="providerClass"):
            grouped(spark).applyInPandasWithState(count, "value long, n long", "n long",
                                                  "update", "NoTimeout")
        enable(spark)
        assert "RocksDB" in spark.conf.get(key)
    finally:
        disable(spark)
        spark.conf.set(key, before)


def test_statekit_adapters_keep_their_own_operators_with_the_switch_on(spark):
    """statekit's own adapters call Spark's methods themselves: the switch must not route them."""
    from statekit import KeyedProcessFunction
    from statekit.spark import apply_in_pandas_with_state

    class Noop(KeyedProcessFunction):
        def process_element(self, value, ctx):
            return ()

    enable(spark)
    try:
        out = apply_in_pandas_with_state(grouped(spark), Noop(), "value long")
        assert "FlatMapGroupsInPandasWithState" in plan(out)
    finally:
        disable(spark)
