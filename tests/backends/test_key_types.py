"""Key types: recorded in every snapshot format, checked at restore (a StateTypeError naming both
types, before anything loads; compatible types restore unchanged) and enforced at access, on both
backends, through the cross-backend transfer, Spark-style partition stores, the local runner and
inspection.  (The Flink ports, testRestoreWithWrongKeySerializer and testKeySerializerUpgrade,
are in the conformance suite.)"""

from __future__ import annotations

import pytest

from statekit import (
    EmbeddedRocksDBStateBackend,
    HashMapStateBackend,
    KeyedProcessFunction,
    StreamExecutionEnvironment,
    Types,
    ValueStateDescriptor,
)
from statekit.backends.bulk import BulkState
from statekit.backends.transfer import restore_into
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.errors import CorruptCheckpointError, JobExecutionError, StateTypeError
from statekit.inspection import convert_savepoint, open_checkpoint
from statekit.runtime.partition import PartitionStore, drop_local_state, new_attempt_token
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import GenericSerializer
from statekit.testing.cluster import KeyedCluster
from tests.tmpfs import rocksdb_dir

SHM = rocksdb_dir()
KINDS = ["hashmap", "hashmap-incremental", "rocksdb", "rocksdb-incremental"]
V = ValueStateDescriptor("v", Types.STRING())

INT, LONG, DOUBLE, STRING = Types.INT(), Types.LONG(), Types.DOUBLE(), Types.STRING()
PAIR = Types.TUPLE([Types.INT(), Types.STRING()])
GENERIC = Types.GENERIC()
#: keys of each recorded type, and declared types that must refuse them
SAMPLES = {
    "INT": (INT, [1, 2, -7, 1 << 20], [DOUBLE, STRING, Types.SHORT(), Types.BOOLEAN(), PAIR]),
    "LONG": (LONG, [1, 1 << 40], [INT, DOUBLE, STRING]),
    "DOUBLE": (DOUBLE, [1.5, -2.25], [INT, LONG, Types.FLOAT(), STRING]),
    "STRING": (STRING, ["1", "a"], [INT, Types.CHAR(), Types.PRIMITIVE_ARRAY(Types.BYTE())]),
    "TUPLE<INT, STRING>": (PAIR, [(1, "a"), (2, "b")], [GENERIC, INT, Types.TUPLE([INT])]),
    "GENERIC": (GENERIC, ["a", 1, (1, "x")], [PAIR]),
}


def factory(kind: str):
    if kind.startswith("hashmap"):
        return HashMapStateBackend(incremental=kind.endswith("incremental"))
    backend = EmbeddedRocksDBStateBackend(kind.endswith("incremental"))
    if SHM:
        backend.set_db_storage_paths(SHM)
    return backend


@pytest.fixture
def storage(tmp_path):
    return FileSystemCheckpointStorage(str(tmp_path / "ck"), file_state_size_threshold=64)


def written(kind, storage, key_type, keys, later=(), parallelism=2):
    """A cluster of two partitions holding ``keys`` (then ``later`` ones, in a second checkpoint:
    an incremental one's changelog or new SSTs) under ``key_type``."""
    cluster = KeyedCluster(factory(kind), storage, parallelism,
                           key_serializer=key_type.get_serializer())
    for key in keys:
        cluster.state(key, V).update(repr(key))
    cluster.checkpoint()
    for key in later:
        cluster.state(key, V).update(repr(key))
    if later:
        cluster.checkpoint()
    return cluster


def values(cluster, keys):
    return [cluster.state(key, V).value() for key in keys]


def recorded_key_types(cluster, checkpoint_id=None):
    cid = checkpoint_id or cluster.completed[-1]
    return {repr(h.get("key_type")) for h in cluster.access.load(cid)["tasks"].values()}


# --- restore -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("recorded", list(SAMPLES))
def test_incompatible_key_types_are_refused_naming_both(kind, recorded, storage):
    key_type, keys, refused = SAMPLES[recorded]
    cluster = written(kind, storage, key_type, keys[:1], later=keys[1:])
    try:
        for declared in refused:
            name = repr(declared).removeprefix("Types.").removesuffix("()")
            with pytest.raises(StateTypeError) as caught:
                cluster.restore(key_serializer=declared.get_serializer(), parallelism=3)
            assert f"keys are {recorded}," in str(caught.value), name
            assert "key type is " in str(caught.value) and cluster.partitions == []
        cluster.restore(key_serializer=key_type.get_serializer(), parallelism=3)
        assert values(cluster, keys) == [repr(k) for k in keys]
    finally:
        cluster.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("recorded", "keys", "declared"), [
    (INT, [1, -(1 << 31), (1 << 31) - 1], LONG),
    (INT, [1, 2], Types.BIG_INT()),
    (Types.BYTE(), [1, -128], Types.SHORT()),
    (INT, [1, 2], GENERIC),
    (STRING, ["a", "b"], GENERIC),
    (DOUBLE, [1.5, 2.0], GENERIC),
    (Types.CHAR(), ["a", "b"], STRING),
    (Types.FLOAT(), [1.5, 2.5], DOUBLE),
    (Types.TUPLE([INT, STRING]), [(1, "a")], Types.TUPLE([LONG, STRING])),
], ids=lambda v: repr(v) if not isinstance(v, list) else "keys")
def test_compatible_key_types_restore_unchanged_and_are_recorded_anew(kind, recorded, keys,
                                                                       declared, storage):
    cluster = written(kind, storage, recorded, keys[:1], later=keys[1:])
    try:
        cluster.restore(key_serializer=declared.get_serializer(), parallelism=3)
        assert values(cluster, keys) == [repr(k) for k in keys]
        cluster.checkpoint()
        assert recorded_key_types(cluster) == {repr(declared.get_serializer().config())}
    finally:
        cluster.close()


@pytest.mark.parametrize("kind", KINDS)
def test_generic_keys_restore_under_a_declared_type_only_when_every_key_fits(kind, storage):
    """Generic keys (Spark's) restore into a scalar key type with each key checked: in a heap
    checkpoint's parts or changelog, a native RocksDB checkpoint, a savepoint."""
    cluster = written(kind, storage, GENERIC, ["a", "b"], later=["c"])
    try:
        cluster.state(7, V).update("7")  # a key no STRING holds, in the newest changes only
        cluster.checkpoint()
        with pytest.raises(StateTypeError, match=r"keys are GENERIC.*key 7 is not of the "
                                                 r"declared key type STRING"):
            cluster.restore(key_serializer=STRING.get_serializer(), parallelism=3)
        cluster.restore(2, key_serializer=STRING.get_serializer(), parallelism=3)
        assert values(cluster, ["a", "b", "c"]) == ["'a'", "'b'", "'c'"]
        cluster.restore(3, key_serializer=GenericSerializer())
        savepoint = _savepoint(cluster)
        assert {h["key_type"] for h in savepoint} == {"generic"}
        target = factory(kind).create_keyed_state_backend(
            key_serializer=STRING.get_serializer(), key_group_range=KeyGroupRange.all(128),
            max_parallelism=128)
        try:
            with pytest.raises(StateTypeError, match="key 7 is not of the declared key type"):
                target.restore(savepoint, cluster.access.reader())
        finally:
            target.dispose()
    finally:
        cluster.close()


def _savepoint(cluster):
    """Every partition's savepoint handle (the backend-neutral, key-grouped format)."""
    cid = cluster.next_checkpoint
    cluster.next_checkpoint += 1
    return [b.snapshot(cid, cluster.access.streams(cid, f"s{i}"), savepoint=True).run()
            for i, b in enumerate(cluster.partitions)]


@pytest.mark.parametrize("kind", KINDS)
def test_older_snapshots_without_a_key_type_restore_as_before(kind, storage):
    cluster = written(kind, storage, INT, [1, 2], later=[3])
    handles = [dict(h) for h in cluster.access.load(cluster.completed[-1])["tasks"].values()]
    for handle in handles:
        del handle["key_type"]
    try:
        for declared in (INT, STRING):  # unchecked, as before key types were recorded
            target = factory(kind).create_keyed_state_backend(
                key_serializer=declared.get_serializer(), key_group_range=KeyGroupRange.all(128),
                max_parallelism=128)
            try:
                target.restore(handles, cluster.access.reader())
                if declared is INT:
                    target.set_current_key(3)
                    assert target.get_partitioned_state(V).value() == "3"
            finally:
                target.dispose()
    finally:
        cluster.close()


@pytest.mark.parametrize("kind", KINDS)
def test_every_handle_format_records_its_key_type(kind, storage):
    cluster = written(kind, storage, INT, [1, 2], later=[3])
    try:
        formats = {h["format"] for h in cluster.access.load(2)["tasks"].values()}
        assert formats == {"statekit-heap-changelog/1" if kind == "hashmap-incremental" else
                           "statekit-rocksdb/1" if kind.startswith("rocksdb") else
                           "statekit-kv/2"}
        assert recorded_key_types(cluster, 1) == recorded_key_types(cluster, 2) == {"'INT'"}
        assert {h["key_type"] for h in _savepoint(cluster)} == {"INT"}
    finally:
        cluster.close()
    generic = written(kind, storage, GENERIC, ["a"])
    try:
        assert recorded_key_types(generic) == {"'generic'"}
    finally:
        generic.close()


@pytest.mark.parametrize("kind", ["hashmap", "rocksdb"])
def test_a_key_type_no_serializer_has_is_a_corrupt_checkpoint(kind, storage):
    cluster = written(kind, storage, INT, [1, 2])
    try:
        metadata = cluster.access.load(1)
        for cid, forged in enumerate(("NO_SUCH_TYPE", ["tuple", "x"], 7, {"a": 1}), 10):
            for handle in metadata["tasks"].values():
                handle["key_type"] = forged
            with pytest.raises(CorruptCheckpointError, match="key type"):
                cluster.partitions[0].restore_key_check(next(iter(metadata["tasks"].values())))
            cluster.access.commit(cid, metadata | {"checkpoint_id": cid})  # the schema pass too
            with pytest.raises(CorruptCheckpointError, match="key_type"):
                cluster.access.load(cid)
    finally:
        cluster.close()


# --- the cross-backend transfer and Spark's generic partition stores ---------------------------


@pytest.mark.parametrize(("source", "target"), [("rocksdb", "hashmap"), ("hashmap", "rocksdb"),
                                                ("rocksdb-incremental", "hashmap")])
def test_transfer_between_backends_checks_the_key_type(source, target, storage):
    cluster = written(source, storage, INT, [1, 2], later=[3])
    handles = list(cluster.access.load(cluster.completed[-1])["tasks"].values())
    try:
        for declared, ok in ((STRING, False), (LONG, True), (GENERIC, True)):
            backend = factory(target).create_keyed_state_backend(
                key_serializer=declared.get_serializer(), key_group_range=KeyGroupRange.all(128),
                max_parallelism=128)
            try:
                sources = [(h, cluster.access.reader()) for h in handles]
                if not ok:
                    with pytest.raises(StateTypeError, match=r"keys are INT.*key type is STRING"):
                        restore_into(backend, sources, key_filter=lambda k: True)
                    continue
                restore_into(backend, sources, key_filter=lambda k: k != 2)
                got = []
                for key in (1, 2, 3):
                    backend.set_current_key(key)
                    got.append(backend.get_partitioned_state(V).value())
                assert got == ["1", None, "3"]
            finally:
                backend.dispose()
    finally:
        cluster.close()


@pytest.mark.parametrize("kind", ["hashmap", "rocksdb"])
def test_a_spark_partition_store_restores_under_a_declared_key_type(kind, storage):
    """Spark's partition stores keep generic keys (its key columns): a version restores into a
    backend with a declared key type where every key fits it, and still into generic ones."""
    drop_local_state()
    store = PartitionStore(factory(kind), storage, "query", "op", 0, GenericSerializer())
    backend = store.open(0, new_attempt_token(0, 0))
    for key in ("u1", "u2"):
        backend.set_current_key(key)
        backend.get_partitioned_state(V).update(key)
    store.commit()
    drop_local_state()
    version = storage.create_access("query/op/p00000")
    sources = [(h, version.reader()) for h in version.load(0)["tasks"].values()]
    assert {h["key_type"] for h, _ in sources} == {"generic"}
    for declared in (STRING, GENERIC):
        target = factory(kind).create_keyed_state_backend(
            key_serializer=declared.get_serializer(), key_group_range=KeyGroupRange.all(128),
            max_parallelism=128)
        try:
            restore_into(target, sources)
            target.set_current_key("u2")
            assert target.get_partitioned_state(V).value() == "u2"
        finally:
            target.dispose()
    reopened = PartitionStore(factory(kind), storage, "query", "op", 0, GenericSerializer())
    backend = reopened.open(1, new_attempt_token(1, 0))  # the next batch, in a fresh process
    backend.set_current_key("u1")
    assert backend.get_partitioned_state(V).value() == "u1"
    reopened.abort()
    drop_local_state()


# --- access ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["hashmap", "rocksdb"])
@pytest.mark.parametrize(("declared", "good", "bad"), [
    (INT, [0, -(1 << 31), (1 << 31) - 1, 1 << 30, -(1 << 30) - 5], [1 << 31, True, 1.0, "1"]),
    (LONG, [(1 << 63) - 1, -(1 << 63), 5], [1 << 63, False, 2.0]),
    (Types.BYTE(), [127, -128], [128, -129]),
    (DOUBLE, [1.5, 2], [True, "1.5", None]),
    (PAIR, [(1, "a")], [(1, 2), [1, "a"], (1,), ("a", 1)]),
    (GENERIC, [1, "a", (1, 2.5), None], [float("nan"), [1], {1: 2}]),
], ids=lambda v: repr(v) if not isinstance(v, list) else "keys")
def test_declared_key_type_at_access(kind, declared, good, bad, storage):
    cluster = KeyedCluster(factory(kind), storage, 1, key_serializer=declared.get_serializer())
    try:
        backend = cluster.partitions[0]
        state = backend.get_partitioned_state(V)
        for key in good:
            backend.set_current_key(key)
            state.update(repr(key))
        for key in bad:
            backend.set_current_key(good[-1])
            with pytest.raises(StateTypeError, match="key"):
                backend.set_current_key(key)
            assert backend.get_current_key() == good[-1] and state.value() == repr(good[-1])
            with pytest.raises(StateTypeError):
                BulkState(backend).put(V, [good[0], key], ["x", "y"])
            with pytest.raises(StateTypeError):
                BulkState(backend).get(V, [key])
        assert BulkState(backend).get(V, good) == [repr(k) for k in good]
    finally:
        cluster.close()


# --- the local runner --------------------------------------------------------------------------


class _Count(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value, ctx):
        self.count.update((self.count.value() or 0) + 1)
        yield ctx.get_current_key(), self.count.value()


def _job(events, key_type, **conf):
    env = StreamExecutionEnvironment.get_execution_environment(
        {"state.backend.type": conf.pop("backend", "hashmap"), **conf})
    env.set_parallelism(2)
    return env.from_collection(events).key_by(lambda v: v, key_type=key_type).process(_Count())


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_local_runner_enforces_and_restores_the_declared_key_type(backend, tmp_path):
    with pytest.raises(JobExecutionError) as caught:
        _job([1, 2], STRING, backend=backend).execute_and_collect()
    assert isinstance(caught.value.__cause__, StateTypeError)
    assert "declared key type STRING" in str(caught.value)
    first = _job([1, 2, 1], INT, backend=backend).execute_and_collect(
        savepoint_dir=str(tmp_path / "sp"))
    assert sorted(first) == [(1, 1), (1, 2), (2, 1)]
    resume = {"execution.savepoint.path": first.savepoint_path, "backend": backend}
    with pytest.raises(StateTypeError, match=r"keys are INT.*key type is STRING"):
        _job([1, 2, 1, "1"], STRING, **resume).execute_and_collect()
    for key_type in (INT, LONG, None):  # the same type, a wider one, generic keys
        assert sorted(_job([1, 2, 1, 2], key_type, **resume).execute_and_collect()) == [
            (2, 2)]


# --- inspection and savepoint conversion -------------------------------------------------------


@pytest.mark.parametrize("kind", ["hashmap", "rocksdb-incremental"])
def test_inspection_types_keys_by_the_recorded_key_type(kind, storage, tmp_path):
    cluster = written(kind, storage, INT, [1, 2, 3], parallelism=1)
    try:
        path = cluster.access.checkpoint_path(1)
        view = open_checkpoint(path)
        assert str(view.state("v").schema().field("key").type) == "int32"  # not inferred int64
        assert sorted(view.state("v").to_pandas()["key"]) == [1, 2, 3]
        converted = convert_savepoint(path, str(tmp_path / "sp"))
        opened = open_checkpoint(converted)
        assert {s.handle["key_type"] for s in opened.sources} == {"INT"}
        assert str(opened.state("v").schema().field("key").type) == "int32"
        target = factory(kind).create_keyed_state_backend(
            key_serializer=DOUBLE.get_serializer(), key_group_range=KeyGroupRange.all(128),
            max_parallelism=128)
        try:
            with pytest.raises(StateTypeError, match="keys are INT"):
                target.restore([s.handle for s in opened.sources], opened.sources[0].reader)
        finally:
            target.dispose()
    finally:
        cluster.close()
    generic = written(kind, storage, GENERIC, [1, 2])
    try:  # untyped keys are still inferred from the data
        view = open_checkpoint(generic.access.checkpoint_path(1))
        assert str(view.state("v").schema().field("key").type) == "int64"
    finally:
        generic.close()
