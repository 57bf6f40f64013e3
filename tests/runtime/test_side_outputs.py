"""Side outputs on the local runner (PyFlink's OutputTag cases of test_data_stream.py): values
yielded as ``(tag, value)`` go to the tag's output, committed exactly once with the main output
(also across a failure and restart), collected or sunk in the same run; on Spark a tag in the
output is a typed error."""

from __future__ import annotations

import pytest

from statekit import KeyedProcessFunction, OutputTag
from statekit.errors import StateError
from statekit.runtime.functions import side_output_of
from tests.runtime.envs import env_for

LATE = OutputTag("late")
EVEN = OutputTag("even")


class Split(KeyedProcessFunction):
    """Main output: odd values; even values to EVEN, values over 100 to LATE as (key, value)."""

    fail_at: int | None = None  # a class attribute: each attempt runs copies of the function

    def process_element(self, value, ctx):
        key, n = value
        if n == type(self).fail_at:
            type(self).fail_at = None  # once: the restarted attempt goes on
            raise RuntimeError("boom")
        if n > 100:
            yield LATE, (key, n)
        elif n % 2 == 0:
            yield EVEN, n
        else:
            yield key, n


ROWS = [("a", 1), ("b", 2), ("a", 3), ("b", 4), ("a", 150), ("b", 5), ("a", 6), ("b", 200)]



@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_side_outputs_are_collected_with_the_main_output(tmp_path, backend):
    result = (env_for(tmp_path, backend).from_collection(ROWS).key_by(lambda r: r[0])
              .process(Split()).execute_and_collect())
    assert sorted(result) == [("a", 1), ("a", 3), ("b", 5)]
    assert sorted(result.get_side_output(EVEN)) == [2, 4, 6]
    assert sorted(result.get_side_output(OutputTag("late"))) == [("a", 150), ("b", 200)]
    assert result.get_side_output(OutputTag("none")) == []


def test_side_outputs_exactly_once_across_a_restart(tmp_path):
    env = env_for(tmp_path, **{"execution.checkpointing.interval": "10 ms",
                               "restart-strategy.type": "fixed-delay",
                               "restart-strategy.fixed-delay.attempts": "3",
                               "restart-strategy.fixed-delay.delay": "0 ms"})
    class FailOnce(Split):
        fail_at = 5

    result = env.from_collection(ROWS).key_by(lambda r: r[0]).process(
        FailOnce()).execute_and_collect()
    assert result.restarts == 1
    assert sorted(result) == [("a", 1), ("a", 3), ("b", 5)]
    assert sorted(result.get_side_output(EVEN)) == [2, 4, 6]
    assert sorted(result.get_side_output(LATE)) == [("a", 150), ("b", 200)]


def test_side_output_streams_collect_and_sink_in_one_run(tmp_path):
    env = env_for(tmp_path)
    main = env.from_collection(ROWS).key_by(lambda r: r[0]).process(Split())
    assert sorted(main.get_side_output(EVEN).execute_and_collect()) == [2, 4, 6]
    got: dict[str, list] = {"main": [], "late": []}
    main = env.from_collection(ROWS).key_by(lambda r: r[0]).process(Split())
    main.add_sink(got["main"].append)
    main.get_side_output(LATE).add_sink(got["late"].append)
    results = env.execute()
    assert len(results) == 1  # the main stream and its side output: one job
    assert sorted(got["main"]) == [("a", 1), ("a", 3), ("b", 5)]
    assert sorted(got["late"]) == [("a", 150), ("b", 200)]
    only_side: list = []
    stream = env.from_collection(ROWS).key_by(lambda r: r[0]).process(Split())
    stream.get_side_output(EVEN).add_sink(only_side.append)
    assert len(env.execute()) == 1 and sorted(only_side) == [2, 4, 6]


def test_tags_are_checked_and_compared_by_id():
    assert OutputTag("x") == OutputTag("x") and OutputTag("x") != OutputTag("y")
    assert side_output_of((OutputTag("x"), 1)) == OutputTag("x")
    assert side_output_of(("x", 1)) is None and side_output_of((OutputTag("x"), 1, 2)) is None
    with pytest.raises(TypeError, match="string id"):
        OutputTag("")


def test_on_spark_a_side_output_is_a_typed_error():
    from statekit.spark.frames import rows_frame

    with pytest.raises(StateError, match="side output 'even'"):
        rows_frame([("a", 1), (EVEN, 2)], ["key", "n"])
    assert list(rows_frame([("a", 1)], ["key", "n"])["n"]) == [1]
