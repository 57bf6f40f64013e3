"""The inspection API on real checkpoints of both backends, full and incremental, on the local
disk and the S3 server: listing, walking, reading every state kind, verifying damaged ones,
garbage, pickle safety."""

from __future__ import annotations

import os
import pickle

import pytest

from statekit import ValueStateDescriptor
from statekit.errors import CheckpointNotFoundError, StateError
from statekit.inspection import collect_garbage, list_checkpoints, open_checkpoint, verify
from statekit.serde.keygroups import key_group_for_bytes
from statekit.serde.types import GenericSerializer, Types, packb
from tests.inspection.states import KEYS, MAXP, REMOVED, as_model, model, write_job

KINDS = [("hashmap", False), ("hashmap", True), ("rocksdb", False), ("rocksdb", True)]


def _check_states(view, rounds=2):
    expected = model(rounds)
    states = {s.name: s for s in view.states()}
    assert sorted(states) == sorted(expected)
    for name, state in states.items():
        frame = state.to_pandas()
        assert as_model(frame, state.kind) == expected[name], name
    assert states["last"].ttl and "ttl_timestamp" in states["last"].schema().names
    assert states["count"].schema().field("value").type == "int64"
    assert states["bymod"].schema().names == ["key", "user_key", "value"]
    assert states["seen"].schema().names == ["key", "index", "value"]


@pytest.mark.parametrize(("kind", "incremental"), KINDS)
def test_reads_every_state_of_every_backend_and_mode(tmp_path, kind, incremental):
    job = write_job(str(tmp_path / "ck"), kind, incremental, str(tmp_path / "work"))
    view = open_checkpoint(job.path)  # the job directory: its newest checkpoint
    assert view.info.id == 2 and view.info.backend == kind
    assert [p.key_groups for p in view.partitions] == [(0, 63), (64, 127)]
    assert {p.incremental for p in view.partitions} == {incremental}
    if kind == "hashmap" and incremental:  # a base plus a changelog that removes keys
        assert all(p.format == "statekit-heap-changelog/1" for p in view.partitions)
        assert any(s.encoding == "changelog" for p in view.partitions for s in p.states)
    _check_states(view)
    assert view.state("count").count() == len(KEYS) - len(REMOVED)
    _check_states(open_checkpoint(job.chk(1)), rounds=1)  # an older checkpoint, named directly


@pytest.mark.parametrize(("kind", "incremental"), [("hashmap", True), ("rocksdb", True)])
def test_reads_incremental_checkpoints_on_s3(tmp_path, s3_server, s3_url, kind, incremental):
    options = s3_server.storage_options()
    job = write_job(f"{s3_url}/ck", kind, incremental, str(tmp_path / "work"), options)
    infos = list_checkpoints(f"{s3_url}/ck", storage_options=options)
    # a heap job's first incremental checkpoint is its full base; RocksDB records the mode
    assert [(i.id, i.status, i.incremental) for i in infos] == [(1, "retained", kind == "rocksdb"),
                                                                (2, "retained", incremental)]
    _check_states(open_checkpoint(job.path, storage_options=options))
    report = verify(job.path, storage_options=options)
    assert report.ok and len(report.checkpoints) == 2


@pytest.mark.parametrize(("kind", "incremental"), KINDS)
def test_reads_a_range_of_key_groups(tmp_path, kind, incremental):
    """Key groups 40-90 straddle both partitions: exactly the keys in them, from every format
    (heap plain parts hold any key group in any order)."""
    job = write_job(str(tmp_path / "ck"), kind, incremental, str(tmp_path / "work"))
    state = open_checkpoint(job.path).state("count")
    rows = [row for batch in state.read_batches(key_groups=(40, 90)) for row in batch.to_pylist()]
    inside = {key: value for key, value in model()["count"].items()
              if 40 <= key_group_for_bytes(packb(key), MAXP) <= 90}
    assert {row["key"]: row["value"] for row in rows} == inside and len(rows) == len(inside)
    assert 0 < len(inside) < len(model()["count"])


def test_reads_stream_in_bounded_batches(tmp_path):
    job = write_job(str(tmp_path / "ck"), "hashmap", False, str(tmp_path / "work"))
    batches = list(open_checkpoint(job.path).state("seen").read_batches(batch_rows=16))
    assert len(batches) > 3 and max(b.num_rows for b in batches) <= 16
    assert sum(b.num_rows for b in batches) == sum(len(v) for v in model()["seen"].values())


def test_lists_checkpoints_savepoints_and_incomplete_ones(tmp_path):
    root = tmp_path / "ck"
    heap = write_job(str(root), "hashmap", True, str(tmp_path / "work"))
    rocks = write_job(str(root), "rocksdb", False, str(tmp_path / "work"))
    os.makedirs(f"{heap.path}/chk-3")
    with open(f"{heap.path}/chk-3/keyed-process-0-count-abc", "wb") as fh:
        fh.write(b"interrupted")
    infos = list_checkpoints(str(root))
    by_job = {(i.job, i.id): i for i in infos}
    assert by_job[(heap.job, 2)].backend == "hashmap" and by_job[(heap.job, 2)].incremental
    assert by_job[(heap.job, 3)].status == "incomplete"
    assert by_job[(rocks.job, 1)].files > 0 and by_job[(rocks.job, 1)].size > 0
    assert by_job[(rocks.job, 2)].timestamp.year == 2023
    with pytest.raises(CheckpointNotFoundError, match="holds 2 jobs"):
        open_checkpoint(str(root))


def test_wrong_paths_are_typed_errors(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="no such directory"):
        list_checkpoints(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointNotFoundError):
        open_checkpoint(str(tmp_path / "empty"))
    job = write_job(str(tmp_path / "ck"), "hashmap", False, str(tmp_path / "work"))
    with pytest.raises(CheckpointNotFoundError):
        open_checkpoint(job.chk(7))
    with pytest.raises(StateError, match="no such state"):
        open_checkpoint(job.path).state("nope")


@pytest.mark.parametrize("kind", ["hashmap", "rocksdb"])
def test_verify_names_every_damaged_file(tmp_path, kind):
    job = write_job(str(tmp_path / "ck"), kind, True, str(tmp_path / "work"))
    assert verify(job.path).ok
    shared = sorted((tmp_path / "ck" / job.job / "shared").iterdir())
    flipped, deleted = shared[0], shared[-1]
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    deleted.unlink()
    report = verify(job.path)
    assert not report.ok
    found = {(p.path.rsplit("/", 1)[-1], p.error) for p in report.problems}
    assert (flipped.name, "ChecksumMismatchError") in found
    assert (deleted.name, "MissingFileError") in found
    # both checkpoints reference the shared files: each is reported as damaged
    assert {p.checkpoint.rsplit("/", 1)[-1] for p in report.problems} == {"chk-1", "chk-2"}
    metadata = tmp_path / "ck" / job.job / "chk-2" / "_metadata"
    metadata.write_bytes(metadata.read_bytes()[:-3])
    report = verify(job.chk(2))
    assert [(p.path, p.error) for p in report.problems] == [(f"{job.chk(2)}/_metadata",
                                                            "TruncatedCheckpointError")]


def test_garbage_is_listed_then_deleted(tmp_path):
    job = write_job(str(tmp_path / "ck"), "hashmap", True, str(tmp_path / "work"))
    base = tmp_path / "ck" / job.job
    part, orphan = "keyed-process-0-count-0123456789ab", "keyed-process-1-seen-base-abcdef012345"
    (base / "chk-9").mkdir()
    (base / "chk-9" / part).write_bytes(b"x")
    (base / "shared" / orphan).write_bytes(b"y")
    report = collect_garbage(job.path)
    assert sorted((g.reason, g.path.rsplit("/", 2)[-2:][-1]) for g in report.items) == [
        ("incomplete-checkpoint", part), ("unreferenced-shared", orphan)]
    assert (base / "shared" / orphan).exists()  # a dry run
    collect_garbage(job.path, delete=True)
    assert not (base / "shared" / orphan).exists() and not (base / "chk-9" / part).exists()
    assert verify(job.path).ok


def test_pickled_state_is_read_as_bytes_never_unpickled(tmp_path):
    from statekit import FileSystemCheckpointStorage, HashMapStateBackend
    from statekit.serde.keygroups import KeyGroupRange

    class Boom:
        def __reduce__(self):
            return (os.system, ("echo unpickled > " + str(tmp_path / "owned"),))

    access = FileSystemCheckpointStorage(str(tmp_path / "ck")).create_access("job")
    backend = HashMapStateBackend(False).create_keyed_state_backend(
        key_serializer=GenericSerializer(), key_group_range=KeyGroupRange.all(128), max_parallelism=128)
    state = backend.get_partitioned_state(ValueStateDescriptor("p", Types.PICKLED_BYTE_ARRAY()))
    backend.set_current_key("a")
    state.update(Boom())
    access.commit(1, {"tasks": {"t": backend.snapshot(1, access.streams(1, "t")).run()}})
    backend.dispose()
    frame = open_checkpoint(str(tmp_path / "ck" / "job")).state("p").to_pandas()
    assert frame["value"][0] == pickle.dumps(Boom(), protocol=pickle.HIGHEST_PROTOCOL)
    assert not (tmp_path / "owned").exists()


def test_typed_columns_follow_the_descriptor(tmp_path):
    import datetime as dt
    import decimal

    import pyarrow as pa

    from statekit import FileSystemCheckpointStorage, HashMapStateBackend, MapStateDescriptor
    from statekit.serde.keygroups import KeyGroupRange

    access = FileSystemCheckpointStorage(str(tmp_path / "ck")).create_access("job")
    backend = HashMapStateBackend(False).create_keyed_state_backend(
        key_serializer=GenericSerializer(), key_group_range=KeyGroupRange.all(128), max_parallelism=128)
    row = backend.get_partitioned_state(ValueStateDescriptor(
        "row", Types.ROW_NAMED(["day", "price", "tags"],
                               [Types.SQL_DATE(), Types.BIG_DEC(), Types.LIST(Types.STRING())])))
    pairs = backend.get_partitioned_state(MapStateDescriptor(
        "pairs", Types.STRING(), Types.TUPLE([Types.INT(), Types.DOUBLE()])))
    mixed = backend.get_partitioned_state(ValueStateDescriptor("mixed"))
    for i, key in enumerate([("a", 1), ("b", 2)]):  # tuple keys: untyped, mixed -> JSON text
        backend.set_current_key(key)
        row.update({"day": dt.date(2024, 1, 1 + i), "price": decimal.Decimal(f"{i}.50"), "tags": ["x"] * i})
        pairs.put(f"p{i}", (i, i / 2))
        mixed.update(i if i else "zero")
    access.commit(1, {"tasks": {"t": backend.snapshot(1, access.streams(1, "t")).run()}})
    backend.dispose()
    view = open_checkpoint(str(tmp_path / "ck" / "job"))
    schema = view.state("row").schema()
    assert schema.field("key").type == pa.string()  # tuple keys: JSON text
    assert schema.field("value").type == pa.struct([("day", pa.date32()), ("price", pa.string()),
                                                    ("tags", pa.list_(pa.string()))])
    rows = view.state("row").to_pandas().sort_values("key")
    assert rows["key"].tolist() == ['["a",1]', '["b",2]']
    assert rows["value"].tolist()[1] == {"day": dt.date(2024, 1, 2), "price": "1.50", "tags": ["x"]}
    got = view.state("pairs").to_pandas().sort_values("user_key")
    assert got["value"].tolist() == [{"f0": 0, "f1": 0.0}, {"f0": 1, "f1": 0.5}]
    assert sorted(view.state("mixed").to_pandas()["value"]) == ['"zero"', "1"]
