"""Bulk access (:class:`~statekit.backends.bulk.BulkState`) to list and map state, as every
backend must give it: the same results as the per-key state API, with TTL, typed errors that
write nothing, namespaced states refused, and the current key left alone.  Part of
:class:`~statekit.testing.conformance.BackendConformance`."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from statekit.backends.base import StateBackend
from statekit.backends.bulk import BulkState
from statekit.checkpoint.base import CheckpointStorage
from statekit.errors import StateError, StateNameClashError, StateTypeError
from statekit.serde.types import Types
from statekit.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateTtlConfig,
    Time,
)
from statekit.testing.cluster import KeyedCluster

BULK_LIST = ListStateDescriptor("bulk-l", Types.LONG())
BULK_MAP = MapStateDescriptor("bulk-m", Types.STRING(), Types.LIST(Types.INT()))


def _with_ttl(descriptor: StateDescriptor, name: str, seconds: int = 100) -> StateDescriptor:
    copy: StateDescriptor
    if isinstance(descriptor, MapStateDescriptor):
        copy = MapStateDescriptor(name, descriptor.key_type_info, descriptor.type_info)
    else:
        copy = ListStateDescriptor(name, descriptor.type_info)
    copy.enable_time_to_live(StateTtlConfig.new_builder(Time.seconds(seconds)).build())
    return copy


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


class BulkStateConformance:
    """List and map state through :class:`BulkState`, against the per-key state API."""

    @pytest.fixture
    def one(self, state_backend: StateBackend, checkpoint_storage: CheckpointStorage
            ) -> Iterator[KeyedCluster]:
        """One partition holding every key, STRING keys, a settable TTL clock (``one.clock``)."""
        cluster = KeyedCluster(state_backend, checkpoint_storage, 1, clock=_Clock(),
                               key_serializer=Types.STRING().get_serializer())
        yield cluster
        cluster.close()

    @pytest.mark.parametrize("ttl", [False, True], ids=["plain", "ttl"])
    def test_bulk_list_and_map_match_per_key_access(self, one: KeyedCluster, ttl: bool) -> None:
        """Random bulk writes equal the same writes key by key, before and after a restore
        (with TTL each key is visited through the state API)."""
        lst, mp = BULK_LIST, BULK_MAP
        if ttl:
            lst, mp = _with_ttl(lst, "bulk-l-ttl"), _with_ttl(mp, "bulk-m-ttl")
        backend, rng = one.partitions[0], random.Random(7)
        keys = [f"k{i}" for i in range(40)]
        want_l: dict[str, list[int]] = {k: [] for k in keys}
        want_m: dict[str, dict[str, Any]] = {k: {} for k in keys}
        backend.set_current_key("k0")
        bulk = BulkState(backend)
        for step in range(30):
            ks = rng.choices(keys, k=12)
            op = step % 6
            if op == 0:
                values = [rng.randrange(1000) for _ in ks]
                bulk.add(lst, ks, values)
                for k, v in zip(ks, values, strict=True):
                    want_l[k].append(v)
            elif op == 1:
                lists = [[rng.randrange(9) for _ in range(rng.randrange(3))] for _ in ks]
                bulk.add_all(lst, ks, lists)
                for k, vs in zip(ks, lists, strict=True):
                    want_l[k].extend(vs)
            elif op == 2:
                lists = [[rng.randrange(9)] * rng.randrange(2) for _ in ks]
                bulk.put(lst, ks, lists)
                want_l.update(zip(ks, lists, strict=True))
            elif op == 3:
                users = [f"u{rng.randrange(5)}" for _ in ks]
                values = [None if rng.random() < 0.2 else [rng.randrange(9)] for _ in ks]
                bulk.put_entries(mp, ks, users, values)
                for k, u, v in zip(ks, users, values, strict=True):
                    want_m[k][u] = v
            elif op == 4:
                users = [f"u{rng.randrange(5)}" for _ in ks]
                bulk.remove_entries(mp, ks, users)
                for k, u in zip(ks, users, strict=True):
                    want_m[k].pop(u, None)
            else:
                bulk.clear(mp, ks[:2])
                bulk.put(mp, ks[2:4], [{"x": [1]}, {}])
                for k in ks[:2]:
                    want_m[k] = {}
                want_m.update(zip(ks[2:4], [{"x": [1]}, {}], strict=True))
            assert backend.get_current_key() == "k0"  # never moved
        for _ in range(2):
            assert bulk.get(lst, keys) == [want_l[k] for k in keys]
            assert bulk.get(mp, keys) == [want_m[k] for k in keys]
            users = [f"u{i % 5}" for i in range(len(keys))]
            assert bulk.get_entries(mp, keys, users) == [want_m[k].get(u)
                                                        for k, u in zip(keys, users, strict=True)]
            for k in keys:  # the per-key API reads the same
                assert list(one.state(k, lst).get()) == want_l[k]  # type: ignore[attr-defined]
                assert dict(one.state(k, mp).items()) == want_m[k]  # type: ignore[attr-defined]
            one.restore(one.checkpoint())
            backend = one.partitions[0]
            bulk = BulkState(backend)

    def test_bulk_list_and_map_ttl(self, one: KeyedCluster) -> None:
        """Bulk writes stamp each element and entry; expired ones are gone from bulk reads."""
        lst, mp = _with_ttl(BULK_LIST, "l-ttl", 10), _with_ttl(BULK_MAP, "m-ttl", 10)
        bulk, clock = BulkState(one.partitions[0]), one.clock
        assert isinstance(clock, _Clock)
        bulk.add(lst, ["a", "b"], [1, 2])
        bulk.put_entries(mp, ["a", "b"], ["old", "old"], [[1], [2]])
        clock.now += 6_000
        bulk.add_all(lst, ["a"], [[3]])
        bulk.put_entries(mp, ["a"], ["new"], [[3]])
        clock.now += 6_000
        assert bulk.get(lst, ["a", "b"]) == [[3], []]
        assert bulk.get(mp, ["a", "b"]) == [{"new": [3]}, {}]
        assert bulk.get_entries(mp, ["a", "a"], ["old", "new"]) == [None, [3]]

    def test_bulk_list_and_map_typed_errors_write_nothing(self, one: KeyedCluster) -> None:
        backend = one.partitions[0]
        bulk = BulkState(backend)
        bulk.add(BULK_LIST, ["a"], [1])
        bulk.put_entries(BULK_MAP, ["a"], ["x"], [[1]])
        bad: list[tuple[type[Exception], str, Any]] = [
            (StateTypeError, "declared key type STRING", lambda: bulk.add(BULK_LIST, ["a", 1], [2, 3])),
            (StateTypeError, "'bulk-l'", lambda: bulk.add(BULK_LIST, ["a", "b"], [2, "3"])),
            (StateError, "None to a list", lambda: bulk.add(BULK_LIST, ["a", "b"], [2, None])),
            (StateError, "cannot be None", lambda: bulk.add_all(BULK_LIST, ["a", "b"], [[2], None])),
            (StateTypeError, "a list of elements", lambda: bulk.add_all(BULK_LIST, ["a"], [5])),
            (StateError, "cannot be None", lambda: bulk.put(BULK_LIST, ["b", "a"], [[2], None])),
            (StateTypeError, "'bulk-m'", lambda: bulk.put_entries(BULK_MAP, ["a", "b"], ["y", 2],
                                                                 [[1], [2]])),
            (StateTypeError, "'bulk-m'", lambda: bulk.put_entries(BULK_MAP, ["a", "b"], ["y", "z"],
                                                                 [[1], ["no"]])),
            (StateTypeError, "hashable", lambda: bulk.put_entries(
                MapStateDescriptor("bulk-any", Types.LIST(Types.INT()), Types.LONG()), ["a"],
                [[1]], [1])),
            (StateTypeError, "dict of entries", lambda: bulk.put(BULK_MAP, ["b", "a"],
                                                                 [{"y": [1]}, None])),
            (ValueError, "differ in length", lambda: bulk.put_entries(BULK_MAP, ["a"], ["x", "y"],
                                                                     [[1], [2]])),
            (StateTypeError, "not reducing", lambda: bulk.get(
                ReducingStateDescriptor("r", lambda a, b: a + b, Types.LONG()), ["a"])),
            (StateTypeError, "not list", lambda: bulk.get_entries(BULK_LIST, ["a"], ["x"])),
        ]
        for error, match, call in bad:
            with pytest.raises(error, match=match):
                call()
            assert bulk.get(BULK_LIST, ["a", "b"]) == [[1], []]  # nothing written
            assert bulk.get(BULK_MAP, ["a", "b"]) == [{"x": [1]}, {}]

    def test_bulk_refuses_a_namespaced_state(self, one: KeyedCluster) -> None:
        """As for value states: a name registered with namespaces is not the same state."""
        backend = one.partitions[0]
        backend.get_namespaced_state(ListStateDescriptor("spaced", Types.LONG()),
                                     Types.STRING().get_serializer())
        with pytest.raises(StateNameClashError, match="namespaced"):
            BulkState(backend).add(ListStateDescriptor("spaced", Types.LONG()), ["a"], [1])
