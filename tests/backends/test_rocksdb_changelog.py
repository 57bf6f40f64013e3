"""Changelog checkpoints of the RocksDB backend (``state.changelog.enabled``): between
materializations a checkpoint uploads the write-ahead log written since the last one."""

import os
import random
import time

import pytest

from statekit.backends.heap import HashMapStateBackend
from statekit.backends.rocksdb import ROCKSDB_FORMAT, EmbeddedRocksDBStateBackend
from statekit.backends.transfer import restore_into
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.errors import (
    CheckpointNotFoundError,
    ConfigError,
    CorruptCheckpointError,
    StateError,
)
from statekit.runtime.environment import StreamExecutionEnvironment
from statekit.serde.keygroups import KeyGroupRange, key_group_for_bytes
from statekit.serde.types import Types
from statekit.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    Time,
    ValueStateDescriptor,
)
from tests.backends.test_rocksdb import ALL, KEY, SHM, keyed

VALUE = ValueStateDescriptor("v", Types.STRING())
LIST = ListStateDescriptor("l", Types.LONG())
MAP = MapStateDescriptor("m", Types.STRING(), Types.LONG())


def rocks(changelog=True, incremental=True, **config):
    conf = {"state.changelog.enabled": changelog, **config}
    backend = EmbeddedRocksDBStateBackend(incremental).configure(conf)
    if SHM:
        backend.set_db_storage_paths(SHM)
    return backend


def access_of(tmp_path):
    return FileSystemCheckpointStorage(str(tmp_path / "chk")).create_access("job")


def checkpoint(kb, access, cid, complete=True):
    streams = access.streams(cid, "t0")
    handle = kb.snapshot(cid, streams).run()
    access.commit(cid, {"tasks": {"t0": handle}})
    if complete:
        kb.notify_checkpoint_complete(cid)
    return handle, streams.bytes_written


def write_round(kb, states, keys, tag):
    v, lst, m = states
    for i in keys:
        kb.set_current_key(f"k{i}")
        v.update(f"{tag}-{i}-" + "x" * 60)
        lst.add(i)
        m.put(tag, i)
        if i % 7 == 0:
            m.remove("r0")


def contents(kb, n):
    v = kb.get_partitioned_state(VALUE)
    lst = kb.get_partitioned_state(LIST)
    m = kb.get_partitioned_state(MAP)
    out = {}
    for i in range(n):
        kb.set_current_key(f"k{i}")
        out[i] = (v.value(), list(lst.get() or []), dict(m.items()))
    return out


def states_of(kb):
    return (kb.get_partitioned_state(VALUE), kb.get_partitioned_state(LIST),
            kb.get_partitioned_state(MAP))


def built(kb, access, n, rounds=1, step=9):
    """``n`` keys written and materialized (checkpoint 1), then ``rounds`` changelog checkpoints,
    each changing every ``step``-th key: the last one's handle."""
    st = states_of(kb)
    write_round(kb, st, range(n), "r0")
    handle, _ = checkpoint(kb, access, 1)
    for cid in range(2, rounds + 2):
        write_round(kb, st, range(cid, n, step), f"r{cid}")
        handle, _ = checkpoint(kb, access, cid)
    return handle


def restored(backend, handle, access, rng=ALL):
    kb = keyed(backend, rng)
    kb.restore([handle], access.reader())
    return kb


def restores_exactly(backend, handle, access, n, want, why=None):
    """A backend from ``backend`` restored from ``handle`` holds ``want`` (:func:`contents`)."""
    other = restored(backend, handle, access)
    try:
        assert contents(other, n) == want, why
    finally:
        other.dispose()


def test_changelog_checkpoints_upload_the_log_and_restore_exactly(tmp_path):
    access = access_of(tmp_path)
    backend = rocks()
    kb = keyed(backend)
    n = 20_000
    try:
        st = states_of(kb)
        write_round(kb, st, range(n), "r0")
        full, full_bytes = checkpoint(kb, access, 1)
        assert full["changelog"]["segments"] == [] and full["sst"]
        expected = {}
        for cid in range(2, 6):
            write_round(kb, st, range(cid, n, 100), f"r{cid}")  # 1 % of the keys
            handle, written = checkpoint(kb, access, cid)
            assert handle["format"] == ROCKSDB_FORMAT
            assert handle["sst"] == full["sst"]  # the materialization, reused whole
            assert len(handle["changelog"]["segments"]) >= cid - 1
            assert written <= 0.05 * full_bytes, (written, full_bytes)
            expected[cid] = (handle, contents(kb, n))
        for cid, (handle, want) in expected.items():  # every checkpoint of the chain
            restores_exactly(rocks(changelog=False), handle, access, n, want, cid)
    finally:
        kb.dispose()


def test_logs_rotated_and_archived_between_checkpoints_stay_exact(tmp_path):
    access = access_of(tmp_path)
    backend = rocks(**{"state.backend.rocksdb.writebuffer.size": "256 kb",
                       "state.backend.rocksdb.changelog.max-log-ratio": "100"})
    kb = keyed(backend)
    n = 5_000
    try:
        st = states_of(kb)
        write_round(kb, st, range(n), "r0")
        checkpoint(kb, access, 1)
        for cid in range(2, 5):
            write_round(kb, st, range(n), f"r{cid}")  # many memtable flushes, logs archived
            handle, _ = checkpoint(kb, access, cid)
            logs = {s["log"] for s in handle["changelog"]["segments"]}
            assert len(logs) >= cid, logs
            archive = kb.db_path / "archive"
            covered = {s["log"]: s["offset"] + s["size"] for s in handle["changelog"]["segments"]}
            for name in os.listdir(archive) if archive.exists() else ():
                number = int(name.split(".")[0])  # what is left is not held whole yet
                assert covered.get(number) != os.path.getsize(archive / name)
        gone = [n for n in logs if not (kb.db_path / "archive" / f"{n:06d}.log").exists()
                and not (kb.db_path / f"{n:06d}.log").exists()]
        assert gone  # archived logs a completed checkpoint holds whole were deleted
        want = contents(kb, n)
        restores_exactly(backend, handle, access, n, want)
    finally:
        kb.dispose()


def _materialization_of(handle):
    files = [*handle["sst"].values(),
             *(p for entry in handle.get("pieces", {}).values() for p in entry["parts"])]
    return tuple(sorted(h.get("path", "inline") for h in files))


def test_the_next_materialization_is_uploaded_by_the_checkpoints_after_the_interval(tmp_path):
    """Flink materializes between checkpoints: here the checkpoint after the interval takes the
    native checkpoint and it and the ones after it upload a share each, while they still extend
    the last materialization; then checkpoints extend the new one.  Exact all along."""
    access = access_of(tmp_path)
    kb = keyed(rocks(incremental=False, **{  # small files: a share is a few of them
        "state.changelog.periodic-materialize.interval": "1 ms",
        "state.backend.rocksdb.writebuffer.size": "64 kb",
        "state.backend.rocksdb.compaction.level.target-file-size-base": "64 kb"}))
    try:
        st = states_of(kb)
        write_round(kb, st, range(3000), "r0")
        first, full = checkpoint(kb, access, 1)
        seen, sizes = [], []
        for cid in range(2, 40):
            write_round(kb, st, range(cid, 3000, 100), f"r{cid}")
            handle, written = checkpoint(kb, access, cid)
            assert handle["changelog"]["segments"]  # never a checkpoint of its own files
            sizes.append(written / full)
            seen.append(_materialization_of(handle))
            if cid % 9 == 0:  # every checkpoint restores exactly, before and after a switch
                want = contents(kb, 3000)
                restores_exactly(rocks(changelog=False), handle, access, 3000, want, cid)
        switches = [n for n in range(1, len(seen)) if seen[n] != seen[n - 1]]
        assert seen[0] == _materialization_of(first) and switches, seen
        # a share of the materialization (here, of 7 files: one or two each), never all of it
        assert max(sizes) < 0.5, sizes
    finally:
        kb.dispose()


def test_a_materialization_whose_upload_was_aborted_is_uploaded_again(tmp_path):
    access = access_of(tmp_path)
    kb = keyed(rocks(incremental=False,
                     **{"state.changelog.periodic-materialize.interval": "1 ms"}))
    try:
        st = states_of(kb)
        write_round(kb, st, range(2000), "r0")
        first, _ = checkpoint(kb, access, 1)
        for cid in range(2, 30):
            write_round(kb, st, range(cid, 2000, 50), f"r{cid}")
            handle, _ = checkpoint(kb, access, cid, complete=cid % 3 != 0)
            if cid % 3 == 0:
                kb.notify_checkpoint_aborted(cid)  # its share is given back
        assert _materialization_of(handle) != _materialization_of(first)
        want = contents(kb, 2000)
        restores_exactly(rocks(), handle, access, 2000, want)
    finally:
        kb.dispose()


def test_materializes_by_the_log_ratio_and_for_a_new_state(tmp_path):
    access = access_of(tmp_path)
    kb = keyed(rocks(**{"state.backend.rocksdb.changelog.max-log-ratio": "0.2"}))
    try:
        st = states_of(kb)
        write_round(kb, st, range(1000), "r0")
        first, _ = checkpoint(kb, access, 1)
        for cid in range(2, 40):
            write_round(kb, st, range(cid, 1000, 50), f"r{cid}")
            handle, _ = checkpoint(kb, access, cid)
        # the logs outgrew a fifth of the materialization after a few rounds: a new one
        assert _materialization_of(handle) != _materialization_of(first)
        # bounded: the ratio, plus what is logged while the next one is uploaded
        assert handle["changelog"]["log_bytes"] < sum(
            h["size"] for g in ("sst", "misc") for h in handle[g].values())
    finally:
        kb.dispose()
    kb = keyed(rocks())
    try:
        st = states_of(kb)
        write_round(kb, st, range(100), "r0")
        checkpoint(kb, access, 101)
        write_round(kb, st, range(10), "r1")
        assert checkpoint(kb, access, 102)[0]["changelog"]["segments"]
        extra = kb.get_partitioned_state(ValueStateDescriptor("extra", Types.LONG()))
        kb.set_current_key("k1")
        extra.update(7)  # a column family the materialization lacks: materialize again
        handle, _ = checkpoint(kb, access, 103)
        assert handle["changelog"]["segments"] == [] and "extra" in handle["states"]
        other = restored(rocks(), handle, access)
        other.set_current_key("k1")
        assert other.get_partitioned_state(ValueStateDescriptor("extra", Types.LONG())).value() == 7
        other.dispose()
    finally:
        kb.dispose()


def test_a_checkpoint_that_never_completed_is_not_extended(tmp_path):
    access = access_of(tmp_path)
    kb = keyed(rocks())
    try:
        st = states_of(kb)
        write_round(kb, st, range(500), "r0")
        checkpoint(kb, access, 1)
        write_round(kb, st, range(0, 500, 3), "r2")
        second, _ = checkpoint(kb, access, 2, complete=False)
        kb.notify_checkpoint_aborted(2)
        write_round(kb, st, range(1, 500, 5), "r3")
        third, _ = checkpoint(kb, access, 3)
        # the third carries everything since the completed first, the aborted second's too
        assert third["changelog"]["segments"][0]["offset"] == 0
        assert len(second["changelog"]["segments"]) <= len(third["changelog"]["segments"])
        want = contents(kb, 500)
        restores_exactly(rocks(), third, access, 500, want)
    finally:
        kb.dispose()


def test_rescale_and_backend_switch_of_a_changelog_checkpoint(tmp_path):
    access = access_of(tmp_path)
    kb = keyed(rocks())
    try:
        handle = built(kb, access, 2000)
        assert handle["changelog"]["segments"]
        want = contents(kb, 2000)
    finally:
        kb.dispose()
    got = {}
    for rng in (KeyGroupRange(0, 63), KeyGroupRange(64, 127)):
        half = restored(rocks(), handle, access, rng)
        for i in want:
            if key_group_for_bytes(KEY.serialize(f"k{i}"), 128) in rng:
                half.set_current_key(f"k{i}")
                v, lst, m = states_of(half)
                got[i] = (v.value(), list(lst.get() or []), dict(m.items()))
        half.dispose()
    assert got == want
    heap = HashMapStateBackend().create_keyed_state_backend(
        key_serializer=KEY, key_group_range=ALL, max_parallelism=128)
    restore_into(heap, [(handle, access.reader())])  # the logs replayed, then converted
    assert contents(heap, 2000) == want
    heap.dispose()


def test_a_missing_or_damaged_segment_is_refused(tmp_path):
    access = access_of(tmp_path)
    kb = keyed(rocks())
    try:
        handle = built(kb, access, 300, rounds=2, step=4)
    finally:
        kb.dispose()
    segments = handle["changelog"]["segments"]
    assert len(segments) >= 2
    dropped = {**handle, "changelog": {**handle["changelog"], "segments": segments[1:]}}
    moved = {**handle, "changelog": {**handle["changelog"],
                                     "segments": [{**segments[0], "offset": 1}, *segments[1:]]}}
    for bad in (dropped, moved):
        other = keyed(rocks())
        with pytest.raises(CorruptCheckpointError, match="segment"):
            other.restore([bad], access.reader())
        other.dispose()
    data = segments[-1]["data"]
    assert data["type"] == "file"  # (2.5 KB: above the inline threshold)
    path = next((tmp_path / "chk").rglob(data["path"].rsplit("/", 1)[-1]))
    path.write_bytes(b"\0" * data["size"])  # same size, damaged bytes
    other = keyed(rocks())
    with pytest.raises(CorruptCheckpointError):
        other.restore([handle], access.reader())
    other.dispose()


def _large_sst_on_its_way(tmp_path, n=6000):
    """A small materialization (checkpoint 1), then ``n`` KiB of new values flushed into one SST
    file by the native checkpoint of the next materialization (checkpoint 2): far more than a
    share, so uploaded in pieces by the checkpoints after it, until they switch to it."""
    access = access_of(tmp_path)
    kb = keyed(rocks(**{"state.changelog.periodic-materialize.interval": "1 ms"}))
    v = kb.get_partitioned_state(VALUE)
    rng = random.Random(5)
    for i in range(50):
        kb.set_current_key(f"k{i}")
        v.update("small")
    checkpoint(kb, access, 1)
    for i in range(n):  # incompressible: the SST file holds them at full size
        kb.set_current_key(f"k{i}")
        v.update(rng.randbytes(512).hex())
    _, log_bytes = checkpoint(kb, access, 2)
    rounds, cid = [], 3
    while cid < 60:
        kb.set_current_key(f"k{cid}")
        v.update(f"round {cid}")
        handle, written = checkpoint(kb, access, cid)
        rounds.append(written)
        if "pieces" in handle:
            break
        cid += 1
    return kb, access, handle, rounds, log_bytes


def _values(kb, n=6000):
    v = kb.get_partitioned_state(VALUE)
    out = {}
    for i in range(n):
        kb.set_current_key(f"k{i}")
        out[i] = v.value()
    return out


def test_an_sst_larger_than_a_share_is_uploaded_in_pieces(tmp_path):
    """No checkpoint carries one large SST file whole (the round that would upload it uploads
    one piece); a restore joins the pieces, exactly; the next materialization reuses the file
    by its pieces; a damaged or missing piece is a typed error."""
    from statekit.backends.rocksdb.ahead import MIN_PIECE

    kb, access, handle, rounds, log_bytes = _large_sst_on_its_way(tmp_path)
    (name, entry), = handle["pieces"].items()
    pieces, size = entry["parts"], entry["size"]
    assert size == sum(p["size"] for p in pieces)
    try:
        want = _values(kb)
        for cid in (80, 81):  # the next materializations reuse the file by its pieces
            later, written = checkpoint(kb, access, cid)
            assert written < 0.2 * size and later["pieces"] == handle["pieces"], written
    finally:
        kb.dispose()
    assert size >= 0.8 * log_bytes and len(pieces) >= 3, (size, log_bytes, len(pieces))
    assert max(p["size"] for p in pieces) <= max(MIN_PIECE, size // 2)
    assert max(rounds) < 0.5 * size, rounds  # a piece (and a log) per round, never the file
    other = restored(rocks(changelog=False), handle, access)
    assert _values(other) == want
    other.dispose()
    # restored into a changelog backend: its first checkpoint materializes, reusing the pieces
    other = restored(rocks(), handle, access)
    other.adopt_restored_base(handle)
    again, written = checkpoint(other, access, 100)
    other.dispose()
    assert again["pieces"] == handle["pieces"] and written < 0.2 * size
    # pieces out of order (each intact; a handle not read through the metadata's checks)
    swapped = {**handle, "pieces": {name: {**entry, "parts": [pieces[1], pieces[0], *pieces[2:]]}}}
    other = keyed(rocks())
    with pytest.raises(CorruptCheckpointError, match="pieces"):
        other.restore([swapped], access.reader())
    other.dispose()
    # a damaged piece, then a missing one
    first = next((tmp_path / "chk").rglob(pieces[1]["path"].rsplit("/", 1)[-1]))
    saved = first.read_bytes()
    first.write_bytes(b"\0" * len(saved))
    for damage in (CorruptCheckpointError, CheckpointNotFoundError):
        other = keyed(rocks())
        with pytest.raises(damage):
            other.restore([handle], access.reader())
        other.dispose()
        first.unlink(missing_ok=True)


def test_malformed_pieces_are_refused_when_the_metadata_is_read(tmp_path):
    from statekit.checkpoint import schema

    kb, _, handle, _, _ = _large_sst_on_its_way(tmp_path, n=3000)
    kb.dispose()
    schema.check_metadata({"tasks": {"t0": handle}}, "chk-9")  # the real one passes
    (name, entry), = handle["pieces"].items()
    pieces = entry["parts"]
    piece = pieces[0]
    assert len(pieces) >= 2
    for bad in ({name: {**entry, "parts": []}}, {name: "all"}, {name: pieces},
                {"../x.sst": entry}, {"x.log": entry}, [entry],
                {name: {**entry, "parts": [{**piece, "type": "url"}, *pieces[1:]]}},
                {name: {**entry, "parts": [{**piece, "path": "../../x"}, *pieces[1:]]}},
                # every piece intact, the file not: out of order, repeated, left out
                {name: {**entry, "parts": [pieces[1], pieces[0], *pieces[2:]]}},
                {name: {**entry, "parts": [pieces[0], pieces[0], *pieces[2:]]}},
                {name: {**entry, "parts": pieces[:-1]}},
                {name: {**entry, "crc": entry["crc"] ^ 1}}):
        with pytest.raises(CorruptCheckpointError):
            schema.check_metadata({"tasks": {"t0": {**handle, "pieces": bad}}}, "chk-9")
    some = next(iter(handle["sst"]), None)
    if some is not None:  # a file both whole and in pieces
        with pytest.raises(CorruptCheckpointError):
            schema.check_metadata({"tasks": {"t0": {**handle, "pieces": {some: entry}}}},
                                  "chk-9")


def test_what_cannot_take_effect_is_refused():
    with pytest.raises(ConfigError, match=r"state\.changelog\.enabled"):
        HashMapStateBackend().configure({"state.changelog.enabled": "true"})
    with pytest.raises(ConfigError, match="periodic-materialize"):
        HashMapStateBackend().configure({"state.backend.changelog.periodic-materialize.interval": "1 min"})
    HashMapStateBackend().configure({"state.changelog.enabled": "false"})
    for key, value in (("state.changelog.storage", "filesystem"),
                       ("state.backend.changelog.max-failures-allowed", "3")):
        with pytest.raises(ConfigError, match="cannot take effect"):
            StreamExecutionEnvironment.get_execution_environment({key: value})
    never = EmbeddedRocksDBStateBackend().configure(
        {"state.changelog.periodic-materialize.interval": "-1"})  # Flink: no periodic one
    assert never.get_materialization_interval() == -1
    with pytest.raises(ConfigError, match="periodic-materialize"):
        EmbeddedRocksDBStateBackend().configure({"state.changelog.periodic-materialize.interval": "0"})
    env = StreamExecutionEnvironment.get_execution_environment()
    env.enable_changelog_state_backend(True)
    assert env.is_changelog_state_backend_enabled()
    with pytest.raises(ConfigError, match="heap"):
        env.set_state_backend(HashMapStateBackend())
    env.set_state_backend(EmbeddedRocksDBStateBackend())
    assert env.get_state_backend().is_changelog_enabled()
    kb = keyed(rocks())
    try:
        ttl = StateTtlConfig.new_builder(Time.seconds(1)).cleanup_full_snapshot().build()
        desc = ValueStateDescriptor("t", Types.LONG())
        desc.enable_time_to_live(ttl)
        with pytest.raises(StateError, match="cleanup_full_snapshot"):
            kb.get_partitioned_state(desc)
    finally:
        kb.dispose()


def test_a_job_fails_restarts_and_resumes_exactly_on_changelog_checkpoints(tmp_path):
    from statekit import ExternalizedCheckpointCleanup, RestartStrategies
    from statekit.checkpoint.savepoint import open_external
    from tests.runtime.envs import env_for, expected_final, final_of
    from tests.runtime.test_local import ITEMS, RunningSum

    conf = {"state.changelog.enabled": "true", "state.backend.incremental": "true",
            "execution.checkpointing.interval": "10 ms",
            "state.checkpoints.num-retained": "1"}
    if SHM:
        conf["state.backend.rocksdb.localdir"] = SHM
    env = env_for(tmp_path, "rocksdb", **conf)
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(3, 0))
    env.get_checkpoint_config().enable_externalized_checkpoints(
        ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION)
    result = (env.from_collection(ITEMS[:2000]).map(lambda x: time.sleep(0.0002) or x)
              .key_by(lambda x: x[0]).process(RunningSum(fail_at={1200})).execute_and_collect())
    assert result.restarts == 1 and len(result) == 2000
    assert final_of(result) == expected_final(ITEMS[:2000])
    body, _ = open_external(result.latest_checkpoint)
    tasks = list(_native_handles(body))
    assert tasks and all("changelog" in t for t in tasks)
    assert any(t["changelog"]["segments"] for t in tasks)  # logs on top of a materialization
    # the one retained checkpoint restores although the files it extends were written by
    # checkpoints since discarded
    resumed = env_for(tmp_path, "rocksdb", **{**conf, "execution.savepoint.path":
                                                 result.latest_checkpoint})
    more = (resumed.from_collection(ITEMS).key_by(lambda x: x[0]).process(RunningSum())
            .execute_and_collect())
    assert len(more) == len(ITEMS) - 2000
    assert final_of(list(result) + list(more)) == expected_final(ITEMS)


def _native_handles(obj):
    if isinstance(obj, dict):
        if obj.get("format") == ROCKSDB_FORMAT:
            yield obj
            return
        for value in obj.values():
            yield from _native_handles(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _native_handles(value)


def _stores(tmp_path, retained, **config):
    """New ``PartitionStore``s of one Spark partition of a changelog RocksDB backend over
    FileSystem storage, one per micro-batch as Spark's tasks make them."""
    from statekit.runtime.partition import PartitionStore
    from statekit.serde.types import GenericSerializer

    storage = FileSystemCheckpointStorage(str(tmp_path / "chk"))

    def store():
        return PartitionStore(rocks(**config), storage, "query", "op", 0, GenericSerializer(),
                              versions_retained=retained)

    return store


def test_a_spark_partition_commits_changelog_versions_and_restores_after_retention(tmp_path):
    from statekit.checkpoint.savepoint import open_external
    from statekit.runtime.partition import drop_local_state, new_attempt_token

    count = ValueStateDescriptor("count", Types.LONG())
    store = _stores(tmp_path, 3, **{"state.backend.rocksdb.changelog.max-log-ratio": "100"})

    drop_local_state()
    try:
        expected = {}
        for batch in range(8):
            s = store()
            backend = s.open(batch, new_attempt_token(batch, 0))
            for k in range(batch, 300, 3):
                backend.set_current_key(f"k{k}")
                state = backend.get_partitioned_state(count)
                state.update((state.value() or 0) + 1)
                expected[k] = expected.get(k, 0) + 1
            path = s.commit()
            assert s.reused == (batch > 0)  # the warm backend extends its changelog
        body, _ = open_external(path)
        assert [len(h["changelog"]["segments"]) for h in _native_handles(body)] == [7]
        drop_local_state()  # a new executor: versions 5-7 remain, built on a materialization
        s = store()
        backend = s.open(8, new_attempt_token("read"))
        for k in range(300):
            backend.set_current_key(f"k{k}")
            assert backend.get_partitioned_state(count).value() == expected.get(k), k
        s.abort()
    finally:
        drop_local_state()


def test_a_malformed_changelog_is_refused_when_the_metadata_is_read(tmp_path):
    from statekit.checkpoint import schema

    access = access_of(tmp_path)
    kb = keyed(rocks())
    try:
        handle = built(kb, access, 100, step=3)
    finally:
        kb.dispose()
    schema.check_metadata({"tasks": {"t0": handle}}, "chk-2")  # the real one passes
    log = handle["changelog"]
    seg = log["segments"][0]
    bad = [{"segments": "all"}, {"base_log": -1}, {"families": [3]}, {"starts": {"x": 1}},
           {"segments": [{**seg, "size": seg["size"] + 1}]},
           {"segments": [{**seg, "data": {"type": "file", "path": "../../x", "size": 1,
                                           "crc": 0}}]}]
    for change in bad:
        with pytest.raises(CorruptCheckpointError):
            schema.check_metadata({"tasks": {"t0": {**handle, "changelog": {**log, **change}}}},
                                  "chk-2")


@pytest.mark.parametrize(("incremental", "interval"),
                         [(False, "10 min"), (True, "10 min"), (False, "1 ms"), (True, "1 ms")])
def test_discarding_the_materialization_keeps_what_later_checkpoints_use(tmp_path, incremental,
                                                                         interval):
    """Every file of a materialization is shared: a changelog checkpoint still needs them after
    the checkpoint that wrote them was discarded (threshold 0: no file inline); so are the
    shares of the next one, referenced by each checkpoint that carries them (1 ms)."""
    storage = FileSystemCheckpointStorage(str(tmp_path / "chk"), file_state_size_threshold=0)
    access = storage.create_access("job")
    kb = keyed(rocks(incremental=incremental,
                     **{"state.changelog.periodic-materialize.interval": interval}))
    try:
        st = states_of(kb)
        write_round(kb, st, range(500), "r0")
        first, _ = checkpoint(kb, access, 1)
        for cid in range(2, 16 if interval == "1 ms" else 4):
            write_round(kb, st, range(cid, 500, 7), f"r{cid}")
            handle, _ = checkpoint(kb, access, cid)
            access.discard(cid - 1, [cid])  # only the newest is kept
        assert handle["changelog"]["segments"]
        if interval == "1 ms":  # the materialization switched meanwhile
            assert _materialization_of(handle) != _materialization_of(first)
        want = contents(kb, 500)
    finally:
        kb.dispose()
    restores_exactly(rocks(), handle, access, 500, want)


def test_the_tools_show_read_and_verify_a_changelog_checkpoint(tmp_path):
    from click.testing import CliRunner

    from statekit import ExternalizedCheckpointCleanup
    from statekit.cli import main
    from tests.runtime.envs import env_for, expected_final
    from tests.runtime.test_local import ITEMS, RunningSum

    conf = {"state.changelog.enabled": "true", "execution.checkpointing.interval": "10 ms"}
    if SHM:
        conf["state.backend.rocksdb.localdir"] = SHM
    env = env_for(tmp_path, "rocksdb", **conf)
    env.get_checkpoint_config().enable_externalized_checkpoints(
        ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION)
    result = (env.from_collection(ITEMS[:1500]).map(lambda x: time.sleep(0.0002) or x)
              .key_by(lambda x: x[0]).process(RunningSum()).execute_and_collect())

    def run(*args):
        done = CliRunner().invoke(main, list(args), catch_exceptions=False)
        assert done.exit_code == 0, done.output
        return done.output

    assert "changelog" in run("checkpoints", "list", str(tmp_path / "chk"))
    assert run("checkpoints", "verify", result.latest_checkpoint).startswith("OK")
    out = tmp_path / "count.jsonl"
    run("state", "export", result.latest_checkpoint, "--state", "count", "--to", str(out))
    import json

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["key"]: r["value"] for r in rows} == {
        k: c for k, (c, _) in expected_final(ITEMS[:1500]).items()}


def test_a_spark_partition_restores_after_retention_with_pieces(tmp_path):
    """Spark's version retention with a materialization uploaded in pieces across micro-batches:
    a new executor restores the newest version exactly, every piece it needs kept."""
    from statekit.checkpoint.savepoint import open_external
    from statekit.runtime.partition import drop_local_state, new_attempt_token

    text = ValueStateDescriptor("text", Types.STRING())
    rng = random.Random(7)
    store = _stores(tmp_path, 2, **{"state.changelog.periodic-materialize.interval": "1 ms"})

    drop_local_state()
    try:
        expected, seen_pieces = {}, False
        for batch in range(24):
            s = store()
            backend = s.open(batch, new_attempt_token(batch, 0))
            state = backend.get_partitioned_state(text)
            keys = range(50) if batch == 0 else range(4000) if batch == 1 else [batch]
            for k in keys:
                backend.set_current_key(f"k{k}")
                expected[k] = rng.randbytes(512).hex()
                state.update(expected[k])
            path = s.commit()
            body, _ = open_external(path)
            seen_pieces |= any("pieces" in h for h in _native_handles(body))
        assert seen_pieces
        drop_local_state()  # a new executor: only the last two versions remain
        s = store()
        backend = s.open(24, new_attempt_token("read"))
        state = backend.get_partitioned_state(text)
        for k in range(4000):
            backend.set_current_key(f"k{k}")
            assert state.value() == expected[k], k
        s.abort()
    finally:
        drop_local_state()
