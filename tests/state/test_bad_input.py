"""Bad input at the state API: each a typed error naming the state; nothing checkpointed is lost."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from statekit.backends.heap import HashMapStateBackend
from statekit.checkpoint.config import ExternalizedCheckpointCleanup
from statekit.errors import (
    JobExecutionError,
    NoKeyContextError,
    StateNameClashError,
    StateSizeError,
    StateTypeError,
)
from statekit.runtime.environment import StreamExecutionEnvironment
from statekit.runtime.functions import KeyedProcessFunction
from statekit.serde.keygroups import key_group_range_for_operator
from statekit.serde.types import Types, serializer_for
from statekit.state.descriptors import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor

BACKENDS = ["hashmap", "rocksdb"]


def make_factory(kind: str):
    if kind == "hashmap":
        return HashMapStateBackend()
    rocksdb = pytest.importorskip("statekit.backends.rocksdb")
    return rocksdb.EmbeddedRocksDBStateBackend()


@pytest.fixture(params=BACKENDS)
def backend(request):
    factory = make_factory(request.param)
    b = factory.create_keyed_state_backend(
        key_serializer=serializer_for(Types.STRING()),
        key_group_range=key_group_range_for_operator(128, 1, 0), max_parallelism=128)
    yield b
    b.dispose()


def value(b, name="count", t=None):
    return b.get_partitioned_state(ValueStateDescriptor(name, t or Types.LONG()))


def test_wrong_types_are_rejected_with_the_state_name(backend):
    backend.set_current_key("k")
    count = value(backend)
    count.update(5)
    with pytest.raises(StateTypeError, match="'count'"):
        count.update("five")
    assert count.value() == 5
    items = backend.get_partitioned_state(ListStateDescriptor("items", Types.LONG()))
    items.add(1)
    with pytest.raises(StateTypeError, match="'items'"):
        items.add("x")
    with pytest.raises(StateTypeError, match="'items'"):
        items.add_all([2, "y"])
    assert list(items.get()) == [1]
    table = backend.get_partitioned_state(MapStateDescriptor("table", Types.STRING(), Types.LONG()))
    table.put("a", 1)
    with pytest.raises(StateTypeError, match="'table'"):
        table.put(3, 1)
    with pytest.raises(StateTypeError, match="'table'"):
        table.put("b", "not a long")
    assert dict(table.items()) == {"a": 1}
    ints = backend.get_partitioned_state(MapStateDescriptor("ints", Types.INT(), Types.INT()))
    ints.put(1, 2)
    for bad_key, bad_value in ((2**40, 1), (1, 2**40), (-(2**31) - 1, 1), (True, 1), (1, False),
                               (1.0, 1), (1, 1.5), (None, 1)):
        with pytest.raises(StateTypeError, match="'ints'"):
            ints.put(bad_key, bad_value)
    ints.put(2**31 - 1, -(2**31))  # the bounds themselves
    assert dict(ints.items()) == {1: 2, 2**31 - 1: -(2**31)}


def test_oversized_values_and_keys_are_rejected(backend):
    backend.set_size_limits(max_key_size=32, max_value_size=64)
    backend.set_current_key("k")
    name = value(backend, "name", Types.STRING())
    name.update("ok")
    with pytest.raises(StateSizeError, match=r"'name'.*value of"):
        name.update("x" * 100)
    assert name.value() == "ok"
    items = backend.get_partitioned_state(ListStateDescriptor("items", Types.STRING()))
    items.add("a")
    with pytest.raises(StateSizeError, match="'items'"):
        items.add("x" * 100)
    with pytest.raises(StateSizeError, match="'items'"):
        items.update(["b", "x" * 100])
    assert list(items.get()) == ["a"]
    table = backend.get_partitioned_state(MapStateDescriptor("table", Types.STRING(), Types.STRING()))
    table.put("a", "1")
    with pytest.raises(StateSizeError, match=r"'table'.*value"):
        table.put("b", "x" * 100)
    with pytest.raises(StateSizeError, match=r"'table'.*key"):
        table.put("y" * 100, "1")
    assert dict(table.items()) == {"a": "1"}
    backend.set_current_key("z" * 100)  # the current key itself is too large
    with pytest.raises(StateSizeError, match=r"'name'.*key of"):
        name.update("ok")


def test_state_name_clashes(backend):
    backend.set_current_key("k")
    value(backend, "a")
    with pytest.raises(StateNameClashError, match="'a'"):
        backend.get_partitioned_state(ListStateDescriptor("a", Types.LONG()))
    with pytest.raises(StateNameClashError, match="'a'"):
        value(backend, "a", Types.STRING())
    assert value(backend, "a") is not None  # the same descriptor again is fine


def test_state_outside_a_keyed_context(backend):
    count = value(backend)
    with pytest.raises(NoKeyContextError, match="'count'"):
        count.value()
    with pytest.raises(NoKeyContextError, match="'count'"):
        count.update(1)
    items = backend.get_partitioned_state(ListStateDescriptor("items", Types.LONG()))
    with pytest.raises(NoKeyContextError, match="'items'"):
        items.add(1)


ITEMS = [(f"k{i % 5}", i) for i in range(300)]


class Misbehave(KeyedProcessFunction):
    """Counts per key; at element ``bad`` it does ``what`` wrong."""

    def __init__(self, what: str | None = None, bad: int = 250) -> None:
        self.what, self.bad = what, bad

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.note = ctx.get_state(ValueStateDescriptor("note", Types.STRING()))
        self.ctx = ctx

    def process_element(self, v, ctx):
        if v[1] == self.bad and self.what == "type":
            self.count.update("not a number")
        if v[1] == self.bad and self.what == "size":
            self.note.update("x" * 1000)
        if v[1] == self.bad and self.what == "clash":
            self.ctx.get_list_state(ListStateDescriptor("count", Types.LONG()))
        self.count.update((self.count.value() or 0) + 1)
        yield v[0], self.count.value()


def job(tmp_path, backend_kind, func, items, extra=None):
    env = StreamExecutionEnvironment.get_execution_environment({
        "state.backend.type": backend_kind, "state.checkpoints.dir": str(tmp_path / "ckpt"),
        "state.checkpoint-storage": "filesystem",
        "execution.checkpointing.interval": "10 ms", "state.backend.max-value-size": "256",
        "state.checkpoints.num-retained": "2", **(extra or {})})
    env.set_parallelism(2)
    env.get_checkpoint_config().enable_externalized_checkpoints(
        ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION)
    slow = env.from_collection(items).map(lambda v: (time.sleep(0.0003), v)[1])
    return slow.key_by(lambda v: v[0]).process(func).execute_and_collect()


@pytest.mark.parametrize("backend_kind", BACKENDS)
@pytest.mark.parametrize(("what", "error"), [("type", StateTypeError), ("size", StateSizeError),
                                             ("clash", StateNameClashError)])
def test_bad_input_fails_the_job_but_keeps_completed_checkpoints(tmp_path, backend_kind, what, error):
    if backend_kind == "rocksdb":
        pytest.importorskip("statekit.backends.rocksdb")
    with pytest.raises(JobExecutionError) as info:
        job(tmp_path, backend_kind, Misbehave(what), ITEMS)
    cause = info.value.__cause__
    assert isinstance(cause, error)
    assert cause.state_name in ("count", "note") and f"'{cause.state_name}'" in str(cause)
    job_dirs = list((tmp_path / "ckpt").iterdir())
    assert len(job_dirs) == 1
    latest = max((d for d in job_dirs[0].iterdir() if (d / "_metadata").exists()),
                 key=lambda d: int(d.name.split("-")[1]))
    result = job(tmp_path, backend_kind, Misbehave(), [*ITEMS, ("k1", 999)],
                 {"execution.savepoint.path": str(latest)})
    final: dict[str, int] = {}
    for key, n in result:
        final[key] = max(final.get(key, 0), n)
    expected = Counter(k for k, _ in ITEMS)
    expected["k1"] += 1
    assert final == {k: expected[k] for k in final} and final["k1"] == expected["k1"]
