"""Constant-time heap captures: the snapshot reads the live dict while processing goes on.

A capture shares the live dict (no copy); the live side keeps the dict's size fixed while captures
are pending (new keys staged, removals as tombstones), saves the old value of each key's first
change (copying mutable ones), and settles once no snapshot reads the dict any more.
"""

from __future__ import annotations

import gc
import random
import sys
import threading
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from statekit import (
    HashMapStateBackend,
    JobManagerCheckpointStorage,
    ListStateDescriptor,
    MapStateDescriptor,
    Types,
    ValueStateDescriptor,
)
from statekit.backends.bulk import BulkState
from statekit.backends.heap import HeapKeyedStateBackend
from statekit.backends.heap import capture as table_module
from statekit.backends.heap.capture import Capture
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.errors import CheckpointError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import serializer_for

MAXP = 16
COUNT = ValueStateDescriptor("c", Types.LONG())
NAMES = ValueStateDescriptor("n", Types.MAP(Types.STRING(), Types.LONG()))  # mutable values
LIST = ListStateDescriptor("l", Types.LONG())
MAP = MapStateDescriptor("m", Types.STRING(), Types.LONG())


@pytest.fixture(autouse=True, params=["one dict", "sharded"])
def saved_values(request: Any, monkeypatch: Any) -> str:
    """Every case twice: values saved since a capture in one dict (a small table), and spread
    over many (a big table's: here two keys per shard)."""
    if request.param == "sharded":
        monkeypatch.setattr(table_module, "UNDO_SHARD_KEYS", 2)
    return str(request.param)


def make(**kw: Any) -> HeapKeyedStateBackend:
    factory = HashMapStateBackend(True, **kw)
    return factory.create_keyed_state_backend(
        key_serializer=serializer_for(Types.LONG()), key_group_range=KeyGroupRange.all(MAXP),
        max_parallelism=MAXP)


def access() -> CheckpointStorageAccess:
    return JobManagerCheckpointStorage().create_access(uuid.uuid4().hex)


def states(backend: HeapKeyedStateBackend) -> tuple[Any, Any, Any, Any]:
    return tuple(backend.get_partitioned_state(d) for d in (COUNT, NAMES, LIST, MAP))


def dump(backend: HeapKeyedStateBackend, keys: range) -> dict[str, dict[int, Any]]:
    c, n, lst, m = states(backend)
    out: dict[str, dict[int, Any]] = {"c": {}, "n": {}, "l": {}, "m": {}}
    for k in keys:
        backend.set_current_key(k)
        if c.value() is not None:
            out["c"][k] = c.value()
        if n.value() is not None:
            out["n"][k] = dict(n.value())
        if lst.get():
            out["l"][k] = list(lst.get())
        if not m.is_empty():
            out["m"][k] = dict(m.items())
    return out


def restored(acc: CheckpointStorageAccess, handle: dict[str, Any], keys: range
             ) -> dict[str, dict[int, Any]]:
    backend = make()
    backend.restore([handle], acc.reader())
    try:
        return dump(backend, keys)
    finally:
        backend.dispose()


def apply(backend: HeapKeyedStateBackend, op: tuple[str, int, int]) -> None:
    """One change: every kind of write, in place and replacing, new keys and removals."""
    kind, key, x = op
    c, n, lst, m = states(backend)
    backend.set_current_key(key)
    if kind == "set":
        c.update(x)
    elif kind == "incr":
        c.update((c.value() or 0) + x)
    elif kind == "clear":
        c.clear()
    elif kind == "name":  # in place on a handed-out mutable value
        value = n.value()
        if value is None:
            n.update({"x": x})
        else:
            value["x"] = value.get("x", 0) + x
    elif kind == "unname":
        n.update(None)
    elif kind == "append":
        lst.add(x)
    elif kind == "relist":
        lst.update([x] if x % 3 else [])
    elif kind == "put":
        m.put(f"u{x % 4}", x)
    elif kind == "remove":
        m.remove(f"u{x % 4}")


KINDS = ["set", "incr", "clear", "name", "unname", "append", "relist", "put", "remove"]
KEYS = 24


def test_capture_shares_the_live_dict_without_copying() -> None:
    backend = make()
    c, *_ = states(backend)
    for k in range(1000):
        backend.set_current_key(k)
        c.update(k)
    table = backend.tables["c"]
    data = table.data
    before = dict(data)
    run = backend.snapshot(1, access().streams(1, "t"))
    assert table.data is data and data == before  # nothing copied, nothing changed
    assert [type(cap) for cap in table.snaps] == [Capture]
    assert run.sync_seconds < 0.05
    run.cancel()


def test_writes_during_a_pending_capture_keep_the_dict_size_and_settle_afterwards() -> None:
    backend = make()
    c, *_ = states(backend)
    for k in range(10):
        backend.set_current_key(k)
        c.update(k)
    acc = access()
    table = backend.tables["c"]
    run = backend.snapshot(1, acc.streams(1, "t"))
    size = len(table.data)
    for k in range(5, 15):  # overwrite 5..9, add 10..14
        backend.set_current_key(k)
        c.update(-k)
    for k in (0, 12):  # remove an old key and a staged one
        backend.set_current_key(k)
        c.clear()
    assert len(table.data) == size
    assert table.staged == {10: -10, 11: -11, 13: -13, 14: -14}
    assert table.tombs == {0}
    backend.set_current_key(0)
    assert c.value() is None
    backend.set_current_key(11)
    assert c.value() == -11
    handle = run.run()
    assert restored(acc, handle, range(20))["c"] == {k: k for k in range(10)}
    assert not table.snaps and table.watch  # released, not settled yet
    backend.set_current_key(3)
    c.update(33)  # the first write after the snapshot settles
    assert not table.watch and table.staged is None and not table.tombs
    expected = {k: k for k in range(1, 5)} | {3: 33} | {k: -k for k in range(5, 15) if k != 12}
    assert table.data == expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(
    st.tuples(st.sampled_from(KINDS), st.integers(0, KEYS - 1), st.integers(1, 50)),
    st.tuples(st.sampled_from(["capture", "run", "cancel"]), st.integers(0, 3), st.just(0))),
    min_size=10, max_size=120), st.booleans())
@example([("set", 1, 5), ("capture", 0, 0), ("set", 1, 7), ("clear", 1, 0), ("set", 2, 3),
          ("name", 1, 2), ("capture", 0, 0), ("name", 1, 3), ("set", 1, 9), ("run", 1, 0),
          ("run", 0, 0)], False)
def test_snapshots_interleaved_with_changes_restore_their_capture(ops: list[Any],
                                                                  incremental: bool) -> None:
    """Any interleaving of changes with captures, runs (in any order) and cancels: each snapshot
    restores exactly the state at its capture, and the live state is never disturbed."""
    backend = make(incremental=incremental)
    acc = access()
    model = make()  # the same changes applied to a backend that never snapshots
    pending: list[tuple[Any, dict[str, Any], int]] = []
    cid = 0
    for op in ops:
        kind, n, _ = op
        if kind == "capture":
            cid += 1
            pending.append((backend.snapshot(cid, acc.streams(cid, "t")), dump(model, range(KEYS)),
                            cid))
        elif kind in ("run", "cancel") and pending:
            run, expected, done_cid = pending.pop(n % len(pending))
            if kind == "cancel":
                run.cancel()
                backend.notify_checkpoint_aborted(done_cid)
                continue
            handle = run.run()
            acc.commit(done_cid, {"tasks": {"t": handle}})
            if not incremental:
                assert restored(acc, handle, range(KEYS)) == expected
        elif kind not in ("capture", "run", "cancel"):
            apply(backend, op)
            apply(model, op)
    assert dump(backend, range(KEYS)) == dump(model, range(KEYS))
    for run, expected, _ in pending:
        handle = run.run()
        if not incremental:
            assert restored(acc, handle, range(KEYS)) == expected
    assert dump(backend, range(KEYS)) == dump(model, range(KEYS))


@pytest.mark.parametrize("incremental", [False, True])
def test_capture_under_concurrent_changes_on_another_thread(incremental: bool) -> None:
    """The snapshot thread reads the live dicts while the processing thread changes, adds and
    removes keys (switching threads every few microseconds)."""
    keys = 3000
    backend = make(incremental=incremental)
    model = make()
    rng = random.Random(5)
    for k in range(keys):
        for target in (backend, model):
            apply(target, ("set", k, k))
            apply(target, ("name", k, k))
            apply(target, ("append", k, k))
    acc = access()
    if incremental:  # the next one is a changelog over this base
        acc.commit(1, {"tasks": {"t": backend.snapshot(1, acc.streams(1, "t")).run()}})
        backend.notify_checkpoint_complete(1)
    expected = dump(model, range(keys + 500))
    run = backend.snapshot(2, acc.streams(2, "t"))
    result: dict[str, Any] = {}
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        thread = threading.Thread(target=lambda: result.setdefault("h", run.run()))
        thread.start()
        while thread.is_alive() or len(result) == 0:
            op = (rng.choice(KINDS), rng.randrange(keys + 500), rng.randrange(1, 50))
            apply(backend, op)
            apply(model, op)
            if not thread.is_alive():
                break
        thread.join()
    finally:
        sys.setswitchinterval(interval)
    acc.commit(2, {"tasks": {"t": result["h"]}})
    chain = make()
    chain.restore([acc.load(2)["tasks"]["t"]], acc.reader())
    assert dump(chain, range(keys + 500)) == expected
    chain.dispose()
    assert dump(backend, range(keys + 500)) == dump(model, range(keys + 500))


def test_cancel_before_the_run_releases_and_the_run_refuses() -> None:
    backend = make()
    c, *_ = states(backend)
    backend.set_current_key(1)
    c.update(1)
    run = backend.snapshot(1, access().streams(1, "t"))
    assert backend.tables["c"].snaps
    run.cancel()
    assert not backend.tables["c"].snaps and not backend.tables["n"].snaps
    with pytest.raises(CheckpointError):
        run.run()
    c.update(2)
    assert not backend.tables["c"].watch


def test_a_dropped_run_releases_its_captures() -> None:
    backend = make()
    c, *_ = states(backend)
    backend.set_current_key(1)
    c.update(1)
    backend.snapshot(1, access().streams(1, "t"))  # never run, never cancelled
    gc.collect()
    assert not backend.tables["c"].snaps
    c.update(2)
    assert not backend.tables["c"].watch and backend.tables["c"].data == {1: 2}


def test_bulk_access_during_a_pending_capture() -> None:
    backend = make()
    bulk = BulkState(backend)
    bulk.put(COUNT, list(range(10)), list(range(10)))
    bulk.put(NAMES, [1, 2], [{"a": 1}, {"b": 2}])
    acc = access()
    run = backend.snapshot(1, acc.streams(1, "t"))
    bulk.put(COUNT, [3, 10, 11], [None, 100, 110])  # remove, then two new keys (staged)
    assert bulk.get(COUNT, [2, 3, 10, 11, 12]) == [2, None, 100, 110, None]
    bulk.get(NAMES, [1])[0]["a"] = 99  # a mutable value handed out: a private copy
    handle = run.run()
    got = restored(acc, handle, range(12))
    assert got["c"] == {k: k for k in range(10)}
    assert got["n"] == {1: {"a": 1}, 2: {"b": 2}}
    assert bulk.get(NAMES, [1]) == [{"a": 99}]
    assert bulk.get(COUNT, list(range(12))) == [0, 1, 2, None, *range(4, 10), 100, 110]


def test_bulk_list_and_map_access_during_a_pending_capture() -> None:
    """Bulk appends, entry puts and removals while a snapshot is pending change private copies
    (new keys staged): the snapshot keeps what was there at capture."""
    backend = make()
    bulk = BulkState(backend)
    bulk.add(LIST, [1, 2, 1], [10, 20, 11])
    bulk.put_entries(MAP, [1, 2], ["a", "b"], [1, 2])
    acc = access()
    run = backend.snapshot(1, acc.streams(1, "t"))
    bulk.add(LIST, [1, 3, 3], [12, 30, 31])  # an in-place append, then a new key (staged)
    bulk.put_entries(MAP, [1, 3], ["x", "c"], [9, 3])
    bulk.remove_entries(MAP, [2], ["b"])  # the map empties: removed
    assert bulk.get(LIST, [1, 2, 3]) == [[10, 11, 12], [20], [30, 31]]
    assert bulk.get_entries(MAP, [1, 1, 2, 3], ["a", "x", "b", "c"]) == [1, 9, None, 3]
    got = restored(acc, run.run(), range(4))
    assert got["l"] == {1: [10, 11], 2: [20]}
    assert got["m"] == {1: {"a": 1}, 2: {"b": 2}}
    assert bulk.get(MAP, [1, 2, 3]) == [{"a": 1, "x": 9}, {}, {"c": 3}]


def test_nothing_a_snapshot_holds_is_scanned_by_the_garbage_collector() -> None:
    """The copy of immutable values (tuples, untracked as they are made) and the saved old
    values (a dict of plain keys and values) are not tracked by CPython's collector: a snapshot
    of a big state adds nothing to the collections the processing thread triggers (lists of the
    same entries did: 17-68 ms pauses at 1M keys)."""
    backend = make()
    c, *_ = states(backend)
    for k in range(10_000):
        backend.set_current_key(k)
        c.update(k)
    run = backend.snapshot(1, access().streams(1, "t"))
    cap = backend.tables["c"].snaps[0]
    for k in range(0, 10_000, 3):  # changed while the capture is pending: old values saved
        backend.set_current_key(k)
        c.update(-k)
    assert sum(map(len, cap.shards)) == 3334 and not any(map(gc.is_tracked, cap.shards))
    copied = cap.copy_out(None)
    assert not backend.tables["c"].snaps  # released: the live side's fast path is back
    assert copied.chunks and not any(gc.is_tracked(part) for chunk in copied.chunks
                                     for part in chunk)  # type: ignore[union-attr]
    keys, values = [], []
    take = copied.reader()
    while (part := take(1000)) is not None:
        keys += part[0]
        values += part[1]
    assert dict(zip(keys, values, strict=True)) == {k: k for k in range(10_000)}  # as captured
    run.cancel()


def test_staged_keys_are_folded_in_steps_and_stay_readable() -> None:
    """Keys first written while a snapshot was pending are folded into the live dict a step per
    slow-path access (a big fold in one call paused processing); the local runner asks
    ``prepare_snapshot`` until it is done, so the next capture has nothing to fold."""
    from statekit.backends.heap.table import SETTLE_STEP

    backend = make()
    c, *_ = states(backend)
    run = backend.snapshot(1, access().streams(1, "t"))
    keys = 3 * SETTLE_STEP + 5
    for k in range(keys):  # all new while the capture is pending: staged
        backend.set_current_key(k)
        c.update(k + 1)
    table = backend.tables["c"]
    assert len(table.staged) == keys
    run.cancel()
    assert not backend.prepare_snapshot()  # one step
    assert table.watch and len(table.staged) == keys - SETTLE_STEP
    for k in (0, keys // 2, keys - 1):  # every key readable, wherever it is (a read folds a step)
        backend.set_current_key(k)
        assert c.value() == k + 1
    steps = 1
    while not backend.prepare_snapshot():
        steps += 1
    assert steps <= 4 and table.staged is None and not table.watch and len(table.data) == keys
    assert all(table.data[k] == k + 1 for k in range(keys))
    backend.set_current_key(keys - 1)
    c.update(7)  # written to the live dict directly again
    assert table.data[keys - 1] == 7


def test_no_dict_of_saved_values_outgrows_its_share(saved_values: str) -> None:
    """A big table's capture spreads the values saved meanwhile over dicts of at most about
    ``UNDO_SHARD_KEYS`` keys each, even when every key changes (one big dict resizes in a single
    C call: 23 ms at 700k entries, a pause of the processing thread); the snapshot still sees
    every value as it was at capture."""
    n = 100_000
    backend = make()
    c, *_ = states(backend)
    for k in range(n):
        backend.set_current_key(k)
        c.update(k)
    acc = access()
    run = backend.snapshot(1, acc.streams(1, "t"))
    cap = backend.tables["c"].snaps[0]
    for k in range(n):  # every key changes while the capture is pending
        backend.set_current_key(k)
        c.update(-k)
    share = table_module.UNDO_SHARD_KEYS
    # the fewest dicts (a power of two) of ``share`` keys that hold every key of the table
    assert len(cap.shards) == (65_536 if saved_values == "sharded" else 4)
    assert sum(map(len, cap.shards)) == n and max(map(len, cap.shards)) <= share
    handle = run.run()
    acc.commit(1, {"tasks": {"t": handle}})
    assert restored(acc, handle, range(0, n, 997))["c"] == {k: k for k in range(0, n, 997)}
    backend.set_current_key(5)
    assert c.value() == -5
