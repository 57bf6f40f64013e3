"""Heap backend snapshots: copy-on-write isolation, incremental changelogs, restore and cleanup."""

from __future__ import annotations

import random
import threading
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekit import (
    FileSystemCheckpointStorage,
    HashMapStateBackend,
    JobManagerCheckpointStorage,
    ListStateDescriptor,
    MapStateDescriptor,
    Types,
    ValueStateDescriptor,
)
from statekit.backends.heap import HEAP_CHANGELOG_FORMAT, HeapKeyedStateBackend
from statekit.backends.kvformat import KV_FORMAT
from statekit.checkpoint.config import CheckpointConfig
from statekit.checkpoint.handles import file_paths
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.checkpoint.streams import SHARED_PREFIX
from statekit.errors import ConfigError
from statekit.runtime.coordinator import CheckpointCoordinator
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import serializer_for

MAXP = 16
VALUE = ValueStateDescriptor("v", Types.MAP(Types.STRING(), Types.LONG()))
LIST = ListStateDescriptor("l", Types.LONG())
MAP = MapStateDescriptor("m", Types.STRING(), Types.LIST(Types.LONG()))
COUNT = ValueStateDescriptor("c", Types.LONG())


def make(incremental: bool = False, asynchronous: bool = True,
         rng: KeyGroupRange | None = None, **kw: Any) -> HeapKeyedStateBackend:
    factory = HashMapStateBackend(asynchronous, incremental=incremental, **kw)
    return factory.create_keyed_state_backend(
        key_serializer=serializer_for(Types.LONG()),
        key_group_range=rng or KeyGroupRange.all(MAXP), max_parallelism=MAXP,
    )


def memory_access() -> CheckpointStorageAccess:
    return JobManagerCheckpointStorage().create_access(uuid.uuid4().hex)


def dump(backend: HeapKeyedStateBackend, keys: range | list[int]) -> dict[str, dict[int, Any]]:
    """Everything the backend holds for ``keys``, as plain (deep-copied) Python values."""
    v, lst, m, c = (backend.get_partitioned_state(d) for d in (VALUE, LIST, MAP, COUNT))
    out: dict[str, dict[int, Any]] = {"v": {}, "l": {}, "m": {}, "c": {}}
    for k in keys:
        backend.set_current_key(k)
        if v.value() is not None:
            out["v"][k] = dict(v.value())
        if list(lst.get()):
            out["l"][k] = list(lst.get())
        if not m.is_empty():
            out["m"][k] = {uk: list(uv) for uk, uv in m.items()}
        if c.value() is not None:
            out["c"][k] = c.value()
    return out


def checkpoint(backend: HeapKeyedStateBackend, access: CheckpointStorageAccess, cid: int,
               during: Any = None) -> dict[str, Any]:
    """Snapshot, run the async part (optionally while ``during()`` mutates), commit, confirm."""
    streams = access.streams(cid, "t")
    run = backend.snapshot(cid, streams)
    if during is None:
        handle = run.run()
    else:
        result: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: result.setdefault("h", run.run()))
        thread.start()
        during(thread)
        thread.join()
        handle = result["h"]
    access.commit(cid, {"tasks": {"t": handle}})
    backend.notify_checkpoint_complete(cid)
    return handle


def restore(access: CheckpointStorageAccess, cid: int, **kw: Any) -> HeapKeyedStateBackend:
    backend = make(**kw)
    backend.restore([access.load(cid)["tasks"]["t"]], access.reader())
    return backend


def populate(backend: HeapKeyedStateBackend, n: int) -> None:
    v, lst, m, c = (backend.get_partitioned_state(d) for d in (VALUE, LIST, MAP, COUNT))
    for k in range(n):
        backend.set_current_key(k)
        v.update({"a": k})
        lst.add_all([k, k + 1])
        m.put("x", [k])
        c.update(k)


def mutate_everything(backend: HeapKeyedStateBackend, n: int, rounds: int) -> None:
    """In-place and replacing mutations of every kind of state."""
    v, lst, m, c = (backend.get_partitioned_state(d) for d in (VALUE, LIST, MAP, COUNT))
    for r in range(rounds):
        for k in range(n):
            backend.set_current_key(k)
            v.value()["a"] += 1000  # in place, no update()
            lst.get().append(-r)  # in place on the handed-out list
            lst.add(r)
            m.get("x").append(r)  # in place on a map value
            m.put(f"y{r}", [r])
            c.update(c.value() + 1)
            if k % 7 == 0:
                m.remove("x")
                m.put("x", [-1])


@pytest.mark.parametrize("mode", ["thread", "fork"])
@pytest.mark.parametrize("incremental", [False, True])
def test_snapshot_under_concurrent_mutation_restores_capture_state(incremental: bool, mode: str) -> None:
    n = 300
    backend = make(incremental=incremental, snapshot_mode=mode)
    access = memory_access()
    populate(backend, n)
    if incremental:  # make the next one a changelog over a confirmed base
        checkpoint(backend, access, 1)
        mutate_everything(backend, n, 1)
    expected = dump(backend, range(n))
    live_expected: dict[str, Any] = {}

    def during(thread: threading.Thread) -> None:
        rounds = 0
        while thread.is_alive() or rounds < 2:
            mutate_everything(backend, n, 1)
            rounds += 1
        live_expected.update(dump(backend, range(n)))

    handle = checkpoint(backend, access, 2, during=during)
    assert handle["format"] == (HEAP_CHANGELOG_FORMAT if incremental else KV_FORMAT)
    if incremental:
        assert handle["incremental"] is True
    assert dump(restore(access, 2), range(n)) == expected
    assert dump(backend, range(n)) == live_expected != expected


def test_synchronous_snapshots_match_asynchronous() -> None:
    access = memory_access()
    a, s = make(), make(asynchronous=False)
    for b in (a, s):
        populate(b, 50)
    checkpoint(a, access, 1)
    checkpoint(s, access, 2)
    assert dump(restore(access, 1), range(50)) == dump(restore(access, 2), range(50)) == dump(a, range(50))


def test_incremental_writes_only_changes_and_rematerializes() -> None:
    n = 2000
    backend = make(incremental=True, materialization_interval=3)
    access = memory_access()
    c = backend.get_partitioned_state(COUNT)
    for k in range(n):
        backend.set_current_key(k)
        c.update(k)
    sizes = []
    for cid in range(1, 6):
        streams = access.streams(cid, "t")
        handle = backend.snapshot(cid, streams).run()
        access.commit(cid, {"tasks": {"t": handle}})
        backend.notify_checkpoint_complete(cid)
        sizes.append((handle["incremental"], streams.bytes_written))
        for k in range(cid * 10, cid * 10 + 20):  # 1% of keys change
            backend.set_current_key(k)
            c.update(-k)
    assert [inc for inc, _ in sizes] == [False, True, True, True, False]
    full = sizes[0][1]
    assert all(size <= 0.05 * full for inc, size in sizes if inc)
    handle = checkpoint(backend, access, 6)
    assert handle["incremental"] and len(handle["logs"]) == 1
    assert dump(restore(access, 6), range(n)) == dump(backend, range(n))


def test_aborted_checkpoint_folds_dirty_keys_back() -> None:
    backend = make(incremental=True)
    access = memory_access()
    c = backend.get_partitioned_state(COUNT)
    for k in range(20):
        backend.set_current_key(k)
        c.update(k)
    checkpoint(backend, access, 1)
    backend.set_current_key(3)
    c.update(333)
    streams = access.streams(2, "t")
    run = backend.snapshot(2, streams)
    run.cancel()
    backend.notify_checkpoint_aborted(2)  # never completes
    backend.set_current_key(4)
    c.update(444)
    handle = checkpoint(backend, access, 3)
    assert handle["incremental"]
    assert dump(restore(access, 3), range(20)) == dump(backend, range(20))


def test_only_confirmed_checkpoints_serve_as_base() -> None:
    backend = make(incremental=True)
    access = memory_access()
    c = backend.get_partitioned_state(COUNT)
    backend.set_current_key(1)
    c.update(1)
    streams = access.streams(1, "t")
    handle1 = backend.snapshot(1, streams).run()  # written but never confirmed
    backend.set_current_key(2)
    c.update(2)
    handle2 = checkpoint(backend, access, 2)
    assert handle1["incremental"] is False and handle2["incremental"] is False
    assert dump(restore(access, 2), [1, 2])["c"] == {1: 1, 2: 2}


def test_savepoints_stay_full_kv_format_and_keep_dirty_tracking() -> None:
    backend = make(incremental=True)
    access = memory_access()
    populate(backend, 10)
    checkpoint(backend, access, 1)
    backend.set_current_key(5)
    backend.get_partitioned_state(COUNT).update(55)
    sp = backend.snapshot(99, access.streams(99, "sp"), savepoint=True).run()
    assert sp["format"] == KV_FORMAT
    handle = checkpoint(backend, access, 2)
    assert handle["incremental"]
    assert dump(restore(access, 2), range(10)) == dump(backend, range(10))


def test_changelog_restores_rescaled() -> None:
    backend = make(incremental=True)
    access = memory_access()
    populate(backend, 200)
    checkpoint(backend, access, 1)
    mutate_everything(backend, 200, 1)
    checkpoint(backend, access, 2)
    expected = dump(backend, range(200))
    merged: dict[str, dict[int, Any]] = {"v": {}, "l": {}, "m": {}, "c": {}}
    for rng in (KeyGroupRange(0, 6), KeyGroupRange(7, MAXP - 1)):
        part = restore(access, 2, rng=rng)
        owned = [k for k in range(200) if part.key_group_of(k) in rng]
        for name, values in dump(part, owned).items():
            assert not set(values) & set(merged[name])
            merged[name].update(values)
    assert merged == expected


def test_discarding_old_checkpoints_keeps_referenced_base_and_logs(tmp_path: Any) -> None:
    config = CheckpointConfig().set_num_retained_checkpoints(2)
    access = FileSystemCheckpointStorage(str(tmp_path), file_state_size_threshold=0).create_access("job")
    coordinator = CheckpointCoordinator(config, access)
    backend = make(incremental=True, materialization_interval=3, max_log_ratio=10.0)
    populate(backend, 100)
    for round_ in range(8):
        cid = coordinator.trigger({"t": backend}, {})
        coordinator.poll(wait=True)
        assert coordinator.latest_completed() == cid
        for retained in coordinator.retained:
            restored = make()
            restored.restore([access.load(retained)["tasks"]["t"]], access.reader())
            if retained == cid:
                assert dump(restored, range(100)) == dump(backend, range(100))
        mutate_everything(backend, 10 + round_, 1)
        referenced = set().union(*(file_paths(access.load(c)) for c in coordinator.retained))
        on_disk = {k for k in access.store.list(SHARED_PREFIX)}
        assert referenced >= {p for p in on_disk}, "no unreferenced shared files are left"
        assert {p for p in referenced if p.startswith(SHARED_PREFIX)} <= on_disk
    assert [s.incremental for s in coordinator.stats] == [False, True, True, True, False, True, True, True]
    assert access.completed() == coordinator.retained == [7, 8]
    coordinator.shutdown()


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("count"), st.integers(0, 30), st.integers(-5, 5)),
        st.tuples(st.just("clear"), st.integers(0, 30), st.just(0)),
        st.tuples(st.just("append"), st.integers(0, 30), st.integers(0, 9)),
        st.tuples(st.just("inplace"), st.integers(0, 30), st.integers(0, 9)),
        st.tuples(st.just("mapput"), st.integers(0, 30), st.integers(0, 3)),
        st.tuples(st.just("mapremove"), st.integers(0, 30), st.integers(0, 3)),
        st.tuples(st.just("checkpoint"), st.just(0), st.booleans()),
    ),
    max_size=60,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, interval=st.integers(1, 4))
def test_incremental_restores_identically_to_full_and_to_model(ops: list[Any], interval: int) -> None:
    backend = make(incremental=True, materialization_interval=interval)
    access = memory_access()
    lst, m, c = (backend.get_partitioned_state(d) for d in (LIST, MAP, COUNT))
    model: dict[str, dict[int, Any]] = {"l": {}, "m": {}, "c": {}}
    cid = 0
    for op, k, arg in ops:
        backend.set_current_key(k)
        if op == "count":
            c.update(arg)
            model["c"][k] = arg
        elif op == "clear":
            lst.clear()
            model["l"].pop(k, None)
        elif op == "append":
            lst.add(arg)
            model["l"].setdefault(k, []).append(arg)
        elif op == "inplace" and model["l"].get(k):
            lst.get()[0] = arg
            model["l"][k][0] = arg
        elif op == "mapput":
            m.put(str(arg), [arg])
            model["m"].setdefault(k, {})[str(arg)] = [arg]
        elif op == "mapremove":
            m.remove(str(arg))
            model["m"].get(k, {}).pop(str(arg), None)
            if not model["m"].get(k, True):
                del model["m"][k]
        elif op == "checkpoint":
            cid += 1
            run = backend.snapshot(cid, access.streams(cid, "t"))
            if arg:  # complete it
                access.commit(cid, {"tasks": {"t": run.run()}})
                backend.notify_checkpoint_complete(cid)
                full = backend.snapshot(1000 + cid, access.streams(1000 + cid, "t"), savepoint=True).run()
                access.commit(1000 + cid, {"tasks": {"t": full}})
                inc_state = _dump_lmc(restore(access, cid))
                assert inc_state == _dump_lmc(restore(access, 1000 + cid))
                assert inc_state == {n: {kk: vv for kk, vv in d.items()} for n, d in model.items()}
            else:  # aborted
                run.cancel()
                backend.notify_checkpoint_aborted(cid)
    assert _dump_lmc(backend) == model


def _dump_lmc(backend: HeapKeyedStateBackend) -> dict[str, dict[int, Any]]:
    lst, m, c = (backend.get_partitioned_state(d) for d in (LIST, MAP, COUNT))
    out: dict[str, dict[int, Any]] = {"l": {}, "m": {}, "c": {}}
    for k in range(31):
        backend.set_current_key(k)
        if list(lst.get()):
            out["l"][k] = list(lst.get())
        if not m.is_empty():
            out["m"][k] = {uk: list(uv) for uk, uv in m.items()}
        if c.value() is not None:
            out["c"][k] = c.value()
    return out


def test_configuration_keys() -> None:
    b = HashMapStateBackend().configure({
        "state.backend.incremental": "true",
        "state.backend.heap.materialization-interval": "4",
        "state.backend.heap.max-log-ratio": "0.25",
        "state.backend.async": "false",
    })
    assert b.is_incremental_checkpoints_enabled()
    assert b.get_materialization_interval() == 4
    assert b.get_max_log_ratio() == 0.25
    assert not b.is_using_asynchronous_snapshots()
    assert not HashMapStateBackend(incremental=False).configure(
        {"state.backend.incremental": "true"}).is_incremental_checkpoints_enabled()
    with pytest.raises(ConfigError):
        HashMapStateBackend().configure({"state.backend.heap.materialization-interval": "0"})
    with pytest.raises(ConfigError):
        HashMapStateBackend().configure({"state.backend.incremental": "maybe"})
    with pytest.raises(ConfigError):
        HashMapStateBackend(max_log_ratio=0)
    assert HashMapStateBackend().configure(
        {"state.backend.heap.snapshot-mode": "fork"}).get_snapshot_mode() == "fork"
    with pytest.raises(ConfigError):
        HashMapStateBackend(snapshot_mode="spawn")
    paced = HashMapStateBackend().configure({"state.backend.heap.snapshot-pace": "2.5"})
    assert paced.get_snapshot_pace() == 2.5
    assert make(snapshot_pace=0).pace_ratio == 0
    with pytest.raises(ConfigError):
        HashMapStateBackend().configure({"state.backend.heap.snapshot-pace": "-1"})


def test_fork_snapshot_cancel_reaps_child() -> None:
    backend = make(snapshot_mode="fork")
    populate(backend, 50)
    access = memory_access()
    run = backend.snapshot(1, access.streams(1, "t"))
    run.cancel()
    run.cancel()
    handle = checkpoint(backend, access, 2)
    assert dump(restore(access, 2), range(50)) == dump(backend, range(50))
    assert handle["format"] == KV_FORMAT


@pytest.mark.parametrize("incremental", [False, True])
def test_immutable_map_values_are_read_without_copies_and_stay_isolated(incremental: bool) -> None:
    desc = MapStateDescriptor("mi", Types.STRING(), Types.LONG())
    backend = make(incremental=incremental)
    access = memory_access()
    m = backend.get_partitioned_state(desc)
    for k in range(20):
        backend.set_current_key(k)
        m.put("a", k)
    checkpoint(backend, access, 1)
    backend.set_current_key(3)
    m.put("b", 3)
    run = backend.snapshot(2, access.streams(2, "t"))
    for k in range(20):  # reads hand out shared values; writes after capture must not leak
        backend.set_current_key(k)
        assert m.get("a") == k and m.items()[0] == ("a", k)
        m.put("a", -k)
        m.remove("b")
    access.commit(2, {"tasks": {"t": run.run()}})
    restored = restore(access, 2)
    rm = restored.get_partitioned_state(desc)
    for k in range(20):
        restored.set_current_key(k)
        assert dict(rm.items()) == ({"a": 3, "b": 3} if k == 3 else {"a": k})


def test_unnotified_attempts_are_bounded_and_lose_nothing() -> None:
    backend = make(incremental=True)
    access = memory_access()
    c = backend.get_partitioned_state(COUNT)
    for k in range(40):
        backend.set_current_key(k)
        c.update(k)
    checkpoint(backend, access, 1)
    for cid in range(2, 40):  # checkpoints nobody confirms or aborts
        backend.set_current_key(cid)
        c.update(-cid)
        backend.snapshot(cid, access.streams(cid, "t")).run()
    assert len(backend._attempts) <= 16
    handle = checkpoint(backend, access, 40)
    assert handle["incremental"]
    assert dump(restore(access, 40), range(40)) == dump(backend, range(40))


@pytest.mark.parametrize("incremental", [False, True])
def test_checkpoints_are_plain_parts_and_restore_rescaled(incremental: bool, tmp_path: Any) -> None:
    backend = make(incremental=incremental)
    access = memory_access()
    populate(backend, 300)
    handle = checkpoint(backend, access, 1)
    entries = handle["base"] if incremental else handle["states"]
    assert {entry["encoding"] for entry in entries.values()} == {"plain"}
    expected = dump(backend, range(300))
    from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend

    for rng in (KeyGroupRange(0, 6), KeyGroupRange(7, MAXP - 1), KeyGroupRange.all(MAXP)):
        restored = [restore(access, 1, rng=rng)]
        if not incremental:  # a heap checkpoint also restores into RocksDB (backend-neutral)
            factory = EmbeddedRocksDBStateBackend()
            factory.set_db_storage_paths(str(tmp_path / uuid.uuid4().hex))
            rocks = factory.create_keyed_state_backend(
                key_serializer=serializer_for(Types.LONG()), key_group_range=rng,
                max_parallelism=MAXP)
            rocks.restore([access.load(1)["tasks"]["t"]], access.reader())
            restored.append(rocks)
        for part in restored:
            owned = [k for k in range(300) if part.key_group_of(k) in rng]
            assert dump(part, range(300)) == {
                name: {k: v for k, v in values.items() if k in owned}
                for name, values in expected.items()}
            part.dispose()


def test_state_registered_while_a_snapshot_carries_it_over_stays_isolated() -> None:
    source = make()
    populate(source, 50)
    access = memory_access()
    checkpoint(source, access, 1)
    backend = restore(access, 1)  # restored, nothing registered yet
    run = backend.snapshot(2, access.streams(2, "t"))  # carries the restored states over
    mutate_everything(backend, 50, 1)  # registers every state and mutates values in place
    handle = run.run()
    access.commit(2, {"tasks": {"t": handle}})
    assert dump(restore(access, 2), range(50)) == dump(source, range(50))
    assert dump(backend, range(50)) != dump(source, range(50))


class FakeTime:
    """The pacer's clock, moved by hand; ``sleep`` records and calls ``on_sleep``."""

    def __init__(self, on_sleep: Any = None) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self.on_sleep = on_sleep

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if self.on_sleep is not None:
            self.on_sleep(seconds)


def test_pacer_sleeps_only_while_the_processing_thread_works(monkeypatch: Any) -> None:
    """The writer works in turns of PACE_TURN and then yields the GIL for ``ratio`` times the
    turn, unless the processing thread stayed idle through a whole turn and yield."""
    from statekit.backends.heap import snapshot as heap_module

    def asleep(seconds: float) -> None:  # the processing thread runs while the writer sleeps
        if seconds and moves_while_asleep:
            current["key"] += 1

    clock = FakeTime(asleep)
    monkeypatch.setattr(heap_module, "time", clock)
    current = {"key": 1}
    moves_while_asleep = True
    pacer = heap_module._Pacer(2.0, lambda: current["key"])
    clock.now = heap_module.PACE_TURN / 2
    pacer()  # within the turn: no yield
    assert clock.slept == []
    clock.now = 1.0
    pacer()  # a whole turn: it yields twice the turn; the processing thread ran meanwhile
    assert clock.slept == [2.0]
    clock.now = 1.5
    moves_while_asleep = False
    pacer()  # it still worked last time: yield again; this time it did not move
    assert clock.slept == [2.0, 1.0]
    clock.now = 2.0
    pacer()  # idle through a turn and a yield: full speed, no yield
    assert clock.slept == [2.0, 1.0]
    current["key"] += 1
    clock.now = 2.25
    pacer()  # it works again: yield
    assert clock.slept == [2.0, 1.0, 0.5]


def test_a_pacer_following_another_goes_on_from_its_turn(monkeypatch: Any) -> None:
    """The writer's pacer takes over from the copy phase's (hurried) pacer: its first turn starts
    where that one's last ended, and it keeps what that one saw (an idle processing thread), so
    it does not yield once more for the whole copy phase."""
    from statekit.backends.heap import snapshot as heap_module

    clock = FakeTime()
    monkeypatch.setattr(heap_module, "time", clock)
    pacer = heap_module._Pacer(1.0, lambda: 7)  # the processing thread stays on key 7: idle
    clock.now = 5.0
    hurried = pacer.hurried()
    clock.now = 6.0
    hurried()  # its first turn: it yields once and sees the processing thread idle
    clock.now = 10.0
    hurried()  # idle: full speed
    assert clock.slept == [1.0]
    pacer.follow(hurried)
    clock.now = 10.5
    pacer()  # without ``follow`` this turn would span 0 .. 10.5 and yield 10.5
    assert clock.slept == [1.0]


@pytest.mark.parametrize("on_taker", [True, False])
def test_a_snapshot_written_by_the_thread_that_took_it_is_not_paced(
        monkeypatch: Any, on_taker: bool) -> None:
    """Pacing leaves the GIL to the processing thread, so a snapshot written by that thread
    itself (a Spark task's commit) never sleeps, and reads its captures in place (nothing
    changes them meanwhile) instead of copying them out first; one written by a transfer thread
    beside a busy processing thread does both."""
    from statekit.backends.heap import capture as capture_module
    from statekit.backends.heap import snapshot as heap_module

    slept: list[float] = []
    copies: list[int] = []
    monkeypatch.setattr(heap_module, "PACE_TURN", 0.0)  # every step ends a turn
    monkeypatch.setattr(heap_module.time, "sleep", slept.append)
    copy_out = capture_module.Capture.copy_out
    monkeypatch.setattr(capture_module.Capture, "copy_out",
                        lambda self, pace: copies.append(1) or copy_out(self, pace))
    backend = make()
    populate(backend, 3_000)
    access = memory_access()
    run = backend.snapshot(1, access.streams(1, "t"))
    if on_taker:
        handle = run.run()
    else:
        backend.set_current_key(-1)
        keys = iter(range(-2, -10**6, -1))
        monkeypatch.setattr(heap_module._Pacer, "__init__", _moving(
            heap_module._Pacer.__init__, lambda: backend.set_current_key(next(keys))))
        out: dict[str, Any] = {}
        writer = threading.Thread(target=lambda: out.update(handle=run.run()))
        writer.start()
        writer.join()
        handle = out["handle"]
    access.commit(1, {"tasks": {"t": handle}})
    assert dump(restore(access, 1), range(3_000)) == dump(backend, range(3_000))
    assert (slept == []) is on_taker
    assert (copies == []) is on_taker


def _moving(init: Any, move: Any) -> Any:
    """``_Pacer.__init__`` whose key function moves the current key at every look (a busy
    processing thread)."""
    def patched(self: Any, ratio: float, current_key: Any) -> None:
        def looked() -> Any:
            move()
            return current_key()
        init(self, ratio, looked)
    return patched


@pytest.mark.parametrize("entries", [0, 1, 15, 16, 4097, 65535, 65537, 150_000])
def test_paced_parts_are_the_bytes_packb_writes(entries: int) -> None:
    """A paced part is gathered from short packing steps (the GIL is held briefly) but is the same
    bytes ``packb([keys, values])`` writes, as large as an unpaced part; TTL drops still apply."""
    from statekit.backends.plainparts import reader_parts, slice_reader
    from statekit.serde.msgpack import packb, unpackb

    rng = random.Random(entries)
    keys = list(range(entries))
    values = [rng.randbytes(rng.randrange(0, 30)) for _ in keys]

    def drop(value: bytes) -> bytes | None:  # empty values are not written
        return value or None

    expected = [(k, v) for k, v in zip(keys, values, strict=True) if v]
    paced = list(reader_parts(slice_reader(keys, values), drop=drop, pace=lambda: None))
    unpaced = list(reader_parts(slice_reader(keys, values), drop=drop))
    for parts in (paced, unpaced):
        got = []
        for part in parts:
            ks, vs = unpackb(part)
            assert part == packb([ks, vs])
            got += zip(ks, vs, strict=True)
        assert got == expected
    assert len(paced) <= len(unpaced) + 1


def _filled(keys: int) -> Any:
    """A backend holding ``key * 3`` for each key below ``keys`` in ValueState "n"."""
    backend = make()
    state = backend.get_partitioned_state(ValueStateDescriptor("n", Types.LONG()))
    for key in range(keys):
        backend.set_current_key(key)
        state.update(key * 3)
    return backend


def _assert_restores(handle: Any, access: Any, keys: Any) -> None:
    """A fresh backend restored from ``handle`` holds ``key * 3`` for each of ``keys``."""
    restored = make()
    restored.restore([handle], access.reader())
    again = restored.get_partitioned_state(ValueStateDescriptor("n", Types.LONG()))
    for key in keys:
        restored.set_current_key(key)
        assert again.value() == key * 3
    restored.dispose()


@pytest.mark.parametrize("storage", ["local", "memory"])
@pytest.mark.parametrize("writer", ["taker", "other"])
def test_who_writes_a_snapshots_parts(writer: str, storage: str, tmp_path: Any,
                                      monkeypatch: Any) -> None:
    """The thread that took a snapshot hands its parts to the store itself (the local disk
    writes them on a writer thread of its own).  A snapshot written beside the processing
    thread, which paces itself, hands them to a writer thread when the store has none, so the
    writes go on while it yields the GIL.  Both restore exactly."""
    from statekit.checkpoint.blobstore.base import BlobStore
    from statekit.checkpoint.blobstore.local import LocalBlobStore

    seen: list[str] = []
    cls = LocalBlobStore if storage == "local" else BlobStore
    put_parts = cls.put_parts

    def recording(self: Any, key: str, parts: Any) -> None:
        seen.append(threading.current_thread().name)
        put_parts(self, key, parts)

    monkeypatch.setattr(cls, "put_parts", recording)
    backend = _filled(5000)
    root = str(tmp_path) if storage == "local" else f"memory://statekit-who-{uuid.uuid4().hex}"
    access = FileSystemCheckpointStorage(root, file_state_size_threshold=0).create_access("job")
    streams = access.streams(1, "task")
    run = backend.snapshot(1, streams)
    handles: list[Any] = []
    if writer == "taker":
        handles.append(run.run())
    else:
        thread = threading.Thread(target=lambda: handles.append(run.run()), name="snapshotter")
        thread.start()
        thread.join()
    expected = {"taker": "MainThread", "other": "snapshotter"}[writer]
    if writer == "other" and storage == "memory":
        expected = "statekit-writer"
    assert seen == [expected]
    _assert_restores(handles[0], access, (0, 1234, 4999))
    backend.dispose()
    if storage == "memory":
        import fsspec

        fsspec.filesystem("memory").rm(root.removeprefix("memory://"), recursive=True)


@pytest.mark.parametrize(("helper_after", "buffers"), [(1 << 40, 1), (1, 3)],
                         ids=["one-thread", "helper"])
def test_a_snapshots_parts_reuse_a_few_buffers(helper_after: int, buffers: int, tmp_path: Any,
                                              monkeypatch: Any) -> None:
    """Nothing between the packer and the disk keeps a part once it is passed on, so a state
    of many parts is packed into a few reused buffers (fresh memory for every part cost page
    faults): one buffer when each part is written before the next is packed (any part kept
    would cost a fresh buffer per part), three beside the helper.  The parts restore exactly."""
    import msgpack

    from statekit.backends import plainparts
    from statekit.checkpoint.blobstore import partwriter

    created: list[bool] = []
    real = msgpack.Packer

    def counting(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("autoreset") is False:  # a reused part buffer (not a one-shot packer)
            created.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(msgpack, "Packer", counting)
    monkeypatch.setattr(plainparts, "PLAIN_PART_BYTES", 4096)
    monkeypatch.setattr(partwriter, "HELPER_AFTER", helper_after)
    monkeypatch.setattr(plainparts, "PART_BUFFERS", buffers)
    backend = _filled(20_000)
    access = FileSystemCheckpointStorage(str(tmp_path), file_state_size_threshold=0).create_access("job")
    handle = backend.snapshot(1, access.streams(1, "task")).run()
    parts = handle["states"]["n"]["parts"]
    assert len(parts) > 20
    assert 1 <= len(created) <= buffers + 1  # (+1: the first part, held as the inline head)
    _assert_restores(handle, access, (0, 7777, 19_999))
    backend.dispose()
