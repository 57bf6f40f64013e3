"""The operator state conformance suite: Flink's ``OperatorStateBackendTest`` and PyFlink's
broadcast cases of ``test_data_stream.py``, ported to statekit's API.

Subclass :class:`OperatorStateConformance` with a ``state_backend`` fixture (a keyed
:class:`StateBackend`: the broadcast jobs run on it); every case runs over every storage of the
``checkpoint_storage`` fixture.  Left out, as Java-only: ``testCorrectClassLoaderUsedOnSnapshot``
(class loaders), the Kryo registration half of ``testRegisterStatesWithoutTypeSerializer``.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

import pytest

from statekit.backends.base import StateBackend
from statekit.backends.operator import OperatorStateBackend, read_snapshots, repartition
from statekit.checkpoint.base import CheckpointStorage
from statekit.errors import CheckpointError, ReadOnlyStateError, StateError, StateNameClashError
from statekit.runtime.broadcast import BroadcastProcessFunction, KeyedBroadcastProcessFunction
from statekit.runtime.environment import StreamExecutionEnvironment
from statekit.runtime.functions import OutputTag
from statekit.runtime.watermarks import WatermarkStrategy
from statekit.serde.types import Types
from statekit.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
)
from statekit.testing.conformance.storage import STORAGE_KINDS, make_storage


def _lists(n: int) -> list[ListStateDescriptor]:
    return [ListStateDescriptor(f"test{i}", Types.GENERIC()) for i in range(1, n + 1)]


def _maps() -> list[MapStateDescriptor]:
    return [MapStateDescriptor(f"test{i}", Types.GENERIC(), Types.GENERIC()) for i in (4, 5, 6)]


class OperatorStateConformance:
    """Operator state and broadcast state as Flink has them, over every storage."""

    @pytest.fixture(params=STORAGE_KINDS)
    def checkpoint_storage(self, request: Any, tmp_path: Any) -> CheckpointStorage:
        return make_storage(request.param, tmp_path)

    @pytest.fixture
    def roundtrip(self, checkpoint_storage: CheckpointStorage) -> Any:
        """Snapshot a subtask's operator state into the storage and restore it from there."""
        access = checkpoint_storage.create_access(uuid.uuid4().hex)
        ids = iter(range(1, 1000))

        def restore(backend: OperatorStateBackend, parallelism: int = 1,
                    others: list[OperatorStateBackend] = ()) -> list[OperatorStateBackend]:
            cid = next(ids)
            handles = []
            for n, subtask in enumerate([backend, *others]):
                data = subtask.snapshot()
                handles.append(None if data is None else OperatorStateBackend.write(
                    data, access.streams(cid, f"op-{n}")))
            parts = repartition(read_snapshots(handles, access.reader()), parallelism)
            return [OperatorStateBackend(part) for part in parts]

        yield restore
        access.delete_all()

    @pytest.fixture
    def env(self, state_backend: StateBackend, checkpoint_storage: CheckpointStorage
            ) -> StreamExecutionEnvironment:
        env = StreamExecutionEnvironment.get_execution_environment()
        env.set_state_backend(state_backend)
        env.get_checkpoint_config().set_checkpoint_storage(checkpoint_storage)
        env.enable_checkpointing(10)
        env.set_parallelism(2)
        return env

    # --- OperatorStateBackendTest -----------------------------------------------------------------

    def test_create_empty(self) -> None:
        backend = OperatorStateBackend()
        assert backend.get_registered_state_names() == set()
        assert backend.get_registered_broadcast_state_names() == set()

    def test_register_states_without_type(self) -> None:
        backend = OperatorStateBackend()
        untyped = backend.get_list_state(ListStateDescriptor("test"))
        typed = backend.get_list_state(ListStateDescriptor("test2", Types.STRING()))
        assert untyped is not None and len(backend.get_registered_state_names()) == 2
        assert typed.get() == []
        typed.add("kevin")
        typed.add("sunny")
        assert typed.get() == ["kevin", "sunny"]

    def test_register_states(self) -> None:
        backend = OperatorStateBackend()
        d1, d2, d3 = _lists(3)
        s1 = backend.get_list_state(d1)
        assert backend.get_registered_state_names() == {"test1"} and s1.get() == []
        s1.add(42)
        s1.add(4711)
        assert s1.get() == [42, 4711]
        s2 = backend.get_list_state(d2)
        s2.add_all([7, 13, 23])
        assert s2.get() == [7, 13, 23] and len(backend.get_registered_state_names()) == 2
        s3 = backend.get_union_list_state(d3)
        s3.add(17)
        s3.add(3)
        s3.add(123)
        assert s3.get() == [17, 3, 123] and len(backend.get_registered_state_names()) == 3
        s1b = backend.get_list_state(d1)
        s1b.add(123)
        assert s1b.get() == s1.get() == [42, 4711, 123]  # one state behind both handles
        with pytest.raises(StateNameClashError):
            backend.get_union_list_state(d2)
        with pytest.raises(StateNameClashError):
            backend.get_list_state(d3)

    def test_null_values_are_refused(self) -> None:
        state = OperatorStateBackend().get_list_state(ListStateDescriptor("l", Types.LONG()))
        state.add(1)
        for call, arg in (("add", None), ("add_all", None), ("update", None), ("add_all", [None])):
            with pytest.raises(StateError):
                getattr(state, call)(arg)
        assert state.get() == [1]  # nothing lost by the refusals

    def test_snapshot_empty(self) -> None:
        assert OperatorStateBackend().snapshot() is None

    def test_snapshot_broadcast_state_with_empty_operator_state(self, roundtrip: Any) -> None:
        desc = MapStateDescriptor("test-broadcast", Types.INT(), Types.INT())
        backend = OperatorStateBackend()
        expected = {1: 2, 3: 4, 5: 6}
        backend.get_broadcast_state(desc).put_all(expected)
        backend = roundtrip(backend)[0]
        state = backend.get_broadcast_state(desc)
        assert dict(state.items()) == expected
        state.remove(1)
        del expected[1]
        backend = roundtrip(backend)[0]
        state = backend.get_broadcast_state(desc)
        assert dict(state.items()) == expected
        state.clear()
        backend = roundtrip(backend)[0]
        assert dict(backend.get_broadcast_state(desc).items()) == {}

    def _fill(self) -> OperatorStateBackend:
        backend = OperatorStateBackend()
        d1, d2, d3 = _lists(3)
        b1, b2, b3 = _maps()
        backend.get_list_state(d1).add_all([42, 4711])
        backend.get_list_state(d2).add_all([7, 13, 23])
        backend.get_union_list_state(d3).add_all([17, 18, 19, 20])
        backend.get_broadcast_state(b1).put_all({1: 2, 2: 5})
        backend.get_broadcast_state(b2).put(2, 5)
        backend.get_broadcast_state(b3)
        return backend

    def _check_restored(self, backend: OperatorStateBackend) -> None:
        assert len(backend.get_registered_state_names()) == 3  # before any descriptor asks
        assert len(backend.get_registered_broadcast_state_names()) == 3
        d1, d2, d3 = _lists(3)
        b1, b2, b3 = _maps()
        assert backend.get_list_state(d1).get() == [42, 4711]
        assert backend.get_list_state(d2).get() == [7, 13, 23]
        assert backend.get_union_list_state(d3).get() == [17, 18, 19, 20]
        assert list(backend.get_broadcast_state(b1).items()) == [(1, 2), (2, 5)]
        assert list(backend.get_broadcast_state(b2).items()) == [(2, 5)]
        assert list(backend.get_broadcast_state(b3).items()) == []
        assert len(backend.get_registered_state_names()) == 3
        assert len(backend.get_registered_broadcast_state_names()) == 3

    def test_snapshot_restore_sync(self, roundtrip: Any) -> None:
        self._check_restored(roundtrip(self._fill())[0])

    def test_snapshot_restore_async(self, checkpoint_storage: CheckpointStorage) -> None:
        """Changes after the snapshot's synchronous part (in-place changes of elements too)
        never reach what its asynchronous part writes."""
        backend = self._fill()
        mutable = backend.get_list_state(ListStateDescriptor("test7", Types.GENERIC()))
        mutable.add({"value": 1})
        data = backend.snapshot()
        assert data is not None
        backend.get_list_state(_lists(1)[0]).add(77)
        backend.get_broadcast_state(_maps()[0]).put(32, 97)
        for element in mutable.get():
            element["value"] += 10
        backend.get_union_list_state(_lists(3)[2]).clear()
        backend.get_broadcast_state(_maps()[1]).clear()
        backend.get_list_state(ListStateDescriptor("test8", Types.GENERIC()))
        access = checkpoint_storage.create_access(uuid.uuid4().hex)
        try:
            handle = OperatorStateBackend.write(data, access.streams(1, "op"))
            restored = OperatorStateBackend(read_snapshots([handle], access.reader())[0])
        finally:
            access.delete_all()
        assert restored.get_list_state(ListStateDescriptor("test7", Types.GENERIC())).get() == [
            {"value": 1}]
        assert len(restored.get_registered_state_names()) == 4
        restored.get_list_state(ListStateDescriptor("test7", Types.GENERIC()))
        self._check_restored_lists(restored)

    def _check_restored_lists(self, backend: OperatorStateBackend) -> None:
        d1, d2, d3 = _lists(3)
        assert backend.get_list_state(d1).get() == [42, 4711]
        assert backend.get_list_state(d2).get() == [7, 13, 23]
        assert backend.get_union_list_state(d3).get() == [17, 18, 19, 20]
        assert list(backend.get_broadcast_state(_maps()[0]).items()) == [(1, 2), (2, 5)]

    def test_snapshot_write_into_an_aborted_checkpoint_fails(
            self, checkpoint_storage: CheckpointStorage) -> None:
        """testSnapshotAsyncCancel: an aborted checkpoint's write stops with an error."""
        data = self._fill().snapshot()
        access = checkpoint_storage.create_access(uuid.uuid4().hex)
        try:
            streams = access.streams(1, "op")
            streams.cancelled = True
            with pytest.raises(CheckpointError):
                OperatorStateBackend.write(data, streams)  # type: ignore[arg-type]
        finally:
            access.delete_all()

    # --- redistribution (RoundRobinOperatorStateRepartitioner) -----------------------------------

    def test_rescale_splits_unions_and_copies(self, roundtrip: Any) -> None:
        d1, _, d3 = _lists(3)
        b1 = _maps()[0]
        old = [OperatorStateBackend() for _ in range(2)]
        for n, backend in enumerate(old):
            backend.get_list_state(d1).add_all([10 * n + i for i in range(3 - n)])
            backend.get_list_state(ListStateDescriptor("test2", Types.GENERIC())).add_all(
                [100 * n + i for i in range(3 - n)])
            backend.get_union_list_state(d3).add(f"s{n}")
            backend.get_broadcast_state(b1).put("rule", n)
        new = roundtrip(old[0], 3, old[1:])
        # 5 elements to 3 subtasks: 2, 2, 1; the next state's round starts where the odd ones
        # ended (subtask 2), so its runs go to subtasks 2, 0, 1
        assert [b.get_list_state(d1).get() for b in new] == [[0, 1], [2, 10], [11]]
        assert [b.get_list_state(ListStateDescriptor("test2", Types.GENERIC())).get()
                for b in new] == [[2, 100], [101], [0, 1]]
        assert [b.get_union_list_state(d3).get() for b in new] == [["s0", "s1"]] * 3
        assert [dict(b.get_broadcast_state(b1).items()) for b in new] == [
            {"rule": 0}, {"rule": 1}, {"rule": 0}]  # new subtask i: old i % 2's copy
        same = roundtrip(new[0], 3, new[1:])  # same parallelism: lists stay, unions unite
        assert [b.get_list_state(d1).get() for b in same] == [[0, 1], [2, 10], [11]]
        assert same[0].get_union_list_state(d3).get() == ["s0", "s1"] * 3

    # --- PyFlink test_data_stream.py ----------------------------------------------------------------

    def test_co_broadcast_process(self, env: StreamExecutionEnvironment) -> None:
        mapping = MapStateDescriptor("mapping", Types.INT(), Types.STRING())
        ds = env.from_collection([1, 2, 3, 4, 5], type_info=Types.INT())
        broadcast = env.from_collection([(0, "a"), (1, "b")]).broadcast(mapping)
        out = ds.connect(broadcast).process(_CachingBroadcast(mapping)).execute_and_collect()
        assert sorted(out) == sorted(["0a", "0a", "1b", "1b", "a2", "a4", "b1", "b3", "b5"])

    def test_keyed_co_broadcast_process(self, env: StreamExecutionEnvironment) -> None:
        mapping = MapStateDescriptor("mapping", Types.INT(), Types.STRING())
        strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(
            lambda value, _: int(value[1]))
        ds = env.from_collection([(1, "1603708211000"), (2, "1603708212000"),
                                  (3, "1603708213000"), (4, "1603708214000")]
                                 ).assign_timestamps_and_watermarks(strategy)
        broadcast = env.from_collection([(0, "1603708215000", "a"), (1, "1603708215000", "b")]
                                        ).assign_timestamps_and_watermarks(strategy)
        out = (ds.key_by(lambda t: t[0]).connect(broadcast.broadcast(mapping))
               .process(_CachingKeyedBroadcast(mapping)).execute_and_collect())
        assert sorted(out) == sorted([
            "value: 0a, ts: 1603708215000", "value: 0a, ts: 1603708215000",
            "value: 1, ts: 1603708221000", "value: 1b, ts: 1603708215000",
            "value: 1b, ts: 1603708215000", "value: 2, ts: 1603708222000",
            "value: 3, ts: 1603708223000", "value: 4, ts: 1603708224000",
            "value: a2, ts: 1603708212000", "value: a4, ts: 1603708214000",
            "value: b1, ts: 1603708211000", "value: b3, ts: 1603708213000"])

    def test_co_broadcast_side_output(self, env: StreamExecutionEnvironment) -> None:
        dummy = MapStateDescriptor("dummy", Types.INT(), Types.STRING())
        ds = env.from_collection([("a", 0), ("b", 1), ("c", 2)])
        broadcast = env.from_collection([(3, "d"), (4, "f")]).broadcast(dummy)
        out = ds.connect(broadcast).process(_SideBroadcast()).execute_and_collect()
        assert sorted(out) == ["a", "b", "c", "d", "d", "f", "f"]
        assert sorted(out.get_side_output(SIDE)) == [0, 1, 2, 3, 3, 4, 4]

    def test_keyed_co_broadcast_side_output(self, env: StreamExecutionEnvironment) -> None:
        dummy = MapStateDescriptor("dummy", Types.INT(), Types.STRING())
        ds = env.from_collection([("a", 0), ("b", 1), ("a", 2), ("b", 3)])
        broadcast = env.from_collection([(5, "c"), (6, "d")]).broadcast(dummy)
        out = (ds.key_by(lambda e: e[0]).connect(broadcast)
               .process(_SideKeyedBroadcast()).execute_and_collect())
        assert sorted(out) == ["a", "a", "b", "b", "c", "c", "d", "d"]
        assert sorted(out.get_side_output(SIDE)) == [0, 1, 2, 4, 5, 5, 6, 6]

    def test_read_only_view_refuses_writes(self) -> None:
        """Flink's ReadOnlyBroadcastState has no writers; here every writer raises."""
        mapping = MapStateDescriptor("mapping", Types.INT(), Types.STRING())
        view = OperatorStateBackend().get_broadcast_state(mapping).read_only()
        for call, args in (("put", (1, "a")), ("put_all", ({1: "a"},)), ("remove", (1,)),
                           ("clear", ()), ("__setitem__", (1, "a")), ("__delitem__", (1,))):
            with pytest.raises(ReadOnlyStateError):
                getattr(view, call)(*args)


SIDE = OutputTag("side", Types.INT())


class _CachingBroadcast(BroadcastProcessFunction):
    def __init__(self, desc: MapStateDescriptor) -> None:
        self.desc = desc
        self.cache: dict[int, list[int]] = defaultdict(list)

    def process_element(self, value: int, ctx: Any) -> Any:
        state = ctx.get_broadcast_state(self.desc)
        key = value % 2
        if state.contains(key):
            for v in self.cache.pop(key, []):
                yield state.get(key) + str(v)
            yield state.get(key) + str(value)
        else:
            self.cache[key].append(value)

    def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
        key = value[0]
        yield str(key) + value[1]
        ctx.get_broadcast_state(self.desc).put(key, value[1])
        for v in self.cache.pop(key, []):
            yield value[1] + str(v)


def _text(s: Any, t: Any) -> str:
    return f"value: {s}, ts: {t}"


class _CachingKeyedBroadcast(KeyedBroadcastProcessFunction):
    def __init__(self, desc: MapStateDescriptor) -> None:
        self.desc = desc

    def open(self, runtime_context: Any) -> None:
        self.cache: dict[int, list[Any]] = defaultdict(list)

    def process_element(self, value: Any, ctx: Any) -> Any:
        state = ctx.get_broadcast_state(self.desc)
        key = value[0] % 2
        if state.contains(key):
            for v in self.cache.pop(key, []):
                yield _text(state.get(key) + str(v[0]), v[1])
            yield _text(state.get(key) + str(value[0]), value[1])
        else:
            self.cache[key].append(value)
        ctx.timer_service().register_event_time_timer(ctx.timestamp() + 10000)

    def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
        key = value[0]
        yield _text(str(key) + value[2], ctx.timestamp())
        ctx.get_broadcast_state(self.desc).put(key, value[2])
        for v in self.cache.pop(key, []):
            yield _text(value[2] + str(v[0]), v[1])

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield _text(ctx.get_current_key(), timestamp)


class _SideBroadcast(BroadcastProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value[0]
        yield SIDE, value[1]

    def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
        yield value[1]
        yield SIDE, value[0]


class _SideKeyedBroadcast(KeyedBroadcastProcessFunction):
    def open(self, runtime_context: Any) -> None:
        self.total = runtime_context.get_reducing_state(
            ReducingStateDescriptor("reduce", lambda i, j: i + j, Types.INT()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.total.add(value[1])
        yield value[0]
        yield SIDE, self.total.get()

    def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
        yield value[1]
        yield SIDE, value[0]
