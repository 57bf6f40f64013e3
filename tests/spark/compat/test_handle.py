"""Spark's state variables on statekit backends, without a Spark session: values as Spark's API
returns them, TTL with Spark's semantics on the batch's time, type checks at the call, and
``deleteIfExists``."""

import datetime

import numpy as np
import pytest
from pyspark.errors import PySparkRuntimeError
from pyspark.sql.types import (
    ArrayType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from statekit.backends.base import StateBackend
from statekit.errors import StateError, StateTypeError
from statekit.registry import backend_registry
from statekit.serde.keygroups import key_group_range_for_operator
from statekit.serde.keys import as_key_serializer
from statekit.serde.types import GenericSerializer
from statekit.spark.compat.handle import Handle


def struct(*fields, nullable=True):
    return StructType([StructField(name, kind, nullable) for name, kind in fields])


N = struct(("n", LongType()))
K = struct(("k", StringType()))
ROW = [("n", IntegerType()), ("f", DoubleType()), ("s", StringType()), ("t", TimestampType()),
       ("d", DateType()), ("a", ArrayType(IntegerType())), ("r", struct(("x", IntegerType())))]


class Clock:
    now = 0

    def __call__(self):
        return self.now


class Context:  # what the handle reads of a RuntimeContext
    def __init__(self, backend):
        self._backend = backend


@pytest.fixture(params=["hashmap", "rocksdb"])
def setup(request):
    factory = backend_registry.create(request.param, {}, StateBackend)
    backend = factory.create_keyed_state_backend(
        key_serializer=as_key_serializer(GenericSerializer()),
        key_group_range=key_group_range_for_operator(128, 1, 0),
        max_parallelism=128, operator_id="compat")
    clock = backend.clock = Clock()
    handle = Handle("ProcessingTime", Context(backend))
    yield handle, backend, clock
    backend.dispose()


def test_ttl_expires_from_the_batch_whose_time_reaches_it(setup):
    handle, backend, clock = setup
    value = handle.getValueState("v", N, 10_000)
    items = handle.getListState("l", N, 10_000)
    entries = handle.getMapState("m", K, N, 10_000)
    backend.set_current_key("a")
    clock.now = 1_000
    value.update((1,))
    items.appendValue((1,))
    entries.updateValue(("x",), (1,))
    clock.now = 5_000
    items.appendValue((2,))  # its own expiry
    entries.updateValue(("y",), (2,))
    clock.now = 10_999
    assert value.get() == (1,) and list(items.get()) == [(1,), (2,)]
    clock.now = 11_000  # Spark: expired once the batch's timestamp reaches the expiry
    assert value.get() is None and not value.exists()
    assert list(items.get()) == [(2,)]
    assert list(entries.keys()) == [("y",)] and entries.getValue(("x",)) is None
    value.update((3,))  # an update starts a new expiry
    clock.now = 20_999
    assert value.get() == (3,)
    clock.now = 21_000
    assert value.get() is None and not items.exists() and not entries.exists()


def test_values_round_trip_as_spark_returns_them(setup):
    handle, backend, _ = setup
    value = handle.getValueState("v", struct(*ROW))
    backend.set_current_key(("k", 1))
    when = datetime.datetime(2024, 5, 1, 12, 30)
    value.update((np.int64(5), np.float32(1.5), "x", when, when.date(), [1, 2], (7,)))
    n, f, s, t, d, a, r = value.get()
    assert (n, f, s, t, d, a, r.x) == (5, 1.5, "x", when, when.date(), [1, 2], 7)
    assert type(n) is int and type(t) is datetime.datetime


@pytest.mark.parametrize("bad", [(1,), ("not a number",) * 7, None, "text"])
def test_values_the_schema_refuses_are_refused_at_the_call(setup, bad):
    handle, backend, _ = setup
    value = handle.getValueState("v", StructType([StructField("n", IntegerType(), False)] + [
        StructField(name, kind) for name, kind in ROW[1:]]))
    backend.set_current_key("k")
    with pytest.raises(StateTypeError):
        value.update(bad)
    with pytest.raises(StateTypeError):
        value.update((None, 1.0, "s", None, None, None, None))  # not null


def test_delete_if_exists_raises_sparks_error_on_use(setup):
    handle, backend, _ = setup
    temp = handle.getValueState("temp", N)
    handle.deleteIfExists("temp")
    backend.set_current_key("k")
    with pytest.raises(PySparkRuntimeError, match="Error checking value state exists") as caught:
        temp.exists()
    assert isinstance(caught.value, StateError)


def test_delete_if_exists_removes_the_stored_values_of_every_key(setup):
    handle, backend, _ = setup
    temp, kept = handle.getListState("temp", N), handle.getValueState("kept", N)
    for key in ("a", "b", "c"):
        backend.set_current_key(key)
        temp.appendValue((1,))
        kept.update((2,))
    backend.set_current_key("b")
    handle.deleteIfExists("temp")
    assert list(backend.get_keys("temp")) == []
    assert sorted(backend.get_keys("kept")) == ["a", "b", "c"] and kept.get() == (2,)
    assert backend.get_current_key() == "b"
    fresh = Handle("ProcessingTime", handle.context)  # the next batch declares it again
    again = fresh.getListState("temp", N)
    backend.set_current_key("a")
    assert list(again.get()) == []


def test_handle_misuse_is_refused():
    handle = Handle("None")
    with pytest.raises(StateError, match="ttlDurationMs"):
        handle.getValueState("v", N, 1000)
    with pytest.raises(StateError, match="ttlDurationMs"):
        Handle("ProcessingTime").getListState("v", N, 0)
    with pytest.raises(StateTypeError):
        handle.getMapState("m", K, 12)
    handle.getValueState("v", N)
    with pytest.raises(StateError, match="declared as Value"):
        handle.getListState("v", N)
    with pytest.raises(StateError, match="timeMode"):
        handle.registerTimer(5)
    handle.in_init = False
    with pytest.raises(StateError, match="only possible in init"):
        handle.getValueState("w", N)


def test_query_info_in_the_drivers_check_run_of_init():
    """Spark's driver-side handle answers getQueryInfo() with new ids and batch 0 (its check
    run of ``init`` is not a query's task); statekit's check run of ``init`` does the same."""
    import uuid

    info = Handle("None").getQueryInfo()
    assert info.getBatchId() == 0
    assert isinstance(info.getQueryId(), uuid.UUID) and isinstance(info.getRunId(), uuid.UUID)
    assert str(info) == (f"QueryInfo(queryId={info.getQueryId()}, runId={info.getRunId()}, "
                         "batchId=0)")
    with pytest.raises(StateError, match="outside a Spark task"):
        Handle("None", batch_id=3).getQueryInfo()
