"""``ReusedBuffer``: results packed into one reused buffer, never overwriting a result still held."""

from __future__ import annotations

import pytest

from statekit.errors import SerializationError
from statekit.serde.msgpack import ReusedBuffer, packb


def test_a_released_result_lets_the_next_reuse_its_buffer() -> None:
    buffer = ReusedBuffer()
    first = buffer.pack([list(range(1000)), [b"x" * 50] * 1000])
    owner = first.obj
    assert first == packb([list(range(1000)), [b"x" * 50] * 1000])
    del first
    second = buffer.pack([[1, 2], [b"a", b"b"]])
    assert second.obj is owner  # the same buffer, no fresh memory
    assert second == packb([[1, 2], [b"a", b"b"]])


def test_a_held_result_is_never_overwritten() -> None:
    buffer = ReusedBuffer()
    values = [[[n] * 100, [bytes([n]) * 40] * 100] for n in range(5)]
    held = [buffer.pack(v) for v in values]  # a queue or a list keeps every result
    assert [bytes(view) for view in held] == [packb(v) for v in values]
    assert len({id(view.obj) for view in held}) == len(held)


def test_a_failed_pack_leaves_nothing_behind() -> None:
    buffer = ReusedBuffer()
    with pytest.raises(SerializationError):
        buffer.pack([[1, 2], [b"a", object()]])
    assert buffer.pack([[3], [b"c"]]) == packb([[3], [b"c"]])
