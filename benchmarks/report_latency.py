"""Tables and a plot of the Spark ``foreach_batch`` latency benchmark (``test_spark_latency.py``):
per backend configuration and state size, the measured micro-batches' latency, its ratio to the
smallest size, the stateless baseline and the checkpoint bytes.

Run: ``python -m benchmarks.report_latency results/spark-latency.json [--img docs/img/x.png]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _label(run: dict[str, Any]) -> str:
    return f"{run['backend']}, {'incremental' if run['incremental'] else 'full'} checkpoints"


def _split(run: dict[str, Any], size: int) -> str:
    """p50 latency of the measured batches whose state was reused in memory / restored."""
    measured = [b for b in run["batches"] if b["kind"] == "statekit" and b["size"] == size]
    out = []
    for restored in (False, True):
        xs = [b["trigger_s"] for b in measured if bool(b["restored_rows"]) is restored]
        out.append(f"{statistics.median(xs):.2f}" if xs else "-")
    return " / ".join(out)


def table(run: dict[str, Any]) -> str:
    """A markdown table of one run's sizes (latencies from Spark's ``triggerExecution``)."""
    lines = [f"**{_label(run)}**", "",
             "| keys held | state | p50 s | max s | p50 / smallest | baseline p50 s | state adds s "
             "| checkpoint MB / batch (p50) | restored batches | p50 s reused / restored | load 1m |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in run["sizes"]:
        sk, bl = r["statekit_trigger_s"], r["baseline_trigger_s"]
        gib = r["size"] * run["value_bytes"] / 2**30
        lines.append(
            f"| {r['size']:,} | {gib:.2f} GiB | {sk['p50']:.2f} | {sk['max']:.2f} | "
            f"{r['statekit_ratio_to_smallest']:.2f} | {bl['p50']:.2f} | {r['state_added_p50_s']:.2f} | "
            f"{r['checkpoint_bytes_p50'] / 1e6:,.0f} | {r['batches_with_restore']}/{r['measured']} | "
            f"{_split(run, r['size'])} | {r['loadavg_1m'][0]}-{r['loadavg_1m'][1]} |")
    return "\n".join(lines) + "\n"


def plot(runs: list[tuple[str, dict[str, Any]]], out: Path) -> None:
    """p50 latency (bars: min..max) against keys held, one line per (label, run)."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, run in runs:
        sizes = [r["size"] for r in run["sizes"]]
        p50 = [r["statekit_trigger_s"]["p50"] for r in run["sizes"]]
        lo = [p - r["statekit_trigger_s"]["min"] for p, r in zip(p50, run["sizes"], strict=True)]
        hi = [r["statekit_trigger_s"]["max"] - p for p, r in zip(p50, run["sizes"], strict=True)]
        ax.errorbar(sizes, p50, yerr=[lo, hi], marker="o", capsize=3, label=f"{label}: {_label(run)}")
    base = runs[0][1]["sizes"]
    ax.plot([r["size"] for r in base], [r["baseline_trigger_s"]["p50"] for r in base], "k--",
            label="stateless foreachBatch baseline")
    ax.set_xscale("log")
    ax.set_xlabel("keys held (1 KiB each)")
    ax.set_ylabel("micro-batch latency, s (p50, min..max)")
    ax.set_title("foreach_batch: 10,000 keys read and rewritten per micro-batch")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="+", help="label=path or path")
    parser.add_argument("--img", type=Path)
    args = parser.parse_args(argv)
    runs: list[tuple[str, dict[str, Any]]] = []
    for item in args.results:
        label, _, path = str(item).rpartition("=")
        for run in json.loads(Path(path).read_text())["runs"]:
            runs.append((label, run))
            print(f"{label} " + table(run))
    if args.img:
        plot([r for r in runs if r[1]["incremental"]], args.img)


if __name__ == "__main__":
    main()
