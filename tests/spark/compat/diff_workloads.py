"""The user code of the differential runs, written against Spark's own APIs only (no statekit):
each workload's input files, and the processor or function Spark and statekit both run.

Input rows are ``(k string, v long, ms long)``; ``ts`` (``ms`` as a timestamp) is added for the
watermark.  Processing time: ``PERIOD`` ms is the short TTL and the session gap; the driver
lets more than that pass between files, so every decision on time is made far from its boundary.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.streaming.state import GroupStateTimeout

PERIOD = 4_000  # ms: the short TTL and the processing-time session gap
LONG_TTL = 3_600_000  # ms: a TTL no run reaches
GAP = 30_000  # ms: event-time session gap
DELAY = "25 seconds"  # the watermark's delay, more than the input's disorder
T0 = 1_700_000_000_000
TICK = "~tick"


def rows_of(index: int, keys: int = 6, rows: int = 24) -> list[tuple[str, int, int]]:
    """File ``index``: up to ``rows`` rows over ``keys`` keys (every key in every file), event
    times of minute ``index`` up to 20 s out of order."""
    out = []
    for j in range(rows):
        key = (index * 5 + j * 3) % (keys + 1)  # every key but one per file
        if key == keys:
            continue
        ms = T0 + index * 60_000 + (j * 37_003 + index * 11_000) % 60_000 - (j % 3) * 7_000
        out.append((f"k{key}", index * 100 + j, ms))
    return out


def tick_rows(index: int) -> list[tuple[str, int, int]]:
    """A row far ahead in event time: the watermark passes every session before it."""
    return [(TICK, index * 100, T0 + (index + 10) * 60_000)]


# --- running count ------------------------------------------------------------------------------


class RunningCount(StatefulProcessor):
    """Count and sum of ``v`` per key in a value state."""

    def init(self, handle: Any) -> None:
        self.state = handle.getValueState("ct", "c long, t long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
                        ) -> Iterator[pd.DataFrame]:
        c, t = self.state.get() or (0, 0)
        for frame in rows:
            c += len(frame)
            t += int(frame["v"].sum())
        self.state.update((c, t))
        yield pd.DataFrame({"k": [key[0]], "c": [c], "t": [t]})

    def close(self) -> None:
        pass


class RunningCountWithInitialState(RunningCount):
    """The running count, starting from an initial count per key."""

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
        self.state.update((int(initialState["c0"].sum()), int(initialState["t0"].sum())))


def count_fn(key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any
             ) -> Iterator[pd.DataFrame]:
    """The running count as an ``applyInPandasWithState`` function."""
    c, t = state.get if state.exists else (0, 0)
    for frame in pdfs:
        c += len(frame)
        t += int(frame["v"].sum())
    state.update((c, t))
    yield pd.DataFrame({"k": [key[0]], "c": [c], "t": [t]})


# --- list and map state with TTL ----------------------------------------------------------------


class TtlLists(StatefulProcessor):
    """Per key: the recent ``v`` values in a list state and counts per ``v % 3`` in a map state
    with the short TTL (gone by the next file), and the same with ``LONG_TTL`` (kept); a total
    without TTL.  A list longer than 3 is cut to its last 2 with ``put``."""

    def init(self, handle: Any) -> None:
        self.recent = handle.getListState("recent", "v long", PERIOD)
        self.buckets = handle.getMapState("buckets", "b long", "n long", PERIOD)
        self.kept = handle.getListState("kept", "v long", LONG_TTL)
        self.kept_buckets = handle.getMapState("keptBuckets", "b long", "n long", LONG_TTL)
        self.total = handle.getValueState("total", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
                        ) -> Iterator[pd.DataFrame]:
        values = [int(v) for frame in rows for v in frame["v"].tolist()]
        out: dict[str, list[str]] = {"k": [key[0]]}
        for name, lst, buckets in (("recent", self.recent, self.buckets),
                                   ("kept", self.kept, self.kept_buckets)):
            for v in values:
                lst.appendValue((v,))
                n = buckets.getValue((v % 3,))
                buckets.updateValue((v % 3,), ((n[0] if n else 0) + 1,))
            held = [r[0] for r in lst.get()]
            if len(held) > 3:
                held = held[-2:]
                lst.put([(v,) for v in held])
            out[name] = [str(held)]
            out[f"{name}Buckets"] = [str(sorted((b[0], n[0]) for b, n in buckets.iterator()))]
        total = (self.total.get() or (0,))[0] + len(values)
        self.total.update((total,))
        yield pd.DataFrame({**out, "total": [total]})

    def close(self) -> None:
        pass


# --- sessions -----------------------------------------------------------------------------------


def _sessions(times: list[int], gap: int) -> list[tuple[int, int, int]]:
    """(start, end, events) of the sessions ``times`` form with ``gap``."""
    out: list[tuple[int, int, int]] = []
    for t in sorted(times):
        if out and t - out[-1][1] < gap:
            start, _, n = out[-1]
            out[-1] = (start, t, n + 1)
        else:
            out.append((t, t, 1))
    return out


class ProcessingTimeSessions(StatefulProcessor):
    """A session per key closes ``PERIOD`` after its last input (a processing-time timer, moved
    on every input); it emits how many events it had and the first and last ``v``."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.values = handle.getListState("values", "v long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
                        ) -> Iterator[pd.DataFrame]:
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        self.values.appendList([(int(v),) for frame in rows for v in frame["v"].tolist()])
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + PERIOD)
        return iter(())

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any
                           ) -> Iterator[pd.DataFrame]:
        values = [r[0] for r in self.values.get()]
        self.values.clear()
        yield pd.DataFrame({"k": [key[0]], "events": [len(values)], "first": [values[0]],
                            "last": [values[-1]]})

    def close(self) -> None:
        pass


class EventTimeSessions(StatefulProcessor):
    """Event-time sessions with ``GAP``: the open event times in a list state, a timer ``GAP``
    after each; a firing timer emits the sessions that ended before it."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.times = handle.getListState("times", "ms long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
                        ) -> Iterator[pd.DataFrame]:
        times = [int(t) for frame in rows for t in frame["ms"].tolist()]
        for t in sorted(set(times)):
            self.handle.registerTimer(t + GAP)
        self.times.appendList([(t,) for t in times])
        return iter(())

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any
                           ) -> Iterator[pd.DataFrame]:
        expiry = expiredTimerInfo.getExpiryTimeInMs()
        times = [r[0] for r in self.times.get()]
        out, kept = [], []
        for start, end, n in _sessions(times, GAP):
            if end + GAP <= expiry:
                out.append((key[0], start, end, n))
            else:
                kept += [t for t in times if start <= t <= end]
        if kept:
            self.times.put([(t,) for t in kept])
        else:
            self.times.clear()
        if out:
            yield pd.DataFrame(out, columns=["k", "start", "end", "events"])

    def close(self) -> None:
        pass


def event_sessions_fn(key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any
                      ) -> Iterator[pd.DataFrame]:
    """Event-time sessions as an ``applyInPandasWithState`` function (``EventTimeTimeout``):
    sessions that ended ``GAP`` before the watermark are emitted, the timeout set to when the
    last open one ends."""
    times = [int(t) for t in state.get[0].split()] if state.exists else []
    times += [int(t) for frame in pdfs for t in frame["ms"].tolist()]
    watermark = state.getCurrentWatermarkMs()
    out, kept = [], []
    for start, end, n in _sessions(times, GAP):
        if end + GAP <= watermark:
            out.append((key[0], start, end, n))
        else:
            kept += [t for t in times if start <= t <= end]
    if kept:
        state.update((" ".join(map(str, kept)),))
        state.setTimeoutTimestamp(max(kept) + GAP)
    elif state.exists:
        state.remove()
    if out:
        yield pd.DataFrame(out, columns=["k", "start", "end", "events"])


# --- the workloads --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """A query's user code: which API, its output, its time."""

    api: str  # "tws" (transformWithStateInPandas) or "aipws" (applyInPandasWithState)
    user: Any  # processor class or function
    output: str
    time: str = "None"  # "None", "ProcessingTime" or "EventTime"
    state: str = ""  # aipws: stateStructType
    initial: bool = False  # tws: an initial state

    def define(self, spark: Any, source: Any) -> Any:
        """The query's DataFrame over ``source``, as the user writes it."""
        if self.time == "EventTime":
            source = source.withWatermark("ts", DELAY)
        grouped = source.groupBy("k")
        if self.api == "aipws":
            timeout = (GroupStateTimeout.EventTimeTimeout if self.time == "EventTime"
                       else GroupStateTimeout.NoTimeout)
            return grouped.applyInPandasWithState(self.user, self.output, self.state, "update",
                                                  timeout)
        initial = None
        if self.initial:
            initial = spark.createDataFrame(
                [(f"k{i}", i, 10 * i) for i in range(0, 8, 2)], "k string, c0 long, t0 long"
            ).groupBy("k")
        return grouped.transformWithStateInPandas(self.user(), self.output, "Update", self.time,
                                                  initialState=initial)


COUNT_OUT = "k string, c long, t long"
SESSION_OUT = "k string, start long, end long, events long"
WORKLOADS = {
    "count_tws": Workload("tws", RunningCount, COUNT_OUT),
    "count_aipws": Workload("aipws", count_fn, COUNT_OUT, state="c long, t long"),
    "initial_tws": Workload("tws", RunningCountWithInitialState, COUNT_OUT, initial=True),
    "ttl_tws": Workload("tws", TtlLists, "k string, recent string, recentBuckets string, "
                        "kept string, keptBuckets string, total long", time="ProcessingTime"),
    "psession_tws": Workload("tws", ProcessingTimeSessions,
                             "k string, events long, first long, last long",
                             time="ProcessingTime"),
    "esession_tws": Workload("tws", EventTimeSessions, SESSION_OUT, time="EventTime"),
    "esession_aipws": Workload("aipws", event_sessions_fn, SESSION_OUT, time="EventTime",
                               state="times string"),
}
