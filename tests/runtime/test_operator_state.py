"""Operator state on the local runner: even-split and union list state and broadcast state
through a stop-with-savepoint and resumes at parallelism 2 -> 3 -> 1, exactly as Flink
redistributes them; both backends, every checkpoint storage."""

import random
import time

import pytest

from statekit import StreamExecutionEnvironment
from statekit.backends.operator_format import FORMAT
from statekit.checkpoint.savepoint import open_external
from statekit.errors import (
    ConfigError,
    CorruptCheckpointError,
    JobExecutionError,
    ReadOnlyStateError,
    StateError,
    StateNameClashError,
)
from statekit.inspection import open_checkpoint
from statekit.runtime.broadcast import BroadcastProcessFunction, KeyedBroadcastProcessFunction
from statekit.runtime.checkpointed import CheckpointedFunction
from statekit.runtime.functions import KeyedProcessFunction, MapFunction, OutputTag
from statekit.runtime.timers import TimeDomain
from statekit.runtime.watermarks import WatermarkStrategy
from statekit.serde.types import Types
from statekit.state.descriptors import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statekit.testing.s3 import ACCESS_KEY, SECRET_KEY
from tests.runtime.envs import env_for

BACKENDS = ["hashmap", "rocksdb"]
BUFFER = ListStateDescriptor("buffer", Types.LONG())
SUBTASKS = ListStateDescriptor("subtasks", Types.STRING())
CONFIG = MapStateDescriptor("config", Types.STRING(), Types.STRING())


class Buffering(BroadcastProcessFunction, CheckpointedFunction):
    """Buffers its elements in split list state, records itself in union list state before
    each checkpoint, keeps ``k=v`` broadcast elements in broadcast state, and reports what it
    was restored with when a ``report`` element is broadcast."""

    def initialize_state(self, context):
        store = context.get_operator_state_store()
        self.buffer = store.get_list_state(BUFFER)
        self.subtasks = store.get_union_list_state(SUBTASKS)
        self.restored = (context.is_restored(), self.buffer.get(), self.subtasks.get())

    def open(self, runtime_context):
        self.index = runtime_context.get_index_of_this_subtask()

    def snapshot_state(self, context):
        self.subtasks.update([f"s{self.index}:{len(self.buffer.get())}"])

    def process_element(self, value, ctx):
        self.buffer.add(value)

    def process_broadcast_element(self, value, ctx):
        config = ctx.get_broadcast_state(CONFIG)
        if value == "report":
            yield self.index, self.restored, sorted(config.items())
        else:
            key, _, setting = value.partition("=")
            config.put(key, setting)


def _env(kind, tmp_path, backend, request, **conf):
    if kind == "s3":
        server = request.getfixturevalue("s3_server")
        url = request.getfixturevalue("s3_url")
        env = StreamExecutionEnvironment.get_execution_environment({
            "state.backend.type": backend, "state.checkpoints.dir": f"{url}/chk",
            "state.storage.fs.memory-threshold": "0", "s3.endpoint": server.endpoint_url,
            "s3.access-key": ACCESS_KEY, "s3.secret-key": SECRET_KEY, **conf})
        return env, f"{url}/sp"
    if kind == "jobmanager":
        env = StreamExecutionEnvironment.get_execution_environment({
            "state.backend.type": backend, "state.checkpoint-storage": "jobmanager", **conf})
    else:
        env = env_for(tmp_path, backend, **conf)
    return env, f"{tmp_path}/sp"


def _run(env, events, broadcasts, parallelism, savepoint_dir):
    env.set_parallelism(parallelism)
    env.enable_checkpointing(10)
    stream = env.from_collection(events).connect(env.from_collection(broadcasts).broadcast(CONFIG))
    return stream.process(Buffering()).execute_and_collect(savepoint_dir=savepoint_dir)


E1, B1 = [10, 11, 12, 13, 14], ["a=1", "b=2", "a=3", "c=4", "d=5"]
E2, B2 = [20, 21, 22], ["report", "e=6", "f=7"]
FIRST = [("a", "3"), ("b", "2"), ("c", "4"), ("d", "5")]


@pytest.mark.parametrize("storage", ["jobmanager", "filesystem", "s3"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_rescale_2_3_1_redistributes_as_flink(tmp_path, backend, storage, request):
    env, sp = _env(storage, tmp_path, backend, request)
    # p=2: round-robin puts 10, 12, 14 on subtask 0 and 11, 13 on subtask 1
    first = _run(env, E1, B1, 2, sp)
    assert list(first) == []
    meta, _ = open_external(first.savepoint_path, getattr(
        env.resolved_checkpoint_storage(), "storage_options", None))
    assert len(meta["operator_state"]) == 2

    env, _ = _env(storage, tmp_path, backend, request,
                  **{"execution.savepoint.path": first.savepoint_path})
    second = _run(env, E1 + E2, B1 + B2, 3, sp)
    union = ["s0:3", "s1:2"]
    # 5 elements [10, 12, 14 | 11, 13] to 3 subtasks: runs of 2, 2, 1 in old subtask order
    assert sorted(second) == [(0, (True, [10, 12], union), FIRST),
                              (1, (True, [14, 11], union), FIRST),
                              (2, (True, [13], union), FIRST)]

    env, _ = _env(storage, tmp_path, backend, request,
                  **{"execution.savepoint.path": second.savepoint_path})
    third = _run(env, E1 + E2, B1 + B2 + ["report"], 1, sp)
    # 20, 21, 22 went round-robin to subtasks 0, 1, 2 of the second run
    assert list(third) == [(0, (True, [10, 12, 20, 14, 11, 21, 13, 22],
                                ["s0:3", "s1:3", "s2:2"]),
                            [*FIRST, ("e", "6"), ("f", "7")])]


def test_a_fresh_job_is_not_restored(tmp_path):
    env = env_for(tmp_path)
    env.enable_checkpointing(10)
    out = (env.from_collection([1]).connect(env.from_collection(["report"]).broadcast(CONFIG))
           .process(Buffering()).execute_and_collect())
    assert sorted(out) == [(0, (False, [], []), []), (1, (False, [], []), [])]


class WritesOnTheReadSide(BroadcastProcessFunction):
    def process_element(self, value, ctx):
        ctx.get_broadcast_state(CONFIG).put("k", "v")

    def process_broadcast_element(self, value, ctx):
        return None


def test_the_read_only_side_cannot_write(tmp_path):
    env = env_for(tmp_path)
    job = (env.from_collection([1]).connect(env.from_collection(["x"]).broadcast(CONFIG))
           .process(WritesOnTheReadSide()))
    with pytest.raises(JobExecutionError) as info:
        job.execute_and_collect()
    assert isinstance(info.value.__cause__, ReadOnlyStateError)


class Clash(Buffering):
    def initialize_state(self, context):
        store = context.get_operator_state_store()
        store.get_list_state(BUFFER)
        store.get_union_list_state(BUFFER)


def test_one_name_one_kind(tmp_path):
    env = env_for(tmp_path)
    job = (env.from_collection([1]).connect(env.from_collection(["x"]).broadcast(CONFIG))
           .process(Clash()))
    with pytest.raises(StateNameClashError, match="union list state"):
        job.execute_and_collect()


class PickledBuffer(Buffering):
    def initialize_state(self, context):
        self.buffer = context.get_operator_state_store().get_list_state(
            ListStateDescriptor("buffer", Types.PICKLED_BYTE_ARRAY()))

    def snapshot_state(self, context):
        pass


def test_pickled_state_needs_a_descriptor_that_opts_in(tmp_path):
    from statekit.errors import PickleNotAllowedError

    env = env_for(tmp_path)
    env.enable_checkpointing(10)
    first = (env.from_collection([1, 2]).connect(env.from_collection(["a=1", "b=2"])
                                                 .broadcast(CONFIG))
             .process(PickledBuffer()).execute_and_collect(savepoint_dir=f"{tmp_path}/sp"))
    env = env_for(tmp_path, **{"execution.savepoint.path": first.savepoint_path})
    job = (env.from_collection([1, 2]).connect(env.from_collection(["a=1", "b=2"])
                                               .broadcast(CONFIG)).process(Buffering()))
    with pytest.raises(JobExecutionError) as info:  # damaged-checkpoint errors fail the attempt
        job.execute_and_collect()
    assert isinstance(info.value.__cause__, PickleNotAllowedError)


def test_damaged_operator_state_is_a_typed_error(tmp_path):
    from statekit.checkpoint.blobstore.fsspec import blob_store_for
    from statekit.checkpoint.checksum import crc32
    from statekit.checkpoint.metadata import decode_metadata, encode_metadata
    from statekit.serde.types import packb

    env = env_for(tmp_path)
    env.enable_checkpointing(10)
    first = _run(env, E1, B1, 2, f"{tmp_path}/sp")
    store = blob_store_for(first.savepoint_path)
    body = decode_metadata(store.get("_metadata"))
    data = packb({"format": FORMAT, "version": 1, "states": {
        "buffer": {"mode": "split", "layout": ["map", "LONG", None, False], "entries": [1]}}})
    body["operator_state"][0] = {"type": "inline", "data": data, "size": len(data),
                                 "crc": crc32(data)}
    store.put("_metadata", encode_metadata(body))
    env = env_for(tmp_path, **{"execution.savepoint.path": first.savepoint_path})
    with pytest.raises(JobExecutionError, match="layout kind") as info:
        _run(env, E1, B1, 2, None)
    assert isinstance(info.value.__cause__, CorruptCheckpointError)
    body["operator_state"] = body["operator_state"][:1]  # one subtask's entry lost
    store.put("_metadata", encode_metadata(body))
    with pytest.raises(CorruptCheckpointError, match="1 entries for 2 subtasks"):
        _run(env_for(tmp_path, **{"execution.savepoint.path": first.savepoint_path}),
             E1, B1, 2, None)


def test_broadcast_streams_run_streaming_only(tmp_path):
    env = env_for(tmp_path, **{"execution.runtime-mode": "BATCH"})
    job = (env.from_collection([1]).connect(env.from_collection(["x"]).broadcast(CONFIG))
           .process(Buffering()))
    with pytest.raises(ConfigError, match="STREAMING"):
        job.execute_and_collect()


# --- the broadcast state pattern: rules broadcast, keyed events matched -------------------------

RULES = MapStateDescriptor("rules", Types.STRING(), Types.LONG())
COUNT = ValueStateDescriptor("matches", Types.LONG())
BIG = OutputTag("big")


class MatchRules(KeyedBroadcastProcessFunction):
    """Counts each user's events at or above their type's threshold; ``reset`` clears every
    user's count (``apply_to_keyed_state``); amounts over 900 also go to a side output."""

    def open(self, runtime_context):
        self.count = runtime_context.get_state(COUNT)

    def process_element(self, value, ctx):
        user, kind, amount = value
        threshold = ctx.get_broadcast_state(RULES).get(kind)
        if threshold is None or amount < threshold:
            return
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield ctx.get_current_key(), kind, amount, n
        if amount > 900:
            yield BIG, (user, amount)

    def process_broadcast_element(self, value, ctx):
        op, kind, threshold = value
        rules = ctx.get_broadcast_state(RULES)
        if op == "set":
            rules.put(kind, threshold)
        elif op == "drop":
            rules.remove(kind)
        else:
            ctx.apply_to_keyed_state(COUNT, lambda key, state: state.clear())


def _workload(seed, n):
    rng = random.Random(seed)
    kinds = ["click", "buy", "view"]
    events = [(f"u{rng.randrange(12)}", rng.choice(kinds), rng.randrange(1000)) for _ in range(n)]
    rules = []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.6:
            rules.append(("set", rng.choice(kinds), rng.randrange(1000)))
        elif roll < 0.9:
            rules.append(("drop", rng.choice(kinds), 0))
        else:
            rules.append(("reset", "", 0))
    return events, rules


def _reference(events, rules):
    """The same rules in plain Python: one element of each input in turn."""
    thresholds, counts, out, big = {}, {}, [], []
    for i in range(max(len(events), len(rules))):
        if i < len(events):
            user, kind, amount = events[i]
            if kind in thresholds and amount >= thresholds[kind]:
                counts[user] = counts.get(user, 0) + 1
                out.append((user, kind, amount, counts[user]))
                if amount > 900:
                    big.append((user, amount))
        if i < len(rules):
            op, kind, threshold = rules[i]
            if op == "set":
                thresholds[kind] = threshold
            elif op == "drop":
                thresholds.pop(kind, None)
            else:
                counts.clear()
    return out, big


def _match(env, events, rules, parallelism, savepoint_dir=None):
    env.set_parallelism(parallelism)
    env.enable_checkpointing(10)
    processed = (env.from_collection(events).key_by(lambda e: e[0])
                 .connect(env.from_collection(rules).broadcast(RULES)).process(MatchRules()))
    return processed.execute_and_collect(savepoint_dir=savepoint_dir)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rules_pattern_equals_python_across_a_savepoint_and_rescale(tmp_path, backend):
    events, rules = _workload(7, 400)
    expected, expected_big = _reference(events, rules)
    assert len(expected) > 50 and expected_big  # the workload matches, resets and alerts
    first = _match(env_for(tmp_path, backend), events[:150], rules[:150], 2, f"{tmp_path}/sp")
    env = env_for(tmp_path, backend, **{"execution.savepoint.path": first.savepoint_path})
    second = _match(env, events, rules, 3)
    assert sorted([*first, *second]) == sorted(expected)
    big = [*first.get_side_output(BIG), *second.get_side_output(BIG)]
    assert sorted(big) == sorted(expected_big)


class Remind(KeyedBroadcastProcessFunction):
    """Keyed side registers an event-time timer; the timer reads the broadcast state."""

    def process_element(self, value, ctx):
        ctx.timer_service().register_event_time_timer(ctx.timestamp() + 5)

    def process_broadcast_element(self, value, ctx):
        ctx.get_broadcast_state(RULES).put("greeting", value)

    def on_timer(self, timestamp, ctx):
        assert ctx.time_domain() == TimeDomain.EVENT_TIME
        yield ctx.get_current_key(), timestamp, ctx.get_broadcast_state(RULES).get("greeting")


def test_keyed_broadcast_timers_see_the_broadcast_state(tmp_path):
    env = env_for(tmp_path)
    strategy = (WatermarkStrategy.for_monotonous_timestamps()
                .with_timestamp_assigner(lambda e, _ts: e[1]))
    events = env.from_collection([("a", 10), ("b", 20)]).assign_timestamps_and_watermarks(strategy)
    out = (events.key_by(lambda e: e[0]).connect(env.from_collection([1, 2]).broadcast(RULES))
           .process(Remind()).execute_and_collect())
    # b's watermark (19) fires a's timer before the second broadcast element; b's fires at the end
    assert sorted(out) == [("a", 15, 1), ("b", 25, 2)]


FAILED_ONCE: list[int] = []


class FailsOnce(Buffering):
    """Fails the first time it sees element 25 (after some checkpoints were taken)."""

    def process_element(self, value, ctx):
        time.sleep(0.002)
        if value == 25 and not FAILED_ONCE:
            FAILED_ONCE.append(value)
            raise RuntimeError("boom")
        self.buffer.add(value)


class SnapshotFails(Buffering):
    def snapshot_state(self, context):
        raise RuntimeError("snapshot_state failed")


@pytest.mark.parametrize("backend", BACKENDS)
def test_failover_restores_operator_state_exactly_once(tmp_path, backend):
    FAILED_ONCE.clear()
    env = env_for(tmp_path, backend, **{"restart-strategy.type": "fixed-delay",
                                        "restart-strategy.fixed-delay.attempts": "2",
                                        "restart-strategy.fixed-delay.delay": "0 ms"})
    env.enable_checkpointing(10)
    events, settings = list(range(40)), [f"k{i}={i}" for i in range(40)]
    result = (env.from_collection(events).connect(env.from_collection(settings).broadcast(CONFIG))
              .process(FailsOnce()).execute_and_collect(savepoint_dir=f"{tmp_path}/sp"))
    assert result.restarts == 1 and FAILED_ONCE == [25]
    assert any(s.status == "completed" for s in result.checkpoint_stats)
    states = {s.name: s.to_pandas() for s in open_checkpoint(result.savepoint_path).operator_states()}
    assert sorted(states["buffer"].value) == events  # every element once, none twice
    config = states["config"]
    assert (config.groupby("subtask").size() == 40).all()


def test_a_failing_snapshot_state_fails_the_job(tmp_path):
    env = env_for(tmp_path)
    env.enable_checkpointing(10)
    job = (env.from_collection([1]).connect(env.from_collection(["a=1"]).broadcast(CONFIG))
           .process(SnapshotFails()))
    with pytest.raises(JobExecutionError, match="snapshot_state failed"):
        job.execute_and_collect()


class CountsPerSubtask(KeyedProcessFunction, CheckpointedFunction):
    """A keyed function with operator state: how many elements each subtask saw."""

    def initialize_state(self, context):
        self.seen = context.get_operator_state_store().get_union_list_state(
            ListStateDescriptor("seen", Types.LONG()))
        self.before = sum(self.seen.get())
        self.count = 0

    def snapshot_state(self, context):
        self.seen.update([self.count])

    def process_element(self, value, ctx):
        self.count += 1
        yield self.before


class MapWithOperatorState(MapFunction, CheckpointedFunction):
    def initialize_state(self, context):
        self.seen = context.get_operator_state_store().get_list_state(
            ListStateDescriptor("mapped", Types.LONG()))

    def snapshot_state(self, context):
        pass

    def map(self, value):
        self.seen.add(value)
        return value


@pytest.mark.parametrize("backend", BACKENDS)
def test_keyed_functions_keep_operator_state(tmp_path, backend):
    env = env_for(tmp_path, backend)
    env.enable_checkpointing(10)
    first = (env.from_collection(list(range(10))).key_by(lambda v: v % 4)
             .process(CountsPerSubtask()).execute_and_collect(savepoint_dir=f"{tmp_path}/sp"))
    assert set(first) == {0}
    env = env_for(tmp_path, backend, **{"execution.savepoint.path": first.savepoint_path})
    env.set_parallelism(3)
    second = (env.from_collection(list(range(12))).key_by(lambda v: v % 4)
              .process(CountsPerSubtask()).execute_and_collect())
    assert set(second) == {10}  # the union of both subtasks' counts, on every new subtask
    env = env_for(tmp_path, backend)
    env.enable_checkpointing(10)
    mapped = (env.from_collection([1, 2, 3]).key_by(lambda v: v).map(MapWithOperatorState())
              .execute_and_collect(savepoint_dir=f"{tmp_path}/sp2"))
    view = open_checkpoint(mapped.savepoint_path)
    assert sorted(view.state("mapped").to_pandas().value) == [1, 2, 3]


def test_engines_without_operator_state_refuse_it():
    from statekit.testing import KeyedOneInputStreamOperatorTestHarness

    for function in (CountsPerSubtask(), Buffering()):
        with KeyedOneInputStreamOperatorTestHarness(function, lambda v: v) as harness, \
                pytest.raises(StateError, match="local runner only"):
            harness.open()


def test_spark_adapters_refuse_operator_state_in_the_driver():
    from statekit.spark.adapters import build_spec

    for function in (CountsPerSubtask(), MatchRules()):
        with pytest.raises(StateError, match="local runner only"):
            build_spec(None, function, ["k"], "k long", None, None)  # before Spark is asked
