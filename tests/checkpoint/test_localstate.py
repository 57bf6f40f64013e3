"""Task-local copies of snapshots as untrusted input: a copy is used only when it is the one asked
for, whole, below its root and reached without links; otherwise the caller falls back."""

import os
import zlib

import pytest

from statekit.checkpoint.blobstore.local import LocalBlobStore
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.checkpoint.localstate import MANIFEST, TaskLocalStateStore, handle_digest
from statekit.checkpoint.metadata import encode_metadata


@pytest.fixture
def setup(tmp_path):
    remote = CheckpointStorageAccess(LocalBlobStore(str(tmp_path / "remote")),
                                     str(tmp_path / "remote"), inline_threshold=0)
    root = tmp_path / "root"
    local = TaskLocalStateStore(root, root / "task", "job|task")
    return remote, local, tmp_path


def snapshot(remote, local, cid, payload=b"state bytes " * 100):
    """A task handle of one streamed file and one whole file, copied locally as written."""
    streams = local.streams(cid, remote.streams(cid, "task"))
    parts, _ = streams.write_parts([payload[:500], payload[500:]], state_name="s")
    source = remote.store.root + f"/src-{cid}"
    with open(source, "wb") as fh:
        fh.write(payload[::-1])
    whole = streams.write_file(source, state_name="f")
    os.unlink(source)
    handle = {"parts": parts, "file": whole}
    assert local.complete(cid, handle)
    return handle


def test_copy_reads_back_exactly(setup):
    remote, local, _ = setup
    handle = snapshot(remote, local, 1)
    reader = local.reader(1, handle)
    assert local.last_source == "local"
    assert reader.read(handle["parts"]) == remote.reader().read(handle["parts"])
    assert reader.read(handle["file"]) == remote.reader().read(handle["file"])


def test_only_the_newest_copy_is_kept_and_only_for_its_id(setup):
    remote, local, _ = setup
    first = snapshot(remote, local, 1)
    second = snapshot(remote, local, 2)
    assert sorted(p.name for p in local.directory.iterdir()) == ["chk-2"]
    assert local.reader(1, first) is None and local.last_source == "missing"
    assert local.reader(2, first) is None and local.last_source == "stale"  # another handle
    assert local.reader(2, second) is not None


def test_other_scope_is_stale(setup):
    remote, local, _ = setup
    handle = snapshot(remote, local, 1)
    other = TaskLocalStateStore(local.root, local.directory, "job|other-task")
    assert other.reader(1, handle) is None and other.last_source == "stale"


def test_aborted_checkpoint_leaves_nothing(setup):
    remote, local, _ = setup
    streams = local.streams(3, remote.streams(3, "task"))
    streams.write(b"x" * 100, state_name="s")
    local.abort(3)
    assert not local.directory.exists() or not any(local.directory.iterdir())


def test_handle_naming_a_path_outside_is_refused(setup):
    remote, local, _ = setup
    handle = snapshot(remote, local, 1)
    forged = {**handle, "file": {**handle["file"], "path": "../../outside"}}
    # a manifest made for the forged handle, so that only the path check stands in the way
    local2 = TaskLocalStateStore(local.root, local.directory, local.scope)
    (local.directory / "chk-1" / MANIFEST).write_bytes(encode_metadata({
        "layout": "local-copy", "scope": local.scope, "checkpoint_id": 1,
        "digest": handle_digest(forged)}))
    assert local2.reader(1, forged) is None and local2.last_source == "damaged"


def test_state_file_that_is_a_link_is_refused(setup):
    remote, local, tmp_path = setup
    handle = snapshot(remote, local, 1)
    target = local.directory / "chk-1" / handle["file"]["path"]
    outside = tmp_path / "outside"
    target.rename(outside)
    os.symlink(outside, target)
    assert local.reader(1, handle) is None and local.last_source == "damaged"
    assert outside.exists()


def test_copy_directory_that_links_elsewhere_is_refused(setup):
    remote, local, tmp_path = setup
    handle = snapshot(remote, local, 1)
    copy = local.directory / "chk-1"
    copy.rename(tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", copy)
    assert local.reader(1, handle) is None and local.last_source == "damaged"
    local.dispose()  # the link goes, its target stays
    assert not copy.is_symlink() and (tmp_path / "elsewhere").is_dir()


def test_failing_local_write_spoils_only_the_copy(setup, monkeypatch):
    remote, local, _ = setup
    streams = local.streams(1, remote.streams(1, "task"))
    real_open = os.open

    def failing_open(path, *args, **kwargs):
        if ".pending-" in str(path):
            raise OSError(28, "No space left on device")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing_open)
    parts, _ = streams.write_parts([b"a" * 100, b"b" * 100], state_name="s")
    monkeypatch.setattr(os, "open", real_open)
    handle = {"parts": parts}
    assert remote.reader().read(parts) == b"a" * 100 + b"b" * 100  # the checkpoint is whole
    assert not local.complete(1, handle)
    assert local.reader(1, handle) is None and local.last_source == "missing"


def _fallback_setup(setup):
    """A copy whose second part is damaged (same size): its reader, armed or not."""
    from statekit.checkpoint.localstate import FallbackReader

    remote, local, _ = setup
    payload = bytes(range(256)) * 4
    streams = local.streams(1, remote.streams(1, "task"))
    handle, parts = streams.write_parts([payload[:400], payload[400:800], payload[800:]],
                                        state_name="s")
    assert local.complete(1, handle)
    copy = local.directory / "chk-1" / handle["path"]
    data = bytearray(copy.read_bytes())
    data[500] ^= 0xFF
    copy.write_bytes(bytes(data))
    reader = FallbackReader(local.reader(1, handle), remote.reader())
    return reader, handle, parts, payload


def test_fallback_reader_reads_damaged_ranges_from_checkpoint_storage_once_armed(setup):
    """Part heads read from a damaged copy: raised during the restore; once armed, the damaged
    range and those after it come from checkpoint storage."""
    from statekit.errors import ChecksumMismatchError

    reader, handle, parts, payload = _fallback_setup(setup)
    ranges = [[offset, 200, zlib.crc32(payload[offset:offset + 200])] for offset, _, _ in parts]
    with pytest.raises(ChecksumMismatchError):  # the damaged byte 500 is in the second range
        list(reader.read_ranges(handle, ranges))
    assert not reader.failed
    reader.arm()
    got = [bytes(d) for d in reader.read_ranges(handle, ranges)]
    assert got == [payload[offset:offset + 200] for offset, _, _ in ranges]
    assert reader.failed


def test_fallback_reader_reads_damaged_parts_from_checkpoint_storage_once_armed(setup):
    from statekit.errors import ChecksumMismatchError

    reader, handle, parts, payload = _fallback_setup(setup)
    with pytest.raises(ChecksumMismatchError):  # during the restore: the caller falls back whole
        list(reader.read_parts(handle, parts, owned=True))
    assert not reader.failed
    reader.arm()
    got = [bytes(p) for p in reader.read_parts(handle, parts, owned=True)]
    assert b"".join(got) == payload and len(got) == 3
    assert reader.failed  # later reads go to checkpoint storage directly
    assert reader.read(handle, *parts[1]) == payload[400:800]
    assert reader.read(handle) == payload
