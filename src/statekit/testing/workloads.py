"""Reference keyed functions shared by the Spark end-to-end tests and benchmarks: a per-key running
count and sum of column ``v``, per element and vectorized (bulk state access)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd

from statekit.runtime.functions import KeyedProcessFunction, VectorizedKeyedFunction
from statekit.serde.types import Types
from statekit.state.descriptors import ValueStateDescriptor


class RunningCount(KeyedProcessFunction):
    """Per-key running count and sum, one output row ``(key, count, sum)`` per input row."""

    def open(self, ctx: Any) -> None:
        self.c = ctx.get_state(ValueStateDescriptor("c", Types.LONG()))
        self.t = ctx.get_state(ValueStateDescriptor("t", Types.LONG()))

    def process_element(self, row: Any, ctx: Any) -> Iterator[Any]:
        c = (self.c.value() or 0) + 1
        t = (self.t.value() or 0) + row[1]
        self.c.update(c)
        self.t.update(t)
        yield ctx.get_current_key(), c, t


class VectorCount(VectorizedKeyedFunction):
    """The same aggregate, once per batch with bulk state access; one row per updated key."""

    def open(self, ctx: Any) -> None:
        self.c = ValueStateDescriptor("c", Types.LONG())
        self.t = ValueStateDescriptor("t", Types.LONG())
        ctx.get_state(self.c)  # registered up front, as the applyInPandasWithState adapter needs
        ctx.get_state(self.t)

    def process_batch(self, rows: pd.DataFrame, state: Any) -> pd.DataFrame:
        agg = rows.groupby("key", sort=False)["v"].agg(["size", "sum"])
        keys = agg.index.tolist()
        counts = [(p or 0) + n for p, n in zip(state.get(self.c, keys), agg["size"].tolist(), strict=True)]
        totals = [(p or 0) + s for p, s in zip(state.get(self.t, keys), agg["sum"].tolist(), strict=True)]
        state.put(self.c, keys, counts)
        state.put(self.t, keys, totals)
        return pd.DataFrame({"key": keys, "c": counts, "t": totals})
