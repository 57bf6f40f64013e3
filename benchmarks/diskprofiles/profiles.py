"""Physical disk profiles for statekit benchmarks.

Three profiles, ``nvme``, ``sata-ssd`` and ``hdd-7200``. ``nvme`` is the real
disk of the benchmark machine (no slowdown). The two slower ones are made
*physical* by running the benchmark in a subprocess with the ``libiodelay.so``
LD_PRELOAD shim (``iodelay.c`` next to this file): each read / write / fsync
that the subprocess issues on a file under the benchmark's working or
checkpoint directory takes as long as it would on the simulated device
(latency + bytes / bandwidth, plus a seek model for the HDD). See README.md.

Typical use from a benchmark driver::

    from benchmarks.diskprofiles.profiles import subprocess_env
    env = subprocess_env("hdd-7200", [workdir, checkpoint_dir])
    subprocess.run([sys.executable, "-m", "my_bench", ...], env=env, check=True)

Only the standard library is needed (plus gcc to build the shim once).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Union

HERE = Path(__file__).resolve().parent
SHIM_SOURCE = HERE / "iodelay.c"

PathLike = Union[str, "os.PathLike[str]"]

# ---------------------------------------------------------------------------
# profiles


@dataclasses.dataclass(frozen=True)
class Profile:
    """Parameters of one simulated disk (all latencies in microseconds)."""

    name: str
    description: str
    read_lat_us: int = 0  # per-op latency of a read (SSD-style, overlappable)
    write_lat_us: int = 0  # per-op latency of a write
    fsync_lat_us: int = 0  # fsync / fdatasync latency
    seek_us: int = 0  # HDD positioning (seek + rotation) for non-sequential ops
    read_mbps: float = 0.0  # MB/s (1e6 B/s); 0 = unlimited
    write_mbps: float = 0.0
    serial: bool = False  # device serves one op at a time (HDD: one head)
    uses_shim: bool = True  # False: the real disk, no delay injected
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)

    # Expected random 4 KiB read latency (us) under the model.
    @property
    def random_read_us(self) -> float:
        xfer = 4096 / (self.read_mbps * 1e6) * 1e6 if self.read_mbps else 0.0
        return self.seek_us + self.read_lat_us + xfer

    def with_overrides(self, **kw) -> Profile:
        return dataclasses.replace(self, **kw)


# The real disk of the benchmark machine, measured with fio as root:
# 2.5 GB/s sequential write, 23 us 4k random read (QD1, O_DIRECT),
# 0.35 ms fdatasync.  No shim: its numbers are whatever the disk delivers.
NVME = Profile(
    name="nvme",
    description="the machine's real NVMe-class disk (virtio /dev/vda); no injected delay",
    uses_shim=False,
    sources={
        "all": "the real disk; fio on this machine: 2.5 GB/s seq write, 23 us 4k "
        "random read (QD1), 0.35 ms fdatasync (see README 'Measured')",
    },
)

# Samsung 870 EVO (SATA 6 Gb/s, MLC/TLC V-NAND), the archetypal SATA SSD.
SATA_SSD = Profile(
    name="sata-ssd",
    description="SATA SSD (Samsung 870 EVO class)",
    read_lat_us=77,  # 4 KiB QD1 random read 13,000 IOPS -> 1e6/13000 = 77 us
    write_lat_us=28,  # 4 KiB QD1 random write 36,000 IOPS -> 1e6/36000 = 28 us
    fsync_lat_us=1000,  # cache flush without power-loss protection: ~1 ms (estimate)
    read_mbps=560,  # sequential read "up to 560 MB/s"
    write_mbps=530,  # sequential write "up to 530 MB/s"
    serial=False,  # internal parallelism: latencies overlap, bandwidth is shared
    sources={
        "read_mbps, write_mbps": "Samsung 870 EVO data sheet (2021): sequential "
        "read up to 560 MB/s, sequential write up to 530 MB/s",
        "read_lat_us": "Samsung 870 EVO data sheet: random read 4KB QD1 up to 13,000 IOPS -> 77 us per op",
        "write_lat_us": "Samsung 870 EVO data sheet: random write 4KB QD1 up to 36,000 IOPS -> 28 us per op",
        "fsync_lat_us": "engineering estimate, no data sheet gives it: a consumer "
        "SATA SSD without power-loss protection must flush its volatile write "
        "cache (ATA FLUSH CACHE) on fdatasync; published fio --fdatasync=1 runs "
        "on such drives are typically 0.5-3 ms; 1 ms chosen",
    },
)

# 7200 rpm 3.5" desktop drive (Seagate Barracuda / WD Blue class).
HDD_7200 = Profile(
    name="hdd-7200",
    description="7200 rpm SATA hard disk (Seagate BarraCuda / WD Blue class)",
    seek_us=12670,  # 8.5 ms average seek + 4.17 ms average rotational latency
    fsync_lat_us=12670,  # a flush needs one positioning op (journal commit)
    read_mbps=180,
    write_mbps=180,
    serial=True,  # one head: ops queue behind each other
    sources={
        "seek_us": "average seek 8.5 ms (read) from 7200 rpm desktop drive data "
        "sheets, e.g. Seagate Barracuda 7200.12 'average seek, read <8.5 ms'; "
        "+ average rotational latency = half a revolution = 60 s / 7200 / 2 = "
        "4.17 ms; total 12.67 ms per non-sequential op",
        "read_mbps, write_mbps": "sustained sequential transfer of current 7200 "
        "rpm desktop drives is ~200-220 MB/s on outer tracks falling to ~100 MB/s "
        "on inner tracks (e.g. Seagate BarraCuda ST2000DM008 'up to 220 MB/s'); "
        "180 MB/s chosen as a typical average",
        "fsync_lat_us": "model choice: fdatasync on ext4 forces a journal commit + "
        "FLUSH CACHE, i.e. at least one positioning op; = seek + rotation",
    },
)

PROFILES: dict[str, Profile] = {p.name: p for p in (NVME, SATA_SSD, HDD_7200)}
PROFILE_NAMES: tuple[str, ...] = tuple(PROFILES)


def get_profile(profile: str | Profile) -> Profile:
    if isinstance(profile, Profile):
        return profile
    try:
        return PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown disk profile {profile!r}; known: {', '.join(PROFILES)}") from None


# ---------------------------------------------------------------------------
# shim build


def default_cache_dir() -> Path:
    base = os.environ.get("STATEKIT_DISKPROFILE_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "statekit" / "diskprofiles"


def build_shim(cache_dir: PathLike | None = None, *, force: bool = False, cc: str | None = None) -> Path:
    """Compile ``iodelay.c`` into ``<cache_dir>/libiodelay-<hash>.so`` if missing.

    The file name contains a hash of the source, so editing iodelay.c triggers a
    rebuild. Safe to call concurrently (atomic rename). Returns the .so path.
    """
    src = SHIM_SOURCE.read_bytes()
    digest = hashlib.sha256(src).hexdigest()[:16]
    out_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = out_dir / f"libiodelay-{digest}.so"
    if out.exists() and not force:
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    cc = cc or os.environ.get("CC") or "gcc"
    if shutil.which(cc) is None:
        raise RuntimeError(f"cannot build the iodelay shim: compiler {cc!r} not found")
    fd, tmp = tempfile.mkstemp(prefix=".libiodelay-", suffix=".so", dir=out_dir)
    os.close(fd)
    cmd = [cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", tmp, str(SHIM_SOURCE), "-ldl", "-lpthread"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building the iodelay shim failed:\n$ {' '.join(cmd)}\n{proc.stderr}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


# ---------------------------------------------------------------------------
# environment for a subprocess


def _canon_prefixes(prefix: PathLike | Iterable[PathLike]) -> list[str]:
    items = [prefix] if isinstance(prefix, (str, os.PathLike)) else list(prefix)
    out = []
    for p in items:
        s = os.fspath(p)
        if not s:
            raise ValueError("empty path prefix")
        if ":" in s:
            raise ValueError(f"path prefix may not contain ':': {s!r}")
        out.append(os.path.realpath(s))
    if not out:
        raise ValueError("at least one path prefix is required")
    return out


def profile_env(
    profile: str | Profile,
    prefix: PathLike | Sequence[PathLike],
    *,
    stats_path: PathLike | None = None,
    device: str | None = None,
    cache_dir: PathLike | None = None,
    base_ld_preload: str | None = None,
) -> dict[str, str]:
    """Environment variables that put a *subprocess* on the given disk profile.

    ``prefix``: the directory (or directories, e.g. ``[workdir, checkpoint_dir]``)
    whose files get the profile's latency/bandwidth; everything else runs at
    full speed. Paths are canonicalised (symlinks resolved); they need not exist
    yet, but a symlink created later inside them will not be followed.

    ``device``: name of the simulated device. All processes using the same name
    share one device (one bandwidth budget, one queue, one HDD head) -- including
    forked/spawned children such as Spark Python workers. Default: derived from
    the profile name and the prefixes.

    ``stats_path``: if given, each process that touched a tracked file appends a
    JSON line of counters (ops, bytes, injected delay, mmaps) there at exit.

    Returns only the variables to add; merge them into a copy of ``os.environ``
    (or use :func:`subprocess_env`). For ``nvme`` (no shim) the dict only
    carries the ``STATEKIT_DISK_PROFILE`` label.
    """
    prof = get_profile(profile)
    prefixes = _canon_prefixes(prefix)
    env = {"STATEKIT_DISK_PROFILE": prof.name}
    if not prof.uses_shim:
        return env
    so = build_shim(cache_dir)
    existing = base_ld_preload if base_ld_preload is not None else os.environ.get("LD_PRELOAD", "")
    existing = " ".join(x for x in existing.replace(":", " ").split() if "libiodelay" not in x)
    if device is None:
        h = hashlib.sha1(("\0".join(prefixes)).encode()).hexdigest()[:10]
        device = f"iodelay-{prof.name}-{os.getuid()}-{h}"
    env.update(
        {
            "LD_PRELOAD": f"{so} {existing}".strip(),
            "IODELAY_PREFIX": ":".join(prefixes),
            "IODELAY_READ_LAT_US": str(int(prof.read_lat_us)),
            "IODELAY_WRITE_LAT_US": str(int(prof.write_lat_us)),
            "IODELAY_FSYNC_LAT_US": str(int(prof.fsync_lat_us)),
            "IODELAY_SEEK_US": str(int(prof.seek_us)),
            "IODELAY_READ_MBPS": repr(float(prof.read_mbps)),
            "IODELAY_WRITE_MBPS": repr(float(prof.write_mbps)),
            "IODELAY_SERIAL": "1" if prof.serial else "0",
            "IODELAY_SHM": device,
        }
    )
    if stats_path is not None:
        env["IODELAY_STATS"] = os.fspath(stats_path)
    return env


def subprocess_env(
    profile: str | Profile,
    prefix: PathLike | Sequence[PathLike],
    base: Mapping[str, str] | None = None,
    **kw,
) -> dict[str, str]:
    """A complete environment (``base`` or ``os.environ`` + :func:`profile_env`)."""
    env = dict(os.environ if base is None else base)
    env.update(profile_env(profile, prefix, base_ld_preload=env.get("LD_PRELOAD", ""), **kw))
    return env


def run_under_profile(
    profile: str | Profile,
    prefix: PathLike | Sequence[PathLike],
    argv: Sequence[str],
    *,
    stats_path: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    **run_kw,
) -> subprocess.CompletedProcess:
    """``subprocess.run(argv)`` with the profile applied to ``prefix``."""
    full_env = subprocess_env(profile, prefix, base=env, stats_path=stats_path)
    return subprocess.run(list(argv), env=full_env, **run_kw)


def remove_device_state(device: str) -> None:
    """Unlink the shared-memory device state (``/dev/shm/<device>``), if any."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join("/dev/shm", device.lstrip("/")))


# ---------------------------------------------------------------------------
# optional: cgroup-v1 blkio throttling of a file-backed loop device


BLKIO_ROOT = Path("/sys/fs/cgroup/blkio")


def loop_device_supported() -> tuple[bool, str]:
    """Whether :func:`loop_device_profile` can work here (root, cgroup-v1 blkio, tools)."""
    if os.geteuid() != 0:
        return False, "needs root"
    if not (BLKIO_ROOT / "blkio.throttle.read_iops_device").exists():
        return False, f"{BLKIO_ROOT} (cgroup v1 blkio throttling) not available"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return False, f"{tool} not found"
    return True, "ok"


@dataclasses.dataclass
class LoopDevice:
    mountpoint: Path
    loop: str
    major_minor: str
    cgroup: Path

    def join(self, pid: int | None = None) -> None:
        """Move a process (default: the caller) into the throttled cgroup."""
        (self.cgroup / "cgroup.procs").write_text(f"{pid or os.getpid()}\n")

    def preexec_fn(self):
        """For ``subprocess.Popen(preexec_fn=...)``: the child joins the cgroup."""
        path = str(self.cgroup / "cgroup.procs")

        def _join():
            with open(path, "w") as f:
                f.write(str(os.getpid()))

        return _join


@contextlib.contextmanager
def loop_device_profile(
    profile: str | Profile,
    *,
    size_mb: int = 1024,
    image_dir: PathLike = "/var/tmp",
    mountpoint: PathLike | None = None,
) -> Iterator[LoopDevice]:
    """Alternative, kernel-side profile: an ext4 loop device throttled with blkio.

    Creates a sparse image file, attaches it as a loop device with direct I/O
    (no double caching), formats and mounts it, and creates a cgroup-v1 blkio
    group with ``blkio.throttle.{read,write}_{bps,iops}_device`` set from the
    profile (IOPS = 1e6 / per-op latency). Only I/O issued by processes *in
    that cgroup* is throttled: run the benchmark with ``preexec_fn=dev.preexec_fn()``.

    Caveats (measured on this machine, see README): blkio throttling is a rate
    limiter, not a latency model -- IOPS and MB/s averages hold, but single ops
    are released in bursts per 100 ms slice (p50 4k read 0.17 ms at 150 IOPS);
    page-cache hits are never throttled; cgroup-v1 does not attribute background
    (flusher-thread) writeback to the cgroup, so only writes the process itself
    pushes out (fsync/fdatasync, O_DIRECT) are throttled. The LD_PRELOAD shim
    (:func:`profile_env`) is therefore the primary mechanism.
    """
    ok, why = loop_device_supported()
    if not ok:
        raise RuntimeError(f"loop_device_profile unavailable: {why}")
    prof = get_profile(profile)
    stack = contextlib.ExitStack()
    with stack:
        img_fd, img = tempfile.mkstemp(prefix=f"statekit-{prof.name}-", suffix=".img", dir=image_dir)
        os.close(img_fd)
        stack.callback(os.unlink, img)
        os.truncate(img, size_mb * 1024 * 1024)
        loop = subprocess.run(
            ["losetup", "--find", "--show", "--direct-io=on", img], check=True, capture_output=True, text=True
        ).stdout.strip()
        stack.callback(subprocess.run, ["losetup", "-d", loop], check=False)
        subprocess.run(["mkfs.ext4", "-q", "-F", loop], check=True, capture_output=True)
        if mountpoint is None:
            mnt = Path(tempfile.mkdtemp(prefix=f"statekit-{prof.name}-mnt-"))
            stack.callback(os.rmdir, mnt)
        else:
            mnt = Path(mountpoint)
            mnt.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", loop, str(mnt)], check=True, capture_output=True)
        stack.callback(subprocess.run, ["umount", str(mnt)], check=False)
        mm = Path(f"/sys/block/{os.path.basename(loop)}/dev").read_text().strip()
        cg = BLKIO_ROOT / f"statekit-{prof.name}-{os.getpid()}-{os.path.basename(loop)}"
        cg.mkdir()

        def _rm_cgroup():
            # move stragglers back to the root group, then remove
            with contextlib.suppress(OSError):
                for pid in (cg / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        (BLKIO_ROOT / "cgroup.procs").write_text(pid)
            with contextlib.suppress(OSError):
                cg.rmdir()

        stack.callback(_rm_cgroup)
        settings = {}
        if prof.uses_shim:
            rl = prof.seek_us + prof.read_lat_us
            wl = prof.seek_us + prof.write_lat_us
            if rl:
                settings["blkio.throttle.read_iops_device"] = int(1e6 / rl)
            if wl:
                settings["blkio.throttle.write_iops_device"] = int(1e6 / wl)
            if prof.read_mbps:
                settings["blkio.throttle.read_bps_device"] = int(prof.read_mbps * 1e6)
            if prof.write_mbps:
                settings["blkio.throttle.write_bps_device"] = int(prof.write_mbps * 1e6)
        for k, v in settings.items():
            (cg / k).write_text(f"{mm} {v}\n")
        yield LoopDevice(mountpoint=mnt, loop=loop, major_minor=mm, cgroup=cg)


if __name__ == "__main__":  # pragma: no cover - small CLI
    import json

    if len(sys.argv) >= 3:
        print(json.dumps(profile_env(sys.argv[1], sys.argv[2:]), indent=2))
    else:
        for p in PROFILES.values():
            print(f"{p.name:10s} {p.description}")
            for k, v in p.sources.items():
                print(f"    {k}: {v}")
        print("\nusage: python profiles.py PROFILE DIR [DIR...]   -> env vars as JSON")
