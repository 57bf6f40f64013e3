"""Every blob store through the shared conformance suite: in-process memory, local disk, fsspec
(``memory://`` and the local S3 server) and the Spark driver's JobManager store over HTTP."""

from __future__ import annotations

import os
import uuid

import pytest

from statekit.checkpoint.blobstore import (
    FsspecBlobStore,
    LocalBlobStore,
    MemoryBlobStore,
    blob_store_for,
)
from statekit.spark.jobmanager import JobManagerServer, RemoteBlobStore
from statekit.testing.conformance import BlobStoreConformance


class TestMemoryBlobStore(BlobStoreConformance):
    @pytest.fixture
    def store(self):
        return MemoryBlobStore()

    def set_raw(self, store, key, data):
        store._blobs[key] = bytes(data)

    def get_raw(self, store, key):
        return store._blobs.get(key)


class TestLocalBlobStore(BlobStoreConformance):
    @pytest.fixture
    def store(self, tmp_path):
        return LocalBlobStore(str(tmp_path / "root"))

    def set_raw(self, store, key, data):
        path = os.path.join(store.root, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)

    def get_raw(self, store, key):
        try:
            with open(os.path.join(store.root, key), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None


class _FsspecRaw(BlobStoreConformance):
    def set_raw(self, store, key, data):
        store.fs.pipe_file(f"{store.root}/{key}", bytes(data))

    def get_raw(self, store, key):
        store.fs.invalidate_cache()
        try:
            return bytes(store.fs.cat_file(f"{store.root}/{key}"))
        except FileNotFoundError:
            return None


class TestFsspecMemoryBlobStore(_FsspecRaw):
    @pytest.fixture
    def store(self):
        store = FsspecBlobStore(f"memory://statekit-bs-{uuid.uuid4().hex}")
        yield store
        store.delete_prefix("")  # fsspec's memory file system is one dict per process


class TestFsspecS3BlobStore(_FsspecRaw):
    @pytest.fixture
    def store(self, s3_server, s3_url):
        return FsspecBlobStore(s3_url + "/bs", s3_server.storage_options())


@pytest.fixture(scope="module")
def jobmanager_server():
    server = JobManagerServer("127.0.0.1")
    yield server
    server.shutdown()


class TestRemoteBlobStore(BlobStoreConformance):
    """The driver's JobManager store, reached over HTTP; raw access is the driver's memory."""

    @pytest.fixture
    def store(self, jobmanager_server):
        self.server = jobmanager_server
        return RemoteBlobStore(jobmanager_server.url, jobmanager_server.new_secret(),
                               f"job-{uuid.uuid4().hex}")

    def set_raw(self, store, key, data):
        self.server.store.put(self.server.raw_key(store.secret, f"{store.namespace}/{key}"), data)

    def get_raw(self, store, key):
        return self.server.store._blobs.get(self.server.raw_key(store.secret,
                                                                f"{store.namespace}/{key}"))


# --- choosing the store for a URL ------------------------------------------------------------------


def test_local_urls_get_the_local_store(tmp_path):
    assert isinstance(blob_store_for(str(tmp_path)), LocalBlobStore)
    assert isinstance(blob_store_for(f"file://{tmp_path}"), LocalBlobStore)
    assert isinstance(blob_store_for("memory://statekit-pick"), FsspecBlobStore)
    # constructed as before the split, a local path keeps the local atomic commit
    store = FsspecBlobStore(str(tmp_path / "root"))
    assert isinstance(store, LocalBlobStore) and store.local
    assert store.supports_links and store.supports_streamed_writes
    remote = FsspecBlobStore("memory://statekit-pick")
    assert not remote.local and not remote.supports_links
