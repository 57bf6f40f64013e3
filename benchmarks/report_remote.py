"""The RocksDB restore-from-storage section of ``docs/benchmarks.md``: a restore and a restart
(restore → first element) on 1-8 transfer threads against the raw download of the same files on
as many threads (``benchmarks/test_remote_restore_bench.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_MIB = 1024 * 1024


def section_remote_restore(data: dict[str, Any],
                           command: str | Callable[[dict[str, Any]], str] = "make bench") -> str:
    """One table of every size, storage and thread count (empty when the run has none);
    ``command``: what produced the figures, or a function of a row's figures saying it."""
    said = command if callable(command) else (lambda _: command)
    rows = [b["extra_info"] for b in data.get("benchmarks", [])
            if b["name"].startswith("test_rocksdb_restore_from_storage")]
    if not rows:
        return ""
    lines = [
        "## RocksDB restore from checkpoint storage (transfer threads)",
        "",
        "One RocksDB state of 1 KiB values, checkpointed in full to a FileSystem storage on the "
        "local disk and to S3 (s3fs against moto's server on 127.0.0.1). Per storage and "
        "`state.backend.rocksdb.checkpoint.transfer.thread.num`, interleaved in the same run: "
        "the raw download of the checkpoint's files with fsspec `get_file` on as many threads "
        "(nothing verified), and a restart (a new backend restores the checkpoint, every file "
        "verified for size and CRC-32 on its transfer thread, the state registered, the first "
        "key read). `restore / raw` and `first element / raw` are time ratios (1.0: as fast as "
        "the raw download); the local storage hard-links SST files where the raw download "
        "copies them. Median of the rounds. Benchmark: `benchmarks/test_remote_restore_bench.py`"
        " (1 GiB: marker `large`).",
        "",
        "| state | files | storage | threads | raw download | raw MiB/s | restore | restore / raw "
        "| restart → first element | first element / raw | command |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in sorted(rows, key=lambda e: (e["state_bytes"], e["storage"], e["threads"])):
        lines.append(
            f"| {e['state_bytes'] / _MIB:,.0f} MiB ({e['keys']:,} keys) | {e['files']} "
            f"| {e['storage']} | {e['threads']} | {e['raw_s']:.3f} s | {e['raw_mib_s']:,.0f} "
            f"| {e['restore_s']:.3f} s | {e['restore_vs_raw']:.2f} | {e['first_element_s']:.3f} s "
            f"| {e['first_element_vs_raw']:.2f} | `{said(e)}` |")
    return "\n".join(lines) + "\n\n" + _summary(rows) + "\n"


def _summary(rows: list[dict[str, Any]]) -> str:
    """Per size and storage: the range of ``restore / raw`` over the thread counts, the raw
    download's MiB/s on 1 thread and at best, and the longest time from the restore's end to
    the first key read."""
    out = []
    for size, storage in sorted({(e["state_bytes"], e["storage"]) for e in rows}):
        group = [e for e in rows if (e["state_bytes"], e["storage"]) == (size, storage)]
        ratios = [e["restore_vs_raw"] for e in group]
        one = [e["raw_mib_s"] for e in group if e["threads"] == 1]
        after = max(e["first_element_s"] - e["restore_s"] for e in group)
        out.append(
            f"- {size / _MIB:,.0f} MiB from {storage}: restore / raw {min(ratios):.2f}-"
            f"{max(ratios):.2f}; raw download {one[0] if one else 0:,.0f} MiB/s on 1 thread, "
            f"{max(e['raw_mib_s'] for e in group):,.0f} MiB/s at best; the first key read at "
            f"most {after * 1000:.0f} ms after the restore returned.")
    return "\n".join(out) + "\n"
