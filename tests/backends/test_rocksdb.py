"""RocksDB-specific behaviour: layout, options profiles, incremental checkpoints, process safety."""

import glob
import os
import subprocess
import sys
import time

import pytest
from rocksdict import Options

from statekit.backends.heap import HashMapStateBackend
from statekit.backends.kvformat import KV_FORMAT
from statekit.backends.legacy import FsStateBackend
from statekit.backends.rocksdb import (
    ROCKSDB_FORMAT,
    EmbeddedRocksDBStateBackend,
    PredefinedOptions,
    RocksDBStateBackend,
    open_db,
)
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.jobmanager import JobManagerCheckpointStorage
from statekit.errors import BackendLockedError, ConfigError, StateError
from statekit.registry import backend_registry
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import Types, serializer_for
from statekit.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    Time,
    ValueStateDescriptor,
)
from statekit.testing.cluster import KeyedCluster
from tests.tmpfs import rocksdb_dir

# tmpfs where available: the databases fsync on every open, which dominates test time on slow
# disks; the checkpoint storage still goes to tmp_path
SHM = rocksdb_dir()
KEY = serializer_for(Types.STRING())
ALL = KeyGroupRange(0, 127)
VALUE = ValueStateDescriptor("v", Types.LONG())
LIST = ListStateDescriptor("l", Types.STRING())
MAP = MapStateDescriptor("m", Types.STRING(), Types.LONG())


def rocks(incremental=None):
    backend = EmbeddedRocksDBStateBackend(incremental)
    if SHM:
        backend.set_db_storage_paths(SHM)
    return backend


def keyed(backend=None, rng=ALL, clock=None):
    backend = backend or rocks()
    return backend.create_keyed_state_backend(key_serializer=KEY, key_group_range=rng,
                                              max_parallelism=128, clock=clock)


def storage_access(tmp_path, kind="filesystem"):
    if kind == "jobmanager":
        return JobManagerCheckpointStorage().create_access(f"job-{time.monotonic_ns()}")
    return FileSystemCheckpointStorage(str(tmp_path / "chk")).create_access("job")


def checkpoint(kb, access, cid, savepoint=False):
    streams = access.streams(cid, "t0")
    handle = kb.snapshot(cid, streams, savepoint=savepoint).run()
    if not savepoint:
        access.commit(cid, {"tasks": {"t0": handle}})
        kb.notify_checkpoint_complete(cid)
    return handle, streams


def options_text(kb):
    files = sorted(glob.glob(str(kb.db_path / "OPTIONS-*")))
    assert files, "no OPTIONS file"
    return open(files[-1]).read()


# --- layout and state semantics ---------------------------------------------------------------------


def test_registry_and_facade(tmp_path):
    assert backend_registry.resolve("rocksdb") is EmbeddedRocksDBStateBackend
    facade = RocksDBStateBackend(str(tmp_path / "cp"), enable_incremental_checkpointing=True)
    assert isinstance(facade.get_checkpoint_backend(), FsStateBackend)
    storage = facade.default_checkpoint_storage()
    assert isinstance(storage, FileSystemCheckpointStorage)
    assert storage.get_checkpoint_path() == str(tmp_path / "cp")
    assert facade.is_incremental_checkpoints_enabled()
    custom = RocksDBStateBackend(checkpoint_stream_backend=FsStateBackend(str(tmp_path / "x")))
    assert custom.get_checkpoint_backend().get_checkpoint_path() == str(tmp_path / "x")
    with pytest.raises(ConfigError):
        RocksDBStateBackend()


def test_keys_are_key_group_prefixed_and_lists_append(tmp_path):
    kb = keyed()
    try:
        v, lst, m = (kb.get_partitioned_state(d) for d in (VALUE, LIST, MAP))
        kb.set_current_key("a")
        v.update(5)
        lst.add("x")
        lst.add_all(["y", "z"])
        m.put_all({"p": 1, "q": None})
        kg = kb.key_group_of("a")
        prefix = kg.to_bytes(2, "big") + KEY.serialize("a")
        assert list(kb.cfs["v"].keys()) == [prefix]
        # one entry per element, in sequence order: appends never rewrite the list
        assert list(kb.cfs["l"].keys()) == [prefix + i.to_bytes(8, "big") for i in range(3)]
        assert lst.get() == ["x", "y", "z"]
        assert dict(m.items()) == {"p": 1, "q": None} and m.contains("q") and m.get("q") is None
        lst.update(["only"])
        assert lst.get() == ["only"]
        m.remove("p")
        assert m.keys() == ["q"]
        kb.set_current_key("b")
        assert v.value() is None and lst.get() == [] and m.is_empty()
        with pytest.raises(StateError):
            lst.add(None)
        kb.set_current_key("a")
        lst.clear()
        m.clear()
        assert lst.get() == [] and m.is_empty()
    finally:
        kb.dispose()
    assert not kb.instance_dir.exists()


def test_savepoint_is_backend_neutral_both_ways(tmp_path):
    access = storage_access(tmp_path)
    kb = keyed()
    heap = HashMapStateBackend().create_keyed_state_backend(
        key_serializer=KEY, key_group_range=ALL, max_parallelism=128)
    back = keyed()
    try:
        states = [kb.get_partitioned_state(d) for d in (VALUE, LIST, MAP)]
        for i in range(50):
            kb.set_current_key(f"k{i}")
            states[0].update(i)
            states[1].add_all([str(i)] * (i % 20))
            states[2].put_all({f"u{j}": j for j in range(i % 17)})
        savepoint, _ = checkpoint(kb, access, 1, savepoint=True)
        assert savepoint["format"] == KV_FORMAT
        heap.restore([savepoint], access.reader())
        hs = [heap.get_partitioned_state(d) for d in (VALUE, LIST, MAP)]
        for i in range(50):
            heap.set_current_key(f"k{i}")
            assert hs[0].value() == i
            assert hs[1].get() == [str(i)] * (i % 20)
            assert dict(hs[2].items()) == {f"u{j}": j for j in range(i % 17)}
        heap_handle = heap.snapshot(2, access.streams(2, "h")).run()
        back.restore([heap_handle], access.reader())
        bs = [back.get_partitioned_state(d) for d in (VALUE, LIST, MAP)]
        for i in range(50):
            back.set_current_key(f"k{i}")
            assert bs[0].value() == i
            assert bs[1].get() == [str(i)] * (i % 20)
            assert dict(bs[2].items()) == {f"u{j}": j for j in range(i % 17)}
    finally:
        kb.dispose()
        back.dispose()
        heap.dispose()


def test_restored_states_carry_over_until_registered(tmp_path):
    access = storage_access(tmp_path)
    kb = keyed(rocks(True))
    kb.get_partitioned_state(VALUE)
    kb.set_current_key("a")
    kb.get_partitioned_state(VALUE).update(1)
    h1, _ = checkpoint(kb, access, 1)
    kb.dispose()
    kb2 = keyed(rocks(True))
    kb2.restore([h1], access.reader())
    h2, _ = checkpoint(kb2, access, 2)  # "v" never registered here, but must survive
    kb2.dispose()
    kb3 = keyed()
    kb3.restore([h2], access.reader())
    kb3.set_current_key("a")
    assert kb3.get_partitioned_state(VALUE).value() == 1
    kb3.dispose()


# --- incremental checkpoints ---------------------------------------------------------------------------


def test_incremental_uploads_under_ten_percent_after_one_percent_change(tmp_path):
    access = storage_access(tmp_path)
    backend = rocks(True)
    kb = keyed(backend)
    try:
        v = kb.get_partitioned_state(ValueStateDescriptor("v", Types.STRING()))
        payload = "x" * 40
        for i in range(100_000):
            kb.set_current_key(f"key-{i}")
            v.update(f"{payload}{i}")
        full, full_streams = checkpoint(kb, access, 1)
        full_bytes = full_streams.bytes_written
        for i in range(0, 100_000, 100):  # 1% of the keys change
            kb.set_current_key(f"key-{i}")
            v.update(f"changed-{i}")
        incremental, inc_streams = checkpoint(kb, access, 2)
        assert incremental["format"] == ROCKSDB_FORMAT and incremental["incremental"]
        assert incremental["reused_sst"] >= 1
        total = sum(h["size"] for h in [*incremental["sst"].values(),
                                         *incremental["misc"].values()])
        assert inc_streams.bytes_written <= 0.10 * full_bytes, (inc_streams.bytes_written,
                                                                 full_bytes)
        assert inc_streams.bytes_written <= 0.10 * total
        # reused SSTs are referenced by the same shared files, with size and checksum
        for name, handle in incremental["sst"].items():
            if name in full["sst"]:
                assert handle == full["sst"][name]
                assert handle["path"].startswith("shared/") and "crc" in handle
        kb.dispose()
        restored = keyed(backend)
        restored.restore([incremental], access.reader())
        rv = restored.get_partitioned_state(ValueStateDescriptor("v", Types.STRING()))
        for i in (0, 1, 100, 99_999, 50_000):
            restored.set_current_key(f"key-{i}")
            assert rv.value() == (f"changed-{i}" if i % 100 == 0 else f"{payload}{i}")
        restored.dispose()
    finally:
        kb.dispose()


def test_full_mode_uploads_everything_exclusively(tmp_path):
    access = storage_access(tmp_path)
    kb = keyed(rocks(False))
    try:
        v = kb.get_partitioned_state(VALUE)
        for i in range(2000):
            kb.set_current_key(f"k{i}")
            v.update(i)
        checkpoint(kb, access, 1)
        kb.set_current_key("k1")
        v.update(-1)
        h2, _ = checkpoint(kb, access, 2)
        assert not h2["incremental"] and h2["reused_sst"] == 0
        for handle in h2["sst"].values():
            assert handle["type"] == "inline" or handle["path"].startswith("chk-2/")
    finally:
        kb.dispose()


def test_discarding_retained_checkpoints_keeps_referenced_shared_files(tmp_path):
    access = storage_access(tmp_path)
    backend = rocks(True)
    kb = keyed(backend)
    retained: list[int] = []
    expected: dict[int, dict[str, int]] = {}
    model: dict[str, int] = {}
    try:
        v = kb.get_partitioned_state(VALUE)
        for cid in range(1, 9):
            for i in range(cid * 300, cid * 300 + 600):
                kb.set_current_key(f"k{i % 1500}")
                v.update(i)
                model[f"k{i % 1500}"] = i
            if cid % 3 == 0:  # compaction replaces SSTs: old shared files become unreferenced
                kb.ensure_open()
                for cf in kb.cfs.values():
                    cf.compact_range(None, None)
            checkpoint(kb, access, cid)
            expected[cid] = dict(model)
            retained.append(cid)
            while len(retained) > 2:
                access.discard(retained.pop(0), retained)
            # every file a retained checkpoint references still exists
            for keep in retained:
                for path in _paths(access.load(keep)):
                    assert access.store.exists(path), (keep, path)
        shared = [p for p in access.store.list("shared/")]
        referenced = set().union(*(_paths(access.load(c)) for c in retained))
        assert set(shared) <= referenced  # unreferenced shared files were swept
        for keep in retained:
            restored = keyed(backend)
            restored.restore([access.load(keep)["tasks"]["t0"]], access.reader())
            rv = restored.get_partitioned_state(VALUE)
            for key, value in expected[keep].items():
                restored.set_current_key(key)
                assert rv.value() == value
            restored.dispose()
    finally:
        kb.dispose()


def _paths(body):
    from statekit.checkpoint.handles import file_paths

    return file_paths(body)


@pytest.mark.parametrize("kind", ["jobmanager", "filesystem"])
@pytest.mark.parametrize("incremental", [False, True])
def test_rescale_4_2_3_with_many_files(tmp_path, kind, incremental):
    storage = (JobManagerCheckpointStorage() if kind == "jobmanager"
               else FileSystemCheckpointStorage(str(tmp_path / "c"), file_state_size_threshold=64))
    backend = rocks(incremental)
    backend.set_number_of_transfering_threads(3)
    cluster = KeyedCluster(backend, storage, parallelism=4)
    try:
        expected = {}
        for i in range(400):
            key = f"key-{i}"
            cluster.state(key, VALUE).update(i)
            cluster.state(key, LIST).add_all([str(i), "z"])
            cluster.state(key, MAP).put("m", i)
            expected[key] = (i, [str(i), "z"], {"m": i})
        for parallelism in (2, 3, 1, 4):
            cluster.checkpoint()
            cluster.restore(parallelism=parallelism)
            got = {k: (cluster.state(k, VALUE).value(), cluster.state(k, LIST).get(),
                       dict(cluster.state(k, MAP).items())) for k in expected}
            assert got == expected
            for backend_part in cluster.partitions:  # foreign key groups were deleted
                rng = backend_part.key_group_range
                for key in backend_part.cfs["v"].keys():  # noqa: SIM118 - an Rdict
                    assert int.from_bytes(key[:2], "big") in rng
    finally:
        cluster.close()


# --- TTL --------------------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 1_000_000

    def __call__(self):
        return self.now


def test_ttl_compaction_filter_sweep_and_savepoint_cleanup(tmp_path):
    clock = Clock()
    access = storage_access(tmp_path)
    kb = keyed(clock=clock)
    try:
        d = ValueStateDescriptor("ttl", Types.LONG())
        d.enable_time_to_live(StateTtlConfig.new_builder(Time.seconds(10))
                              .cleanup_in_rocksdb_compact_filter(1000).build())
        state = kb.get_partitioned_state(d)
        for i in range(10):
            kb.set_current_key(f"k{i}")
            state.update(i)
        clock.now += 20_000
        checkpoint(kb, access, 1)  # the bounded sweep deletes expired entries from the live db
        assert list(kb.cfs["ttl"].keys()) == []
    finally:
        kb.dispose()


def test_ttl_compaction_filter_budget_and_periodic_pass(tmp_path):
    """Each checkpoint looks at ``query_time_after_num_entries`` entries; a pass that started
    ``periodic_compaction_time`` ago is finished at once, so every entry is seen in that time."""
    clock = Clock()
    access = storage_access(tmp_path)
    kb = keyed(clock=clock)
    try:
        d = ValueStateDescriptor("ttl", Types.LONG())
        d.enable_time_to_live(StateTtlConfig.new_builder(Time.seconds(10))
                              .cleanup_in_rocksdb_compact_filter(4, Time.minutes(1)).build())
        state = kb.get_partitioned_state(d)
        for i in range(20):
            kb.set_current_key(f"k{i:02d}")
            state.update(i)
        clock.now += 20_000  # all expired
        checkpoint(kb, access, 1)
        assert len(list(kb.cfs["ttl"].keys())) == 16  # the first 4 looked at and dropped
        checkpoint(kb, access, 2)
        assert len(list(kb.cfs["ttl"].keys())) == 12
        clock.now += 60_000  # the pass started a minute ago: it is finished now
        checkpoint(kb, access, 3)
        assert list(kb.cfs["ttl"].keys()) == []
    finally:
        kb.dispose()


def test_ttl_filter_disabled_keeps_entries(tmp_path):
    clock = Clock()
    backend = rocks()
    backend.disable_ttl_compaction_filter()
    kb = keyed(backend, clock=clock)
    try:
        d = ValueStateDescriptor("ttl", Types.LONG())
        d.enable_time_to_live(StateTtlConfig.new_builder(Time.seconds(10)).build())
        kb.set_current_key("a")
        kb.get_partitioned_state(d).update(1)
        clock.now += 20_000
        checkpoint(kb, storage_access(tmp_path), 1)
        assert len(list(kb.cfs["ttl"].keys())) == 1
    finally:
        kb.dispose()


# --- options ------------------------------------------------------------------------------------------


def _open_with(profile, factory=None, managed=True):
    backend = rocks()
    backend.set_memory_configuration(managed=managed)
    backend.set_predefined_options(profile)
    if factory is not None:
        backend.set_options(factory)
    kb = keyed(backend)
    kb.get_partitioned_state(VALUE)  # opens the database and creates a column family
    return kb


def _cf_sections(text):
    return text.count("[CFOptions")


def test_predefined_default():
    kb = _open_with(PredefinedOptions.DEFAULT)
    try:
        text = options_text(kb)
        assert "use_fsync=false" in text
        assert "max_background_jobs=2" in text  # RocksDB's own default, not a profile's 4
        assert text.count("\n  block_size=4096") == 2
        assert _cf_sections(text) == 2
    finally:
        kb.dispose()


def test_predefined_spinning_disk():
    kb = _open_with(PredefinedOptions.SPINNING_DISK_OPTIMIZED)
    try:
        text = options_text(kb)
        for line in ("max_background_jobs=4", "max_open_files=-1", "use_fsync=false"):
            assert line in text
        # every column family (default and the state's) has the profile
        assert text.count("compaction_style=kCompactionStyleLevel") == 2
        assert text.count("level_compaction_dynamic_level_bytes=true") == 2
    finally:
        kb.dispose()


@pytest.mark.parametrize("managed", [False, True])
def test_predefined_spinning_disk_high_mem(managed):
    """The profile's settings; its 256 MB block cache unless managed memory replaces it by the
    process's budget (Flink's precedence), keeping the profile's other table settings."""
    from statekit.backends.rocksdb.memory import DEFAULT_MANAGED_BYTES

    kb = _open_with(PredefinedOptions.SPINNING_DISK_OPTIMIZED_HIGH_MEM, managed=managed)
    try:
        text = options_text(kb)
        for line in ("max_background_jobs=4", "max_open_files=-1", "use_fsync=false"):
            assert line in text
        for line in ("target_file_size_base=268435456", "max_bytes_for_level_base=1073741824",
                     "write_buffer_size=67108864", "max_write_buffer_number=4",
                     "min_write_buffer_number_to_merge=3", "block_size=131072",
                     "filter_policy=bloomfilter", "level_compaction_dynamic_level_bytes=true",
                     "compaction_style=kCompactionStyleLevel"):
            assert text.count(line) == 2, line
        capacity = kb.db.property_int_value("rocksdb.block-cache-capacity")
        if managed:  # the shared cache: the budget less the write buffers' share
            assert capacity == pytest.approx(DEFAULT_MANAGED_BYTES * 2.5 / 3, rel=0.01)
            assert text.count("cache_index_and_filter_blocks=true") == 2
        else:
            assert capacity == pytest.approx(256 * 1024 * 1024, rel=0.01)
    finally:
        kb.dispose()


def test_predefined_flash_ssd():
    kb = _open_with(PredefinedOptions.FLASH_SSD_OPTIMIZED)
    try:
        text = options_text(kb)
        for line in ("max_background_jobs=4", "max_open_files=-1", "use_fsync=false"):
            assert line in text
    finally:
        kb.dispose()


def small_write_buffer(options: Options) -> None:
    """An options factory used by name from the tests."""
    options.set_write_buffer_size(3 * 1024 * 1024)


def test_options_factory_callable_and_dotted_name_on_every_open(tmp_path):
    for factory in (small_write_buffer, f"{__name__}:small_write_buffer"):
        kb = _open_with(PredefinedOptions.FLASH_SSD_OPTIMIZED, factory)
        try:
            text = options_text(kb)
            assert text.count("write_buffer_size=3145728") == 2
            assert "max_open_files=-1" in text
            # restored databases are reopened with the same options
            access = storage_access(tmp_path / str(id(factory)))
            handle, _ = checkpoint(kb, access, 1)
            backend = rocks()
            backend.set_options(factory)
            again = keyed(backend)
            again.restore([handle], access.reader())
            assert options_text(again).count("write_buffer_size=3145728") == 2
            again.dispose()
        finally:
            kb.dispose()
    with pytest.raises(ConfigError):
        rocks().set_options("no.such.module:factory")


def test_getters_setters_and_configure(tmp_path):
    b = EmbeddedRocksDBStateBackend()
    assert not b.is_incremental_checkpoints_enabled()
    assert b.get_predefined_options() is PredefinedOptions.DEFAULT
    assert b.get_number_of_transfering_threads() == 1
    assert b.is_ttl_compaction_filter_enabled()
    assert b.get_db_storage_paths() is None and b.get_options() is None
    b.set_db_storage_paths(str(tmp_path / "a"), "file://" + str(tmp_path / "b"))
    assert b.get_db_storage_paths() == [str(tmp_path / "a"), str(tmp_path / "b")]
    b.set_number_of_transfering_threads(4)
    assert b.get_number_of_transfering_threads() == 4
    b.disable_ttl_compaction_filter()
    assert not b.is_ttl_compaction_filter_enabled()
    b.enable_ttl_compaction_filter()
    assert b.is_ttl_compaction_filter_enabled()
    dirs = set()
    for _ in range(12):
        kb = keyed(b)
        kb.get_partitioned_state(VALUE)
        dirs.add(str(kb.instance_dir.parent))
        kb.dispose()
    assert dirs == {str(tmp_path / "a"), str(tmp_path / "b")}  # spread across the paths
    b.set_db_storage_paths(None)
    assert b.get_db_storage_paths() is None

    c = EmbeddedRocksDBStateBackend().configure({
        "execution.checkpointing.incremental": "true",
        "state.backend.rocksdb.localdir": f"{tmp_path / 'x'},{tmp_path / 'y'}",
        "state.backend.rocksdb.predefined-options": "spinning_disk_optimized_high_mem",
        "state.backend.rocksdb.options-factory": f"{__name__}:small_write_buffer",
        "state.backend.rocksdb.checkpoint.transfer.thread.num": "3",
        "state.backend.rocksdb.ttl.compaction.filter.enabled": "false",
    })
    assert c.is_incremental_checkpoints_enabled()
    assert c.get_db_storage_paths() == [str(tmp_path / "x"), str(tmp_path / "y")]
    assert c.get_predefined_options() is PredefinedOptions.SPINNING_DISK_OPTIMIZED_HIGH_MEM
    assert c.get_number_of_transfering_threads() == 3
    assert not c.is_ttl_compaction_filter_enabled()
    assert EmbeddedRocksDBStateBackend().configure(
        {"state.backend.incremental": True, "state.backend.rocksdb.predefined-options": 3}
    ).get_predefined_options() is PredefinedOptions.FLASH_SSD_OPTIMIZED
    # settings made in code win over configuration, as in Flink
    assert not EmbeddedRocksDBStateBackend(False).configure(
        {"execution.checkpointing.incremental": "true"}).is_incremental_checkpoints_enabled()
    for key, bad in [("execution.checkpointing.incremental", "maybe"),
                     ("state.backend.rocksdb.predefined-options", "FAST"),
                     ("state.backend.rocksdb.checkpoint.transfer.thread.num", "0"),
                     ("state.backend.rocksdb.checkpoint.transfer.thread.num", "two"),
                     ("state.backend.rocksdb.ttl.compaction.filter.enabled", "2"),
                     ("state.backend.rocksdb.localdir", "s3://bucket/dir"),
                     ("state.backend.rocksdb.options-factory", "nope.nope:f")]:
        with pytest.raises(ConfigError) as err:
            EmbeddedRocksDBStateBackend().configure({key: bad})
        assert err.value.key == key


# --- process safety -------------------------------------------------------------------------------


_OPEN_IN_CHILD = """
import sys
from statekit.backends.rocksdb import open_db
from statekit.backends.rocksdb.options import build_options
from statekit.errors import BackendLockedError
try:
    db = open_db(sys.argv[1], build_options)
except BackendLockedError as exc:
    print("LOCKED", exc)
else:
    print("OPENED", sorted(db.get_column_family("v").keys()) != [])
    db.close()
"""


def _open_in_child(path):
    out = subprocess.run([sys.executable, "-c", _OPEN_IN_CHILD, str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_second_process_gets_a_clear_error_and_close_releases_the_lock():
    kb = keyed()
    try:
        kb.set_current_key("a")
        kb.get_partitioned_state(VALUE).update(1)
        assert _open_in_child(kb.db_path).startswith("LOCKED")
        with pytest.raises(BackendLockedError):  # a second handle in this process, too
            from statekit.backends.rocksdb.options import build_options

            open_db(kb.db_path, build_options)
        kb.close()
        assert _open_in_child(kb.db_path).startswith("OPENED True")
    finally:
        kb.dispose()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_database_inherited_through_fork_is_refused_in_the_child():
    kb = keyed()
    try:
        state = kb.get_partitioned_state(VALUE)
        kb.set_current_key("a")
        state.update(1)
        pid = os.fork()
        if pid == 0:  # child: any use must fail clearly, and disposal must not delete files
            code = 3
            try:
                state.value()
            except BackendLockedError:
                code = 0
            except BaseException:
                code = 4
            kb.dispose()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert state.value() == 1  # the parent's database is intact
        assert kb.db_path.exists()
    finally:
        kb.dispose()


def test_use_after_dispose_is_a_state_error():
    kb = keyed()
    state = kb.get_partitioned_state(VALUE)
    kb.set_current_key("a")
    kb.dispose()
    with pytest.raises(StateError):
        state.value()


def test_savepoint_drops_expired_ttl_entries(tmp_path):
    clock = Clock()
    access = storage_access(tmp_path)
    kb = keyed(clock=clock)
    heap = HashMapStateBackend().create_keyed_state_backend(
        key_serializer=KEY, key_group_range=ALL, max_parallelism=128, clock=clock)
    ttl = StateTtlConfig.new_builder(Time.seconds(10)).cleanup_full_snapshot().build()
    descriptors = []
    for d in (ValueStateDescriptor("tv", Types.LONG()), ListStateDescriptor("tl", Types.LONG()),
              MapStateDescriptor("tm", Types.STRING(), Types.LONG())):
        d.enable_time_to_live(ttl)
        descriptors.append(d)
    try:
        v, lst, m = (kb.get_partitioned_state(d) for d in descriptors)
        for key in ("old", "mixed"):
            kb.set_current_key(key)
            v.update(1)
            lst.add_all([1, 2])
            m.put_all({"a": 1, "b": 2})
        clock.now += 6_000
        kb.set_current_key("mixed")
        v.update(2)
        lst.add(3)
        m.put("c", 3)
        clock.now += 6_000  # the first writes are now expired, the second ones are not
        savepoint, _ = checkpoint(kb, access, 1, savepoint=True)
        clock.now -= 12_000  # nothing would be expired on read: only the snapshot dropped them
        heap.restore([savepoint], access.reader())
        hv, hl, hm = (heap.get_partitioned_state(d) for d in descriptors)
        heap.set_current_key("old")
        assert hv.value() is None and hl.get() == [] and hm.is_empty()
        heap.set_current_key("mixed")
        assert hv.value() == 2 and hl.get() == [3] and dict(hm.items()) == {"c": 3}
    finally:
        kb.dispose()
        heap.dispose()
