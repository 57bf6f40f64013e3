"""The windows section of ``docs/benchmarks.md``: window aggregation on the local runner against
the same algorithm in plain Python (``test_window_bench.py``)."""

from __future__ import annotations

from typing import Any


def _rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [b["extra_info"] for b in data.get("benchmarks", [])
            if b["name"].startswith("test_window_aggregation") and "ratio" in b.get("extra_info", {})]


def section_windows(data: dict[str, Any]) -> str:
    """A table of the window benchmarks (empty when the run has none)."""
    rows = _rows(data)
    if not rows:
        return ""
    lines = [
        "## Windows on the local runner",
        "",
        "`benchmarks/test_window_bench.py`: a sum per window by `reduce` over 10^4 keys, tumbling "
        "windows of 10 s and event-time sessions with a 1.5 s gap, against the same algorithm in "
        "plain Python (a dict of running sums, a `heapq` of window ends, the watermark after every "
        "element), interleaved round by round; both give the same windows. The ratio is "
        "throughput(runner) / throughput(raw), the median of the rounds; \"no-op job / raw\" is the "
        "same for a job over the same events whose keyed function does nothing: the ceiling of "
        "any window operator on the local runner.",
        "",
        "| backend | windows | events | raw events/s | runner events/s | ratio | no-op job / raw "
        "| target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["backend"], r["kind"])):
        verdict = "**met**" if r["ratio"] >= r["target"] else "**missed**"
        lines.append(f"| {r['backend']} | {r['kind']} | {r['events']:,} | "
                     f"{r['raw_events_per_s']:,} | {r['runner_events_per_s']:,} | "
                     f"{r['ratio']:.3f} | {r.get('floor_ratio', float('nan')):.3f} | "
                     f">= {r['target']} {verdict} |")
    lines.append("")
    return "\n".join(lines) + "\n"
