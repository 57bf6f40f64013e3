"""The bulk list and map section of ``docs/benchmarks.md``: one ``BulkState`` call over many keys
against the same work key by key (``test_*_bulk_vs_per_key`` in the state access benchmarks)."""

from __future__ import annotations

from typing import Any

from benchmarks._state_access import BULK_OPERATIONS


def _fmt(ops: Any) -> str:
    return "-" if ops is None else f"{round(ops):,}"


def section_bulk(data: dict[str, Any]) -> str:
    """A table of bulk against per-key ops/s on both backends (empty when the run has none)."""
    rows = {}
    for b in data.get("benchmarks", []):
        if b["name"].startswith(("test_heap_bulk_vs_per_key", "test_rocksdb_bulk_vs_per_key")):
            e = b["extra_info"]
            rows[(e["backend"], e["op"])] = e
    if not rows:
        return ""
    keys = next(iter(rows.values()))["keys"]
    lines = [
        "## Bulk list and map access",
        "",
        "What a `VectorizedKeyedFunction` does with one `BulkState` call over a round's keys, "
        "against the same work key by key through the state API (`set_current_key` + one state "
        "call per key), in alternating rounds over the same random key sequence "
        f"({keys:,} existing keys, the states of the state access matrix): `bulk_list_add` "
        "appends one element per key (`add`), `bulk_list_get` reads each key's list, "
        "`bulk_map_put` / `bulk_map_get` put or read one user key per key (`put_entries` / "
        "`get_entries`). The ratio is bulk ops/s over per-key ops/s, the median of the "
        "per-round ratios.",
        "",
        "| operation | heap bulk ops/s | heap per-key ops/s | heap bulk / per-key "
        "| RocksDB bulk ops/s | RocksDB per-key ops/s | RocksDB bulk / per-key |",
        "|---|---|---|---|---|---|---|",
    ]
    for op in BULK_OPERATIONS:
        cells = [f"`{op}`"]
        for backend in ("heap", "rocksdb"):
            e = rows.get((backend, op), {})
            ratio = e.get("ratio_vs_per_key")
            cells += [_fmt(e.get("statekit_ops_s")), _fmt(e.get("per_key_ops_s")),
                      "-" if ratio is None else f"{ratio:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
