"""File-based and streamed checkpoint transfers: ``BlobStore.put_file``/``get_file``,
``CheckpointStreams.write_file``/``StateReader.read_file`` and ``write_parts``/``read_parts``, on
local disk, fsspec ``memory://``, the in-process memory store and the local S3 server; plus the
RocksDB backend using them."""

from __future__ import annotations

import os
import uuid
import zlib

import pytest

from statekit.checkpoint.blobstore import FsspecBlobStore, MemoryBlobStore, set_operation_hook
from statekit.checkpoint.blobstore import local as local_store_module
from statekit.checkpoint.checksum import crc32, crc32_combine, file_crc
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.reader import StateReader
from statekit.checkpoint.streams import CheckpointStreams
from statekit.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ChecksumMismatchError,
    StateSizeError,
    TruncatedCheckpointError,
    UnsafePathError,
)

KINDS = ["local", "memory-fs", "memory", "s3"]
SIZES = [0, 1, 1000, 8 * 1024 * 1024 + 17]  # empty, tiny, small, more than one 8 MiB crc chunk


@pytest.fixture(params=KINDS)
def store(request, tmp_path):
    kind = request.param
    if kind == "local":
        return FsspecBlobStore(str(tmp_path / "root"))
    if kind == "memory-fs":
        return FsspecBlobStore(f"memory://statekit-ft-{uuid.uuid4().hex}")
    if kind == "memory":
        return MemoryBlobStore()
    server = request.getfixturevalue("s3_server")
    url = request.getfixturevalue("s3_url")
    return FsspecBlobStore(url + "/ft", server.storage_options())


def _source(tmp_path, size: int, name: str = "src.bin") -> tuple[str, bytes]:
    data = os.urandom(size)
    path = tmp_path / name
    path.write_bytes(data)
    return str(path), data


# --- BlobStore.put_file / get_file ---------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
def test_put_file_get_file_round_trip(store, tmp_path, size):
    src, data = _source(tmp_path, size)
    store.put_file("chk-1/a.sst", src)
    assert store.exists("chk-1/a.sst")
    assert store.get("chk-1/a.sst") == data
    dest = tmp_path / "out" / "nested" / "a.sst"  # missing parents are created
    store.get_file("chk-1/a.sst", dest)
    assert dest.read_bytes() == data
    assert store.list_temporary() == []


def test_put_file_replaces_and_accepts_pathlike(store, tmp_path):
    first, _ = _source(tmp_path, 5000, "one")
    _, data = _source(tmp_path, 300, "two")
    store.put_file("k", first)
    store.put_file("k", tmp_path / "two")
    assert store.get("k") == data
    dest = tmp_path / "dest"
    dest.write_bytes(b"x" * 10_000)  # an existing, longer file is replaced, not overwritten in part
    store.get_file("k", str(dest))
    assert dest.read_bytes() == data
    assert store.list("") == ["k"]


def test_get_file_missing_is_typed(store, tmp_path):
    with pytest.raises(CheckpointNotFoundError):
        store.get_file("chk-1/nope", tmp_path / "x")


@pytest.mark.parametrize("key", ["../escape", "/abs", "a/../../b", "s3://x/y"])
def test_put_file_and_get_file_check_keys(store, tmp_path, key):
    src, _ = _source(tmp_path, 10)
    with pytest.raises(UnsafePathError):
        store.put_file(key, src)
    with pytest.raises(UnsafePathError):
        store.get_file(key, tmp_path / "x")


def test_local_put_file_missing_source_leaves_nothing(tmp_path):
    store = FsspecBlobStore(str(tmp_path / "root"))
    with pytest.raises((FileNotFoundError, CheckpointError)):
        store.put_file("a/b", tmp_path / "does-not-exist")
    assert not store.exists("a/b")
    assert store.list_temporary() == []


def test_local_put_file_is_atomic_and_fsynced(tmp_path, monkeypatch):
    """The same operation sequence as ``put``: temp, write, fsync, rename, directory fsync."""
    store = FsspecBlobStore(str(tmp_path / "root"))
    src, data = _source(tmp_path, 100_000)
    ops: list[str] = []
    previous = set_operation_hook(lambda op, path: ops.append(op))
    try:
        store.put_file("x/y", src)
    finally:
        set_operation_hook(previous)
    assert ops == ["create-temp", "write", "fsync", "rename", "fsync-dir"]
    assert store.get("x/y") == data


def test_local_put_file_failure_mid_copy_removes_temp(tmp_path, monkeypatch):
    store = FsspecBlobStore(str(tmp_path / "root"))
    src, _ = _source(tmp_path, 1000)
    store.put("k", b"old")

    def boom(src_fd, dst_fd, **kwargs):
        raise OSError(5, "injected I/O error")

    monkeypatch.setattr(local_store_module, "_kernel_copy", boom)
    with pytest.raises(CheckpointError):
        store.put_file("k", src)
    assert store.get("k") == b"old"
    assert store.list_temporary() == []


def test_kernel_copy_falls_back_when_unsupported(tmp_path, monkeypatch):
    import errno

    def unsupported(*args):
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(os, "copy_file_range", unsupported, raising=False)
    store = FsspecBlobStore(str(tmp_path / "root"))
    src, data = _source(tmp_path, 9 * 1024 * 1024 + 3)
    store.put_file("k", src)
    store.get_file("k", tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == data


def test_kernel_copy_finishes_when_copy_file_range_stops_early(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "copy_file_range", lambda *args: 0, raising=False)
    store = FsspecBlobStore(str(tmp_path / "root"))
    src, data = _source(tmp_path, 100_000)
    store.put_file("k", src)
    assert store.get("k") == data


def test_local_get_file_links_only_when_allowed(tmp_path):
    store = FsspecBlobStore(str(tmp_path / "root"))
    src, data = _source(tmp_path, 4096)
    store.put_file("k", src)
    blob = tmp_path / "root" / "k"
    store.get_file("k", tmp_path / "copied")
    assert os.stat(tmp_path / "copied").st_ino != blob.stat().st_ino
    store.get_file("k", tmp_path / "linked", allow_link=True)
    assert os.stat(tmp_path / "linked").st_ino == blob.stat().st_ino
    assert (tmp_path / "linked").read_bytes() == data
    os.unlink(tmp_path / "linked")  # dropping the restored file leaves the checkpoint intact
    assert store.get("k") == data
    assert [p.name for p in (tmp_path).iterdir() if p.name.startswith(".tmp-")] == []


def test_local_get_file_link_falls_back_to_copy(tmp_path, monkeypatch):
    import errno

    def no_link(*args, **kwargs):
        raise OSError(errno.EXDEV, "cross-device link")

    store = FsspecBlobStore(str(tmp_path / "root"))
    src, data = _source(tmp_path, 4096)
    store.put_file("k", src)
    monkeypatch.setattr(os, "link", no_link)
    store.get_file("k", tmp_path / "out", allow_link=True)
    assert (tmp_path / "out").read_bytes() == data


def test_remote_put_file_retries_transient_errors(tmp_path):
    from statekit.checkpoint.blobstore.retry import RetryPolicy, TransientStorageError

    store = FsspecBlobStore(f"memory://statekit-ft-{uuid.uuid4().hex}",
                            retry=RetryPolicy(retries=2, initial_backoff=0.001, max_backoff=0.001))
    src, data = _source(tmp_path, 2000)
    real = store.fs.put_file
    calls = []

    def flaky(lpath, rpath, **kwargs):
        calls.append(rpath)
        if len(calls) == 1:
            raise TransientStorageError("injected")
        return real(lpath, rpath, **kwargs)

    store.fs.put_file = flaky
    store.put_file("k", src)
    assert len(calls) == 2
    assert store.get("k") == data


# --- CheckpointStreams.write_file / StateReader.read_file ----------------------------------------


def _streams(store, threshold=1024, **kwargs) -> CheckpointStreams:
    return CheckpointStreams(store, "chk-3/", "task 0", threshold, **kwargs)


@pytest.mark.parametrize("size", SIZES)
def test_write_file_handle_matches_write(store, tmp_path, size):
    src, data = _source(tmp_path, size)
    streams = _streams(store)
    handle = streams.write_file(src, state_name="000012.sst")
    expected = streams.write(data, state_name="000012.sst")
    assert handle["type"] == expected["type"]
    assert (handle["size"], handle["crc"]) == (size, zlib.crc32(data))
    if size < 1024:
        assert handle == expected
    else:
        assert handle["path"].startswith("chk-3/task_0-000012.sst-")
        assert handle["path"] != expected["path"]  # unique names
        assert store.get(handle["path"]) == data
    out = tmp_path / "restore" / "000012.sst"
    StateReader(store).read_file(handle, out)
    assert out.read_bytes() == data
    assert StateReader(store).read(handle) == data  # readable by the byte path too


def test_write_file_shared_and_accounting(store, tmp_path):
    src, _ = _source(tmp_path, 10)  # under the threshold, but shared files are never inline
    streams = _streams(store)
    handle = streams.write_file(src, state_name="x", shared_name="000007.sst")
    assert handle["type"] == "file" and handle["path"].startswith("shared/task_0-000007.sst-")
    assert streams.written == [handle["path"]]
    assert streams.bytes_written == 10
    assert streams.files_written == 1
    no_shared = _streams(store, allow_shared=False)
    assert no_shared.write_file(src, state_name="x", shared_name="s")["path"].startswith("chk-3/")


def test_write_file_limits(tmp_path):
    store = MemoryBlobStore()
    src, _ = _source(tmp_path, 2000)
    with pytest.raises(StateSizeError):
        _streams(store, threshold=10**9, max_state_size=1000).write_file(src, state_name="big")
    streams = _streams(store)
    streams.cancelled = True
    with pytest.raises(CheckpointError):
        streams.write_file(src, state_name="x")
    assert store.list() == []


@pytest.mark.parametrize("size", [5000, 6 * 1024 * 1024])  # checksummed inline / on a helper thread
def test_write_file_source_changing_leaves_no_orphan(store, tmp_path, monkeypatch, size):
    from statekit.checkpoint import checksum as checksum_module

    src, _ = _source(tmp_path, size)
    monkeypatch.setattr(checksum_module, "file_crc", lambda path: (0, size + 1))
    streams = _streams(store)
    with pytest.raises(CheckpointError, match="changed"):
        streams.write_file(src, state_name="000003.sst", shared_name="000003.sst")
    assert store.list() == []
    assert streams.written == [] and streams.bytes_written == 0


def test_write_file_crc_error_propagates(tmp_path, monkeypatch):
    from statekit.checkpoint import checksum as checksum_module

    store = MemoryBlobStore()
    src, _ = _source(tmp_path, 6 * 1024 * 1024)

    def broken(path):
        raise OSError(5, "injected read error")

    monkeypatch.setattr(checksum_module, "file_crc", broken)
    with pytest.raises(OSError, match="injected"):
        _streams(store).write_file(src, state_name="x")
    assert store.list() == []


@pytest.mark.parametrize("how", ["flip", "truncate", "extend"])
def test_read_file_detects_damaged_blob(store, tmp_path, how):
    src, data = _source(tmp_path, 5000)
    handle = _streams(store).write_file(src, state_name="000001.sst")
    bad = bytearray(data)
    if how == "flip":
        bad[1234] ^= 0x40
    elif how == "truncate":
        bad = bad[:-7]
    else:
        bad += b"tail"
    store.put(handle["path"], bytes(bad))
    out = tmp_path / "restore" / "000001.sst"
    error = ChecksumMismatchError if how == "flip" else TruncatedCheckpointError
    with pytest.raises(error):
        StateReader(store).read_file(handle, out, allow_link=True)
    assert not out.exists()  # the damaged copy is not left behind
    with pytest.raises(error):
        StateReader(store).read(handle)  # the byte path agrees


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_read_file_detects_damaged_download(store, tmp_path, how, monkeypatch):
    """The download itself goes wrong (the stored blob is intact)."""
    src, data = _source(tmp_path, 9000)
    handle = _streams(store).write_file(src, state_name="000002.sst")
    real = store.get_file

    def damaged(key, local_path, **kwargs):
        real(key, local_path, **kwargs)
        with open(local_path, "rb") as fh:
            raw = bytearray(fh.read())
        if how == "flip":
            raw[-1] ^= 1
        else:
            raw = raw[:100]
        os.unlink(local_path)  # never write through a hard link into the checkpoint
        with open(local_path, "wb") as fh:
            fh.write(raw)

    monkeypatch.setattr(store, "get_file", damaged)
    out = tmp_path / "out.sst"
    with pytest.raises(ChecksumMismatchError if how == "flip" else TruncatedCheckpointError):
        StateReader(store).read_file(handle, out)
    assert not out.exists()
    assert store.get(handle["path"]) == data


def test_read_file_missing_blob_and_bad_handles(store, tmp_path):
    reader = StateReader(store)
    with pytest.raises(CheckpointNotFoundError):
        reader.read_file({"type": "file", "path": "chk-1/gone", "size": 1, "crc": 0}, tmp_path / "x")
    with pytest.raises(UnsafePathError):
        reader.read_file({"type": "file", "path": "../x", "size": 1, "crc": 0}, tmp_path / "x")
    with pytest.raises(CheckpointError):
        reader.read_file({"type": "bogus"}, tmp_path / "x")
    with pytest.raises(ChecksumMismatchError):
        reader.read_file({"type": "inline", "data": b"abc", "size": 3, "crc": 1}, tmp_path / "x")


def test_file_crc_streams(tmp_path):
    src, data = _source(tmp_path, 3 * 8 * 1024 * 1024 + 5)
    assert file_crc(src) == (zlib.crc32(data), len(data))


# --- CheckpointStreams.write_parts / StateReader.read_parts (streamed chunks) ---------------------

PARTS = [b"", b"a" * 10, os.urandom(70_000), b"b" * 5, os.urandom(300_000)]


@pytest.mark.parametrize("beside", [False, True])
@pytest.mark.parametrize("shared", [None, "base"])
def test_write_parts_round_trip(store, shared, beside):
    streams = _streams(store)
    handle, locations = streams.write_parts(iter(PARTS), state_name="s", shared_name=shared,
                                            beside=beside)
    data = b"".join(PARTS)
    assert (handle["type"], handle["size"], handle["crc"]) == ("file", len(data), zlib.crc32(data))
    assert [length for _, length, _ in locations] == [len(p) for p in PARTS]
    assert [crc for _, _, crc in locations] == [zlib.crc32(p) for p in PARTS]
    assert handle["path"].startswith("shared/" if shared else "chk-3/")
    assert streams.written == [handle["path"]] and streams.bytes_written == len(data)
    reader = StateReader(store)
    assert reader.read(handle) == data
    assert [bytes(part) for part in reader.read_parts(handle, locations)] == PARTS
    assert store.list_temporary() == []


def test_write_parts_small_result_is_inline(store):
    handle, locations = _streams(store, threshold=1000).write_parts(iter([b"x", b"yz"]),
                                                                  state_name="s")
    assert handle["type"] == "inline" and handle["data"] == b"xyz"
    assert [bytes(p) for p in StateReader(store).read_parts(handle, locations)] == [b"x", b"yz"]
    assert store.list() == []


@pytest.mark.parametrize("how", ["flip", "truncate", "extend"])
def test_read_parts_detects_damage_before_handing_a_part_out(store, how):
    """A damaged part is never handed out; a file of another size than recorded (shorter or
    longer) fails before any part is."""
    handle, locations = _streams(store).write_parts(iter(PARTS), state_name="s")
    data = bytearray(store.get(handle["path"]))
    if how == "flip":
        data[len(data) - 1000] ^= 0xFF  # inside the last part
        error, good = ChecksumMismatchError, PARTS[:-1]
    elif how == "truncate":
        data = data[:-1000]
        error, good = TruncatedCheckpointError, []
    else:
        data += b"\0"
        error, good = TruncatedCheckpointError, []
    store.put(handle["path"], bytes(data))
    got = []
    with pytest.raises(error):
        for part in StateReader(store).read_parts(handle, locations):
            got.append(bytes(part))
    assert got == good


@pytest.mark.parametrize("how", ["intact", "flip", "truncate", "extend"])
def test_read_ranges_reads_and_checks_far_apart_ranges(store, how):
    """Far-apart ranges of one file (part heads) come back in order, each checked against its
    CRC: a local file through one open, other stores range by range; a damaged range is a
    ChecksumMismatchError after the good ones before it, a file of another size than recorded a
    TruncatedCheckpointError."""
    handle, locations = _streams(store).write_parts(iter(PARTS), state_name="s")
    data = b"".join(PARTS)
    ranges = [[offset, min(length, 7), zlib.crc32(data[offset:offset + min(length, 7)])]
              for offset, length, _ in locations]
    expected = [data[offset:offset + length] for offset, length, _ in ranges]
    raw = bytearray(store.get(handle["path"]))
    error, good = None, expected
    if how == "flip":
        raw[ranges[3][0] + 2] ^= 0xFF  # inside the fourth range
        error, good = ChecksumMismatchError, expected[:3]
    elif how == "truncate":
        raw = raw[:-10]
        error, good = TruncatedCheckpointError, []
    elif how == "extend":
        raw += b"\0"
        error, good = TruncatedCheckpointError, []
    store.put(handle["path"], bytes(raw))
    reader = StateReader(store)
    got = []
    if error is None:
        got = [bytes(d) for d in reader.read_ranges(handle, ranges)]
    else:
        with pytest.raises(error):
            for d in reader.read_ranges(handle, ranges):
                got.append(bytes(d))
    assert got == good
    if error is None:
        assert reader.bytes_read == sum(length for _, length, _ in ranges)
    inline = {"type": "inline", "data": data, "size": len(data), "crc": zlib.crc32(data)}
    assert [bytes(d) for d in StateReader(store).read_ranges(inline, ranges)] == expected


def test_read_parts_reuses_buffers_and_stops_early(store, monkeypatch):
    from statekit.checkpoint import reader as reader_module

    monkeypatch.setattr(reader_module, "_SPAN", 100_000)  # many reads through few buffers
    many = [os.urandom(30_000 + i) for i in range(60)]
    handle, locations = _streams(store).write_parts(iter(many), state_name="s")
    assert [bytes(part) for part in StateReader(store).read_parts(handle, locations)] == many
    parts = StateReader(store).read_parts(handle, locations)
    assert bytes(next(parts)) == many[0]
    parts.close()  # the read-ahead thread stops; nothing hangs


def test_write_parts_of_reused_buffers(store, monkeypatch):
    """A state's parts come packed into a few reused buffers in turn, each left alone while it
    is held: a store writing each as it comes (the local disk, on its writer thread) and one
    joining them all (holding every part) store the same bytes."""
    from statekit.backends import plainparts
    from statekit.serde.msgpack import packb, unpackb

    monkeypatch.setattr(plainparts, "PLAIN_PART_BYTES", 20_000)
    keys = list(range(5000))
    values = [os.urandom(n % 90) for n in keys]
    parts = plainparts.reader_parts(plainparts.slice_reader(keys, values))
    handle, locations = _streams(store).write_parts(parts, state_name="s")
    assert handle["type"] == "file" and len(locations) > 10
    got = [unpackb(bytes(p)) for p in StateReader(store).read_parts(handle, locations)]
    assert [k for ks, _ in got for k in ks] == keys
    assert [v for _, vs in got for v in vs] == values
    assert b"".join(packb(part) for part in got) == store.get(handle["path"])


@pytest.mark.parametrize("before", [1, 4], ids=lambda n: f"after-{n}-parts")
@pytest.mark.parametrize("beside", [False, True])
def test_write_parts_failing_producer_leaves_nothing(store, beside, before):
    def parts():
        for _ in range(before):
            yield os.urandom(200_000)
        raise RuntimeError("serializer failed")

    streams = _streams(store)
    with pytest.raises(RuntimeError, match="serializer failed"):
        streams.write_parts(parts(), state_name="s", beside=beside)
    assert store.list() == [] and store.list_temporary() == []
    assert streams.written == []


@pytest.mark.parametrize("beside", [False, True])
def test_write_parts_failing_store_stops_the_producer(tmp_path, monkeypatch, beside):
    store = FsspecBlobStore(str(tmp_path / "root"))
    produced = []

    def parts():
        for i in range(1000):
            produced.append(i)
            yield b"p" * 10_000

    def disk_full(root, key, fill):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(local_store_module, "_atomic_local_commit", disk_full)
    with pytest.raises(CheckpointError, match="No space left"):
        _streams(store).write_parts(parts(), state_name="s", beside=beside)
    assert len(produced) < 1000  # the producer stopped early instead of packing everything
    assert store.list() == [] and store.list_temporary() == []


def test_write_parts_limits():
    store = MemoryBlobStore()
    with pytest.raises(StateSizeError):
        _streams(store, threshold=10**9, max_state_size=1000).write_parts(
            iter([b"x" * 600, b"x" * 600]), state_name="big")
    with pytest.raises(StateSizeError):  # above the inline threshold too
        _streams(store, threshold=100, max_state_size=1000).write_parts(
            iter([b"x" * 600] * 3), state_name="big")
    streams = _streams(store)
    streams.cancelled = True
    with pytest.raises(CheckpointError):
        streams.write_parts(iter([b"x" * 5000]), state_name="x")
    assert store.list() == []


@pytest.mark.parametrize("sizes", [(0, 0), (0, 7), (7, 0), (1, 1), (100, 4096), (10**6, 3 * 10**6 + 7)])
def test_crc32_combine(sizes):
    a, b = os.urandom(sizes[0]), os.urandom(sizes[1])
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


@pytest.mark.parametrize("size", [0, 1, 15, 16, 63, 4097, 3 * 10**6 + 7])
def test_crc32_is_zlibs(size):
    """Checkpoints written with zlib's CRC-32 verify with the faster one, and the other way."""
    data = os.urandom(size)
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data, 0x12345678) == zlib.crc32(data, 0x12345678)
    assert crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])


# --- the RocksDB backend on the file path ---------------------------------------------------------


def _rocks(tmp_path, name):
    from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
    from statekit.serde.keygroups import KeyGroupRange
    from statekit.serde.types import Types, serializer_for

    factory = EmbeddedRocksDBStateBackend(False)
    factory.set_db_storage_paths(str(tmp_path / "work" / name))
    factory.set_number_of_transfering_threads(2)
    return factory.create_keyed_state_backend(key_serializer=serializer_for(Types.LONG()),
                                              key_group_range=KeyGroupRange(0, 127), max_parallelism=128)


@pytest.mark.parametrize("where", ["local", "memory-fs"])
def test_rocksdb_checkpoint_restore_through_files(tmp_path, where):
    from statekit.serde.types import Types
    from statekit.state.descriptors import ValueStateDescriptor

    desc = ValueStateDescriptor("v", Types.LONG())
    root = str(tmp_path / "chk") if where == "local" else f"memory://statekit-ft-{uuid.uuid4().hex}"
    access = FileSystemCheckpointStorage(root, file_state_size_threshold=64).create_access("job")
    kb = _rocks(tmp_path, "a")
    state = kb.get_partitioned_state(desc)
    for k in range(2000):
        kb.set_current_key(k)
        state.update(k * 3)
    streams = access.streams(1, "t0")
    handle = kb.snapshot(1, streams).run()
    access.commit(1, {"tasks": {"t0": handle}})
    files = {**handle["sst"], **handle["misc"]}
    assert handle["sst"] and all(h["type"] == "file" for h in handle["sst"].values())
    assert all("size" in h and "crc" in h for h in files.values())
    kb.dispose()

    fresh = _rocks(tmp_path, "b")
    fresh.restore([handle], access.reader())
    restored = fresh.get_partitioned_state(desc)
    for k in (0, 777, 1999):
        fresh.set_current_key(k)
        assert restored.value() == k * 3
    fresh.dispose()
    for h in files.values():  # the checkpoint survives the restored database's disposal
        if h["type"] == "file":
            assert access.reader().read(h)

    # a damaged SST in the checkpoint: a typed error, never a silently wrong database
    sst = next(iter(handle["sst"].values()))
    data = bytearray(access.reader().read(sst))
    data[len(data) // 2] ^= 0xFF
    access.store.put(sst["path"], bytes(data))
    broken = _rocks(tmp_path, "c")
    with pytest.raises(ChecksumMismatchError):  # a lazy restore: at the latest when it ends
        broken.restore([handle], access.reader())
        broken.finish_restore()
    broken.dispose()
