"""Turn a pytest-benchmark JSON of ``benchmarks/`` into ``docs/benchmarks.md`` tables + PNG plots.

    python -m benchmarks.report benchmarks/results/full.json --out docs/benchmarks.md --img-dir docs/img

Every figure is a ratio measured inside one run (library vs its baseline, interleaved round by
round, or checkpoint vs the raw disk measured in the same test), because the machine is shared.
``benchmarks/results/spark.json`` (the Spark end-to-end benchmark), when present, is included.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from benchmarks._common import TARGETS
from benchmarks._state_access import OPERATIONS
from benchmarks.report_bulk import section_bulk
from benchmarks.report_compat import section_compat
from benchmarks.report_remote import section_remote_restore
from benchmarks.report_timers import section_timers
from benchmarks.report_windows import section_windows

REPO = Path(__file__).resolve().parent.parent
DISKS = ["nvme", "sata-ssd", "hdd-7200"]
OPTIONS = ["DEFAULT", "FLASH_SSD_OPTIMIZED", "SPINNING_DISK_OPTIMIZED", "SPINNING_DISK_OPTIMIZED_HIGH_MEM"]
SHORT = {"DEFAULT": "DEFAULT", "FLASH_SSD_OPTIMIZED": "FLASH_SSD", "SPINNING_DISK_OPTIMIZED": "SPINNING",
         "SPINNING_DISK_OPTIMIZED_HIGH_MEM": "SPINNING_HIGH_MEM"}


# --- formatting --------------------------------------------------------------------------------------


def fmt_int(x: Any) -> str:
    return "-" if x is None else f"{round(x):,}"


def fmt_pct(x: Any, digits: int = 0) -> str:
    return "-" if x is None else f"{x * 100:.{digits}f} %"


def fmt_bytes(n: Any) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def fmt_s(x: Any) -> str:
    if x is None:
        return "-"
    if x < 0.01:
        return f"{x * 1000:.2f} ms"
    if x < 1:
        return f"{x * 1000:.0f} ms"
    return f"{x:.2f} s"


def verdict(value: Any, target: float) -> str:
    if value is None:
        return "not measured"
    return "**met**" if value >= target else "**missed**"


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


# --- loading -----------------------------------------------------------------------------------------


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def merged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first run, with the benchmarks of the later ones replacing (same name) or joining its
    own; each later benchmark keeps its run's date in ``extra_info['run']``."""
    data = dict(runs[0])
    benchmarks = {b["name"]: b for b in data.get("benchmarks", [])}
    for run in runs[1:]:
        for b in run.get("benchmarks", []):
            b = dict(b, extra_info={**b.get("extra_info", {}), "run": run.get("datetime")})
            benchmarks[b["name"]] = b
    data["benchmarks"] = list(benchmarks.values())
    return data


def by_test(data: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return [b for b in data.get("benchmarks", []) if b["name"].startswith(prefix)]


def access_rows(data: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    rows = {}
    for b in by_test(data, "test_heap_state_access") + by_test(data, "test_rocksdb_state_access"):
        e = b["extra_info"]
        if "op" in e:
            rows[(e["backend"], e["op"])] = e
    return rows


# --- sections ----------------------------------------------------------------------------------------


def section_access(data: dict[str, Any], img: Path, rel: str) -> tuple[str, dict[str, Any]]:
    rows = access_rows(data)
    if not rows:
        return "## State access matrix\n\nNot in this run.\n", {}
    keys = next(iter(rows.values()))["keys"]
    heap_ops = next((r["ops_per_round"] for (b, _), r in rows.items() if b == "heap"), None)
    rocks_ops = next((r["ops_per_round"] for (b, _), r in rows.items() if b == "rocksdb"), None)
    header = ["operation", "heap ops/s", "raw dict ops/s", "heap / dict", "RocksDB ops/s",
              "raw rocksdict ops/s", "RocksDB / rocksdict", "RocksDB / prekeyed rocksdict"]
    body = []
    for op in OPERATIONS:
        h, r = rows.get(("heap", op), {}), rows.get(("rocksdb", op), {})
        body.append([f"`{op}`", fmt_int(h.get("statekit_ops_s")), fmt_int(h.get("raw_ops_s")),
                     fmt_pct(h.get("ratio_vs_raw")), fmt_int(r.get("statekit_ops_s")),
                     fmt_int(r.get("raw_ops_s")), fmt_pct(r.get("ratio_vs_raw")),
                     fmt_pct(r.get("ratio_vs_raw_prekeyed"))])
    # plot: ratios per op, both backends, with the targets
    fig, ax = plt.subplots(figsize=(10, 5.5))
    ops = [op for op in OPERATIONS if ("heap", op) in rows or ("rocksdb", op) in rows]
    y = range(len(ops))
    hv = [rows.get(("heap", op), {}).get("ratio_vs_raw") or 0 for op in ops]
    rv = [rows.get(("rocksdb", op), {}).get("ratio_vs_raw") or 0 for op in ops]
    ax.barh([i + 0.2 for i in y], hv, height=0.4, label="heap / raw dict", color="#4C72B0")
    ax.barh([i - 0.2 for i in y], rv, height=0.4, label="RocksDB / raw rocksdict", color="#DD8452")
    ax.axvline(TARGETS["heap"], color="#4C72B0", ls="--", lw=1, label=f"heap target {TARGETS['heap']:.0%}")
    ax.axvline(TARGETS["rocksdb"], color="#DD8452", ls="--", lw=1,
               label=f"RocksDB target {TARGETS['rocksdb']:.0%}")
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_yticks(list(y), ops)
    ax.invert_yaxis()
    ax.set_xlabel("statekit throughput as a fraction of the raw baseline (same run, interleaved)")
    ax.set_title(f"State access: statekit vs raw store ({keys:,} existing keys)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(img / "state_access_ratios.png", dpi=110)
    plt.close(fig)
    # plot: absolute ops/s (log)
    fig, ax = plt.subplots(figsize=(10, 5.5))
    series = [("heap", "statekit_ops_s", "heap (statekit)", "#4C72B0"),
              ("heap", "raw_ops_s", "raw dict", "#A1C9F4"),
              ("rocksdb", "statekit_ops_s", "RocksDB (statekit)", "#DD8452"),
              ("rocksdb", "raw_ops_s", "raw rocksdict", "#FFB482")]
    width = 0.2
    for n, (backend, field, label, color) in enumerate(series):
        vals = [rows.get((backend, op), {}).get(field) or 0 for op in ops]
        ax.barh([i - 0.3 + n * width for i in y], vals, height=width, label=label, color=color)
    ax.set_xscale("log")
    ax.set_yticks(list(y), ops)
    ax.invert_yaxis()
    ax.set_xlabel("operations per second (log scale; noisy shared machine: read the ratios)")
    ax.set_title("State access: absolute throughput")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(img / "state_access_ops.png", dpi=110)
    plt.close(fig)
    text = f"""## State access matrix (flink-benchmarks shape)

{keys:,} existing keys (`Long`), 10 user keys per map, lists of 10 `Long`s; one round =
{fmt_int(heap_ops)} (heap) / {fmt_int(rocks_ops)} (RocksDB) operations over a fixed random key
sequence; statekit and its baseline run the **same key sequence in alternating rounds** and the
ratio is the median of the per-round ratios. statekit side: `backend.set_current_key(k)` + one state
call. Baselines: a `dict` of Python objects (heap); a raw-mode `rocksdict` with the backend's options,
one column family per state, the same key bytes (key-group prefix + msgpack key, built per op) and
msgpack values decoded on read (RocksDB); "prekeyed" = raw rocksdict with the key bytes built before
the loop (the one-C-call floor). `bulk_get`/`bulk_put` are `statekit.backends.bulk.BulkState` against the
vectorized raw call (list comprehension / `dict.update`; rocksdict multi-get / one `WriteBatch`).

![state access ratios]({rel}/state_access_ratios.png)

{table(header, body)}

![state access ops/s]({rel}/state_access_ops.png)
"""
    summary = {"heap_get_hot": rows.get(("heap", "value_get_hot"), {}).get("ratio_vs_raw"),
               "heap_update_hot": rows.get(("heap", "value_update_hot"), {}).get("ratio_vs_raw"),
               "rocks_get_hot": rows.get(("rocksdb", "value_get_hot"), {}).get("ratio_vs_raw"),
               "rocks_update_hot": rows.get(("rocksdb", "value_update_hot"), {}).get("ratio_vs_raw"),
               "heap_get": rows.get(("heap", "value_get"), {}).get("ratio_vs_raw"),
               "heap_update": rows.get(("heap", "value_update"), {}).get("ratio_vs_raw"),
               "rocks_get": rows.get(("rocksdb", "value_get"), {}).get("ratio_vs_raw"),
               "rocks_update": rows.get(("rocksdb", "value_update"), {}).get("ratio_vs_raw"),
               "rocks_get_pre": rows.get(("rocksdb", "value_get"), {}).get("ratio_vs_raw_prekeyed"),
               "rocks_update_pre": rows.get(("rocksdb", "value_update"), {}).get("ratio_vs_raw_prekeyed")}
    return text, summary


def section_checkpoint(data: dict[str, Any], img: Path, rel: str) -> tuple[str, dict[str, Any]]:
    cases = [b["extra_info"] for b in by_test(data, "test_checkpoint_restore") if "full" in b["extra_info"]]
    if not cases:
        return "## Checkpoint and restore\n\nNot in this run.\n", {}
    cases.sort(key=lambda e: (e["backend"], e["keys"] * e["value_bytes"]))
    header = ["backend", "keys x value", "checkpoint bytes", "files", "stall (async)", "stall (sync)",
              "checkpoint total", "write MB/s", "raw disk write MB/s: best (before / after)", "ckpt / disk",
              "restore", "restore MB/s", "raw disk cold read MB/s: best (before / after)", "restore / disk"]
    body = []
    for e in cases:
        full, disk, rest = e["full"], e["disk"].get("best") or e["disk"]["mean"], e["restore_full"]
        b4, af = e["disk"]["before"], e["disk"]["after"]
        sync = e.get("full_sync")
        body.append([e["backend"], f"{e['keys']:,} x {e['value_bytes']} B", fmt_bytes(full["bytes"]),
                     full["files"], fmt_s(full["stall_s"]),
                     fmt_s(sync["stall_s"]) if sync else f"({fmt_s(full['total_s'])})",
                     fmt_s(full["total_s"]), full["write_mb_s"],
                     f"{disk['write_mb_s']} ({b4['write_mb_s']} / {af['write_mb_s']})",
                     fmt_pct(e["ratios"]["checkpoint_write_vs_disk"], 1), fmt_s(rest["restore_s"]),
                     rest["read_mb_s"], f"{disk['read_mb_s']} ({b4['read_mb_s']} / {af['read_mb_s']})",
                     fmt_pct(e["ratios"]["restore_read_vs_disk"], 1)])
    inc_header = ["backend", "keys", "changed", "full bytes", "incremental bytes", "inc / full bytes",
                  "full total", "full stall", "incremental total", "inc stall", "restore of last incremental"]
    inc_body = []
    for e in cases:
        for c in e.get("changes", []):
            inc_body.append([e["backend"], f"{e['keys']:,}", fmt_pct(c["ratio"]),
                             fmt_bytes(c["full"]["bytes"]),
                             fmt_bytes(c["incremental"]["bytes"]), fmt_pct(c["bytes_ratio"], 2),
                             fmt_s(c["full"]["total_s"]), fmt_s(c["full"]["stall_s"]),
                             fmt_s(c["incremental"]["total_s"]),
                             fmt_s(c["incremental"]["stall_s"]),
                             fmt_s(e["restore_incremental"]["restore_s"]) if c["ratio"] == 1.0 else ""])
    # plots
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    ax = axes[0]
    for backend, color in (("heap", "#4C72B0"), ("rocksdb", "#DD8452")):
        for e in (c for c in cases if c["backend"] == backend and c.get("changes")):
            xs = [c["ratio"] * 100 for c in e["changes"]]
            ax.plot(xs, [c["bytes_ratio"] * 100 for c in e["changes"]], marker="o", color=color,
                    alpha=0.4 + 0.6 * (e["keys"] / max(x["keys"] for x in cases)),
                    label=f"{backend} {e['keys']:,} keys")
    ax.plot([1, 100], [1, 100], color="grey", ls=":", lw=1, label="bytes = changed share")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("keys changed since the last checkpoint (%)")
    ax.set_ylabel("incremental bytes / full bytes (%)")
    ax.set_title("Incremental vs full checkpoint size")
    ax.legend(fontsize=7)
    ax = axes[1]
    labels = [f"{e['backend']}\n{fmt_bytes(e['full']['bytes'])}" for e in cases]
    x = range(len(cases))
    ax.bar([i - 0.2 for i in x], [e["ratios"]["checkpoint_write_vs_disk"] for e in cases], 0.4,
           label="checkpoint write / raw disk write", color="#55A868")
    ax.bar([i + 0.2 for i in x], [e["ratios"]["restore_read_vs_disk"] for e in cases], 0.4,
           label="restore / raw disk cold read", color="#8172B3")
    ax.axhline(TARGETS["disk"], color="black", ls="--", lw=1, label=f"target {TARGETS['disk']:.0%}")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel("fraction of the raw disk's throughput")
    ax.set_title("Checkpoint path vs raw sequential disk (same test)")
    ax.legend(fontsize=7)
    ax = axes[2]
    std = [e for e in cases if e["value_bytes"] <= 500]  # the >= 1 GiB runs are in the middle panel
    heap = [e for e in std if e.get("full_sync")]
    rocks = [e for e in std if e["backend"] == "rocksdb"]
    if heap:
        ax.plot([e["keys"] for e in heap], [e["full"]["stall_s"] * 1000 for e in heap], marker="o",
                color="#4C72B0", label="heap async: stall")
        ax.plot([e["keys"] for e in heap], [e["full_sync"]["stall_s"] * 1000 for e in heap], marker="s",
                ls="--", color="#4C72B0", label="heap sync: stall")
    if rocks:
        ax.plot([e["keys"] for e in rocks], [e["full"]["stall_s"] * 1000 for e in rocks], marker="o",
                color="#DD8452", label="RocksDB: stall (fastest round: no flush)")
        flushed = [(e["keys"], c["full"]["stall_s"]) for e in rocks for c in e.get("changes", [])
                   if c["ratio"] == 0.10]
        if flushed:
            ax.plot([k for k, _ in flushed], [v * 1000 for _, v in flushed], marker="^", color="#C44E52",
                    label="RocksDB: stall after 10 % changed (flush)")
        ax.plot([e["keys"] for e in rocks], [e["full"]["total_s"] * 1000 for e in rocks], marker="s",
                ls="--", color="#DD8452", label="RocksDB: whole checkpoint")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("keys")
    ax.set_ylabel("ms")
    ax.set_title("Processing-thread stall per full checkpoint")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(img / "checkpoint.png", dpi=110)
    plt.close(fig)

    def pick(backend: str, keys: int | None = None, large: bool = False) -> dict[str, Any] | None:
        found = [e for e in cases if e["backend"] == backend and (e["value_bytes"] > 500) == large
                 and (keys is None or e["keys"] == keys)]
        return max(found, key=lambda e: e["keys"]) if found else None

    summary: dict[str, Any] = {}
    for backend in ("heap", "rocksdb"):
        std = pick(backend)
        if std and std.get("changes"):
            one = next((c for c in std["changes"] if c["ratio"] == 0.01), None)
            summary[f"{backend}_inc_1pct"] = (one["bytes_ratio"], std["keys"]) if one else None
            if std.get("full_sync"):
                summary[f"{backend}_stall"] = (std["full"]["stall_s"], std["full_sync"]["stall_s"],
                                               std["keys"])
            else:  # RocksDB: full checkpoints after writes (the memtable flush is in the stall)
                summary[f"{backend}_stall_changes"] = (
                    [(c["ratio"], c["full"]["stall_s"], c["full"]["total_s"]) for c in std["changes"]],
                    std["keys"])
        big = pick(backend, large=True) or std
        if big:
            summary[f"{backend}_disk"] = (big["ratios"]["checkpoint_write_vs_disk"],
                                          big["ratios"]["restore_read_vs_disk"], big["full"]["bytes"],
                                          big["full"]["write_mb_s"], _best(big)["write_mb_s"],
                                          big["restore_full"]["read_mb_s"], _best(big)["read_mb_s"])
    text = f"""## Checkpoint and restore

ValueState with random (incompressible) `bytes` values on `FileSystemCheckpointStorage` on the local
disk. Per case, the same data is loaded into a full-checkpoint backend, an incremental one and (heap)
a synchronous-snapshot one. The raw disk is probed in the same test, before and after the
checkpoint, and the **better** probe is the bar (conservative: the shared disk's speed varies a lot
between probes): a sequential write of the checkpoint's size (at least 32 MiB) in 8 MiB writes,
both as one file + `fsync` and as 64 MiB files each fsynced (the faster counts), and a sequential
read of it after evicting it from the page cache (`POSIX_FADV_DONTNEED`). Restores also start with
the checkpoint files evicted from the page cache.
"stall" is the synchronous part of the snapshot (what the processing thread waits for); "sync" is a
`HashMapStateBackend(False)` snapshot, which does everything on the processing thread. RocksDB
snapshots are always asynchronous; its "(sync)" column shows the whole checkpoint, i.e. what a
synchronous snapshot would stall for. Each full checkpoint and restore runs twice in full mode and
the faster round is shown (the machine is shared). For RocksDB the faster round is usually the
second one, whose memtable is already flushed, so its stall column shows the *no-flush* stall; the
stall with a flush is in the "full stall" column of the next table (checkpoints after writes).
"total" = synchronous part + asynchronous part + commit of
`_metadata`. Throughput = checkpoint bytes / total.

![checkpoint]({rel}/checkpoint.png)

### Full checkpoint and restore

{table(header, body)}

### Incremental vs full, by share of keys changed since the previous checkpoint

Changes are applied in sequence (1 %, then 10 %, then 100 % of the keys, each followed by one full
checkpoint on the full backend and one incremental checkpoint on the incremental one). The last
column is the restore of the final incremental checkpoint (base + all changelogs for heap; all
referenced SST files for RocksDB).

{table(inc_header, inc_body)}
"""
    return text, summary


def _best(e: dict[str, Any]) -> dict[str, Any]:
    return e["disk"].get("best") or e["disk"]["mean"]


def section_heap_snapshot(data: dict[str, Any]) -> str:
    stall = [b["extra_info"] for b in by_test(data, "test_heap_async_snapshot_stall_and_throughput")]
    inc = [b["extra_info"] for b in by_test(data, "test_heap_incremental_checkpoint_size")]
    if not stall and not inc:
        return ("## Heap asynchronous snapshots (processing thread during a checkpoint)\n\n"
                "`benchmarks/test_heap_snapshot_bench.py` was not part of this run.\n")
    rows = [[e.get("mode"), fmt_int(e.get("keys")), fmt_s(e.get("sync_snapshot_stall_s")),
             fmt_s(e.get("async_snapshot_stall_s")), fmt_pct(e.get("stall_ratio"), 2),
             fmt_s(e.get("async_part_s")), fmt_int(e.get("throughput_baseline_ops_s")),
             fmt_int(e.get("throughput_during_snapshot_ops_s")), fmt_pct(e.get("throughput_ratio"))]
            for e in stall]
    text = """## Heap asynchronous snapshots (processing thread during a checkpoint)

From `benchmarks/test_heap_snapshot_bench.py` : the stall of
an asynchronous snapshot against a whole synchronous one, and the processing thread's
read-modify-write rate while the asynchronous part runs, against the mean of 2 s windows before
and after it.

"""
    text += table(["snapshot mode", "keys", "sync snapshot stall", "async stall", "async / sync stall",
                   "async part", "ops/s before+after", "ops/s during", "during / baseline"], rows)
    if inc:
        e = inc[0]
        text += (f"\n\nIncremental heap checkpoint after changing 1 % of {fmt_int(e.get('keys'))} keys: "
                 f"{fmt_bytes(e.get('incremental_bytes'))} of {fmt_bytes(e.get('full_bytes'))} "
                 f"({fmt_pct(e.get('bytes_ratio'), 2)}).\n")
    return text + "\n"


def section_export(data: dict[str, Any]) -> str:
    """The 1 GiB state export (``benchmarks/test_export_bench.py``, marker ``large``)."""
    runs = [b["extra_info"] for b in by_test(data, "test_export_1gib_parquet")]
    head = "## Exporting a state (`statekit state export`, Parquet)\n\n"
    if not runs:
        return head + "`benchmarks/test_export_bench.py` (marker `large`) was not part of this run.\n"
    e = runs[0]
    disk = e.get("disk", {}).get("best", {})
    return head + (
        "One heap value state exported by the real command in its own process from a cold page "
        "cache, its output fsynced, against the disk's sequential write (+fsync) throughput "
        "measured in the same test; peak RSS from `wait4`.\n\n") + table(
        ["state", "parquet", "export", "written", "disk write (best)", "export / disk",
         "disk, one fsynced file", "export / that", "peak RSS"],
        [[fmt_bytes(e.get("state_bytes")), fmt_bytes(e.get("parquet_bytes")), fmt_s(e.get("export_s")),
          f"{e.get('export_write_mb_s')} MB/s", f"{disk.get('write_mb_s')} MB/s",
          fmt_pct(e.get("export_vs_disk_write")), f"{e.get('disk_one_file_write_mb_s')} MB/s",
          fmt_pct(e.get("export_vs_disk_one_file")), f"{e.get('peak_rss_mib')} MiB"]]) + "\n"


def section_disks(data: dict[str, Any], img: Path, rel: str) -> tuple[str, dict[str, Any]]:
    runs = {(b["extra_info"]["disk"], b["extra_info"]["options"]): b["extra_info"]
            for b in by_test(data, "test_rocksdb_options_on_disk_profile") if "disk" in b["extra_info"]}
    if not runs:
        return "## PredefinedOptions x disk profiles\n\nNot in this run.\n", {}
    e0 = next(iter(runs.values()))
    metrics = [("mix_ops_s", "get+update mix ops/s", True), ("load_ops_s", "load ops/s", True),
               ("checkpoint_s", "full checkpoint", False), ("restore_s", "restore", False)]
    parts = []
    winners: dict[str, dict[str, str]] = {}
    for disk in DISKS:
        rows = []
        win = {}
        for field, _, higher in metrics:
            cands = [(runs[(disk, o)][field], o) for o in OPTIONS if (disk, o) in runs]
            if cands:
                win[field] = (max if higher else min)(cands)[1]
        winners[disk] = win
        for o in OPTIONS:
            r = runs.get((disk, o))
            if r is None:
                continue

            def mark(field: str, text: str, o: str = o, win: dict[str, str] = win) -> str:
                return f"**{text}**" if win.get(field) == o else text

            rows.append([SHORT[o], mark("mix_ops_s", fmt_int(r["mix_ops_s"])),
                         f"{r['read_p50_us']:.0f} / {r['read_p99_us']:.0f}" if r.get("read_p50_us") else "-",
                         mark("load_ops_s", fmt_int(r["load_ops_s"])),
                         mark("checkpoint_s", fmt_s(r["checkpoint_s"])), fmt_s(r["checkpoint_stall_s"]),
                         f"{r['checkpoint_mb_s']}", mark("restore_s", fmt_s(r["restore_s"]))])
        parts.append(f"**{disk}**\n\n" + table(
            ["options", "mix ops/s", "get p50 / p99 µs", "load ops/s", "checkpoint", "ckpt stall",
             "ckpt MB/s", "restore"], rows))
    # plot: each metric relative to DEFAULT on the same disk profile
    fig, axes = plt.subplots(1, len(metrics) + 1, figsize=(19, 4.4), sharey=False)
    width = 0.2
    colors = ["#8C8C8C", "#55A868", "#C44E52", "#8172B3"]
    ax = axes[0]
    for n, o in enumerate(OPTIONS):
        vals = [(runs.get((disk, o)) or {}).get("mix_ops_s") or 0 for disk in DISKS]
        ax.bar([i - 0.3 + n * width for i in range(len(DISKS))], vals, width, label=SHORT[o], color=colors[n])
    ax.set_yscale("log")
    ax.set_xticks(range(len(DISKS)), DISKS)
    ax.set_title("get+update mix ops/s (absolute, log)", fontsize=9)
    handles, labels = ax.get_legend_handles_labels()
    for ax, (field, label, higher) in zip(axes[1:], metrics, strict=True):
        for n, o in enumerate(OPTIONS):
            vals = []
            for disk in DISKS:
                base, r = runs.get((disk, "DEFAULT")), runs.get((disk, o))
                if not base or not r or not base[field] or not r[field]:
                    vals.append(0)
                    continue
                vals.append(r[field] / base[field] if higher else base[field] / r[field])
            ax.bar([i - 0.3 + n * width for i in range(len(DISKS))], vals, width, label=SHORT[o],
                   color=colors[n])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks(range(len(DISKS)), DISKS)
        ax.set_title(f"{label}\n(speed relative to DEFAULT, higher = better)", fontsize=9)
    fig.legend(handles, labels, loc="lower center", ncol=len(OPTIONS), fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(img / "disk_profiles.png", dpi=110)
    plt.close(fig)
    fvs = {}
    for disk in DISKS:
        f, s = runs.get((disk, "FLASH_SSD_OPTIMIZED")), runs.get((disk, "SPINNING_DISK_OPTIMIZED"))
        if f and s:
            fvs[disk] = {field: (f[field], s[field]) for field, _, _ in metrics}
    text = f"""## PredefinedOptions x disk profiles

`benchmarks/rocksdb_profile_driver.py` runs in a subprocess under
`subprocess_env(profile, [workdir, ckptdir])` (the `benchmarks/diskprofiles` LD_PRELOAD shim: every
read, write and fsync under those directories takes as long as on the modelled device). Workload,
through the statekit API: load {e0['keys']:,} values of {e0['value_bytes']} B (~{fmt_bytes(e0['keys'] *
e0['value_bytes'])}, more than every profile's block cache; HIGH_MEM has 256 MiB), then a
time-boxed mix of 50 % point lookups + 50 % updates of uniformly random keys, then a full checkpoint
to `FileSystemCheckpointStorage` on the same profile and a restore from it. The four option profiles
of one disk profile run back to back; **compare within a disk profile** (bold = best on that disk).

![disk profiles]({rel}/disk_profiles.png)

""" + "\n\n".join(parts) + "\n"
    return text, {"flash_vs_spinning": fvs, "winners": winners}


SPARK_COLUMNS = ["path", "backend", "rows", "keys", "batches", "rows_per_s", "steady_rows_per_s",
                 "ratio_to_apply_in_pandas", "steady_ratio_to_apply_in_pandas", "ratio_to_native_count",
                 "bytes_per_batch", "state_bytes_total", "correct"]


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 10 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def section_spark(spark: Path, img: Path, rel: str) -> str:
    head = "## Spark end-to-end\n\n"
    if not spark.exists():
        return head + ("See the Spark end-to-end throughput benchmark (`benchmarks/test_spark_e2e.py`, "
                       "`benchmarks/spark_driver.py`); its results are included here from "
                       f"`benchmarks/results/{spark.name}` when that file exists (it did not exist when "
                       "this report was generated).\n")
    data = load(spark)
    where = spark.relative_to(REPO) if spark.is_relative_to(REPO) else spark
    if isinstance(data, dict) and "benchmarks" in data:  # pytest-benchmark format
        data = [{"name": b["name"], **{k: v for k, v in b.get("extra_info", {}).items()}}
                for b in data["benchmarks"]]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        return head + f"From `{where}`:\n\n```json\n" + json.dumps(data, indent=2)[:6000] + "\n```\n"
    present = [c for c in SPARK_COLUMNS if any(c in r for r in data)]
    if len(present) < 3:
        present = sorted({k for r in data for k, v in r.items() if not isinstance(v, dict | list)})[:10]
    rows = [[_cell(r.get(c, "")) for c in present] for r in data]
    text = (head + f"From `{where}` (written by `benchmarks/test_spark_e2e.py`, whose "
            "docstring describes the method). Ratios are measured within one run.\n\n"
            + table(present, rows) + "\n")
    runs = [r for r in data if isinstance(r.get("rows_per_s"), int | float)]
    if runs:
        fig, ax = plt.subplots(figsize=(10, 0.45 * len(runs) + 1.5))
        labels = [f"{r.get('path', '?')} [{r.get('backend', '')}]" for r in runs]
        ax.barh(range(len(runs)), [r["rows_per_s"] for r in runs], color="#4C72B0")
        ax.set_yticks(range(len(runs)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("rows per second (log)")
        ax.set_title("Spark end-to-end throughput per path and backend")
        fig.tight_layout()
        fig.savefig(img / "spark_e2e.png", dpi=110)
        plt.close(fig)
        text += f"\n![spark end-to-end]({rel}/spark_e2e.png)\n"
    return text


def machine(data: dict[str, Any]) -> str:
    m = data.get("machine_info", {})
    cpu = m.get("cpu", {})
    sk = m.get("statekit", {})
    commit = data.get("commit_info", {})
    parts = [f"{cpu.get('brand_raw', m.get('processor', '?'))}",
             f"{sk.get('cpus') or cpu.get('count', '?')} vCPUs",
             f"{sk['mem_gib']} GiB RAM" if sk.get("mem_gib") else None,
             f"{m.get('system', '')} {sk.get('kernel') or m.get('release', '')}",
             f"{m.get('python_implementation', '')} {m.get('python_version', '')}",
             f"rocksdict {sk['rocksdict']}" if sk.get("rocksdict") else None,
             "virtio disk, ext4"]
    loads = [b["extra_info"]["loadavg"][0] for b in data.get("benchmarks", [])
             if b.get("extra_info", {}).get("loadavg") and "run" not in b["extra_info"]]
    load_txt = (f" 1-minute load average during the run: {min(loads):.1f}-{max(loads):.1f} on 2 vCPUs"
                if loads else "")
    return (", ".join(p for p in parts if p) + f". Commit `{str(commit.get('id', '?'))[:10]}`"
            + (" (with local changes)" if commit.get("dirty") else "") + f", {data.get('datetime', '')}."
            + load_txt)


def closing(acc: dict[str, Any], ck: dict[str, Any], disks: dict[str, Any]) -> str:
    lines = ["## Summary against the targets", ""]
    th, tr, td = TARGETS["heap"], TARGETS["rocksdb"], TARGETS["disk"]
    if acc:
        lines.append(
            f"- **Heap Value get / update**: {fmt_pct(acc['heap_get'])} / {fmt_pct(acc['heap_update'])} "
            f"of raw `dict` ops/s (target >= {th:.0%}: get {verdict(acc['heap_get'], th)}, "
            f"update {verdict(acc['heap_update'], th)}). On a cache-resident set of 1,000 hot keys, where "
            f"the raw dict is fastest: {fmt_pct(acc.get('heap_get_hot'))} / "
            f"{fmt_pct(acc.get('heap_update_hot'))} (get {verdict(acc.get('heap_get_hot'), th)}, "
            f"update {verdict(acc.get('heap_update_hot'), th)}).")
        lines.append(
            f"- **RocksDB Value get / update**: {fmt_pct(acc['rocks_get'])} / {fmt_pct(acc['rocks_update'])} "
            f"of raw `rocksdict` ops/s with the same key encoding (target >= {tr:.0%}: get "
            f"{verdict(acc['rocks_get'], tr)}, update {verdict(acc['rocks_update'], tr)}); against "
            f"prekeyed raw rocksdict (key bytes built outside the loop) {fmt_pct(acc['rocks_get_pre'])} / "
            f"{fmt_pct(acc['rocks_update_pre'])}; on 1,000 hot keys {fmt_pct(acc.get('rocks_get_hot'))} / "
            f"{fmt_pct(acc.get('rocks_update_hot'))} of raw rocksdict.")
    for backend, name in (("heap", "Heap"), ("rocksdb", "RocksDB")):
        one = ck.get(f"{backend}_inc_1pct")
        if one:
            lines.append(f"- **{name} incremental vs full checkpoint bytes at 1 % change** "
                         f"({one[1]:,} keys): {fmt_pct(one[0], 2)}.")
    for backend, name in (("heap", "Heap"), ("rocksdb", "RocksDB")):
        st = ck.get(f"{backend}_stall")
        if st:
            what = "synchronous snapshot" if backend == "heap" else "whole (always asynchronous) checkpoint"
            lines.append(f"- **{name} async vs sync stall** ({st[2]:,} keys): {fmt_s(st[0])} vs "
                         f"{fmt_s(st[1])} for a {what} ({fmt_pct(st[0] / st[1] if st[1] else None, 1)}).")
    rs = ck.get("rocksdb_stall_changes")
    if rs:
        parts = ", ".join(f"{fmt_s(st)} of {fmt_s(tot)} ({fmt_pct(st / tot if tot else None)}) after "
                          f"{fmt_pct(r)} of the keys changed" for r, st, tot in rs[0])
        lines.append(f"- **RocksDB stall** (always asynchronous; the stall is the memtable flush + hard "
                     f"links, {rs[1]:,} keys): {parts}.")
    for backend, name in (("heap", "Heap"), ("rocksdb", "RocksDB")):
        d = ck.get(f"{backend}_disk")
        if d:
            lines.append(f"- **{name} checkpoint write throughput** ({fmt_bytes(d[2])}): {d[3]} MB/s = "
                         f"{fmt_pct(d[0], 1)} of the raw disk's {d[4]} MB/s; restore {d[5]} MB/s = "
                         f"{fmt_pct(d[1], 1)} of the raw cold read {d[6]} MB/s (target >= {td:.0%}: "
                         f"write {verdict(d[0], td)}, restore {verdict(d[1], td)}).")
    fvs = disks.get("flash_vs_spinning", {}) if disks else {}
    if fvs:
        parts = []
        for disk, m in fvs.items():
            f_mix, s_mix = m["mix_ops_s"]
            f_ck, s_ck = m["checkpoint_s"]
            factor = max(f_mix, s_mix) / max(min(f_mix, s_mix), 1e-9)
            parts.append(f"{disk}: mix {fmt_int(f_mix)} vs {fmt_int(s_mix)} ops/s "
                         f"({'FLASH' if f_mix >= s_mix else 'SPINNING'} wins, x{factor:.2f}), "
                         f"checkpoint {fmt_s(f_ck)} vs {fmt_s(s_ck)}")
        lines.append("- **FLASH_SSD_OPTIMIZED vs SPINNING_DISK_OPTIMIZED**: " + "; ".join(parts) + ".")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("json", type=Path, nargs="+",
                        help="pytest-benchmark JSON; benchmarks of further files (separate runs, "
                             "e.g. of one benchmark file) replace or join those of the first")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--img-dir", type=Path, default=REPO / "docs" / "img")
    parser.add_argument("--command", default="make bench")
    parser.add_argument("--spark", type=Path, default=REPO / "benchmarks" / "results" / "spark.json")
    parser.add_argument("--spark-sessions", type=Path,
                        default=REPO / "benchmarks" / "results" / "spark-sessions.json")
    parser.add_argument("--spark-compat", type=Path,
                        default=REPO / "benchmarks" / "results" / "spark-compat.json")
    parser.add_argument("--analysis", type=Path, default=Path(__file__).with_name("analysis.md"),
                        help="hand-written findings appended to the report (profiles, proposed fixes)")
    args = parser.parse_args(argv)
    if os.environ.get("BENCH_ARGS"):  # set by the Makefile: the extra pytest arguments of this run
        args.command += f" BENCH_ARGS='{os.environ['BENCH_ARGS']}'"
    data = merged([load(path) for path in args.json])
    args.img_dir.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(args.img_dir, args.out.parent)
    acc_text, acc = section_access(data, args.img_dir, rel)
    ck_text, ck = section_checkpoint(data, args.img_dir, rel)
    disk_text, disks = section_disks(data, args.img_dir, rel)
    timers_text, timers_summary = section_timers(data, args.spark_sessions, args.img_dir, rel)
    compat_text, compat_summary = section_compat(args.spark_compat)
    quick = data.get("machine_info", {}).get("statekit", {}).get("quick")
    sources = " + ".join(f"[`{path.name}`]({os.path.relpath(path, args.out.parent)})"
                         for path in args.json)
    doc = [
        "# statekit benchmarks",
        "",
        f"Generated by `python -m benchmarks.report` from {sources} "
        f"(pytest-benchmark JSON), produced by **`{args.command}`**"
        + (" (quick mode: small sizes, figures are plumbing checks only)" if quick else "") + ".",
        "",
        f"**Machine:** {machine(data)}. The machine was shared with other test runs, so "
        "absolute numbers are noisy; every comparison below is a ratio measured within one run, against "
        "a baseline measured in the same test (interleaved round by round for state access).",
        "",
        "Reproduce: `make bench` (full; does its own setup; about 11-16 min on this machine without "
        "Spark) or `make bench-quick` (< 3 min, small sizes, no timing assertions, Spark deselected; "
        "what CI runs). `make bench` also collects the Spark end-to-end benchmark "
        "(`benchmarks/test_spark_e2e.py`, marker `spark`); `BENCH_ARGS='-m \"not spark\"'` leaves it "
        "out, and its own run then supplies `benchmarks/results/spark.json`. "
        "`STATEKIT_BENCH_STRICT=1 make bench` turns the targets into assertions. "
        "Full-mode sizes: 500k keys for state access; 10^4, 10^5, 10^6 keys x 100 B plus "
        "10^6 x 1100 B (>= 1 GiB) for checkpoints; 320k x 1 KiB per disk-profile run.",
        "",
        closing(acc, ck, disks) + "".join(line + "\n" for line in timers_summary + compat_summary),
        acc_text,
        section_bulk(data),
        ck_text,
        section_heap_snapshot(data),
        section_remote_restore(data, args.command),
        section_export(data),
        disk_text,
        section_spark(args.spark, args.img_dir, rel),
        timers_text,
        compat_text,
        section_windows(data),
    ]
    if args.analysis.exists():
        doc.append(args.analysis.read_text())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(doc))
    print(f"wrote {args.out} and plots in {args.img_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
