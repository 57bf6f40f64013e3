"""Nesting limits of the msgpack format: one limit when writing and reading, typed errors, and no
C stack overflow (each crash-prone case runs in a subprocess, where a crash fails the test)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import msgpack
import pytest

from statekit.errors import SerializationError, StateTypeError
from statekit.serde.msgpack import MAX_EXT_NESTING, MAX_PLAIN_NESTING, packb, unpackb
from statekit.serde.types import GenericSerializer
from statekit.state.descriptors import ValueStateDescriptor


def nested_tuple(depth: int, leaf: object = 1) -> object:
    value = leaf
    for _ in range(depth):
        value = (value,)
    return value


def forged_tuples(depth: int, code: int = 1) -> bytes:
    """Bytes of ``depth`` nested extension values, built without statekit's packer (a forgery)."""
    data = msgpack.packb(1)
    for _ in range(depth):
        data = msgpack.packb(msgpack.ExtType(code, b"\x91" + data))
    return data


def run_isolated(code: str) -> str:
    """Run ``code`` in a fresh interpreter; its stdout (a crash fails the test)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    return done.stdout


def test_the_same_limit_on_both_sides():
    deepest = nested_tuple(MAX_EXT_NESTING)
    assert unpackb(packb(deepest)) == deepest
    with pytest.raises(SerializationError, match="nest more than"):
        packb((deepest,))
    assert unpackb(forged_tuples(MAX_EXT_NESTING)) == deepest
    with pytest.raises(SerializationError, match="nest more than"):
        unpackb(forged_tuples(MAX_EXT_NESTING + 1))
    deep_list: object = 1
    for _ in range(MAX_PLAIN_NESTING):
        deep_list = [deep_list]
    assert unpackb(packb(deep_list)) is not None  # (== on it would exceed Python's recursion)
    with pytest.raises(SerializationError):
        packb([deep_list])


def test_forged_nesting_is_a_typed_error_not_a_crash():
    # the reported blob: about 200 nested tuples in 714 bytes, and chains of the other containers
    out = run_isolated("""
        import msgpack
        from statekit.serde.msgpack import unpackb
        for code in (1, 2, 3, 8):
            data = msgpack.packb(1)
            for _ in range(300):
                data = msgpack.packb(msgpack.ExtType(code, b"\\x91" + data))
            try:
                unpackb(data)
                print("decoded", code)
            except Exception as exc:
                print(type(exc).__name__)
        """)
    assert out.split() == ["SerializationError"] * 4
    assert len(forged_tuples(200)) < 1000


def test_deep_values_are_refused_when_written():
    # lists between nested tuples: each level is a nested C call, so the total depth is bounded
    out = run_isolated("""
        from statekit.serde.msgpack import packb
        for tuples, lists in ((300, 0), (50, 500), (31, 1000)):
            value = 1
            for _ in range(tuples):
                for _ in range(lists):
                    value = [value]
                value = (value,)
            try:
                packb(value)
                print("packed")
            except Exception as exc:
                print(type(exc).__name__)
        """)
    assert out.split() == ["SerializationError"] * 3


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_a_state_refuses_a_value_it_could_not_restore(backend, tmp_path):
    from statekit.backends.heap import HashMapStateBackend
    from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
    from statekit.serde.keygroups import KeyGroupRange

    factory = HashMapStateBackend() if backend == "hashmap" else EmbeddedRocksDBStateBackend()
    if backend == "rocksdb":
        factory.set_db_storage_paths(str(tmp_path))
    keyed = factory.create_keyed_state_backend(key_serializer=GenericSerializer(),
                                               key_group_range=KeyGroupRange.all(128),
                                               max_parallelism=128)
    try:
        state = keyed.get_partitioned_state(ValueStateDescriptor("untyped", None))
        keyed.set_current_key("k")
        for depth in (230, 300):
            with pytest.raises(StateTypeError, match="nest more than"):
                state.update(nested_tuple(depth))
        state.update(nested_tuple(MAX_EXT_NESTING))
        assert state.value() == nested_tuple(MAX_EXT_NESTING)
    finally:
        keyed.dispose()
