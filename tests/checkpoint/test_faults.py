"""Fault injection (FaultyFileSystem) and integrity of what is read back.

Transient failures are retried with backoff; an exhausted budget fails the checkpoint through
the coordinator's tolerable-failure rules; damaged checkpoints (truncated, corrupted, swapped
files, unknown format version, unsafe paths, unexpected pickle) raise typed errors, and with
``execution.checkpointing.recover-from-older-on-corruption`` recovery uses the newest intact one.
"""

from __future__ import annotations

import errno
import pickle
import struct
import time
import uuid
import zlib
from collections import Counter

import fsspec
import pytest

from statekit.checkpoint.blobstore import FsspecBlobStore
from statekit.checkpoint.blobstore.retry import RetryPolicy, TransientStorageError, is_transient
from statekit.checkpoint.config import ExternalizedCheckpointCleanup
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.handles import file_paths
from statekit.checkpoint.layout import RECOVER_FROM_OLDER_KEY, CheckpointStorageAccess
from statekit.checkpoint.metadata import decode_metadata, encode_metadata
from statekit.checkpoint.reader import StateReader
from statekit.checkpoint.savepoint import open_external
from statekit.errors import (
    CheckpointError,
    CheckpointStorageError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    JobExecutionError,
    PickleNotAllowedError,
    TruncatedCheckpointError,
    UnsafePathError,
    UnsupportedFormatVersionError,
)
from statekit.runtime.environment import StreamExecutionEnvironment
from statekit.runtime.functions import KeyedProcessFunction
from statekit.runtime.restart import RestartStrategies
from statekit.serde.types import Types
from statekit.state.descriptors import ValueStateDescriptor
from statekit.testing.faults import Fault, FaultPlan

ITEMS = [(f"k{i % 7}", i) for i in range(300)]
MODEL = Counter(k for k, _ in ITEMS)
FAST = RetryPolicy(retries=2, initial_backoff=0.001, max_backoff=0.002)


class Count(KeyedProcessFunction):
    def __init__(self, type_info=None) -> None:
        self.type_info = type_info or Types.LONG()

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", self.type_info))

    def process_element(self, value, ctx):
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield ctx.get_current_key(), n


def finals(result) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, n in result:
        out[key] = max(out.get(key, 0), n)
    return out


@pytest.fixture(params=["memory", "s3"])
def faulty_root(request):
    """(url, base storage options, plan) of a FaultyFileSystem over memory or the local S3."""
    plan = FaultPlan()
    options: dict = {"faulty": {"plan": plan.register()}}
    if request.param == "memory":
        return f"faulty::memory://f-{uuid.uuid4().hex[:8]}", options, plan
    server = request.getfixturevalue("s3_server")
    url = request.getfixturevalue("s3_url")
    options["s3"] = server.storage_options()
    return f"faulty::{url}/f", options, plan


def run_job(url, options, *, retry=FAST, tolerable=None, restarts=0, items=ITEMS, func=None,
            extra=None, retained=1, parallelism=2, pace=0.0003, checkpoints=0):
    """Run the counting job on ``url``; ``checkpoints``: the last quarter of the input waits, one
    element at a time, for checkpoints to complete until that many exist (a loaded machine)."""
    env = StreamExecutionEnvironment.get_execution_environment(
        {"execution.checkpointing.interval": "10 ms", "state.checkpoints.num-retained": str(retained),
         "execution.checkpointing.max-concurrent-checkpoints": "1",
         **(extra or {})})
    env.set_parallelism(parallelism)
    cc = env.get_checkpoint_config()
    cc.set_checkpoint_storage(FileSystemCheckpointStorage(url, 0, storage_options=options, retry=retry))
    cc.enable_externalized_checkpoints(ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION)
    if tolerable is not None:
        cc.set_tolerable_checkpoint_failure_number(tolerable)
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(restarts, 0) if restarts
                             else RestartStrategies.no_restart())
    seen = [0]

    def slow_down(v):
        time.sleep(pace)
        seen[0] += 1
        if checkpoints and seen[0] >= len(items) * 3 // 4:
            found, deadline = _completed(url, options), time.monotonic() + 2
            while found < checkpoints and time.monotonic() < deadline:
                time.sleep(0.005)  # the pending one completes; the next starts after this element
                if _completed(url, options) > found:
                    break
        return v

    slow = env.from_collection(items).map(slow_down)
    return slow.key_by(lambda v: v[0]).process(func or Count()).execute_and_collect()


def _completed(url, options):
    """How many completed checkpoints the job directories under ``url`` hold now."""
    fs, path = fsspec.core.url_to_fs(url, **options)
    fs.invalidate_cache()
    return len(fs.glob(f"{path.rstrip('/')}/*/chk-*/_metadata"))


# --- retries -------------------------------------------------------------------------------------


def test_transient_errors_are_classified():
    assert is_transient(ConnectionResetError())
    assert is_transient(TimeoutError())
    assert is_transient(OSError(errno.EBUSY, "SlowDown: please reduce your request rate"))  # s3fs 503
    assert is_transient(OSError(errno.EREMOTEIO, "InternalError"))  # s3fs 500
    assert is_transient(PermissionError("Throttling: rate exceeded"))
    assert not is_transient(PermissionError("AccessDenied"))
    assert not is_transient(FileNotFoundError("nope"))
    assert not is_transient(OSError(errno.EINVAL, "InvalidArgument"))
    assert not is_transient(ValueError("bug"))


def test_backoff_grows_and_is_capped():
    policy = RetryPolicy(retries=6, initial_backoff=0.1, max_backoff=0.5, jitter=False)
    assert [policy.delay(n) for n in range(1, 6)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    sleeps: list[float] = []
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    assert policy.call(flaky, "op", sleep=sleeps.append) == "ok"
    assert sleeps == [0.1, 0.2]


def test_store_retries_transient_and_gives_up_after_budget(faulty_root):
    url, options, plan = faulty_root
    store = FsspecBlobStore(url, options, retry=FAST)
    plan.add(Fault("pipe_file", times=2))
    store.put("chk-1/a", b"data")  # two failures, third attempt succeeds
    assert store.get("chk-1/a") == b"data"
    plan.add(Fault("pipe_file", times=None, error=ConnectionResetError))
    before = plan.count("pipe_file")
    with pytest.raises(CheckpointStorageError, match=r"after 3 attempt\(s\)"):
        store.put("chk-1/b", b"data")
    assert plan.count("pipe_file") - before == 3


def test_permanent_errors_are_not_retried(faulty_root):
    url, options, plan = faulty_root
    store = FsspecBlobStore(url, options, retry=FAST)
    plan.add(Fault("pipe_file", times=None, error=PermissionError("AccessDenied")))
    with pytest.raises(CheckpointStorageError, match="AccessDenied"):
        store.put("chk-1/a", b"x")
    assert plan.count("pipe_file") == 1


def test_delays_are_tolerated(faulty_root):
    url, options, plan = faulty_root
    plan.add(Fault("pipe_file", action="delay", delay=0.2, times=2))
    start = time.perf_counter()
    store = FsspecBlobStore(url, options, retry=FAST)
    store.put("chk-1/a", b"x")
    store.put("chk-1/b", b"y")
    assert time.perf_counter() - start >= 0.4
    assert store.list("chk-1/") == ["chk-1/a", "chk-1/b"]


def test_job_rides_through_transient_failures(faulty_root):
    url, options, plan = faulty_root
    plan.add(Fault("pipe_file", path="*_metadata", times=2, error=TransientStorageError))
    plan.add(Fault("cat_file", times=2, error=TimeoutError))
    result = run_job(url, options, tolerable=0)
    assert len(plan.fired) >= 3
    assert all(s.status == "completed" for s in result.checkpoint_stats)
    assert finals(result) == dict(MODEL) and len(result) == len(ITEMS)


def test_exhausted_budget_fails_checkpoint_within_tolerance(faulty_root):
    url, options, plan = faulty_root
    plan.add(Fault("pipe_file", path="*/chk-2/*", times=None, error=ConnectionResetError))
    result = run_job(url, options, tolerable=3, pace=0.002)  # chk-2 happens also under load
    failed = [s for s in result.checkpoint_stats if s.status == "failed"]
    assert [s.checkpoint_id for s in failed] == [2]
    assert "after 3 attempt(s)" in failed[0].failure
    assert finals(result) == dict(MODEL) and len(result) == len(ITEMS)


def test_failures_beyond_tolerance_fail_the_job_then_restart(faulty_root):
    url, options, plan = faulty_root
    plan.add(Fault("pipe_file", path="*/chk-2/*", times=None, error=ConnectionResetError))
    with pytest.raises(JobExecutionError) as info:
        run_job(url, options, tolerable=0, pace=0.002)  # chk-2 happens also under load
    assert isinstance(info.value.__cause__, CheckpointError)
    result = run_job(url, options, tolerable=0, restarts=1, pace=0.002)  # chk-2 of the new job fails too
    assert result.restarts == 1
    assert finals(result) == dict(MODEL) and len(result) == len(ITEMS)


def test_truncation_is_detected_on_write_and_read(faulty_root):
    url, options, plan = faulty_root
    store = FsspecBlobStore(url, options, retry=FAST)
    plan.add(Fault("pipe_file", action="truncate", keep=3))
    data = b"0123456789"
    store.put("chk-1/a", data)
    handle = {"type": "file", "path": "chk-1/a", "size": len(data), "crc": zlib.crc32(data)}
    with pytest.raises(TruncatedCheckpointError):
        StateReader(store).read(handle)
    store.put("chk-1/a", data)
    plan.add(Fault("cat_file", action="truncate", keep=5))
    with pytest.raises(TruncatedCheckpointError):
        StateReader(store).read(handle)
    assert StateReader(store).read(handle) == data


# --- integrity of retained checkpoints ------------------------------------------------------------


@pytest.fixture(scope="module")
def retained_template(tmp_path_factory):
    """One finished job with 3 retained checkpoints on the local disk (its job directory), copied
    into each test's store: checkpoint handles are relative to their job directory."""
    url = str(tmp_path_factory.mktemp("retained") / "ckpt")
    # the job waits near its end until 2 checkpoints exist (the final one makes 3), also under load
    result = run_job(url, {}, retained=3, checkpoints=2)
    assert len(result.retained_checkpoints) == 3
    return result.latest_checkpoint.rsplit("/", 1)[0]


def _retained(request, tmp_path):
    template = request.getfixturevalue("retained_template")
    if request.param == "local":
        url, options = str(tmp_path / "ckpt"), {}
    elif request.param == "memory":
        url, options = f"memory://r-{uuid.uuid4().hex[:8]}", {}
    else:
        server = request.getfixturevalue("s3_server")
        url, options = request.getfixturevalue("s3_url") + "/r", server.storage_options()
    job_dir = f"{url}/{template.rsplit('/', 1)[1]}"
    fs, path = fsspec.core.url_to_fs(job_dir, **options)
    fs.put(template, path, recursive=True)
    access = CheckpointStorageAccess(FsspecBlobStore(job_dir, options), job_dir, 0)
    assert len(access.completed()) == 3
    return url, options, access, access.completed()


@pytest.fixture(params=["local", "memory", "s3"])
def retained(request, tmp_path):
    """A finished job with 3 retained checkpoints: (root url, options, access, checkpoint ids)."""
    return _retained(request, tmp_path)


@pytest.fixture(params=["local", "memory"])
def retained_nos3(request, tmp_path):
    """As ``retained``, without S3 (path checks happen before any storage access)."""
    return _retained(request, tmp_path)


def restore_job(url, options, path, fallback=False, func=None):
    extra = {"execution.savepoint.path": path}
    if fallback:
        extra[RECOVER_FROM_OLDER_KEY] = "true"
    return run_job(url, options, items=[*ITEMS, ("k1", 999)], extra=extra, func=func)


def task_files(access, cid):
    return sorted(p for p in file_paths(access.load(cid)) if p.startswith(f"chk-{cid}/"))


def damage(access, cid, how):
    store = access.store
    files = task_files(access, cid)
    if how == "truncate":
        store.put(files[0], store.get(files[0])[:-5])
    elif how == "flip":
        blob = bytearray(store.get(files[0]))
        blob[len(blob) // 2] ^= 0xFF
        store.put(files[0], bytes(blob))
    elif how == "swap":
        a, b = store.get(files[0]), store.get(files[1])
        store.put(files[0], b)
        store.put(files[1], a)
    elif how == "delete":
        store.delete(files[0])
    return files


EXPECTED_ERRORS = {"truncate": TruncatedCheckpointError, "flip": ChecksumMismatchError,
                   "swap": CorruptCheckpointError, "delete": CheckpointError}


@pytest.mark.parametrize("how", ["truncate", "flip", "swap", "delete"])
def test_damaged_files_are_rejected_or_skipped(retained, how):
    url, options, access, ids = retained
    damage(access, ids[-1], how)
    with pytest.raises(EXPECTED_ERRORS[how]):
        access.verify(ids[-1])
    with pytest.raises(EXPECTED_ERRORS[how]):
        access.latest_valid(fallback=False)
    assert access.latest_valid()[0] == ids[-2]
    path = access.checkpoint_path(ids[-1])
    with pytest.raises(JobExecutionError) as info:
        restore_job(url, options, path)
    assert isinstance(info.value.__cause__, EXPECTED_ERRORS[how])
    result = restore_job(url, options, path, fallback=True)  # newest intact: ids[-2]
    expected = dict(MODEL)
    expected["k1"] += 1
    assert finals(result) == {k: v for k, v in expected.items() if k in finals(result)}
    assert finals(result)["k1"] == MODEL["k1"] + 1


def rewrite_metadata(access, cid, body=None, version=None):
    key = f"chk-{cid}/_metadata"
    raw = encode_metadata(body if body is not None else access.load(cid))
    if version is not None:
        head = raw[:8] + struct.pack(">H", version) + raw[10:-4]
        raw = head + struct.pack(">I", zlib.crc32(head))
    access.store.put(key, raw)


def test_unknown_metadata_version_is_rejected(retained):
    _url, options, access, ids = retained
    rewrite_metadata(access, ids[-1], version=99)
    with pytest.raises(UnsupportedFormatVersionError, match="version 99"):
        open_external(access.checkpoint_path(ids[-1]), options)
    metadata, _ = open_external(access.checkpoint_path(ids[-1]), options, fallback_to_older=True)
    assert metadata["checkpoint_id"] == ids[-2]
    # a job directory as the restore path means its newest intact checkpoint
    metadata, _ = open_external(access.location, options, fallback_to_older=True)
    assert metadata["checkpoint_id"] == ids[-2]


@pytest.mark.parametrize("bad", ["../other-job/chk-1/x", "/etc/passwd", "s3://elsewhere/x",
                                 "chk-1/../../x"])
def test_paths_outside_the_job_directory_are_rejected(retained_nos3, bad):
    url, options, access, ids = retained_nos3
    body = access.load(ids[-1])
    good = task_files(access, ids[-1])[0]

    def redirect(obj):
        if isinstance(obj, dict):
            if obj.get("path") == good:
                obj["path"] = bad
            for v in obj.values():
                redirect(v)
        elif isinstance(obj, list):
            for v in obj:
                redirect(v)

    redirect(body)
    rewrite_metadata(access, ids[-1], body)
    with pytest.raises(UnsafePathError):
        access.verify(ids[-1])
    with pytest.raises(UnsafePathError):  # the schema pass refuses it when the job opens it
        restore_job(url, options, access.checkpoint_path(ids[-1]))
    assert access.latest_valid()[0] == ids[-2]


def test_corrupt_metadata_is_rejected(retained):
    _url, _options, access, ids = retained
    key = f"chk-{ids[-1]}/_metadata"
    raw = bytearray(access.store.get(key))
    raw[20] ^= 0x01
    access.store.put(key, bytes(raw))
    with pytest.raises(ChecksumMismatchError):
        decode_metadata(bytes(raw))
    access.store.put(key, bytes(raw[:-9]))
    with pytest.raises(TruncatedCheckpointError):
        access.load(ids[-1])
    assert access.latest_valid()[0] == ids[-2]


def test_nothing_is_unpickled_without_opt_in(tmp_path, monkeypatch):
    url = str(tmp_path / "ckpt")
    result = run_job(url, {}, func=Count(Types.PICKLED_BYTE_ARRAY()))
    assert finals(result) == dict(MODEL)

    def refuse(*args, **kwargs):
        raise AssertionError("pickle.loads was called")

    monkeypatch.setattr(pickle, "loads", refuse)
    with pytest.raises(JobExecutionError) as info:
        restore_job(url, {}, result.latest_checkpoint, func=Count(Types.LONG()))
    cause = info.value.__cause__
    while cause is not None and not isinstance(cause, PickleNotAllowedError):
        cause = cause.__cause__
    assert isinstance(cause, PickleNotAllowedError)
    assert "count" in str(cause)
