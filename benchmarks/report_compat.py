"""The Spark compat section of ``docs/benchmarks.md``: Spark's own APIs through statekit's switch
against Spark running the same code (``test_spark_compat.py``, from its JSON file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

API_NAMES = {"tws": "`transformWithStateInPandas`", "aipws": "`applyInPandasWithState`"}


def load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return data if isinstance(data, list) else []


def summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per (workload, API) for the summary against the targets."""
    lines = []
    for workload, api in dict.fromkeys((r["workload"], r["api"]) for r in rows
                                       if "ratio_to_spark" in r):
        mine = [r for r in rows if (r["workload"], r["api"]) == (workload, api)
                and "ratio_to_spark" in r]
        target = mine[0]["target_ratio"]
        ratios = " / ".join(f"{r['ratio_to_spark']:.2f} ({r['backend']})" for r in mine)
        met = all(r["ratio_to_spark"] >= target for r in mine)
        lines.append(f"- **Spark compat, {workload}, {API_NAMES[api]}**: {ratios} x the rows/s of "
                     f"Spark running the same code ({mine[0]['keys']:,} keys; target >= {target}: "
                     f"{'**met**' if met else '**missed**'}).")
    return lines


def section_compat(path: Path) -> tuple[str, list[str]]:
    """The section's Markdown and its lines for the summary against the targets."""
    rows = load(path)
    head = ["## Spark's own APIs through statekit's switch", ""]
    if not rows:
        return "\n".join([
            *head, "The compat benchmark (`benchmarks/test_spark_compat.py`) has no results here "
            f"(`benchmarks/results/{path.name}` did not exist when this report was generated).",
            ""]) + "\n", []
    text = [
        *head, f"From `benchmarks/results/{path.name}`, written by `benchmarks/test_spark_compat.py` "
        "(method in `benchmarks/spark_compat_driver.py`): the same unchanged processor or "
        "function, run by Spark with its RocksDB state store provider (`spark-rocksdb`) and "
        "through `statekit.spark.compat.enable(spark)` on each statekit backend, in one run; "
        "each run's output is checked against pandas.",
        "",
        "| workload | API | backend | rows | keys | wall | rows/s | x Spark's | correct "
        "| load avg (start-end) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['ratio_to_spark']:.2f}" if "ratio_to_spark" in r else "(Spark's own)"
        load_avg = "-".join(f"{x:g}" for x in r.get("loadavg_1m_start_end", []))
        text.append(f"| {r['workload']} | {API_NAMES[r['api']]} | {r['backend']} | "
                    f"{r['rows']:,} | {r['keys']:,} | {r['wall_s']} s | {r['rows_per_s']:,.0f} | "
                    f"{ratio} | {r['correct']} | {load_avg} |")
    return "\n".join(text) + "\n\n", summary_lines(rows)
