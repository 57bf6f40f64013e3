"""The fsspec blob store: object stores (S3 through s3fs, ``memory://``, chained URLs).

Every write is one PUT of the final key (a multipart upload above ``multipart_threshold`` bytes,
whose completion is equally atomic); never a rename, never fsspec transactions.  Transient
failures are retried; the file system is created anew in each process (fsspec's async file
systems are not fork-safe) and shared by the transfer threads (s3fs is thread-safe for plain
operations; its instance cache is skipped so no state leaks between stores).  The local disk has
its own class, :class:`~statekit.checkpoint.blobstore.local.LocalBlobStore`.
"""

from __future__ import annotations

import os
import posixpath
import threading
from typing import Any

import fsspec
from fsspec.utils import get_protocol

from statekit.checkpoint.blobstore.base import PathBlobStore, is_url, run_operation_hook
from statekit.checkpoint.blobstore.local import LocalBlobStore
from statekit.checkpoint.blobstore.retry import RetryPolicy
from statekit.config import default
from statekit.errors import MissingDependencyError


def _resolve(url: str, storage_options: dict[str, Any]) -> tuple[Any, str]:
    options = dict(storage_options)
    if "::" not in url:
        options.setdefault("skip_instance_cache", True)
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:  # fsspec names the package the protocol needs
        raise _missing(url, exc) from None
    return fs, path


def _missing(url: str, exc: ImportError) -> MissingDependencyError:
    """A URL whose file system's package is not installed (S3: ``statekit[s3]``)."""
    extra = " (pip install 'statekit[s3]')" if get_protocol(url) in ("s3", "s3a") else ""
    return MissingDependencyError("state.checkpoints.dir", f"{url}: {exc}{extra}")


def _is_local(url: str) -> bool:
    """Whether ``url`` names the local file system (decided by its protocol, no instance made;
    a plain path is local, whatever it holds: ``a::b`` is a directory name, not a chain)."""
    if not is_url(url):
        return True
    try:
        proto = fsspec.get_filesystem_class(get_protocol(url)).protocol
    except ImportError as exc:
        raise _missing(url, exc) from None
    return "file" in ((proto,) if isinstance(proto, str) else tuple(proto))


class FsspecBlobStore(PathBlobStore):
    """Blobs on an fsspec file system under ``root`` (a URL).

    Constructed with a local path or ``file://`` URL it returns a :class:`LocalBlobStore`, whose
    atomic commit needs the local disk's rename; code written before the two were split keeps
    its guarantees that way.
    """

    DEFAULT_MULTIPART_THRESHOLD: int = default("state.storage.fs.multipart-threshold")
    DEFAULT_PART_SIZE = 8 * 1024 * 1024
    MIN_PART_SIZE = 5 * 1024 * 1024  # S3's minimum for every part but the last

    def __new__(cls, root: str | None = None, storage_options: dict[str, Any] | None = None,
                **kwargs: Any) -> Any:
        if cls is FsspecBlobStore and root is not None and _is_local(root):
            return LocalBlobStore(root, retry=kwargs.get("retry"))
        return super().__new__(cls)

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None, *,
                 retry: RetryPolicy | None = None, multipart_threshold: int | None = None,
                 part_size: int | None = None) -> None:
        self.root_url = root.rstrip("/") or "/"
        self.storage_options = dict(storage_options or {})
        self.retry = retry if retry is not None else RetryPolicy()
        self.multipart_threshold = (self.DEFAULT_MULTIPART_THRESHOLD if multipart_threshold is None
                                    else int(multipart_threshold))
        self.part_size = max(self.MIN_PART_SIZE, int(part_size or self.DEFAULT_PART_SIZE))
        self._fs: Any = None
        self._pid = -1
        self._lock = threading.Lock()
        self._lock_pid = os.getpid()
        _, path = _resolve(self.root_url, self.storage_options)
        self.root = path.rstrip("/") if path != "/" else path

    @property
    def local(self) -> bool:
        """Blobs are not files on this machine (kept for code that checked this flag)."""
        return False

    @property
    def fs(self) -> Any:
        """The file system, created anew in each process (fsspec async file systems are not fork-safe)."""
        pid = os.getpid()
        if self._fs is None or self._pid != pid:
            if self._lock_pid != pid:  # a lock inherited through fork may be held forever
                self._lock, self._lock_pid = threading.Lock(), pid
            with self._lock:
                if self._fs is None or self._pid != pid:
                    self._fs, _ = _resolve(self.root_url, self.storage_options)
                    self._pid = pid
        return self._fs

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None
        state["_pid"] = -1
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._lock_pid = os.getpid()

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if len(data) > self.multipart_threshold:
            self._call(f"write {path}", lambda: self._multipart_put(path, data))
            return

        def pipe() -> None:
            run_operation_hook("put", path)
            self.fs.pipe_file(path, bytes(data))

        self._call(f"write {path}", pipe)

    def _multipart_put(self, path: str, data: bytes) -> None:
        """A multipart upload: invisible until its completion, aborted on any failure."""
        run_operation_hook("multipart-start", path)
        handle = self.fs.open(path, "wb", block_size=self.part_size)
        try:
            view = memoryview(data)
            for start in range(0, len(view), self.part_size):
                run_operation_hook("multipart-part", path)
                handle.write(view[start:start + self.part_size])
            run_operation_hook("multipart-complete", path)
            handle.close()
        except BaseException:
            discard = getattr(handle, "discard", None)
            try:
                if callable(discard):
                    discard()
            finally:
                handle.closed = True  # never let close() or __del__ commit a partial upload
            raise

    def put_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        """``fs.put_file`` (s3fs streams large files as a multipart upload, which is invisible
        until its completion)."""
        path, source = self._path(key), os.fspath(local_path)

        def upload() -> None:
            run_operation_hook("put", path)
            self.fs.put_file(source, path)

        self._call(f"write {path}", upload)

    def get_file(self, key: str, local_path: str | os.PathLike[str], *, allow_link: bool = False) -> None:
        """``fs.get_file`` (a streamed download), retried per the store's policy."""
        path, dest = self._path(key), os.fspath(local_path)
        os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)  # never "missing blob"
        self._read(path, lambda: self.fs.get_file(path, dest))

    def get(self, key: str, start: int | None = None, length: int | None = None) -> bytes:
        path = self._path(key)

        def read() -> bytes:
            if start is None:
                return bytes(self.fs.cat_file(path))
            end = None if length is None else start + length
            return bytes(self.fs.cat_file(path, start=start, end=end))

        return self._read(path, read)

    def size(self, key: str) -> int:
        path = self._path(key)
        return self._read(path, lambda: int(self.fs.size(path)))

    def exists(self, key: str) -> bool:
        path = self._path(key)

        def check() -> bool:
            self.fs.invalidate_cache(posixpath.dirname(path))
            return bool(self.fs.exists(path))

        return self._call(f"check {path}", check)

    def delete(self, key: str) -> None:
        path = self._path(key)

        def remove() -> None:
            run_operation_hook("delete", path)
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass

        self._call(f"delete {path}", remove)

    def list(self, prefix: str = "") -> list[str]:
        base = self.root

        def find() -> list[str]:
            run_operation_hook("list", base)
            self.fs.invalidate_cache(base)
            try:
                return list(self.fs.find(base, withdirs=False))
            except FileNotFoundError:
                return []

        found = self._call(f"list {base}", find)
        strip = len(base.rstrip("/")) + 1
        keys = []
        for full in found:
            rel = full[strip:] if full.startswith(base) else full
            if rel.startswith(prefix) and not posixpath.basename(rel).startswith(".tmp-"):
                keys.append(rel)
        return sorted(keys)


def blob_store_for(url: str, storage_options: dict[str, Any] | None = None, *,
                   retry: RetryPolicy | None = None, multipart_threshold: int | None = None
                   ) -> LocalBlobStore | FsspecBlobStore:
    """The blob store for ``url``: :class:`LocalBlobStore` on the local file system,
    :class:`FsspecBlobStore` on any other fsspec file system."""
    if _is_local(url):
        return LocalBlobStore(url, retry=retry)
    return FsspecBlobStore(url, storage_options, retry=retry, multipart_threshold=multipart_threshold)
