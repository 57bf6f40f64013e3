"""A stateful query written for Spark's own APIs (a StatefulProcessor with value, list and map
state and event-time timers; an applyInPandasWithState function with an event-time timeout),
and the input and runs the state-import tests share.  In a module so Spark's workers import it."""

import os
import shutil

import pandas as pd
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.streaming.state import GroupStateTimeout

GAP_MS = 25_000
OUTPUT = "user string, n long, items long, total long"


class Sessions(StatefulProcessor):
    """Per user: events so far (value), the batches' sizes (list), events per kind (map); a
    user quiet for GAP_MS of event time is reported with -1 and forgotten (an event-time
    timer)."""

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.sizes = handle.getListState("sizes", "size int")
        self.kinds = handle.getMapState("kinds", "kind string", "n long")

    def handleInputRows(self, key, rows, timerValues):
        frames = list(rows)
        events = pd.concat(frames)
        n = (self.count.get() or (0,))[0] + len(events)
        self.count.update((n,))
        self.sizes.appendValue((len(events),))
        for kind, group in events.groupby("kind"):
            old = self.kinds.getValue((kind,))
            self.kinds.updateValue((kind,), ((old[0] if old else 0) + len(group),))
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        last = int(events["ts"].max().timestamp() * 1000)
        self.handle.registerTimer(last + GAP_MS)
        yield self._row(key, n)

    def _totals(self):
        return (sum(s[0] for s in self.sizes.get()),
                sum(v[0] for _, v in self.kinds.iterator()))

    def _row(self, key, n):
        items, total = self._totals()
        return pd.DataFrame({"user": [key[0]], "n": [n], "items": [items], "total": [total]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        out = self._row(key, -1)
        self.count.clear()
        self.sizes.clear()
        self.kinds.clear()
        yield out


TTL_MS = 86_400_000  # a day of processing time: kept through the test, carried by the import


class RowSessions(Sessions):
    """The Row API (``transformWithState``) in processing time, with TTL: per user, events so far
    (value, TTL), the batches' sizes (list), events per kind (map, TTL), and a processing-time
    timer a day ahead (kept, not fired, through the test); expiry as :class:`Sessions`."""

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "n long", TTL_MS)
        self.sizes = handle.getListState("sizes", "size int")
        self.kinds = handle.getMapState("kinds", "kind string", "n long", TTL_MS)

    def handleInputRows(self, key, rows, timerValues):
        events = list(rows)
        n = (self.count.get() or (0,))[0] + len(events)
        self.count.update((n,))
        self.sizes.appendValue((len(events),))
        for kind in sorted({e.kind for e in events}):
            old = self.kinds.getValue((kind,))
            self.kinds.updateValue((kind,), ((old[0] if old else 0)
                                             + sum(e.kind == kind for e in events),))
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + TTL_MS)
        yield self._row(key, n)

    def _row(self, key, n):
        items, total = self._totals()
        return Row(user=key[0], n=n, items=items, total=total)


def visits(key, pdf_iter, state):
    """Per user: events and kinds seen; a user quiet for GAP_MS is reported with -1."""
    if state.hasTimedOut:
        n, kinds = state.get
        state.remove()
        yield pd.DataFrame({"user": [key[0]], "n": [-1], "items": [n], "total": [kinds]})
        return
    events = pd.concat(list(pdf_iter))
    n, kinds = state.getOption or (0, 0)
    n, kinds = n + len(events), kinds + events["kind"].nunique()
    state.update((n, kinds))
    state.setTimeoutTimestamp(int(events["ts"].max().timestamp() * 1000) + GAP_MS)
    yield pd.DataFrame({"user": [key[0]], "n": [n], "items": [n], "total": [kinds]})


VISITS_STATE = "n long, kinds long"


def batch_frame(batch, users=None):
    """Batch ``batch``'s events: k0-k3 every batch, k4 until batch 3 (timed out after the
    import), k5 until batch 6 (timed out after it), k6 from batch 7 (new after it)."""
    if users is None:
        users = ["k0", "k1", "k2", "k3"]
        users += ["k4"] if batch <= 3 else []
        users += ["k5"] if batch <= 6 else []
        users += ["k6"] if batch >= 7 else []
    rows = [(u, "ab"[(batch + i) % 2], batch * 10_000 + i) for i, u in enumerate(users)
            for _ in range(1 + (i + batch) % 3)]
    frame = pd.DataFrame(rows, columns=["user", "kind", "ms"])
    frame["ts"] = pd.to_datetime(frame.pop("ms"), unit="ms").astype("datetime64[us]")
    return frame


def write_batches(directory, batches, frame=batch_frame):
    os.makedirs(directory, exist_ok=True)
    for batch in batches:
        frame(batch).to_parquet(f"{directory}/part-{batch:05d}.parquet")


def events(spark, directory):
    return (spark.readStream.schema("user string, kind string, ts timestamp")
            .option("maxFilesPerTrigger", 1).parquet(directory)
            .withWatermark("ts", "0 seconds"))


def run(spark, api, directory, checkpoint):
    """The query, native or switched (the same code either way); its output rows."""
    out = []
    grouped = events(spark, directory).groupBy("user")
    if api == "pandas":
        df = grouped.transformWithStateInPandas(Sessions(), OUTPUT, "Update", "EventTime")
    elif api == "apply":
        df = grouped.applyInPandasWithState(visits, OUTPUT, VISITS_STATE, "update",
                                            GroupStateTimeout.EventTimeTimeout)
    elif api == "row":
        df = grouped.transformWithState(RowSessions(), OUTPUT, "Update", "ProcessingTime")
    elif api == "pandas-light":
        df = grouped.transformWithStateInPandas(Counts(), OUTPUT, "Update", "EventTime")
    else:
        df = grouped.applyInPandasWithState(count_visits, OUTPUT, "n long", "update",
                                            GroupStateTimeout.NoTimeout)
    writer = (df.writeStream.outputMode("update")
              .foreachBatch(lambda frame, _: out.extend(tuple(r) for r in frame.collect()))
              .option("checkpointLocation", checkpoint))
    if api != "row":
        writer.trigger(availableNow=True).start().awaitTermination()
        return out
    # in processing time Spark runs an empty batch every trigger (its TTL clean-up), so neither
    # availableNow nor processAllAvailable ends: stop at the first empty batch after the data
    query = writer.trigger(processingTime="200 milliseconds").start()
    try:
        while True:
            query.awaitTermination(1)
            rows = [(p["batchId"], p["numInputRows"]) for p in query.recentProgress]
            last_data = max((b for b, n in rows if n), default=None)
            if last_data is not None and any(b > last_data and not n for b, n in rows):
                return out
    finally:
        query.stop()


def copy_files(src, dst):
    os.makedirs(dst, exist_ok=True)
    for name in sorted(os.listdir(src)):
        shutil.copy(f"{src}/{name}", dst)


class Counts(StatefulProcessor):
    """A light per-key processor for many keys: events so far and an event-time timer."""

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key, rows, timerValues):
        n = (self.count.get() or (0,))[0] + sum(len(pdf) for pdf in rows)
        self.count.update((n,))
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        self.handle.registerTimer(timerValues.getCurrentWatermarkInMs() + 10 * GAP_MS)
        yield pd.DataFrame({"user": [key[0]], "n": [n], "items": [n], "total": [0]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        self.count.clear()
        yield pd.DataFrame({"user": [key[0]], "n": [-1], "items": [0], "total": [0]})


def count_visits(key, pdf_iter, state):
    """The light function for many keys."""
    n = (state.getOption or (0,))[0] + sum(len(pdf) for pdf in pdf_iter)
    state.update((n,))
    yield pd.DataFrame({"user": [key[0]], "n": [n], "items": [n], "total": [0]})


def many_keys(keys):
    """Batches 0-4 bring ``keys / 5`` new users each; batches 5-9 revisit every fifth user."""
    def frame(batch):
        step = keys // 5
        users = range(batch * step, (batch + 1) * step) if batch < 5 else range(batch % 5, keys, 5)
        out = pd.DataFrame({"user": [f"u{u}" for u in users], "kind": "a"})
        out["ts"] = pd.Timestamp(batch * 10_000 + 1_000, unit="ms").as_unit("us")  # past 0
        return out
    return frame
