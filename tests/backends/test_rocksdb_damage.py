"""A damaged block in a RocksDB file: RocksDB's iterators (and rocksdict's ``items()``) end
quietly where they meet one, so every scan statekit makes checks how it ended and raises
CorruptCheckpointError instead of reading on as if the state ended there."""

import glob
import os

import pytest
from rocksdict import Options, Rdict

from statekit.backends.rocksdb.encoding import grouped
from statekit.errors import CorruptCheckpointError
from statekit.serde.types import Types
from statekit.state.descriptors import ListStateDescriptor, MapStateDescriptor
from tests.backends.test_rocksdb import keyed
from tests.backends.test_rocksdb_changelog import rocks


def _damage(sst: str) -> None:
    """Overwrite bytes in the middle of an SST file (a data block; its size is unchanged)."""
    size = os.path.getsize(sst)
    with open(sst, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\xff" * 64)


def test_a_scan_of_a_damaged_database_is_an_error_not_a_shorter_state(tmp_path):
    path = str(tmp_path / "db")
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    db = Rdict(path, opts)
    for i in range(20_000):
        db.put((i % 128).to_bytes(2, "big") + b"k%06d" % i, os.urandom(200))
    db.flush()
    db.close()
    assert len(list(Rdict(path, Options(raw_mode=True)).items())) == 20_000  # (then closed)
    (sst,) = glob.glob(f"{path}/*.sst")
    _damage(sst)
    db = Rdict(path, Options(raw_mode=True))
    try:
        assert 0 < sum(1 for _ in db.items()) < 20_000  # rocksdict's own scan: quietly short
        for start, end in ((b"", None), ((1).to_bytes(2, "big"), None),
                           ((1).to_bytes(2, "big"), (127).to_bytes(2, "big"))):
            with pytest.raises(CorruptCheckpointError, match="unreadable"):
                list(grouped(db, "value", start, end))
    finally:
        db.close()


def test_reading_state_from_a_damaged_file_is_an_error(tmp_path):
    backend = rocks(changelog=False)
    kb = keyed(backend)
    lst = kb.get_partitioned_state(ListStateDescriptor("l", Types.LONG()))
    m = kb.get_partitioned_state(MapStateDescriptor("m", Types.LONG(), Types.STRING()))
    try:
        kb.set_current_key("only")
        for i in range(6_000):
            lst.add(i)
            m.put(i, os.urandom(100).hex())
        kb.db.flush()
        for cf in kb.cfs.values():
            cf.flush()
        ssts = glob.glob(f"{kb.db_path}/*.sst")
        assert ssts
        for sst in ssts:
            _damage(sst)
        kb.db.close()
        kb.cfs.clear()
        kb.db = None
        lst = kb.get_partitioned_state(ListStateDescriptor("l", Types.LONG()))
        m = kb.get_partitioned_state(MapStateDescriptor("m", Types.LONG(), Types.STRING()))
        kb.set_current_key("only")
        for read in (lst.get, m.keys, lambda: list(m.items())):
            with pytest.raises(CorruptCheckpointError):
                read()
    finally:
        kb.dispose()
