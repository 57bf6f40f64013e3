"""In-process alternative for checkpoint storage: a throttled fsspec filesystem.

The LD_PRELOAD shim (profiles.profile_env) is the primary mechanism: it covers
*every* file access of a subprocess under the profiled directories, including
fsspec's LocalFileSystem (which uses Python's open()). This wrapper is for the
cases the shim cannot see: an in-process benchmark that is not started under
the shim, or a non-local fsspec target (memory://, s3:// against moto, ...).

    from benchmarks.diskprofiles.fsspec_throttle import ThrottledFileSystem
    fs = ThrottledFileSystem("hdd-7200", path="/tmp/ckpt", fs=fsspec.filesystem("file"))
    with fs.open("chk-1/state.bin", "wb") as f:   # pays 180 MB/s + seeks
        f.write(data)

Same model as iodelay.c (per-op latency + bytes/bandwidth, HDD seek when an
op is not adjacent to the previous op on the device, fsync latency on
``f.fsync()`` or, with ``fsync_on_close=True``, on closing a written file),
with one device per ThrottledFileSystem instance, shared by its threads.
Only data-moving calls are throttled (open/read/write, cat*, pipe*, put*,
get*, cp_file); metadata calls (ls, info, mkdir, rm) are free.
"""

from __future__ import annotations

import io
import os
import threading
import time

from fsspec.implementations.dirfs import DirFileSystem

try:
    from . import profiles as _profiles
except ImportError:  # pragma: no cover - script use
    import profiles as _profiles  # type: ignore[no-redef]


class Device:
    """Thread-safe Python port of the shim's device model."""

    def __init__(self, profile):
        self.p = _profiles.get_profile(profile)
        self._lock = threading.Lock()
        self._free_at = 0.0
        self._head = None  # (path, end offset)
        self.injected_s = 0.0

    def charge(self, kind: str, path: str | None, offset: int | None, n: int, t0: float) -> None:
        p = self.p
        if not p.uses_shim:
            return
        if kind == "read":
            lat, bw = p.read_lat_us * 1e-6, p.read_mbps
        elif kind == "write":
            lat, bw = p.write_lat_us * 1e-6, p.write_mbps
        else:
            lat, bw = p.fsync_lat_us * 1e-6, 0
        xfer = n / (bw * 1e6) if bw and n else 0.0
        with self._lock:
            seek = 0.0
            if p.seek_us and kind != "sync":
                if (
                    self._head is None
                    or self._head[0] != path
                    or (offset is not None and offset != self._head[1])
                ):
                    seek = p.seek_us * 1e-6
                start_off = self._head[1] if offset is None and self._head else (offset or 0)
                self._head = (path, start_off + n)
            start = max(t0, self._free_at)
            if p.serial or kind == "sync":
                done = start + seek + lat + xfer
                self._free_at = done
            else:
                self._free_at = start + xfer
                done = start + xfer + lat + seek
            self.injected_s += done - t0
        delay = done - time.monotonic()
        if delay > 0:
            time.sleep(delay)


class ThrottledFile(io.RawIOBase):
    """File wrapper charging each read/write to a :class:`Device`."""

    def __init__(self, f, device: Device, path: str, writable: bool, fsync_on_close: bool):
        self._f, self._dev, self._path = f, device, path
        self._w, self._fsync_on_close = writable, fsync_on_close
        self._pos = f.tell() if hasattr(f, "tell") else 0

    def readable(self):
        return not self._w

    def writable(self):
        return self._w

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        self._pos = self._f.seek(offset, whence)
        return self._pos

    def read(self, size=-1):
        t0 = time.monotonic()
        data = self._f.read(size)
        self._dev.charge("read", self._path, self._pos, len(data), t0)
        self._pos += len(data)
        return data

    def readinto(self, b):
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def write(self, b):
        t0 = time.monotonic()
        n = self._f.write(b)
        n = len(b) if n is None else n
        self._dev.charge("write", self._path, self._pos, n, t0)
        self._pos += n
        return n

    def flush(self):
        if not self._f.closed:
            self._f.flush()

    def fsync(self):
        t0 = time.monotonic()
        self.flush()
        fileno = getattr(self._f, "fileno", None)
        if fileno is not None:
            try:
                os.fsync(fileno())
            except (OSError, io.UnsupportedOperation):
                pass
        self._dev.charge("sync", self._path, None, 0, t0)

    def close(self):
        if self.closed:
            return
        try:
            if self._w and self._fsync_on_close:
                self.fsync()
            self._f.close()
        finally:
            super().close()

    def __getattr__(self, name):  # e.g. .name, .mode, .size
        return getattr(self._f, name)


class ThrottledFileSystem(DirFileSystem):
    """A DirFileSystem over ``fs`` rooted at ``path`` whose data I/O pays a disk profile."""

    protocol = "throttled"

    def __init__(self, profile, path="", fs=None, *, fsync_on_close=False, **kw):
        super().__init__(path=path, fs=fs, **kw)
        self.device = Device(profile)
        self.fsync_on_close = fsync_on_close

    def open(self, path, mode="rb", *args, **kwargs):
        if "b" not in mode:  # text mode: buffered text over a throttled binary file
            if "+" in mode:
                raise ValueError("text update modes are not supported")
            encoding = kwargs.pop("encoding", None) or "utf-8"
            raw = self.open(path, mode.replace("t", "") + "b", *args, **kwargs)
            buf = io.BufferedWriter(raw) if raw.writable() else io.BufferedReader(raw)
            return io.TextIOWrapper(buf, encoding=encoding)
        f = super().open(path, mode, *args, **kwargs)
        w = any(c in mode for c in "wax+")
        return ThrottledFile(f, self.device, self._join(path), w, self.fsync_on_close)

    # --- data-moving helpers, routed through open() so that they pay too
    def cat_file(self, path, start=None, end=None, **kwargs):
        with self.open(path, "rb") as f:
            size = None
            if (start is not None and start < 0) or (end is not None and end < 0):
                size = self.size(path)
            start = 0 if start is None else (start if start >= 0 else max(0, size + start))
            if start:
                f.seek(start)
            n = -1 if end is None else max(0, (end if end >= 0 else size + end) - start)
            return f.read(n)

    def cat(self, path, recursive=False, on_error="raise", **kwargs):
        paths = self.expand_path(path, recursive=recursive)
        if len(paths) == 1 and paths[0] == self._strip_protocol(path):
            return self.cat_file(paths[0], **kwargs)
        return {p: self.cat_file(p, **kwargs) for p in paths if self.isfile(p)}

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kwargs):
        return [self.cat_file(p, s, e) for p, s, e in zip(paths, starts, ends, strict=True)]

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        with self.open(path, "wb") as f:
            f.write(value)

    def pipe(self, path, value=None, **kwargs):
        items = path.items() if isinstance(path, dict) else [(path, value)]
        for p, v in items:
            self.pipe_file(p, v)

    def write_text(self, path, value, encoding=None, errors=None, newline=None, **kwargs):
        self.pipe_file(path, value.encode(encoding or "utf-8", errors or "strict"))

    def put_file(self, lpath, rpath, callback=None, mode="overwrite", **kwargs):
        with open(lpath, "rb") as src:
            self.pipe_file(rpath, src.read())

    def put(self, lpath, rpath, recursive=False, **kwargs):
        if recursive:
            raise NotImplementedError("recursive put is not throttled; use put_file per file")
        self.put_file(lpath, rpath)

    def get_file(self, rpath, lpath, callback=None, **kwargs):
        data = self.cat_file(rpath)
        with open(lpath, "wb") as dst:
            dst.write(data)

    def get(self, rpath, lpath, recursive=False, **kwargs):
        if recursive:
            raise NotImplementedError("recursive get is not throttled; use get_file per file")
        self.get_file(rpath, lpath)

    def cp_file(self, path1, path2, **kwargs):
        self.pipe_file(path2, self.cat_file(path1))
