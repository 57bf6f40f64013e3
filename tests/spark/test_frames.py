"""The per-key adapters' pandas helpers build exactly the frames pandas builds."""

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from statekit.spark.frames import frame_rows, key_chunks, key_rows, rows_frame

CASES = [
    [("k1", 1, 2), ("k2", 3, 4)],
    [("k1", 1.5, True), ("k2", 2, False)],
    [("k1", None, 2)],
    [("k1", True, 1), ("k2", 2, 1)],              # bool and int: pandas keeps objects
    [("k1", "a", 1), ("k2", 2, 1)],               # str and int
    [(b"x", 2**70, 1)],                            # beyond int64
    [("k1", dt.datetime(2024, 1, 1), dt.date(2024, 1, 2))],
    [("k1", np.int64(3), 1.0)],
    [("k1", float("nan"), -(2**63))],
]


@pytest.mark.parametrize("rows", CASES)
def test_rows_frame_equals_pandas(rows):
    columns = ["a", "b", "c"]
    pd.testing.assert_frame_equal(rows_frame(rows, columns), pd.DataFrame(rows, columns=columns))


def test_rows_frame_leaves_malformed_input_to_pandas():
    with pytest.raises(ValueError):
        rows_frame([("k1", 1)], ["a", "b", "c"])
    dup = ["a", "a"]
    pd.testing.assert_frame_equal(rows_frame([(1, 2)], dup), pd.DataFrame([(1, 2)], columns=dup))
    pd.testing.assert_frame_equal(rows_frame([], ["a"]), pd.DataFrame([], columns=["a"]))


def test_frame_rows_equal_itertuples():
    frame = pd.DataFrame({"key": ["a", "b"], "v": np.array([1, 2], dtype="int64"),
                          "f": [0.5, None], "t": pd.to_datetime(["2024-01-01", "2024-01-02"])})
    expected = list(frame.itertuples(index=False, name=None))
    got = frame_rows(frame)
    assert repr(got) == repr(expected)  # nan != nan
    assert [tuple(map(type, r)) for r in got] == [tuple(map(type, r)) for r in expected]
    extension = pd.DataFrame({"a": pd.array([1, None], dtype="Int64"), "b": pd.Categorical(["x", "y"]),
                              "d": pd.array(["s", None], dtype="string")})
    assert repr(frame_rows(extension)) == repr(list(extension.itertuples(index=False, name=None)))
    dup = pd.DataFrame([[1, 2]], columns=["a", "a"])
    assert frame_rows(dup) == list(dup.itertuples(index=False, name=None))


# PySpark's own per-key chunk generators, as its worker defines them (same names, same file name)
_PYSPARK_WORKER = '''
def read_udfs(value_offsets):
    import pandas as pd

    def apply_udf_to_group(value_series_gen):
        return (pd.concat(x, axis=1) for x in value_series_gen)

    def transform_with_state_func(group):
        return (df.iloc[:, value_offsets] for _, df in group)

    return apply_udf_to_group, transform_with_state_func
'''


def _pyspark_generators(offsets):
    namespace = {}
    exec(compile(_PYSPARK_WORKER, "/venv/site-packages/pyspark/worker.py", "exec"), namespace)
    return namespace["read_udfs"](offsets)


def _chunks():
    return [pd.DataFrame({"key": ["a", "a"], "v": np.array([1, 2], dtype="int64"), "f": [0.5, 1.5]}),
            pd.DataFrame({"key": ["a"], "v": np.array([3], dtype="int64"), "f": [2.5]}),
            pd.DataFrame({"key": ["a"], "v": pd.array([4], dtype="Int64"), "f": [None]})]


def test_key_chunks_read_pyspark_generators_at_their_source(monkeypatch):
    concat, iloc = _pyspark_generators([2, 0])
    expected = [frame_rows(c) for c in _chunks()]
    series = [[c[name] for name in c.columns] for c in _chunks()]
    built = []
    real_concat = pd.concat
    monkeypatch.setattr(pd, "concat", lambda *a, **k: built.append(1) or real_concat(*a, **k))
    assert repr(list(key_chunks(concat(iter(series))))) == repr(expected)
    assert not built  # the nullable column is read as pandas iterates it, no DataFrame built
    assert repr(list(key_rows(concat(iter(series))))) == repr([r for rows in expected for r in rows])
    picked = [frame_rows(c.iloc[:, [2, 0]]) for c in _chunks()]
    assert repr(list(key_chunks(iloc(iter([("a", c) for c in _chunks()]))))) == repr(picked)


def test_key_chunks_iterate_anything_else_as_given():
    concat, _ = _pyspark_generators([0])
    started = concat(iter([[c[n] for n in c.columns] for c in _chunks()]))
    first = next(started)
    assert repr(list(key_chunks(started))) == repr([frame_rows(c) for c in _chunks()[1:]])
    assert frame_rows(first) == frame_rows(_chunks()[0])
    assert list(key_rows(iter(_chunks()[:1]))) == frame_rows(_chunks()[0])


def test_pyspark_worker_still_builds_the_chunks_it_is_read_for():
    """The adapters read PySpark's chunk generators at their source (a speed-up only: anything
    else is iterated as given); a PySpark that builds them otherwise shows here."""
    import types

    import pyspark.worker

    def walk(code):
        yield code
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from walk(const)

    with open(pyspark.worker.__file__) as fh:
        code = compile(fh.read(), pyspark.worker.__file__, "exec")
    found = {(c.co_qualname, c.co_names) for c in walk(code)}
    assert ("read_udfs.<locals>.apply_udf_to_group.<locals>.<genexpr>", ("concat",)) in found
    assert ("read_udfs.<locals>.transform_with_state_func.<locals>.<genexpr>", ("iloc",)) in found


def test_transform_with_state_tasks_send_no_implicit_keys():
    """The installed PySpark's handle still holds the client whose per-key ``set_implicit_key``
    (a socket round trip to the JVM) the adapter's processor replaces; the other client methods
    stay PySpark's own."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessorHandle
    from pyspark.sql.streaming.stateful_processor_api_client import StatefulProcessorApiClient

    from statekit.spark.transform import _patch_client

    client = object.__new__(StatefulProcessorApiClient)  # no JVM socket: any request would fail
    with pytest.raises(AttributeError):
        client.set_implicit_key(("k1",))
    _patch_client(StatefulProcessorHandle(client), None, "None")
    assert client.set_implicit_key(("k1",)) is None
    assert type(client).set_implicit_key is StatefulProcessorApiClient.set_implicit_key
    _patch_client(object(), None, "None")  # another PySpark's handle: left as it is


def test_transform_with_state_timer_phase_asks_the_client():
    """The installed PySpark's timer phase takes expired timers from the client's
    ``get_expiry_timers_iterator`` and ends on StopIteration, and removes each with
    ``delete_timer``: what the adapter's patched client answers with statekit's own timers."""
    import inspect

    from pyspark.sql.streaming import stateful_processor_util as util
    from pyspark.sql.streaming.stateful_processor_api_client import ExpiredTimerIterator

    phase = inspect.getsource(util.TransformWithStateInPandasUdfUtils._handle_expired_timers)
    assert "ExpiredTimerIterator(" in phase and "delete_timer(" in phase
    assert "get_timestamps(" in phase and "handleExpiredTimer(" in phase
    assert "get_expiry_timers_iterator(" in inspect.getsource(ExpiredTimerIterator.__next__)


@pytest.mark.parametrize("ts", [
    pd.to_datetime([1_000, 2_000], unit="ms"),
    pd.to_datetime([1_000, None], unit="ms", utc=True),
    pd.to_timedelta([1, 2], unit="s"),
])
def test_key_chunks_keep_timestamps_as_pandas_gives_them(monkeypatch, ts):
    """A timestamp column reaches the function as pandas Timestamps, as pandas' own iteration
    gives them (its numpy values' ``tolist()`` would give nanoseconds as ints), and is read
    without building the chunk's DataFrame: every event-time query has such a column (the one
    ``withWatermark`` names), and building a small DataFrame per key cost more than the key's
    work (the adapter's session benchmark ran slower than Spark's own processor)."""
    concat, iloc = _pyspark_generators([1, 0])
    chunk = pd.DataFrame({"key": ["a", "a"], "ts": ts})
    expected = list(chunk.itertuples(index=False, name=None))
    picked = list(chunk.iloc[:, [1, 0]].itertuples(index=False, name=None))
    series = [[chunk[name] for name in chunk.columns]]
    built = []
    real_concat, real_iloc = pd.concat, pd.DataFrame.iloc
    monkeypatch.setattr(pd, "concat", lambda *a, **k: built.append(1) or real_concat(*a, **k))
    monkeypatch.setattr(pd.DataFrame, "iloc",
                        property(lambda self: built.append(1) or real_iloc.fget(self)))
    assert repr(list(key_rows(concat(iter(series))))) == repr(expected)
    assert repr(list(key_rows(iloc(iter([("a", chunk)]))))) == repr(picked)
    assert repr(frame_rows(chunk)) == repr(expected)
    assert not built
