"""Quick self-check of the disk profiles (< 30 s).

Run:  .venv/bin/python -m pytest benchmarks/diskprofiles -q

Timing assertions are one-sided on purpose: the shim *sleeps until* a
modelled completion time, so an injected delay is a hard lower bound on the
measured latency (and modelled bandwidth an upper bound on throughput), no
matter how noisy the machine is. Nothing here asserts that the machine is
fast, except "nvme beats sata-ssd" on fdatasync, where the margin is ~4x.
Coverage of the intercepted calls is checked with the shim's exact counters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import probe  # noqa: E402
import profiles  # noqa: E402

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or profiles.shutil.which("gcc") is None,
    reason="needs Linux + gcc",
)

SIZE_MB = 8
BUDGET = 0.3


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    base = tmp_path_factory.mktemp("probe")
    return {
        name: probe.measure(name, base, size_mb=SIZE_MB, budget=BUDGET) for name in profiles.PROFILE_NAMES
    }


def test_build_shim_is_cached(tmp_path):
    so = profiles.build_shim(tmp_path)
    assert so.exists() and so.suffix == ".so"
    mtime = so.stat().st_mtime_ns
    assert profiles.build_shim(tmp_path) == so
    assert so.stat().st_mtime_ns == mtime


def test_profile_env_shapes(tmp_path):
    assert profiles.profile_env("nvme", tmp_path) == {"STATEKIT_DISK_PROFILE": "nvme"}
    env = profiles.profile_env("hdd-7200", [tmp_path / "work", tmp_path / "ckpt"])
    assert "libiodelay" in env["LD_PRELOAD"]
    assert env["IODELAY_PREFIX"].split(":") == [
        os.path.realpath(tmp_path / "work"),
        os.path.realpath(tmp_path / "ckpt"),
    ]
    assert env["IODELAY_SEEK_US"] == str(profiles.HDD_7200.seek_us)
    assert env["IODELAY_SERIAL"] == "1"
    with pytest.raises(ValueError):
        profiles.profile_env("floppy", tmp_path)


COVERAGE_SCRIPT = textwrap.dedent(
    """
    import os, shutil, sys
    inside, outside = sys.argv[1], sys.argv[2]
    p = os.path.join(inside, "f")
    with open(p, "wb") as f:                 # open + write (Python buffered I/O)
        f.write(b"a" * 10000)
        f.flush()
        os.fsync(f.fileno())                  # fsync
    fd = os.open(p, os.O_RDWR)
    os.pwrite(fd, b"b" * 100, 0)              # pwrite64
    os.writev(fd, [b"c" * 10, b"d" * 10])     # writev
    os.fdatasync(fd)                          # fdatasync
    os.pread(fd, 100, 0)                      # pread64
    os.lseek(fd, 0, 0)
    os.read(fd, 100)                          # read
    os.readv(fd, [bytearray(50)])             # readv
    fd2 = os.dup(fd)                          # dup -> still tracked
    os.pread(fd2, 10, 0)
    os.close(fd2)
    os.close(fd)
    with open(p, "rb") as f:
        f.read()                              # read() until EOF
    shutil.copyfile(p, os.path.join(outside, "copy"))  # sendfile, read side tracked
    # fd reuse: an untracked file that gets the number of a closed tracked fd
    fd = os.open(p, os.O_RDONLY); os.close(fd)
    fd3 = os.open(os.path.join(outside, "copy"), os.O_RDONLY)
    assert fd3 == fd
    os.read(fd3, 100)
    os.close(fd3)
    with open(os.path.join(outside, "g"), "wb") as f:   # outside: not counted
        f.write(b"x" * 5000)
        os.fsync(f.fileno())
    """
)


def test_shim_covers_python_io(tmp_path):
    inside, outside = tmp_path / "in", tmp_path / "out"
    inside.mkdir()
    outside.mkdir()
    stats = tmp_path / "stats.jsonl"
    fast = profiles.SATA_SSD.with_overrides(
        name="test", read_lat_us=1, write_lat_us=1, fsync_lat_us=1, read_mbps=0, write_mbps=0
    )
    env = profiles.subprocess_env(fast, inside, stats_path=stats)
    argv = [sys.executable, "-c", COVERAGE_SCRIPT, str(inside), str(outside)]
    try:
        subprocess.run(argv, env=env, check=True)
    finally:
        profiles.remove_device_state(env["IODELAY_SHM"])
    (s,) = [json.loads(x) for x in stats.read_text().splitlines()]
    assert s["opens"] == 5  # open(wb), os.open, open(rb), sendfile src, reuse probe
    assert s["write_ops"] == 3 and s["write_bytes"] == 10000 + 100 + 20  # writev overwrites at 0
    assert s["sync_ops"] == 2
    # pread 100 + read 100 + readv 50 + dup pread 10 + read-to-EOF 10000 + sendfile 10000
    assert s["read_bytes"] == 100 + 100 + 50 + 10 + 10000 + 10000
    assert s["mmaps"] == 0


def test_hdd_lower_bounds(results):
    r, p = results["hdd-7200"], profiles.HDD_7200
    assert r["rand_read_p50_us"] >= 5000
    assert r["rand_read_p50_us"] >= 0.97 * p.random_read_us
    assert r["fdatasync_p50_ms"] >= 0.97 * p.fsync_lat_us / 1000
    assert r["seq_read_MBps"] <= 1.03 * p.read_mbps
    assert r["seq_write_MBps"] <= 1.03 * p.write_mbps
    # every get misses (no block cache) and pays a seek
    assert r["rocksdb_gets_per_s"] <= 1.2 * 1e6 / p.seek_us
    (s,) = r["shim_stats"]
    assert s["mmaps"] == 0  # RocksDB reads with pread, not mmap
    assert s["seeks"] >= r["rand_read_ops"] + r["rocksdb_gets"] * 0.9


def test_sata_ssd_lower_bounds(results):
    r, p = results["sata-ssd"], profiles.SATA_SSD
    assert r["seq_write_MBps"] <= 700
    assert r["seq_write_MBps"] <= 1.03 * p.write_mbps
    assert r["seq_read_MBps"] <= 1.03 * p.read_mbps
    assert r["rand_read_p50_us"] >= 0.97 * p.random_read_us
    assert r["fdatasync_p50_ms"] >= 0.97 * p.fsync_lat_us / 1000
    assert r["rocksdb_gets_per_s"] <= 1e6 / p.read_lat_us
    (s,) = r["shim_stats"]
    assert s["mmaps"] == 0 and s["read_ops"] >= r["rocksdb_gets"]


def test_nvme_is_unshimmed_and_faster(results):
    n, s, h = results["nvme"], results["sata-ssd"], results["hdd-7200"]
    assert "shim_stats" not in n
    # Best-case latencies: the shimmed minimum is bounded below by the model,
    # the real disk's minimum over many samples is robust to CPU contention.
    assert n["fdatasync_min_ms"] < s["fdatasync_min_ms"] < h["fdatasync_min_ms"]
    assert n["rand_read_min_us"] < s["rand_read_min_us"] < h["rand_read_min_us"]


@pytest.mark.skipif(not profiles.loop_device_supported()[0], reason="no root / cgroup-v1 blkio")
def test_loop_device_profile_setup_and_teardown():
    with profiles.loop_device_profile("hdd-7200", size_mb=64) as dev:
        assert os.path.ismount(dev.mountpoint)
        rd = (dev.cgroup / "blkio.throttle.read_bps_device").read_text().split()
        assert rd == [dev.major_minor, str(int(profiles.HDD_7200.read_mbps * 1e6))]
        cg = dev.cgroup
        mnt = dev.mountpoint
    assert not cg.exists()
    assert not os.path.ismount(mnt)


def test_fsspec_wrapper_lower_bounds(tmp_path):
    import time

    import fsspec
    from fsspec_throttle import ThrottledFileSystem

    p = profiles.HDD_7200
    fs = ThrottledFileSystem(
        p, path=str(tmp_path), fs=fsspec.filesystem("file", auto_mkdir=True), fsync_on_close=True
    )
    data = os.urandom(2 << 20)
    t = time.perf_counter()
    fs.pipe_file("chk-1/state.bin", data)
    dt = time.perf_counter() - t
    assert dt >= 0.97 * (len(data) / (p.write_mbps * 1e6) + (p.seek_us + p.fsync_lat_us) * 1e-6)
    t = time.perf_counter()
    assert fs.cat_file("chk-1/state.bin", 1000, 1100) == data[1000:1100]
    assert time.perf_counter() - t >= 0.97 * p.seek_us * 1e-6
    assert fs.cat_file("chk-1/state.bin") == data
