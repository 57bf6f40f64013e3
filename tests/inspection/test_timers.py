"""Timers in the inspection tools: listed, read and exported as (key, timestamp, domain), and
carried by savepoint conversion (also to another max parallelism) so they fire after a restore."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from statekit import KeyedProcessFunction, StreamExecutionEnvironment
from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
from statekit.inspection import convert_savepoint, open_checkpoint
from statekit.runtime.watermarks import WatermarkStrategy
from statekit.testing.harness import ManualClock

EVENTS = [(f"k{i % 7}", 1_000 + i * 10) for i in range(40)]


class Alarms(KeyedProcessFunction):
    """An event-time timer at +10 s and a processing-time timer at +1 s per element."""

    def process_element(self, value, ctx):
        timers = ctx.timer_service()
        timers.register_event_time_timer(value[1] + 10_000)
        timers.register_processing_time_timer(timers.current_processing_time() + 1_000)
        return ()

    def on_timer(self, timestamp, ctx):
        yield ctx.get_current_key(), timestamp, ctx.time_domain().name


def expected():
    rows = {(k, t + 10_000, "EVENT_TIME") for k, t in EVENTS}
    rows |= {(k, 6_000, "PROCESSING_TIME") for k, _ in EVENTS}
    return sorted(rows)


def env_for(work, backend, **conf):
    env = StreamExecutionEnvironment.get_execution_environment({
        "state.backend.type": "rocksdb" if backend.startswith("rocksdb") else backend,
        "state.checkpoints.dir": f"{work}/chk", "state.checkpoint-storage": "filesystem",
        "execution.checkpointing.interval": "1 h",
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        **conf})
    if backend == "rocksdb-heap-timers":
        rocks = EmbeddedRocksDBStateBackend()
        rocks.set_priority_queue_state_type("HEAP")
        env.set_state_backend(rocks)
    env.set_parallelism(2)
    env.set_processing_time_clock(ManualClock(5_000))
    return env


def job(env, events):
    strategy = WatermarkStrategy.no_watermarks().with_timestamp_assigner(lambda v, ts: v[1])
    return (env.from_collection(events).assign_timestamps_and_watermarks(strategy)
            .key_by(lambda v: v[0]).process(Alarms()))


@pytest.fixture(params=["hashmap", "rocksdb", "rocksdb-heap-timers"])
def stopped(request, tmp_path):
    """A job stopped with a savepoint (no drain): every timer pending, in the savepoint and the
    final checkpoint."""
    result = job(env_for(tmp_path, request.param), EVENTS).execute_and_collect(
        savepoint_dir=f"{tmp_path}/sp")
    assert list(result) == []
    return request.param, result


def rows(frame):
    return sorted(frame.itertuples(index=False, name=None))


def test_timers_are_read_as_rows(stopped, tmp_path):
    backend, result = stopped
    for path in (result.savepoint_path, result.latest_checkpoint):
        view = open_checkpoint(path)
        kinds = {s.name: s.kind for s in view.states()}
        assert kinds["_timer_state/event_user-timers"] == "timers"
        assert kinds["_timer_state/processing_user-timers"] == "timers"
        timers = view.timers()
        frame = timers.to_pandas()
        assert list(frame.columns) == ["key", "timestamp", "domain"]
        assert rows(frame) == expected(), (backend, path)


def test_cli_exports_the_timers(stopped, tmp_path):
    _, result = stopped
    out = tmp_path / "timers.parquet"
    done = subprocess.run([sys.executable, "-m", "statekit", "state", "export",
                           result.latest_checkpoint, "--timers", "--to", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"exported {len(expected())} row(s) of the timers" in done.stdout
    assert rows(pd.read_parquet(out)) == expected()
    both = subprocess.run([sys.executable, "-m", "statekit", "state", "export",
                           result.latest_checkpoint, "--timers", "--state", "x", "--to",
                           str(tmp_path / "x.csv")], capture_output=True, text=True)
    assert both.returncode == 2 and "--state NAME or --timers" in both.stderr


@pytest.mark.parametrize("max_parallelism", [None, 64])
def test_converted_savepoints_keep_the_timers(stopped, tmp_path, max_parallelism):
    """``savepoint convert`` (also to another max parallelism) carries every timer: the job
    resumed from it, on the other backend and another parallelism, fires each once."""
    backend, result = stopped
    converted = convert_savepoint(result.latest_checkpoint, str(tmp_path / "conv"),
                                  max_parallelism=max_parallelism)
    assert rows(open_checkpoint(converted).timers().to_pandas()) == expected()
    other = "hashmap" if backend.startswith("rocksdb") else "rocksdb"
    conf = {"execution.savepoint.path": converted}
    if max_parallelism:
        conf["pipeline.max-parallelism"] = str(max_parallelism)
    env = env_for(tmp_path / "resumed", other, **conf)
    env.set_parallelism(3)
    env.set_processing_time_clock(ManualClock(7_000))  # past every processing-time timer
    resumed = job(env, [*EVENTS, ("late", 50_000)]).execute_and_collect()
    fired = sorted(r for r in resumed if r[0] != "late")
    assert fired == expected()


def test_a_checkpoint_without_timers_says_so(tmp_path):
    env = env_for(tmp_path, "hashmap")

    class Plain(KeyedProcessFunction):
        def process_element(self, value, ctx):
            return ()

    result = env.from_collection(EVENTS).key_by(lambda v: v[0]).process(
        Plain()).execute_and_collect(savepoint_dir=f"{tmp_path}/sp")
    with pytest.raises(Exception, match="holds no timers"):
        open_checkpoint(result.savepoint_path).timers()
