"""``ReusedBuffer``: results packed into one reused buffer, never overwriting a result still held."""

from __future__ import annotations

import pytest

from statekit.errors import SerializationError
from statekit.serde.msgpack import ReusedBuffer, packb


@pytest.mark.parametrize("buffers", [1, 3])
def test_a_released_result_lets_the_next_reuse_its_buffer(buffers: int) -> None:
    buffer = ReusedBuffer(buffers)
    first = buffer.pack([list(range(1000)), [b"x" * 50] * 1000])
    owner = first.obj
    assert first == packb([list(range(1000)), [b"x" * 50] * 1000])
    del first
    second = buffer.pack([[1, 2], [b"a", b"b"]])
    assert second.obj is owner  # the same buffer (still in the CPU's cache), no fresh memory
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


def test_buffers_are_reused_in_turn_while_others_are_held() -> None:
    """A writer holds one part and a queue the next while a third is packed: three buffers
    serve them all, each reused once its result is released, none overwritten while held."""
    buffer = ReusedBuffer(3)
    values = [[[n] * 200, [bytes([n]) * 30] * 200] for n in range(8)]
    held = [buffer.pack(values[0]), buffer.pack(values[1])]
    owners = {id(view.obj) for view in held}
    for n in range(2, 8):
        part = buffer.pack(values[n])
        owners.add(id(part.obj))
        assert [bytes(v) for v in held] == [packb(values[n - 2]), packb(values[n - 1])]
        assert bytes(part) == packb(values[n])
        held = [held[1], part]  # the oldest released: its buffer is the next one free
        del part
    assert len(owners) == 3  # no fresh memory after the first three


def test_every_buffer_held_packs_into_a_fresh_one() -> None:
    buffer = ReusedBuffer(2)
    values = [[[n] * 50, [bytes([n]) * 20] * 50] for n in range(4)]
    held = [buffer.pack(v) for v in values]
    assert [bytes(view) for view in held] == [packb(v) for v in values]
    assert len({id(view.obj) for view in held}) == 4
