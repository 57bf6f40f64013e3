"""The local runner: exactly-once state and output across failures, resumes, rescales, savepoints."""

import time
from collections import Counter

import pytest

from statekit import (
    ExternalizedCheckpointCleanup,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapFunction,
    RestartStrategies,
    StreamExecutionEnvironment,
    Types,
    ValueStateDescriptor,
)
from statekit.checkpoint.savepoint import open_external
from statekit.errors import JobExecutionError, StateSizeError, StateTypeError
from tests.runtime.envs import expected_final, final_of

ITEMS = [(f"user{i % 13}", i) for i in range(3000)]


class RunningSum(KeyedProcessFunction):
    """Emits (key, count, sum) per element; fails once at ``fail_at`` in the first attempt."""

    def __init__(self, fail_at=None):
        self.fail_at = fail_at

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.total = ctx.get_state(ValueStateDescriptor("sum", Types.LONG()))
        self.attempt = ctx.get_attempt_number()

    def process_element(self, value, ctx):
        if self.fail_at is not None and value[1] in self.fail_at and self.attempt == 0:
            raise RuntimeError("injected failure")
        c = (self.count.value() or 0) + 1
        s = (self.total.value() or 0) + value[1]
        self.count.update(c)
        self.total.update(s)
        yield ctx.get_current_key(), c, s


def make_env(conf=None, parallelism=3):
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(parallelism)
    return env


@pytest.mark.parametrize("storage", ["jobmanager", "filesystem"])
def test_failure_restores_exactly_once(tmp_path, storage):
    conf = {"execution.checkpointing.interval": "10 ms"}
    if storage == "filesystem":
        conf["state.checkpoints.dir"] = str(tmp_path)
    env = make_env(conf)
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(3, 0))
    slow = [(k, v) for k, v in ITEMS]
    result = (env.from_collection(slow).map(lambda x: (sum(range(200)) and x))
              .key_by(lambda x: x[0]).process(RunningSum(fail_at={1000, 2500})).execute_and_collect())
    assert result.restarts == 1
    assert len(result) == len(ITEMS)  # no duplicated and no lost outputs
    assert Counter((k, c) for k, c, _ in result) == Counter(
        (k, c) for k, c in {(k, n) for k in expected_final(ITEMS)
                            for n in range(1, expected_final(ITEMS)[k][0] + 1)})
    assert final_of(result) == expected_final(ITEMS)


def test_no_restart_strategy_fails_with_cause():
    env = make_env({"execution.checkpointing.interval": "10 ms"})
    env.set_restart_strategy(RestartStrategies.no_restart())
    with pytest.raises(JobExecutionError, match="injected failure"):
        env.from_collection(ITEMS).key_by(lambda x: x[0]).process(RunningSum({5})).execute_and_collect()


def test_resume_from_retained_checkpoint_with_rescale(tmp_path):
    conf = {"execution.checkpointing.interval": "50 ms", "state.checkpoints.dir": str(tmp_path)}
    env = make_env(conf, parallelism=4)
    env.get_checkpoint_config().enable_externalized_checkpoints(
        ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION)
    first = env.from_collection(ITEMS[:1000]).key_by(lambda x: x[0]).process(RunningSum()
                                                                               ).execute_and_collect()
    assert first.latest_checkpoint is not None
    for parallelism, upto in ((2, 2000), (3, 3000)):
        env = make_env({**conf, "execution.savepoint.path": first.latest_checkpoint}, parallelism)
        env.get_checkpoint_config().enable_externalized_checkpoints(
            ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION)
        more = env.from_collection(ITEMS[:upto]).key_by(lambda x: x[0]).process(RunningSum()
                                                                                ).execute_and_collect()
        assert len(more) == 1000  # only the new elements are processed
        first = more
    assert final_of(first) == expected_final(ITEMS)


def test_checkpoints_deleted_at_end_unless_retained(tmp_path):
    conf = {"execution.checkpointing.interval": "10 ms", "state.checkpoints.dir": str(tmp_path)}
    result = make_env(conf).from_collection(ITEMS[:300]).key_by(lambda x: x[0]).process(
        RunningSum()).execute_and_collect()
    assert result.retained_checkpoints == []
    assert not any(p.name == "_metadata" for p in tmp_path.rglob("*"))
    assert list(tmp_path.iterdir()) == []  # the job's own directory went with its checkpoints
    retained = make_env({**conf, "execution.checkpointing.externalized-checkpoint-retention":
                         "RETAIN_ON_CANCELLATION"}).from_collection(ITEMS[:300]).key_by(
        lambda x: x[0]).process(RunningSum()).execute_and_collect()
    assert [p.name for p in tmp_path.iterdir()] == [retained.job_id]


def test_limit_stops_the_job_and_resume_continues(tmp_path):
    conf = {"execution.checkpointing.interval": "10 ms", "state.checkpoints.dir": str(tmp_path),
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION"}
    items = [(k, v) for k, v in ITEMS]
    # each element takes a while (a sleep releases the CPU, so a loaded machine's asynchronous
    # checkpoints complete long before the input ends)
    stopped = make_env(conf).from_collection(items).map(lambda x: time.sleep(0.0003) or x).key_by(
        lambda x: x[0]).process(RunningSum()).execute_and_collect(limit=500)
    offset = open_external(stopped.latest_checkpoint)[0]["source"]["offset"]
    assert 0 < offset < len(items)
    assert 500 <= len(stopped) == offset  # every output the checkpoint covers, none dropped
    resumed = make_env({**conf, "execution.savepoint.path": stopped.latest_checkpoint}
                       ).from_collection(items).key_by(lambda x: x[0]).process(RunningSum()
                                                                               ).execute_and_collect()
    assert len(resumed) == len(items) - offset  # exactly the elements after the checkpoint
    assert final_of(list(stopped) + list(resumed)) == expected_final(items)


def test_savepoint_restores_into_new_job(tmp_path):
    conf = {"execution.checkpointing.interval": "10 ms", "state.checkpoints.dir": str(tmp_path / "c")}
    result = make_env(conf).from_collection(ITEMS[:100]).key_by(lambda x: x[0]).process(
        RunningSum()).execute_and_collect(savepoint_dir=str(tmp_path / "sp"))
    assert "savepoint-" in result.savepoint_path
    again = make_env({**conf, "execution.savepoint.path": result.savepoint_path}, 2
                     ).from_collection(ITEMS[:200]).key_by(lambda x: x[0]).process(
        RunningSum()).execute_and_collect()
    assert final_of(again) == expected_final(ITEMS[:200])


class Hoarder(MapFunction):
    def open(self, ctx):
        self.items = ctx.get_list_state(ListStateDescriptor("items", Types.STRING()))

    def map(self, value):
        self.items.add("x" * 1000)
        return value[1]


def test_oversized_state_under_jobmanager_storage_is_typed():
    env = make_env({"execution.checkpointing.interval": "10 ms", "state.checkpoint-storage": "jobmanager",
                    "state.checkpoint-storage.jobmanager.max-state-size": "64 kb"}, parallelism=1)
    env.set_restart_strategy(RestartStrategies.no_restart())
    items = [("k", i) for i in range(500)]
    with pytest.raises(JobExecutionError) as info:
        env.from_collection(items).map(lambda x: (sum(range(3000)) and x)).key_by(
            lambda x: x[0]).map(Hoarder()).execute_and_collect()
    cause = info.value.__cause__
    assert isinstance(cause.__cause__ or cause, StateSizeError) or "max_state_size" in str(cause)
    assert "'items'" in str(info.value)


def test_wrong_type_names_the_state():
    class Bad(KeyedProcessFunction):
        def open(self, ctx):
            self.s = ctx.get_state(ValueStateDescriptor("counter", Types.INT()))

        def process_element(self, value, ctx):
            self.s.update("nope")
            return ()

    env = make_env(parallelism=1)
    with pytest.raises(JobExecutionError, match="'counter'") as info:
        env.from_collection([("a", 1)]).key_by(lambda x: x[0]).process(Bad()).execute_and_collect()
    assert isinstance(info.value.__cause__, StateTypeError)


def test_sink_receives_committed_outputs(tmp_path):
    received = []
    env = make_env({"execution.checkpointing.interval": "10 ms"})
    env.from_collection(ITEMS[:200]).key_by(lambda x: x[0]).process(RunningSum()).add_sink(received.append)
    env.execute("sink job")
    assert final_of(received) == expected_final(ITEMS[:200])
