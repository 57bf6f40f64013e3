"""fio-like self-check of the disk profiles.

For each profile a worker subprocess is started *under that profile*
(``profiles.subprocess_env``) and measures, on files inside the profile's
directory:

* sequential write MB/s   (1 MiB buffered writes + fdatasync, timed together)
* sequential read MB/s    (1 MiB O_DIRECT reads; page cache dropped first)
* 4 KiB random read       (O_DIRECT pread, QD1; p50/p99 in us)
* fdatasync latency      (4 KiB append + fdatasync, only the fdatasync timed; p50 ms)
* rocksdict random gets/s (50k-key DB, raw mode, block cache disabled,
                           use_direct_reads, so every miss is a pread)

Usage::

    python benchmarks/diskprofiles/probe.py                 # all profiles, table + JSON
    python -m benchmarks.diskprofiles.probe --profiles hdd-7200 --json out.json
    python benchmarks/diskprofiles/probe.py --loop          # also the blkio loop-device variant

Each measurement loop is time-budgeted (``--budget`` seconds, with a minimum
op count), so the slow profiles finish quickly.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:  # imported as a package module
    from . import profiles as _profiles
except ImportError:  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import profiles as _profiles  # type: ignore[no-redef]

MiB = 1024 * 1024
N_KEYS = 50_000


# ---------------------------------------------------------------------------
# worker side (runs inside the profiled subprocess)


def _pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
    return xs[i]


def _budget_loop(fn, budget_s, min_ops, max_ops):
    lat = []
    t_end = time.perf_counter() + budget_s
    while len(lat) < max_ops and (len(lat) < min_ops or time.perf_counter() < t_end):
        lat.append(fn())
    return lat


def _open_direct(path, flags):
    try:
        return os.open(path, flags | os.O_DIRECT), True
    except OSError:
        return os.open(path, flags), False


def worker(d: Path, size_mb: int, budget: float, do_rocksdb: bool) -> dict:
    d.mkdir(parents=True, exist_ok=True)
    res: dict = {"profile": os.environ.get("STATEKIT_DISK_PROFILE", "?"), "pid": os.getpid()}
    chunk = os.urandom(MiB)
    path = str(d / "seqfile")

    # -- sequential write (+ fdatasync at the end)
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for _ in range(size_mb):
        os.write(fd, chunk)
    os.fdatasync(fd)
    dt = time.perf_counter() - t
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    res["seq_write_MBps"] = size_mb * MiB / 1e6 / dt

    # -- sequential read, bypassing the page cache
    fd, direct = _open_direct(path, os.O_RDONLY)
    if not direct:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    buf = mmap.mmap(-1, MiB)  # page aligned, as O_DIRECT needs
    t = time.perf_counter()
    off = 0
    while True:
        n = os.preadv(fd, [buf], off)
        if n <= 0:
            break
        off += n
    dt = time.perf_counter() - t
    res["seq_read_MBps"] = off / 1e6 / dt
    res["o_direct"] = direct

    # -- 4 KiB random reads, QD1
    buf4 = mmap.mmap(-1, 4096)
    nblocks = size_mb * MiB // 4096
    rnd = random.Random(42)

    def one_read():
        o = rnd.randrange(nblocks) * 4096
        t0 = time.perf_counter()
        os.preadv(fd, [buf4], o)
        return time.perf_counter() - t0

    lat = _budget_loop(one_read, budget, 30, 5000)
    os.close(fd)
    res["rand_read_ops"] = len(lat)
    res["rand_read_p50_us"] = _pct(lat, 0.5) * 1e6
    res["rand_read_p99_us"] = _pct(lat, 0.99) * 1e6
    res["rand_read_mean_us"] = statistics.fmean(lat) * 1e6
    res["rand_read_min_us"] = min(lat) * 1e6

    # -- fdatasync latency (append 4 KiB, then time only the fdatasync)
    fd = os.open(str(d / "syncfile"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    small = os.urandom(4096)

    def one_sync():
        os.write(fd, small)
        t0 = time.perf_counter()
        os.fdatasync(fd)
        return time.perf_counter() - t0

    lat = _budget_loop(one_sync, budget, 10, 1000)
    os.close(fd)
    res["fdatasync_ops"] = len(lat)
    res["fdatasync_p50_ms"] = _pct(lat, 0.5) * 1e3
    res["fdatasync_min_ms"] = min(lat) * 1e3
    os.unlink(path)
    os.unlink(str(d / "syncfile"))

    # -- rocksdict random gets (DB was built, unthrottled, by the parent)
    if do_rocksdb and (d / "db").exists():
        from rocksdict import BlockBasedOptions, Options, Rdict

        def mkopts():
            opts = Options(raw_mode=True)
            bbo = BlockBasedOptions()
            bbo.disable_cache()  # no block cache: every get reads its data block
            opts.set_block_based_table_factory(bbo)
            opts.set_use_direct_reads(True)
            return opts

        # NB: when re-opening an existing DB, rocksdict takes the column
        # family options from the stored OPTIONS file unless they are passed
        # explicitly -- without column_families= the table options (block
        # cache!) above would be silently ignored (8 MiB default cache).
        db = Rdict(str(d / "db"), mkopts(), column_families={"default": mkopts()})
        rk = random.Random(7)
        n = 0
        t = time.perf_counter()
        t_end = t + budget
        while n < 200_000 and (n < 50 or time.perf_counter() < t_end):
            for _ in range(10):
                v = db[b"key%08d" % rk.randrange(N_KEYS)]
                assert v is not None
            n += 10
        dt = time.perf_counter() - t
        db.close()
        res["rocksdb_gets"] = n
        res["rocksdb_gets_per_s"] = n / dt
    return res


def build_db(path: Path) -> None:
    """50k keys x 100 B values, flushed to SST; built without any profile."""
    from rocksdict import Options, Rdict

    if path.exists():
        shutil.rmtree(path)
    db = Rdict(str(path), Options(raw_mode=True))
    rnd = random.Random(1)
    for i in range(N_KEYS):
        db[b"key%08d" % i] = rnd.randbytes(100)
    db.flush()
    db.close()


# ---------------------------------------------------------------------------
# driver side


def measure(
    profile,
    base_dir: Path | str | None = None,
    *,
    size_mb: int = 64,
    budget: float = 1.5,
    rocksdb: bool = True,
    loop: bool = False,
    timeout: float = 300,
) -> dict:
    """Run the worker for one profile in a subprocess; return its results.

    ``loop=True`` uses the cgroup-v1 blkio loop device instead of the shim.
    """
    prof = _profiles.get_profile(profile)
    own_tmp = base_dir is None
    base = Path(tempfile.mkdtemp(prefix="diskprobe-")) if own_tmp else Path(base_dir)
    try:
        ctx = _profiles.loop_device_profile(prof, size_mb=max(256, 4 * size_mb)) if loop else None
        with ctx if ctx is not None else _nullctx() as dev:
            d = (dev.mountpoint if dev is not None else base) / prof.name
            d.mkdir(parents=True, exist_ok=True)
            if rocksdb:
                build_db(d / "db")
            stats = base / f"stats-{prof.name}{'-loop' if loop else ''}.jsonl"
            if stats.exists():
                stats.unlink()
            argv = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                str(d),
                "--size-mb",
                str(size_mb),
                "--budget",
                str(budget),
            ]
            if not rocksdb:
                argv.append("--no-rocksdb")
            if loop:
                env = dict(os.environ, STATEKIT_DISK_PROFILE=prof.name)
                env.pop("LD_PRELOAD", None)
                kw = {"preexec_fn": dev.preexec_fn()}
            else:
                env = _profiles.subprocess_env(prof, d, stats_path=stats)
                kw = {}
            t = time.perf_counter()
            try:
                proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, **kw)
            finally:
                if "IODELAY_SHM" in env:
                    _profiles.remove_device_state(env["IODELAY_SHM"])
            wall = time.perf_counter() - t
            if proc.returncode != 0:
                raise RuntimeError(f"probe worker for {prof.name} failed:\n{proc.stderr}")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            res["profile"] = prof.name + ("+loop" if loop else "")
            res["mechanism"] = "blkio-loop" if loop else ("shim" if prof.uses_shim else "real disk")
            res["wall_s"] = wall
            if stats.exists():
                lines = [json.loads(x) for x in stats.read_text().splitlines() if x.strip()]
                res["shim_stats"] = lines
            res["configured"] = {
                "read_lat_us": prof.read_lat_us,
                "write_lat_us": prof.write_lat_us,
                "fsync_lat_us": prof.fsync_lat_us,
                "seek_us": prof.seek_us,
                "read_mbps": prof.read_mbps,
                "write_mbps": prof.write_mbps,
                "serial": prof.serial,
                "expected_rand_read_us": prof.random_read_us,
            }
            if dev is not None:
                shutil.rmtree(d, ignore_errors=True)
            return res
    finally:
        if own_tmp:
            shutil.rmtree(base, ignore_errors=True)


class _nullctx:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def _median_of(runs: list[dict]) -> dict:
    """Per-metric median over repeated runs (noisy shared machines)."""
    if len(runs) == 1:
        return runs[0]
    out = dict(runs[-1])
    for k, v in runs[-1].items():
        if isinstance(v, float) and all(isinstance(r.get(k), float) for r in runs):
            out[k] = statistics.median(r[k] for r in runs)
    out["repeats"] = len(runs)
    out["runs"] = [{k: v for k, v in r.items() if isinstance(v, (int, float))} for r in runs]
    return out


def format_table(results: list[dict]) -> str:
    hdr = (
        "profile",
        "mechanism",
        "seq write MB/s",
        "seq read MB/s",
        "4k rand read p50 us",
        "fdatasync p50 ms",
        "rocksdict gets/s",
    )
    rows = []
    for r in results:
        rows.append(
            (
                r["profile"],
                r.get("mechanism", ""),
                f"{r['seq_write_MBps']:.0f}",
                f"{r['seq_read_MBps']:.0f}",
                f"{r['rand_read_p50_us']:.0f}",
                f"{r['fdatasync_p50_ms']:.2f}",
                f"{r['rocksdb_gets_per_s']:.0f}" if "rocksdb_gets_per_s" in r else "-",
            )
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(hdr)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [line(hdr), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def format_config_table() -> str:
    out = [
        "| profile | read lat us | write lat us | seek us | fsync us | read MB/s | write MB/s | serial |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in _profiles.PROFILES.values():
        if not p.uses_shim:
            out.append(f"| {p.name} | real disk | | | | | | |")
            continue
        out.append(
            f"| {p.name} | {p.read_lat_us} | {p.write_lat_us} | {p.seek_us} | {p.fsync_lat_us} | "
            f"{p.read_mbps:g} | {p.write_mbps:g} | {p.serial} |"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--profiles", default=",".join(_profiles.PROFILE_NAMES))
    ap.add_argument("--size-mb", type=int, default=64, help="sequential file size (default 64)")
    ap.add_argument("--budget", type=float, default=1.5, help="seconds per latency/gets loop (default 1.5)")
    ap.add_argument("--no-rocksdb", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="runs per profile; report per-metric medians")
    ap.add_argument("--loop", action="store_true", help="also measure the blkio loop-device variant")
    ap.add_argument("--dir", help="base directory for the probe files (default: a temp dir)")
    ap.add_argument(
        "--json",
        default=str(Path(__file__).resolve().parent / "probe_results.json"),
        help="write results here ('' = don't)",
    )
    a = ap.parse_args(argv)

    if a.worker:
        res = worker(Path(a.worker), a.size_mb, a.budget, not a.no_rocksdb)
        print(json.dumps(res))
        return 0

    names = [x for x in a.profiles.split(",") if x]
    jobs = [(n, False) for n in names]
    if a.loop:
        ok, why = _profiles.loop_device_supported()
        if ok:
            jobs += [(n, True) for n in names if _profiles.get_profile(n).uses_shim]
        else:
            print(f"  loop-device variant skipped: {why}", file=sys.stderr)
    results = []
    for name, loop in jobs:
        runs = []
        for _ in range(max(1, a.repeat)):
            runs.append(
                measure(name, a.dir, size_mb=a.size_mb, budget=a.budget, rocksdb=not a.no_rocksdb, loop=loop)
            )
        r = _median_of(runs)
        results.append(r)
        print(
            f"  {r['profile']}: {len(runs)} run(s), {sum(x['wall_s'] for x in runs):.1f} s", file=sys.stderr
        )
    print(format_table(results))
    if a.json:
        meta = {
            "host": os.uname().nodename,
            "kernel": os.uname().release,
            "cpus": os.cpu_count(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "size_mb": a.size_mb,
            "budget_s": a.budget,
            "repeat": a.repeat,
            "loadavg": os.getloadavg(),
        }
        Path(a.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
        print(f"\nwrote {a.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
