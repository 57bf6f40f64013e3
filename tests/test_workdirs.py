"""Working directories end with their owner: removed on close or exit, swept once the owner is
dead (however it died), never while it lives."""

import os
import subprocess
import sys
import time

from statekit import workdirs
from statekit.backends.rocksdb.factory import _database_open

CREATE = ("import sys, time, os; from statekit import workdirs; "
          "p = workdirs.create(sys.argv[1], 'op-'); print(p, flush=True); ")


def owner(root, then):
    """A process that creates a directory under ``root`` and then runs ``then``."""
    proc = subprocess.Popen([sys.executable, "-c", CREATE + then, str(root)],
                            stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def test_a_killed_owners_directory_is_swept_a_live_ones_is_not(tmp_path):
    live, live_dir = owner(tmp_path, "time.sleep(60)")
    dead, dead_dir = owner(tmp_path, "os._exit(0)")  # no clean-up, as after SIGKILL
    dead.wait()
    try:
        assert os.path.isdir(dead_dir) and os.path.isdir(live_dir)
        assert workdirs.sweep(tmp_path, "op-") == [type(tmp_path)(dead_dir)]
        assert not os.path.exists(dead_dir) and not os.path.exists(dead_dir + ".lock")
        assert os.path.isdir(live_dir)
    finally:
        live.kill()
        live.wait()
    assert workdirs.sweep(tmp_path) == [type(tmp_path)(live_dir)]
    assert os.listdir(tmp_path) == []


def test_the_owner_removes_its_directories_on_close_and_at_exit(tmp_path):
    path = workdirs.create(tmp_path, "x-")
    workdirs.remove(path)
    assert os.listdir(tmp_path) == []
    done = subprocess.run([sys.executable, "-c", CREATE, str(tmp_path)], capture_output=True,
                          text=True, check=True)
    assert not os.path.exists(done.stdout.strip()) and os.listdir(tmp_path) == []


def test_directories_of_earlier_versions_are_swept_unless_their_database_is_open(tmp_path):
    idle, busy = tmp_path / "op-kg0-127-0123456789ab", tmp_path / "op-kg0-127-ba9876543210"
    for path in (idle, busy):
        (path / "db").mkdir(parents=True)
        (path / "db" / "LOCK").write_bytes(b"")
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
        "fcntl.lockf(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)"),
        str(busy / "db" / "LOCK")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert _database_open(busy) and not _database_open(idle)
        removed = workdirs.sweep_unowned(tmp_path, r".+-kg\d+-\d+-[0-9a-f]{12}", 600,
                                         _database_open)
        assert removed == [idle] and busy.is_dir()
    finally:
        holder.kill()
        holder.wait()


def test_the_shared_root_goes_with_its_last_directory(tmp_path):
    """``statekit-rocksdb`` is statekit's own root: removed once empty; a root of another name
    (one the user configured) stays."""
    shared, own = tmp_path / "statekit-rocksdb", tmp_path / "my-rocksdb"
    first, second = workdirs.create(shared, "a-"), workdirs.create(shared, "b-")
    mine = workdirs.create(own, "a-")
    workdirs.remove(first)
    assert shared.is_dir()  # the other owner's directory is still in it
    workdirs.remove(second)
    workdirs.remove(mine)
    assert not shared.exists() and own.is_dir()
    again = workdirs.create(shared, "c-")  # made again when needed
    assert again.is_dir()
    workdirs.remove(again)


def test_a_sweep_that_empties_the_shared_root_removes_it(tmp_path):
    shared = tmp_path / "statekit-rocksdb"
    proc, path = owner(shared, "os._exit(0)")  # dies without cleaning up
    proc.wait(timeout=60)
    assert os.path.isdir(path)
    assert [str(p) for p in workdirs.sweep(shared)] == [path]
    assert not shared.exists()
