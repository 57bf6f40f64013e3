"""FileSystemCheckpointStorage on S3 through s3fs, against moto's server on 127.0.0.1."""

from __future__ import annotations

import multiprocessing
import pickle
import threading
from collections import Counter

import pytest

from statekit.checkpoint.blobstore import FsspecBlobStore, set_operation_hook
from statekit.checkpoint.config import ExternalizedCheckpointCleanup
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.errors import CheckpointNotFoundError, CheckpointStorageError
from statekit.runtime.environment import StreamExecutionEnvironment
from statekit.runtime.functions import KeyedProcessFunction
from statekit.runtime.restart import RestartStrategies
from statekit.serde.types import Types
from statekit.state.descriptors import ValueStateDescriptor
from statekit.testing.s3 import ACCESS_KEY, SECRET_KEY

ITEMS = [(f"k{i % 7}", i) for i in range(400)]
MODEL = Counter(k for k, _ in ITEMS)


class Count(KeyedProcessFunction):
    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.attempt = ctx.get_attempt_number()

    def process_element(self, value, ctx):
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        if value[1] == self.fail_at and self.attempt == 0:
            raise RuntimeError("injected failure")
        yield ctx.get_current_key(), n


def s3_env(url: str, endpoint: str, **extra: str) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment({
        "state.checkpoints.dir": url, "execution.checkpointing.interval": "10 ms",
        "state.storage.fs.memory-threshold": "0", "s3.endpoint": endpoint,
        "s3.access-key": ACCESS_KEY, "s3.secret-key": SECRET_KEY, **extra,
    })
    env.get_checkpoint_config().enable_externalized_checkpoints(
        ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION)
    return env


def finals(result) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, n in result:
        out[key] = max(out.get(key, 0), n)
    return out


def test_job_checkpoints_restarts_and_resumes_on_s3(s3_server, s3_url):
    env = s3_env(s3_url + "/ckpt", s3_server.endpoint_url)
    env.set_parallelism(3)
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(2, 0))
    data = [(k, i) for k, i in ITEMS]
    slow = env.from_collection(data).map(lambda v: (sum(range(3000)) and v))
    result = slow.key_by(lambda v: v[0]).process(Count(fail_at=300)).execute_and_collect()
    assert result.restarts == 1
    assert len(result) == len(ITEMS)  # exactly once across the restart
    assert finals(result) == dict(MODEL)
    assert result.latest_checkpoint.startswith(s3_url + "/ckpt/")
    completed = [s for s in result.checkpoint_stats if s.status == "completed"]
    assert completed and sum(s.files_written for s in completed) >= 3
    fs = s3_server.filesystem()
    keys = fs.find(s3_url[len("s3://"):])
    assert any(k.endswith("/_metadata") for k in keys)
    # resume from the retained checkpoint in a new job (another parallelism)
    env2 = s3_env(s3_url + "/ckpt", s3_server.endpoint_url,
                  **{"execution.savepoint.path": result.latest_checkpoint})
    env2.set_parallelism(2)
    more = env2.from_collection([*ITEMS, ("k1", 999)]).key_by(lambda v: v[0]).process(Count())
    assert list(more.execute_and_collect()) == [("k1", MODEL["k1"] + 1)]


def test_credentials_and_endpoint_from_aws_environment(s3_server, s3_url):
    # the s3_server fixture exports AWS_ENDPOINT_URL and AWS_ACCESS_KEY_ID/SECRET: no options
    store = FileSystemCheckpointStorage(s3_url + "/env").create_access("job").store
    store.put("chk-1/x", b"abc")
    assert store.get("chk-1/x") == b"abc"


def test_metadata_is_written_last(s3_server, s3_url):
    ops: list[tuple[str, str]] = []
    previous = set_operation_hook(lambda op, path: ops.append((op, path)))
    try:
        env = s3_env(s3_url + "/order", s3_server.endpoint_url)
        env.set_parallelism(2)
        env.from_collection(ITEMS).key_by(lambda v: v[0]).process(Count()).execute_and_collect()
    finally:
        set_operation_hook(previous)
    puts = [path for op, path in ops if op == "put"]
    assert not [op for op, _ in ops if op == "rename"]  # never rename on an object store
    by_chk: dict[str, list[str]] = {}
    for path in puts:
        chk = next(p for p in path.split("/") if p.startswith("chk-"))
        by_chk.setdefault(chk, []).append(path)
    assert by_chk
    for paths in by_chk.values():
        assert paths[-1].endswith("/_metadata") and sum(p.endswith("_metadata") for p in paths) == 1


def test_multipart_upload_is_atomic(s3_server, s3_url):
    opts = s3_server.storage_options()
    store = FsspecBlobStore(s3_url + "/mp", opts, multipart_threshold=5 * 2**20, part_size=5 * 2**20)
    blob = bytes(range(256)) * (11 * 2**20 // 256)  # 11 MiB: 3 parts
    parts = []
    previous = set_operation_hook(
        lambda op, path: parts.append(op) if op.startswith("multipart") else None)
    try:
        store.put("chk-1/big", blob)
    finally:
        set_operation_hook(previous)
    assert parts.count("multipart-part") == 3 and parts[-1] == "multipart-complete"
    assert store.get("chk-1/big") == blob
    assert store.get("chk-1/big", 5 * 2**20 - 3, 6) == blob[5 * 2**20 - 3: 5 * 2**20 + 3]

    def fail_on_third_part(op: str, path: str, seen=[]) -> None:  # noqa: B006
        if op == "multipart-part":
            seen.append(path)
            if len(seen) == 3:
                raise PermissionError("injected permanent failure")

    previous = set_operation_hook(fail_on_third_part)
    try:
        with pytest.raises(CheckpointStorageError):
            store.put("chk-2/big", blob)
    finally:
        set_operation_hook(previous)
    assert not store.exists("chk-2/big")  # a partial upload never becomes visible
    fs = s3_server.filesystem()
    uploads = fs.call_s3("list_multipart_uploads", Bucket=s3_url[len("s3://"):]).get("Uploads", [])
    assert uploads == []  # and was aborted
    with pytest.raises(CheckpointNotFoundError):
        store.get("chk-2/big")


def test_parallel_uploads_from_transfer_threads(s3_server, s3_url):
    store = FsspecBlobStore(s3_url + "/par", s3_server.storage_options())
    errors: list[BaseException] = []

    def upload(n: int) -> None:
        try:
            for j in range(5):
                store.put(f"chk-1/t{n}-{j}", bytes([n, j]) * 1000)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=upload, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store.list("chk-1/")) == 40
    assert store.get("chk-1/t7-4") == bytes([7, 4]) * 1000


def _child_put(store: FsspecBlobStore, queue) -> None:
    try:
        store.put("chk-9/from-child", b"child")
        queue.put(store.get("chk-9/from-child"))
    except BaseException as exc:  # pragma: no cover - reported to the parent
        queue.put(repr(exc))


def test_store_survives_fork_and_pickle(s3_server, s3_url):
    store = FsspecBlobStore(s3_url + "/fork", s3_server.storage_options())
    store.put("chk-1/parent", b"parent")  # the parent's file system (and its event loop) exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_put, args=(store, queue))
    child.start()
    answer = queue.get(timeout=60)
    child.join(60)
    assert answer == b"child"
    assert store.get("chk-9/from-child") == b"child"
    clone = pickle.loads(pickle.dumps(store))
    assert clone.get("chk-1/parent") == b"parent"
