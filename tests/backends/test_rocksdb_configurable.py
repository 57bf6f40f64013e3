"""Flink's configurable RocksDB options (``state.backend.rocksdb.compaction.style`` and its
siblings): each takes effect on the database and every column family (read back from the
OPTIONS file RocksDB writes), between the predefined profile and the options factory; a value
RocksDB would ignore or change silently is refused at configuration; a checkpoint restores
across a compaction style switch, exactly."""

import re

import pytest

from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend, PredefinedOptions
from statekit.config import validate
from statekit.errors import ConfigError
from statekit.registry import backend_registry
from statekit.serde.types import Types
from statekit.state.descriptors import ValueStateDescriptor
from statekit.values import parse_size
from tests.backends.test_rocksdb import VALUE, checkpoint, keyed, options_text, rocks, storage_access

P = "state.backend.rocksdb."
TUNED = {P + "compaction.style": "level", P + "compaction.level.use-dynamic-size": "true",
         P + "compaction.level.target-file-size-base": "32 mb",
         P + "compaction.level.max-size-level-base": "128 mb", P + "writebuffer.size": "8 mb",
         P + "writebuffer.count": "3", P + "writebuffer.number-to-merge": "2",
         P + "block.blocksize": "16 kb", P + "files.open": "100", P + "thread.num": "3"}
#: what each key of TUNED reads back as, per column family (default and the state's)
PER_FAMILY = ["compaction_style=kCompactionStyleLevel", "level_compaction_dynamic_level_bytes=true",
              "target_file_size_base=33554432", "max_bytes_for_level_base=134217728",
              "write_buffer_size=8388608", "max_write_buffer_number=3",
              "min_write_buffer_number_to_merge=2", "block_size=16384"]
PER_DATABASE = ["max_open_files=100", "max_background_jobs=3"]


def _opened(backend):
    kb = keyed(backend)
    kb.get_partitioned_state(VALUE)  # opens the database and creates a column family
    return kb


def _lines(text):
    return [line.strip() for line in text.splitlines()]


def test_every_configurable_option_takes_effect_on_every_column_family():
    backend = rocks().configure(dict(TUNED))
    assert backend.get_configurable_options()[P + "writebuffer.count"] == 3
    kb = _opened(backend)
    try:
        lines = _lines(options_text(kb))
        for line in PER_FAMILY:
            assert lines.count(line) == 2, line
        for line in PER_DATABASE:
            assert lines.count(line) == 1, line
    finally:
        kb.dispose()


@pytest.mark.parametrize("size", ["256 kb", "1 mb", "4 mb"])
def test_a_small_write_buffer_fills_before_it_flushes(size):
    # the memory budget's arena blocks (6.7 MB by default) larger than the write buffer made
    # RocksDB switch the memtable on every write: a flush and an SST file per write
    kb = _opened(rocks().configure({P + "writebuffer.size": size}))
    try:
        v = kb.get_partitioned_state(VALUE)
        for i in range(1000):  # about 30 KB: far below each size
            kb.set_current_key(f"k{i}")
            v.update(i)
        cf = kb.cfs["v"]
        assert cf.property_int_value("rocksdb.num-entries-active-mem-table") == 1000
        assert _lines(options_text(kb)).count(f"arena_block_size={parse_size('size', size) // 8}") == 2
    finally:
        kb.dispose()


def test_universal_compaction_takes_effect():
    kb = _opened(rocks().configure({P + "compaction.style": "UNIVERSAL"}))
    try:
        assert _lines(options_text(kb)).count("compaction_style=kCompactionStyleUniversal") == 2
    finally:
        kb.dispose()


def test_configurable_options_sit_between_the_profile_and_the_options_factory():
    """Flink's precedence: the profile, then the options set (only those), then the factory."""
    def factory(opts):
        opts.set_max_write_buffer_number(8)

    backend = rocks().configure({P + "writebuffer.count": 6, P + "block.blocksize": "16 kb",
                                 P + "compaction.level.target-file-size-base": "32 mb"})
    backend.set_predefined_options(PredefinedOptions.SPINNING_DISK_OPTIMIZED_HIGH_MEM)
    plain = _opened(backend)
    backend.set_options(factory)
    factored = _opened(backend)
    try:
        lines = _lines(options_text(plain))
        assert lines.count("max_write_buffer_number=6") == 2  # over the profile's 4
        assert lines.count("block_size=16384") == 2  # over the profile's 128 KB
        assert lines.count("target_file_size_base=33554432") == 2
        # what the options leave unset keeps the profile's value
        assert lines.count("max_bytes_for_level_base=1073741824") == 2
        assert lines.count("min_write_buffer_number_to_merge=3") == 2
        assert lines.count("filter_policy=bloomfilter") == 2
        assert _lines(options_text(factored)).count("max_write_buffer_number=8") == 2
    finally:
        plain.dispose()
        factored.dispose()


def test_the_configuration_reaches_the_backend_through_the_registry():
    backend = backend_registry.create("rocksdb", {P + "compaction.style": "universal"},
                                      EmbeddedRocksDBStateBackend)
    assert backend.get_configurable_options() == {P + "compaction.style": "UNIVERSAL"}
    again = backend.configure({P + "files.open": 64})
    assert again.get_configurable_options() == {P + "compaction.style": "UNIVERSAL",
                                                P + "files.open": 64}
    assert backend.get_configurable_options() == {P + "compaction.style": "UNIVERSAL"}


@pytest.mark.parametrize(("key", "value", "message"), [
    ("compaction.style", "FIFO", "deletes the oldest"),
    ("compaction.style", "levle", "expected one of LEVEL, UNIVERSAL"),
    ("writebuffer.count", 1, "at least 2"),
    ("writebuffer.size", "1 kb", "at least 65536"),
    ("files.open", 5, "-1 (no limit) or at least 20"),
    ("files.open", 0, "-1 (no limit) or at least 20"),
    ("thread.num", 0, "at least 1"),
    ("block.blocksize", "big", "size"),
])
def test_a_value_rocksdb_would_not_take_is_refused_naming_the_key(key, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        rocks().configure({P + key: value})
    assert P + key in str(caught.value)
    with pytest.raises(ConfigError, match=re.escape(message)):  # the table the Spark adapters check with
        validate({P + key: value})


def test_settings_rocksdb_would_ignore_or_change_are_refused():
    with pytest.raises(ConfigError, match=r"below state\.backend\.rocksdb\.writebuffer\.count"):
        rocks().configure({P + "writebuffer.number-to-merge": 2})  # RocksDB's count: 2
    with pytest.raises(ConfigError, match="LEVEL compaction only"):
        rocks().configure({P + "compaction.style": "universal",
                           P + "compaction.level.max-size-level-base": "1 gb"})
    # the profile's 4 memtables allow 3 to merge; switching to a profile with 2 is refused
    backend = rocks()
    backend.set_predefined_options(PredefinedOptions.SPINNING_DISK_OPTIMIZED_HIGH_MEM)
    backend = backend.configure({P + "writebuffer.number-to-merge": 3})
    with pytest.raises(ConfigError, match=r"below state\.backend\.rocksdb\.writebuffer\.count"):
        backend.set_predefined_options(PredefinedOptions.DEFAULT)
    assert backend.get_predefined_options() is PredefinedOptions.SPINNING_DISK_OPTIMIZED_HIGH_MEM


def _fill(kb, state, keys, version):
    for i in keys:
        kb.set_current_key(f"key-{i}")
        state.update(f"v{version}-{i}-" + "x" * 200)


def _check(kb, expected):
    state = kb.get_partitioned_state(ValueStateDescriptor("v", Types.STRING()))
    for i, version in expected.items():
        kb.set_current_key(f"key-{i}")
        assert state.value() == f"v{version}-{i}-" + "x" * 200, i


@pytest.mark.parametrize("incremental", [False, True])
def test_a_checkpoint_restores_across_a_compaction_style_switch(tmp_path, incremental):
    """LEVEL -> UNIVERSAL -> LEVEL, each time from a checkpoint whose files lie on several
    levels (compacted down, then new flushes on top), with the state exact."""
    access = storage_access(tmp_path)
    level = rocks(incremental).configure({P + "compaction.style": "LEVEL",
                                          P + "writebuffer.size": "256 kb"})
    universal = rocks(incremental).configure({P + "compaction.style": "UNIVERSAL",
                                              P + "writebuffer.size": "256 kb"})
    desc = ValueStateDescriptor("v", Types.STRING())
    expected = {}
    kb = keyed(level)
    try:
        state = kb.get_partitioned_state(desc)
        _fill(kb, state, range(5000), 1)
        kb.cfs["v"].compact_range(None, None)  # to the bottom level
        _fill(kb, state, range(0, 5000, 7), 2)  # and level-0 files on top
        expected = {i: 2 if i % 7 == 0 else 1 for i in range(5000)}
        handle, _ = checkpoint(kb, access, 1)
    finally:
        kb.dispose()
    for cid, target in enumerate([universal, level], start=2):
        kb = keyed(target)
        try:
            kb.restore([handle], access.reader())
            _check(kb, expected)
            state = kb.get_partitioned_state(desc)
            _fill(kb, state, range(cid, 5000, 5), cid)
            expected.update({i: cid for i in range(cid, 5000, 5)})
            handle, _ = checkpoint(kb, access, cid)
        finally:
            kb.dispose()
    kb = keyed(rocks())
    try:
        kb.restore([handle], access.reader())
        _check(kb, expected)
    finally:
        kb.dispose()


def test_keys_set_before_the_backend_apply_to_it_and_code_wins(tmp_path):
    """Flink configures the application's backend with the job's keys, whenever they came."""
    from statekit import StreamExecutionEnvironment

    env = StreamExecutionEnvironment.get_execution_environment(
        {P + "thread.num": 3, P + "localdir": str(tmp_path / "keys")})
    backend = EmbeddedRocksDBStateBackend()
    backend.set_db_storage_paths(str(tmp_path / "code"))
    env.set_state_backend(backend)
    configured = env.get_state_backend()
    assert configured.get_configurable_options() == {P + "thread.num": 3}
    assert configured.working_roots() == [str(tmp_path / "code")]  # set in code: it wins
    assert backend.get_configurable_options() == {}  # the object passed in is left as it was


def test_block_size_rocksdb_cannot_take_is_refused_and_not_taken_for_a_lock():
    with pytest.raises(ConfigError, match="between 1 and"):
        rocks().configure({P + "block.blocksize": "4 gb"})
    backend = rocks().configure({P + "block.blocksize": "16 kb"})
    assert backend.get_configurable_options()[P + "block.blocksize"] == 16384


def test_the_cache_size_key_says_why_it_is_not_taken():
    with pytest.raises(ConfigError, match="memory budget"):
        validate({P + "block.cache-size": "64 mb"})
