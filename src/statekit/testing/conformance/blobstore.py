"""The blob store conformance suite, in the shape of zarr's ``StoreTests``.

Subclass :class:`BlobStoreConformance` with a ``store`` fixture returning a fresh, empty
:class:`~statekit.checkpoint.blobstore.BlobStore` and two raw hooks, :meth:`set_raw` and
:meth:`get_raw`, that write and read a blob *without* the store's API (the dict, the file, the
object behind it), so every case checks the API against ground truth rather than against itself.
Cases that need a capability run only where the store declares it.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from typing import Any

import pytest

from statekit.checkpoint.blobstore.base import BlobStore
from statekit.errors import CheckpointNotFoundError, UnsafePathError

#: keys a store must refuse: they could leave its root
UNSAFE_KEYS = ("../escape", "/abs", "a/../../b", "s3://x/y", "a//b", "", "c:/x", "a\\b")


class BlobStoreConformance:
    """The behaviour every blob store must have (memory, local disk, object stores, remote)."""

    # --- what a subclass provides -------------------------------------------------------------

    @pytest.fixture
    def store(self) -> BlobStore:
        """A fresh, empty store (override)."""
        raise NotImplementedError("a BlobStoreConformance subclass provides a 'store' fixture")

    @abstractmethod
    def set_raw(self, store: BlobStore, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` without the store's API."""

    @abstractmethod
    def get_raw(self, store: BlobStore, key: str) -> bytes | None:
        """The bytes under ``key`` read without the store's API; None when there are none."""

    # --- single blobs ---------------------------------------------------------------------------

    @pytest.mark.parametrize("data", [b"", b"x", bytes(range(256)) * 40])
    def test_put_is_visible_raw(self, store: BlobStore, data: bytes) -> None:
        store.put("chk-1/blob", data)
        assert self.get_raw(store, "chk-1/blob") == data
        assert store.get("chk-1/blob") == data

    def test_get_reads_raw_blobs(self, store: BlobStore) -> None:
        self.set_raw(store, "a/b/c", b"0123456789")
        assert store.get("a/b/c") == b"0123456789"
        assert store.get("a/b/c", 2, 3) == b"234"
        assert store.get("a/b/c", 7) == b"789"
        assert store.get("a/b/c", 8, 10) == b"89"  # a short read at the end is returned short

    def test_put_replaces(self, store: BlobStore) -> None:
        store.put("k", b"first, longer value")
        store.put("k", b"second")
        assert self.get_raw(store, "k") == b"second"
        assert store.get("k") == b"second"

    def test_missing_blobs_are_typed(self, store: BlobStore, tmp_path: Any) -> None:
        with pytest.raises(CheckpointNotFoundError):
            store.get("chk-1/nope")
        with pytest.raises(CheckpointNotFoundError):
            store.get("chk-1/nope", 0, 1)
        with pytest.raises(CheckpointNotFoundError):
            store.get_file("chk-1/nope", tmp_path / "out")
        assert not store.exists("chk-1/nope")

    def test_size_is_the_stored_length(self, store: BlobStore) -> None:
        self.set_raw(store, "chk-1/sized", b"x" * 836)
        store.put("chk-1/empty", b"")
        assert store.size("chk-1/sized") == 836 and store.size("chk-1/empty") == 0
        with pytest.raises(CheckpointNotFoundError):
            store.size("chk-1/nope")

    def test_exists_and_delete(self, store: BlobStore) -> None:
        assert not store.exists("x/y")
        self.set_raw(store, "x/y", b"data")
        assert store.exists("x/y")
        store.delete("x/y")
        assert not store.exists("x/y")
        assert self.get_raw(store, "x/y") is None
        store.delete("x/y")  # deleting a missing blob is not an error

    @pytest.mark.parametrize("key", UNSAFE_KEYS)
    def test_unsafe_keys_are_refused(self, store: BlobStore, key: str, tmp_path: Any) -> None:
        source = tmp_path / "source"
        source.write_bytes(b"x")
        for operation in (lambda: store.put(key, b"x"), lambda: store.get(key),
                          lambda: store.exists(key), lambda: store.delete(key),
                          lambda: store.put_file(key, source),
                          lambda: store.get_file(key, tmp_path / "out")):
            with pytest.raises(UnsafePathError):
                operation()

    # --- listing -------------------------------------------------------------------------------

    def test_list_and_prefixes(self, store: BlobStore) -> None:
        assert store.list() == []
        for key in ("chk-2/b", "chk-1/a", "chk-1/sub/c", "shared/s"):
            self.set_raw(store, key, key.encode())
        assert store.list() == ["chk-1/a", "chk-1/sub/c", "chk-2/b", "shared/s"]
        assert store.list("chk-1/") == ["chk-1/a", "chk-1/sub/c"]
        assert store.list("chk-") == ["chk-1/a", "chk-1/sub/c", "chk-2/b"]
        assert store.list("nothing/") == []

    def test_delete_prefix(self, store: BlobStore) -> None:
        for key in ("chk-1/a", "chk-1/sub/b", "chk-10/c", "shared/d"):
            store.put(key, b"v")
        store.delete_prefix("chk-1/")
        assert store.list() == ["chk-10/c", "shared/d"]
        assert self.get_raw(store, "chk-1/a") is None
        store.delete_prefix("")
        assert store.list() == []

    # --- whole files, parts and ranges ------------------------------------------------------------

    def test_put_file_and_get_file(self, store: BlobStore, tmp_path: Any) -> None:
        data = os.urandom(100_000)
        source = tmp_path / "source.sst"
        source.write_bytes(data)
        store.put_file("chk-1/000001.sst", source)
        assert self.get_raw(store, "chk-1/000001.sst") == data
        dest = tmp_path / "restore" / "nested" / "000001.sst"  # missing parents are created
        store.get_file("chk-1/000001.sst", dest)
        assert dest.read_bytes() == data
        dest.write_bytes(b"x" * 200_000)  # an existing, longer file is replaced, not patched
        store.get_file("chk-1/000001.sst", str(dest))
        assert dest.read_bytes() == data

    def test_put_parts_concatenates(self, store: BlobStore) -> None:
        parts = [b"", b"a" * 10, os.urandom(70_000), b"b" * 5]
        store.put_parts("shared/p", iter(parts))
        assert self.get_raw(store, "shared/p") == b"".join(parts)

    def test_put_parts_failing_producer_leaves_nothing(self, store: BlobStore) -> None:
        store.put("shared/p", b"old")

        def parts() -> Any:
            yield os.urandom(50_000)
            raise RuntimeError("the producer failed")

        with pytest.raises(RuntimeError, match="producer failed"):
            store.put_parts("shared/p", parts())
        assert store.get("shared/p") == b"old"
        assert store.list() == ["shared/p"]
        assert store.list_temporary() == []

    def test_get_ranges(self, store: BlobStore) -> None:
        data = os.urandom(10_000)
        self.set_raw(store, "r", data)
        ranges = [(0, 10), (10, 0), (100, 1000), (9_990, 100)]
        expected = [data[s:s + n] for s, n in ranges]
        assert [bytes(b) for b in store.get_ranges("r", ranges)] == expected
        buffers: list[bytearray] = []

        def into(length: int) -> memoryview:
            buffers.append(bytearray(length))
            return memoryview(buffers[-1])

        assert [bytes(b) for b in store.get_ranges("r", ranges, into)] == expected
        assert len(buffers) == len(ranges)
        # far-apart ranges (part heads): the same bytes, nothing else read ahead
        assert [bytes(b) for b in store.get_ranges("r", ranges, sparse=True)] == expected
        assert [bytes(b) for b in store.get_ranges("r", ranges[::-1], sparse=True)] == expected[::-1]

    # --- capabilities ----------------------------------------------------------------------------

    def test_capabilities_are_flags(self, store: BlobStore) -> None:
        for name in ("supports_atomic_put", "supports_links", "supports_streamed_writes",
                     "writes_parts_beside", "supports_temporary_files", "local"):
            assert isinstance(getattr(store, name), bool), name
        assert isinstance(store.describe(), str)

    def test_linked_restores_leave_the_blob_intact(self, store: BlobStore, tmp_path: Any) -> None:
        if not store.supports_links:
            pytest.skip("the store cannot hard-link blobs")
        store.put("chk-1/000002.sst", b"immutable")
        dest = tmp_path / "linked.sst"
        store.get_file("chk-1/000002.sst", dest, allow_link=True)
        assert dest.read_bytes() == b"immutable"
        os.unlink(dest)  # dropping the restored file leaves the checkpoint's blob
        assert store.get("chk-1/000002.sst") == b"immutable"

    def test_temporary_files_are_not_blobs(self, store: BlobStore) -> None:
        assert store.list_temporary() == []
        if not store.supports_temporary_files:
            return
        self.set_raw(store, "chk-1/.tmp-0123abcd", b"half written")
        assert store.list() == []
        assert store.list_temporary() == ["chk-1/.tmp-0123abcd"]
