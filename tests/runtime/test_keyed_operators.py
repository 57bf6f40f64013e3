"""PyFlink's KeyedStream operators beyond process/map/flat_map on the local runner: reduce,
filter and the rolling aggregations (cases of PyFlink's test_data_stream.py, single stage: the
local runner runs one keyed operator per job), on both backends, across a savepoint."""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import pytest

from statekit import FilterFunction
from statekit.errors import JobExecutionError
from statekit.state import ReduceFunction, ValueStateDescriptor
from tests.runtime.envs import env_for

BACKENDS = ["hashmap", "rocksdb"]


def by_key(out, key):
    """Outputs per key in order (the runner's partitions interleave keys, never reorder one)."""
    grouped = defaultdict(list)
    for value in out:
        grouped[key(value)].append(value)
    return dict(grouped)


@pytest.mark.parametrize("backend", BACKENDS)
def test_keyed_sum_of_a_named_field_a_position_and_a_basic_value(tmp_path, backend):
    rows = [{"v1": 1, "v2": 1}, {"v1": 1, "v2": 2}, {"v1": 1, "v2": 3}, {"v1": 2, "v2": 5},
            {"v1": 2, "v2": 1}]
    out = env_for(tmp_path, backend).from_collection(rows).key_by(lambda x: x["v1"]).sum("v2")
    assert by_key(out.execute_and_collect(), lambda r: r["v1"]) == {
        1: [{"v1": 1, "v2": 1}, {"v1": 1, "v2": 3}, {"v1": 1, "v2": 6}],
        2: [{"v1": 2, "v2": 5}, {"v1": 2, "v2": 6}]}
    tuples = [(1, 1), (1, 2), (5, 1), (5, 5)]
    out = env_for(tmp_path / "t", backend).from_collection(tuples).key_by(lambda x: x[0]).sum(1)
    assert sorted(out.execute_and_collect()) == [(1, 1), (1, 3), (5, 1), (5, 6)]
    basic = env_for(tmp_path / "b", backend).from_collection([1, 2, 3, 4]).key_by(lambda x: x % 2)
    assert sorted(basic.sum().execute_and_collect()) == [1, 2, 4, 6]


@pytest.mark.parametrize("backend", BACKENDS)
def test_keyed_min_max_and_by(tmp_path, backend):
    rows = [("a", 3, 0), ("a", 1, 1), ("b", 5, 0), ("b", 3, 1), ("b", 3, 2)]

    def run(op, position):
        env = env_for(tmp_path / f"{op}{position}", backend)
        stream = getattr(env.from_collection(rows).key_by(lambda x: x[0]), op)(position)
        return by_key(stream.execute_and_collect(), lambda r: r[0])

    # min/max: the first element with only the field replaced
    assert run("min", 1) == {"a": [("a", 3, 0), ("a", 1, 0)],
                             "b": [("b", 5, 0), ("b", 3, 0), ("b", 3, 0)]}
    assert run("max", 2) == {"a": [("a", 3, 0), ("a", 3, 1)],
                             "b": [("b", 5, 0), ("b", 5, 1), ("b", 5, 2)]}
    # min_by/max_by: the whole element holding the extreme, the first one on ties
    assert run("min_by", 1) == {"a": [("a", 3, 0), ("a", 1, 1)],
                                "b": [("b", 5, 0), ("b", 3, 1), ("b", 3, 1)]}
    assert run("max_by", 1) == {"a": [("a", 3, 0), ("a", 3, 0)],
                                "b": [("b", 5, 0), ("b", 5, 0), ("b", 5, 0)]}


class Point(NamedTuple):
    k: str
    v: int


def test_named_fields_of_a_namedtuple_keep_its_type(tmp_path):
    env = env_for(tmp_path, "hashmap")
    rows = [Point("a", 2), Point("a", 5)]
    out = list(env.from_collection(rows).key_by(lambda p: p.k).max_by("v").execute_and_collect())
    assert out == [Point("a", 2), Point("a", 5)] and all(type(p) is Point for p in out)


class Concat(ReduceFunction):
    def reduce(self, value1, value2):
        return (value1[0], value1[1] + value2[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_reduce_continues_from_a_savepoint(tmp_path, backend):
    rows = [("a", "x"), ("b", "y"), ("a", "z"), ("b", "w"), ("a", "q")]
    first = (env_for(tmp_path, backend).from_collection(rows[:3]).key_by(lambda r: r[0])
             .reduce(Concat()).execute_and_collect(savepoint_dir=f"{tmp_path}/sp"))
    # the resumed job reads the same source from the position the savepoint recorded
    assert sorted(first) == [("a", "x"), ("a", "xz"), ("b", "y")]
    env = env_for(tmp_path, backend, **{"execution.savepoint.path": first.savepoint_path})
    rest = env.from_collection(rows).key_by(lambda r: r[0]).reduce(
        lambda a, b: (a[0], a[1] + b[1])).execute_and_collect()
    assert sorted(rest) == [("a", "xzq"), ("b", "yw")]


class AtMostTwice(FilterFunction):
    """A rich filter with keyed state: the first two elements of each key pass."""

    def open(self, runtime_context):
        self.seen = runtime_context.get_state(ValueStateDescriptor("seen"))

    def filter(self, value):
        n = (self.seen.value() or 0) + 1
        self.seen.update(n)
        return n <= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_keyed_filter_plain_and_rich(tmp_path, backend):
    rows = [("a", 1), ("a", 2), ("b", 3), ("a", 4), ("b", 5), ("b", 6)]
    keyed = env_for(tmp_path, backend).from_collection(rows).key_by(lambda r: r[0])
    assert sorted(keyed.filter(lambda r: r[1] % 2 == 0).execute_and_collect()) == [
        ("a", 2), ("a", 4), ("b", 6)]
    keyed = env_for(tmp_path / "rich", backend).from_collection(rows).key_by(lambda r: r[0])
    assert sorted(keyed.filter(AtMostTwice()).execute_and_collect()) == [
        ("a", 1), ("a", 2), ("b", 3), ("b", 5)]


def test_bad_positions_and_functions_are_refused_as_pyflink_does(tmp_path):
    keyed = env_for(tmp_path, "hashmap").from_collection([1, 3]).key_by(lambda x: x % 2)
    with pytest.raises(JobExecutionError, match="field 1 selected on a basic value") as info:
        keyed.sum(1).execute_and_collect()  # at the key's second element, as in PyFlink
    assert isinstance(info.value.__cause__, TypeError)
    with pytest.raises(TypeError, match="field index"):
        keyed.sum(1.5)
    with pytest.raises(TypeError, match="ReduceFunction"):
        keyed.reduce(42)
    with pytest.raises(TypeError, match="FilterFunction"):
        keyed.filter("x")
