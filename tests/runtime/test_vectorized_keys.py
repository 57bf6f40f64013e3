"""A VectorizedKeyedFunction's current key (``state.get_current_key()``, PyFlink's name) on the
local engine that hands it one key's rows (the test harness); the Spark adapters' are in
tests/spark/test_adapters.py."""

import pandas as pd
import pytest

from statekit import Types, ValueStateDescriptor
from statekit.errors import NoKeyContextError
from statekit.runtime.functions import VectorizedKeyedFunction
from statekit.testing.harness import KeyedOneInputStreamOperatorTestHarness


class Seen(VectorizedKeyedFunction):
    """Counts rows per key through the state handle ``open`` created (the current key's), and
    registers a timer; ``on_timers`` has no current key."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_batch(self, rows, state):
        key = state.get_current_key()
        assert state.get_current_keys() == [key] * len(rows)
        state.timers_of("elsewhere")  # reading another key's timers keeps the current key
        state.register_event_time_timers(["elsewhere"], [100])
        count = (self.count.value() or 0) + len(rows)
        self.count.update(count)
        return pd.DataFrame({"key": [key], "count": [count]})

    def on_timers(self, timers, state):
        with pytest.raises(NoKeyContextError, match="key column"):
            state.get_current_key()
        return pd.DataFrame({"key": timers["key"], "count": [-1] * len(timers)})


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_the_current_key_is_the_rows_key(backend):
    with KeyedOneInputStreamOperatorTestHarness(Seen(), lambda row: row[0], backend=backend
                                                ) as harness:
        for row in [("a", 1), ("b", 2), ("a", 3)]:
            harness.process_element(row)
        harness.process_watermark(200)
        out = [tuple(r) for frame in harness.extract_output_values()
               for r in frame.itertuples(index=False)]
        assert out == [("a", 1), ("b", 1), ("a", 2), ("elsewhere", -1)]
        assert harness.get_state(ValueStateDescriptor("count", Types.LONG()), "a").value() == 2
