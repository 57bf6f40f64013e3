"""The per-key adapters' pandas helpers build exactly the frames pandas builds."""

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from statekit.spark.frames import frame_rows, rows_frame

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
