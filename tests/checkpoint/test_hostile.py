"""Reproductions of a hostile-input probe of checkpoints, as regression tests: each damaged or
forged checkpoint restores exactly or raises a typed error (a crash, a hang or an untyped error
was reported for each before)."""

from __future__ import annotations

import decimal
import glob
import os
import struct
import time
import zlib

import pytest

from statekit.checkpoint.layout import RECOVER_FROM_OLDER_KEY
from statekit.errors import CorruptCheckpointError
from statekit.runtime.environment import StreamExecutionEnvironment
from statekit.runtime.functions import KeyedProcessFunction
from statekit.runtime.restart import RestartStrategies
from statekit.serde.msgpack import MAX_EXT_NESTING
from statekit.serde.types import Types
from statekit.state.descriptors import ValueStateDescriptor
from tests.checkpoint.conftest import WRITERS
from tests.checkpoint.forge import expected_state, restore_and_read, rewrite_metadata, write_job
from tests.serde.test_nesting import run_isolated


@pytest.mark.parametrize("reader", WRITERS)
def test_an_intact_checkpoint_restores_exactly_into_either_backend(copy, reader):
    _, where = copy
    assert restore_and_read(reader, f"{where}/chk-2") == expected_state(2)
    assert restore_and_read(reader, f"{where}/chk-2", parallelism=3) == expected_state(2)


@pytest.mark.parametrize("reader", WRITERS)
def test_swapped_key_group_ranges_are_detected(copy, reader):
    """Finding 6: two tasks' handles with their key-group ranges swapped restored "successfully"
    with all state gone; every restored key is now checked against its recorded range."""
    _, where = copy

    def swap(body):
        first, second = body["tasks"]["p0"], body["tasks"]["p1"]
        first["key_group_range"], second["key_group_range"] = (second["key_group_range"],
                                                               first["key_group_range"])

    rewrite_metadata(f"{where}/chk-2/_metadata", swap)
    # heap parts record their own key groups: the metadata check finds them outside the range
    with pytest.raises(CorruptCheckpointError, match=r"outside the key groups|groups\[0\]: 0 is outside"):
        restore_and_read(reader, f"{where}/chk-2")


# --- _metadata: every field checked before use ---------------------------------------------------------


def _set(path_in_body, value):
    def change(body):
        target = body
        for step in path_in_body[:-1]:
            target = target[step]
        target[path_in_body[-1]] = value
    return change


HUGE = decimal.Decimal("1e999999999")  # 11 bytes of msgpack; int() of it runs for minutes


@pytest.mark.parametrize("field, value", [
    (("source", "offset"), HUGE),            # finding 2
    (("checkpoint_id",), HUGE),
    (("max_parallelism",), HUGE),
    (("tasks",), []),                        # finding 5
    (("tasks",), {}),                        # no handle at all: never an empty restore
    (("tasks", "p1", "key_group_range"), [120, 127]),  # p1's other key groups not covered
    (("tasks", "p0", "key_group_range"), 1_000_000),
    (("tasks", "p0", "key_group_range"), [0, 1_000_000]),
    (("max_parallelism",), None),
    (("tasks", "p0", "max_parallelism"), True),
    (("tasks", "p0", "states"), "x"),
    (("tasks", "p1", "key_group_range"), [60, 100]),  # overlaps p0's
    (("source",), {"offset": -1}),
    (("checkpoint_id",), 1),                 # _metadata copied from an older checkpoint
    (("tasks", "p1", "states", "count", "layout", 1), None),  # no value type (fuzz 40136715)
])
def test_metadata_fields_of_the_wrong_type_or_range_are_corrupt(copy, field, value):
    _, where = copy
    rewrite_metadata(f"{where}/chk-2/_metadata", _set(field, value))
    start = time.monotonic()
    with pytest.raises(CorruptCheckpointError):
        restore_and_read("hashmap", f"{where}/chk-2")
    assert time.monotonic() - start < 10


def test_a_missing_task_handle_is_corrupt(copy):
    _, where = copy
    rewrite_metadata(f"{where}/chk-2/_metadata", lambda body: body["tasks"].pop("p1"))
    with pytest.raises(CorruptCheckpointError, match="key groups"):
        restore_and_read("hashmap", f"{where}/chk-2")


def test_an_emptied_states_map_is_corrupt(copy):
    _, where = copy
    rewrite_metadata(f"{where}/chk-2/_metadata", _set(("tasks", "p0", "states"), {}))
    with pytest.raises(CorruptCheckpointError, match="states"):
        restore_and_read("hashmap", f"{where}/chk-2")


@pytest.mark.parametrize("field, value", [(("base",), {}), (("logs",), [])])
def test_an_emptied_incremental_base_or_dropped_log_is_corrupt(tmp_path, field, value):
    job = write_job("hashmap-incremental", str(tmp_path / "job"))  # chk-2: a base and a log
    rewrite_metadata(f"{job}/chk-2/_metadata", _set(("tasks", "p0", *field), value))
    with pytest.raises(CorruptCheckpointError, match="bytes"):
        restore_and_read("hashmap", f"{job}/chk-2")


def test_undecodable_metadata_is_corrupt(copy):
    _, where = copy
    body = b"\xc1" * 16  # never valid msgpack, with a valid header and checksum
    head = struct.pack(">8sHQ", b"STATEKIT", 1, len(body)) + body
    with open(f"{where}/chk-2/_metadata", "wb") as fh:
        fh.write(head + struct.pack(">I", zlib.crc32(head)))
    with pytest.raises(CorruptCheckpointError, match="undecodable"):
        restore_and_read("hashmap", f"{where}/chk-2")


def test_a_nesting_bomb_in_metadata_is_corrupt_not_a_crash(copy):
    """Finding 1: a tuple nested ~200 deep as ext types (714 bytes) in _metadata killed the process."""
    _, where = copy
    bomb: object = 1
    for _ in range(MAX_EXT_NESTING):
        bomb = (bomb,)
    rewrite_metadata(f"{where}/chk-2/_metadata", _set(("job_name",), bomb))  # the deepest written
    with pytest.raises(CorruptCheckpointError, match="job_name"):  # read, then refused: no string
        restore_and_read("hashmap", f"{where}/chk-2")
    out = run_isolated("""
        import msgpack, struct, zlib
        from statekit.checkpoint.metadata import decode_metadata
        body = msgpack.packb(1)
        for _ in range(200):
            body = msgpack.packb(msgpack.ExtType(1, b"\\x91" + body))
        body = b"\\x81\\xa8job_name" + body
        head = struct.pack(">8sHQ", b"STATEKIT", 1, len(body)) + body
        try:
            decode_metadata(head + struct.pack(">I", zlib.crc32(head)))
        except Exception as exc:
            print(type(exc).__name__)
        """)
    assert out.split() == ["CorruptCheckpointError"]


class _FailOnce(KeyedProcessFunction):
    """Counts per key; at element ``at`` damages the newest checkpoint's ``_metadata`` (a field
    of the wrong type, valid checksum) and fails once, so the restart must skip that checkpoint."""

    failed = False  # class-wide: the runner deep-copies the function for every attempt

    def __init__(self, root: str, at: int) -> None:
        self.root, self.at = root, at

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value, ctx):
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        if value[1] == self.at and not _FailOnce.failed:
            _FailOnce.failed = True
            newest = max(glob.glob(f"{self.root}/*/chk-*/_metadata"),
                         key=lambda p: int(p.split("chk-")[1].split("/")[0]))
            rewrite_metadata(newest, _set(("tasks",), []))
            raise RuntimeError("injected failure after damaging the newest checkpoint")
        yield ctx.get_current_key(), n


def test_restart_falls_back_past_metadata_of_the_wrong_type(tmp_path):
    """Finding 5: an untyped error from a damaged checkpoint skipped the restart strategy and
    the fall-back to an older checkpoint; both now see a CorruptCheckpointError."""
    items = [(f"k{i % 5}", i) for i in range(200)]
    env = StreamExecutionEnvironment.get_execution_environment({
        "execution.checkpointing.interval": "10 ms", "state.checkpoints.num-retained": "3",
        RECOVER_FROM_OLDER_KEY: "true", "state.checkpoints.dir": str(tmp_path),
        "state.checkpoint-storage": "filesystem"})
    env.set_parallelism(2)
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(1, 0))
    _FailOnce.failed = False
    slow = env.from_collection(items).map(lambda v: (time.sleep(0.003), v)[1])
    result = slow.key_by(lambda v: v[0]).process(_FailOnce(str(tmp_path), 150)).execute_and_collect()
    assert _FailOnce.failed and result.restarts == 1
    # the state is exact; outputs of the skipped checkpoint's interval were released when it
    # completed and come again after the older one (as in Flink): the same pairs, no others
    assert set(result) == {(f"k{k}", n) for k in range(5) for n in range(1, 41)}


def test_a_part_length_past_the_real_file_allocates_nothing(copy):
    """Finding 3: a part length of 256 MiB (and a matching recorded size) against a file of a few
    hundred bytes: the reader allocated buffers of the declared length before reading (1 GB RSS,
    an untyped MemoryError at 1.5 GiB); the real size is now checked first."""
    writer, where = copy
    if writer != "hashmap":
        pytest.skip("parts indexes are the heap format's")

    def forge(body):
        state = body["tasks"]["p0"]["states"]["anything"]
        state["data"]["size"] = 256 << 20
        state["parts"][-1][1] = (256 << 20) - state["parts"][-1][0]

    rewrite_metadata(f"{where}/chk-2/_metadata", forge)
    out = run_isolated(f"""
        import resource, sys
        sys.path.insert(0, {os.getcwd()!r})
        from tests.checkpoint.forge import restore_and_read
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            restore_and_read("hashmap", {where + "/chk-2"!r})
        except Exception as exc:
            print(type(exc).__name__, isinstance(exc, __import__("statekit").errors.CorruptCheckpointError))
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
        """)
    name, typed, grown = out.split()
    assert typed == "True", name
    assert int(grown) < 64, f"RSS grew by {grown} MiB"


def test_a_huge_decimal_offset_fails_the_job_start_at_once(copy, tmp_path):
    """Finding 2, through the local runner: ``source.offset`` = Decimal 1e999999999 (11 bytes of
    msgpack) in the checkpoint a job starts from reached ``int()`` and ran for minutes."""
    _, where = copy
    rewrite_metadata(f"{where}/chk-2/_metadata", _set(("source", "offset"), HUGE))
    env = StreamExecutionEnvironment.get_execution_environment({
        "execution.savepoint.path": f"{where}/chk-2", "state.checkpoints.dir": str(tmp_path / "new"),
        "state.checkpoint-storage": "filesystem"})
    stream = env.from_collection([("a", 1)]).key_by(lambda v: v[0])
    start = time.monotonic()
    with pytest.raises(CorruptCheckpointError, match=r"source\.offset"):
        stream.process(_FailOnce(str(tmp_path), -1)).execute_and_collect()
    assert time.monotonic() - start < 10
