"""Reference keyed functions shared by the tests and benchmarks, with their plain answers.

* A per-key running count and sum of column ``v``, per element and vectorized (bulk state access).
* Session windows on timers: a user's session is a run of their events in which no two
  consecutive events (in time order) are more than ``GAP`` apart; it closes ``GAP`` after its
  last event.  :class:`Sessions` keeps each user's open events in a list state and a timer
  ``GAP`` after each event; when a timer fires, every session closed by then is emitted as
  ``(user, start, end, events)``.  :func:`expected_sessions` is the same computation in pandas.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import Any

import pandas as pd

from statekit.runtime.functions import KeyedProcessFunction, RuntimeContext, VectorizedKeyedFunction
from statekit.runtime.timers import TimeDomain
from statekit.serde.types import Types
from statekit.state.descriptors import ListStateDescriptor, ValueStateDescriptor


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


GAP = 30_000  # ms


def split_sessions(times: Iterable[int], gap: int = GAP) -> list[tuple[int, int, int]]:
    """``(start, end, count)`` of the sessions of some event times."""
    sessions: list[list[int]] = []
    for t in sorted(times):
        if sessions and t - sessions[-1][1] <= gap:
            sessions[-1][1] = t
            sessions[-1][2] += 1
        else:
            sessions.append([t, t, 1])
    return [(s, e, c) for s, e, c in sessions]


class Sessions(KeyedProcessFunction):
    """Session windows on timers; ``value`` is ``(user, time, ...)``.

    ``domain`` picks the clock: event time (``ctx.timestamp()``, the watermark closes sessions)
    or processing time (the time is ``current_processing_time()`` when the event arrives).
    """

    def __init__(self, domain: str = "event", gap: int = GAP) -> None:
        self.domain = domain
        self.gap = gap

    def open(self, runtime_context: RuntimeContext) -> None:
        self.events = runtime_context.get_list_state(ListStateDescriptor("events", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterable[Any]:
        timers = ctx.timer_service()
        if self.domain == "event":
            time = ctx.timestamp()
            assert time is not None
            timers.register_event_time_timer(time + self.gap)
        else:
            time = timers.current_processing_time()
            timers.register_processing_time_timer(time + self.gap)
        self.events.add(time)
        return ()

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext
                 ) -> Iterable[Any]:
        assert ctx.time_domain() is (TimeDomain.EVENT_TIME if self.domain == "event"
                                     else TimeDomain.PROCESSING_TIME)
        sessions = split_sessions(self.events.get(), self.gap)
        user = ctx.get_current_key()
        kept: list[int] = []
        for start, end, count in sessions:
            if end + self.gap <= timestamp:
                yield user, start, end, count
            else:
                kept.extend(t for t in self.events.get() if start <= t <= end)
        self.events.update(kept)


def session_events(n: int, users: int, seed: int = 5, disorder: int = 20_000,
                   start: int = 1_700_000_000_000) -> list[tuple[str, int]]:
    """``(user, event time)`` in arrival order: times rise by about a second per event and
    arrive up to ``disorder`` ms out of order; users have bursts and pauses longer than GAP."""
    rng = random.Random(seed)
    out = []
    t = start
    for _ in range(n):
        t += rng.choice((10, 200, 1_000, 2_000, 45_000 if rng.random() < 0.05 else 500))
        out.append((f"u{rng.randrange(users):03d}", t))
    shuffled = sorted(out, key=lambda e: e[1] + rng.randrange(disorder + 1))
    return shuffled


def expected_sessions(events: Iterable[tuple[str, int]], gap: int = GAP
                      ) -> list[tuple[str, int, int, int]]:
    """The sessions of ``(user, time)`` events, computed with pandas (sorted)."""
    frame = pd.DataFrame(list(events), columns=["user", "time"]).sort_values(["user", "time"])
    frame["new"] = frame.groupby("user")["time"].diff().fillna(gap + 1) > gap
    frame["session"] = frame.groupby("user")["new"].cumsum()
    grouped = frame.groupby(["user", "session"])["time"].agg(["min", "max", "count"]).reset_index()
    return sorted((u, int(s), int(e), int(c)) for u, s, e, c in
                  grouped[["user", "min", "max", "count"]].itertuples(index=False))
