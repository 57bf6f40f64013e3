"""The timers section of ``docs/benchmarks.md``: firing cost against pending timers, checkpoints of
timers against the raw disk (``test_timers_bench.py``) and session windows on Spark against Spark's
own timers (``test_spark_sessions.py``, from its JSON file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

BOUND = 1.5
KIND_NAMES = {"heap": "heap", "rocksdb": "RocksDB (timers in RocksDB)",
              "rocksdb-heap": "RocksDB (timer service HEAP)"}
COMMANDS = """Commands (each ratio is measured within one run):

* `make bench` runs all of them (the 10^7 cases are marked `large`, the Spark ones `spark`;
  `make bench-quick` runs the firing and checkpoint benchmarks at 10^4 and 10^5 as a plumbing
  check);
* the timer benchmarks alone: `.venv/bin/python -m pytest benchmarks/test_timers_bench.py
  -p no:cacheprovider -q -s -o testpaths=benchmarks --benchmark-json=benchmarks/results/timers.json`
  (`-m "not large"` leaves out 10^7; `STATEKIT_BENCH_STRICT=1` asserts the bounds), then
  `.venv/bin/python -m benchmarks.report benchmarks/results/full.json benchmarks/results/timers.json`
  puts them beside the other sections' figures;
* `.venv/bin/python -m pytest benchmarks/test_spark_sessions.py -p no:cacheprovider -q -s
  -o testpaths=benchmarks` writes `benchmarks/results/spark-sessions.json`, which the report reads
  (about 40 minutes on 2 cores at 100k users).
"""


def _fmt(x: Any, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("**met**" if ok else "**missed**")


def _firing(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per level and backend, the firing run with the most sizes (the ``large`` one includes the
    smaller run's sizes)."""
    widest: dict[tuple[str, str], dict[str, Any]] = {}
    for b in data.get("benchmarks", []):
        e = b.get("extra_info", {})
        if b["name"].startswith("test_timer_firing") and "fixed" in e:
            seen = widest.get((e["level"], e["kind"]))
            if seen is None or len(e["sizes"]) > len(seen["sizes"]):
                widest[e["level"], e["kind"]] = e
    return list(widest.values())


def _checkpoints(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [b["extra_info"] for b in data.get("benchmarks", [])
            if b["name"].startswith("test_timer_checkpoint_restore")
            and "ratios" in b.get("extra_info", {})]


def firing_table(runs: list[dict[str, Any]]) -> str:
    header = ["level", "timers held by", "pending timers", "1,000 due: ms / advance",
              "x vs smallest", "1 % due: timers / advance", "µs / fired timer", "x vs smallest",
              "load avg"]
    rows = []
    for e in sorted(runs, key=lambda e: (e["level"], e["kind"], len(e["sizes"]))):
        series = [(KIND_NAMES.get(e["kind"], e["kind"]), e["fixed"], e["percent"])]
        if e.get("baseline"):
            series.append(("raw `heapq` of the same entries (baseline)", e["baseline"]["fixed"],
                           e["baseline"]["percent"]))
        for name, fixed, percent in series:
            for n in e["sizes"]:
                f, p = fixed[str(n)], percent[str(n)]
                rows.append([e["level"], name, f"{n:,}",
                             _fmt(f["advance_s"] * 1e3), _fmt(f["advance_ratio_to_smallest"]),
                             f"{p['fired_per_advance']:,}", _fmt(p["us_per_timer"]),
                             _fmt(p["per_timer_ratio_to_smallest"]),
                             _fmt((e.get("loadavg") or [None])[0], 1)])
    return _table(header, rows)


def checkpoint_table(runs: list[dict[str, Any]]) -> str:
    header = ["timers held by", "timers", "checkpoint bytes", "B / timer", "checkpoint (rounds)",
              "write MB/s", "raw disk write MB/s", "ckpt / disk", "restore", "restore MB/s",
              "raw disk cold read MB/s", "restore / disk", "ns / timer: ckpt, restore"]
    rows = []
    for e in sorted(runs, key=lambda e: (e["backend"], e["timers"])):
        disk, full, rest = e["disk"]["best"], e["full"], e["restore_full"]
        rounds = ", ".join(f"{s:.3g}" for s in full.get("all_total_s", [full["total_s"]]))
        rows.append([KIND_NAMES.get(e["backend"], e["backend"]), f"{e['timers']:,}",
                     f"{full['bytes']:,}", _fmt(e["bytes_per_timer"], 1), f"{rounds} s",
                     full["write_mb_s"], disk["write_mb_s"],
                     f"{e['ratios']['checkpoint_write_vs_disk']:.1%}", f"{rest['restore_s']:.3g} s",
                     rest["read_mb_s"], disk["read_mb_s"],
                     f"{e['ratios']['restore_read_vs_disk']:.1%}",
                     f"{e['checkpoint_ns_per_timer']:,}, {e['restore_ns_per_timer']:,}"])
    return _table(header, rows)


def sessions_table(rows_in: list[dict[str, Any]]) -> str:
    header = ["path", "backend", "time", "rows", "users", "wall", "rows/s", "x Spark's TWS",
              "sessions", "= pandas", "= Spark's", "load avg (start-end)"]
    rows = [[r["path"], r["backend"], r["domain"], f"{r['rows']:,}", f"{r['keys']:,}",
             f"{r['wall_s']} s", f"{r['rows_per_s']:,.0f}",
             _fmt(r.get("ratio_to_spark_tws")) if "ratio_to_spark_tws" in r
             else ("(baseline)" if r.get("baseline", True) else "(slower run of Spark's)"),
             f"{r['sessions']:,}", r["correct"], r.get("same_sessions_as_spark", "-"),
             "-".join(f"{x:g}" for x in r.get("loadavg_1m_start_end", []))]
            for r in rows_in]
    return _table(header, rows)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def _plot(runs: list[dict[str, Any]], img: Path) -> bool:
    if not runs:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    for e in runs:
        sizes = e["sizes"]
        label = f"{e['level']}: {KIND_NAMES.get(e['kind'], e['kind'])}"
        style = "-" if e["level"] == "service" else "--"
        axes[0].plot(sizes, [e["fixed"][str(n)]["advance_s"] * 1e3 for n in sizes], style,
                     marker="o", label=label)
        axes[1].plot(sizes, [e["percent"][str(n)]["us_per_timer"] for n in sizes], style,
                     marker="o", label=label)
    for ax, title, unit in ((axes[0], "1,000 timers due per advance", "ms per advance"),
                            (axes[1], "1 % of the timers due per advance", "µs per fired timer")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("pending timers (one per key)")
        ax.set_ylabel(unit)
        ax.set_title(title)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(img / "timers_firing.png", dpi=110)
    plt.close(fig)
    return True


def load_sessions(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return data if isinstance(data, list) else []


def section_timers(data: dict[str, Any], sessions_json: Path, img: Path, rel: str
                   ) -> tuple[str, list[str]]:
    """The section's Markdown and its lines for the summary against the targets."""
    firing, ckpts, sessions = _firing(data), _checkpoints(data), load_sessions(sessions_json)
    summary: list[str] = []
    runs = sorted({b["extra_info"]["run"][:16].replace("T", " ") for b in data.get("benchmarks", [])
                   if b["name"].startswith("test_timer_") and b.get("extra_info", {}).get("run")})
    parts = ["## Timers", "",
             "From `benchmarks/test_timers_bench.py` and `benchmarks/test_spark_sessions.py`, whose "
             "docstrings describe the method"
             + (f"; the timer benchmarks ran on their own ({', '.join(runs)} UTC), not in the run "
                "named at the top, with the load average given per row" if runs else "") + ".", ""]
    if firing:
        largest = {}
        for e in firing:
            if e["level"] == "service" and max(e["sizes"]) >= max(
                    largest.get(e["kind"], {}).get("sizes", [0])):
                largest[e["kind"]] = e
        for kind, e in largest.items():
            top, low = max(e["sizes"]), min(e["sizes"])
            summary.append(
                f"- **Timer firing, {KIND_NAMES.get(kind, kind)}** ({low:,} -> {top:,} pending "
                f"timers): with 1,000 due per advance, the time per advance grows "
                f"x{e['fixed_advance_ratio']} (bound <= {BOUND}x: "
                f"{_verdict(e['fixed_advance_ratio'] <= BOUND)}"
                + ("" if top >= 10_000_000 else f"; measured up to {top:,} only") + "); with 1 % due, "
                f"the time per fired timer grows x{e['percent_per_timer_ratio']} "
                f"({_verdict(e['percent_per_timer_ratio'] <= BOUND)} against the same bound).")
        parts += [
            "### Firing cost against pending timers",
            "",
            "Each key holds one event-time timer; the watermark moves so that (i) 1 % of the "
            "timers or (ii) a fixed 1,000 are due per advance, and fired timers are registered "
            "again later (untimed), so the pending count stays. The sizes take turns within each "
            "round; ratios are medians of per-round ratios. **The 1.5x bound is checked on (ii)**: "
            "with 1 % due, 10^7 keys fire 100x the timers of 10^5 per advance, so the time per "
            "advance must grow about 100x whatever the queue; only with the same number due does "
            "the time per advance show what the number of *keys* costs. (i) is reported per fired "
            "timer, against the same 1.5x. `service` = the backend's queue through "
            "`InternalTimerService`; `harness` = end to end through "
            "`KeyedOneInputStreamOperatorTestHarness.process_watermark` (an `on_timer` that "
            "updates a value state, re-registers its timer and emits a row).",
            ""]
        if _plot(firing, img):
            parts += [f"![timer firing]({rel}/timers_firing.png)", ""]
        parts += [firing_table(firing), ""]
    else:
        parts += ["Timer firing (`test_timer_firing*`) was not part of this run.", ""]
    if ckpts:
        for e in ckpts:
            if e["timers"] >= 10_000_000 or e["timers"] == max(c["timers"] for c in ckpts):
                summary.append(
                    f"- **Checkpoint / restore of {e['timers']:,} timers, "
                    f"{KIND_NAMES.get(e['backend'], e['backend'])}**: "
                    f"{e['ratios']['checkpoint_write_vs_disk']:.1%} / "
                    f"{e['ratios']['restore_read_vs_disk']:.1%} of the raw disk's throughput for "
                    f"the same bytes (target >= 70 %: checkpoint "
                    f"{_verdict(e['ratios']['checkpoint_write_vs_disk'] >= 0.7)}, restore "
                    f"{_verdict(e['ratios']['restore_read_vs_disk'] >= 0.7)}).")
        parts += [
            "### Checkpoint and restore of timers",
            "",
            "A full checkpoint of the timers to `FileSystemCheckpointStorage` and its restore "
            "from a cold page cache until the queue is usable, against the raw disk measured in "
            "the same test (the method of the checkpoint section above: sequential write + "
            "fsync and cold read of about the same bytes, before and after, the better probe "
            "counts). Checkpoint rounds: every round's time (the first RocksDB one flushes the "
            "memtable); the fastest counts.",
            "",
            checkpoint_table(ckpts), ""]
    else:
        parts += ["Checkpoints of timers (`test_timer_checkpoint_restore`) were not part of this "
                  "run.", ""]
    if sessions:
        ours = [r for r in sessions if "ratio_to_spark_tws" in r]
        for r in ours:
            summary.append(
                f"- **Spark sessions, {r['path']} [{r['backend']}]**: {r['ratio_to_spark_tws']}x "
                f"the rows/s of Spark's `transformWithStateInPandas` with its own timers "
                f"({r['domain']} time, {r['keys']:,} users; target >= 2x: "
                f"{_verdict(r['ratio_to_spark_tws'] >= 2.0)}; same sessions: "
                f"{r['same_sessions_as_spark']}).")
        where = (sessions_json.name if not sessions_json.is_absolute()
                 else f"benchmarks/results/{sessions_json.name}")
        parts += ["### Session windows on Spark against Spark's own timers", "",
                  f"From `{where}`. The same input files and sink for every path; each path's "
                  "sessions are checked against pandas before its speed counts.", "",
                  sessions_table(sessions), ""]
    else:
        parts += ["The Spark session benchmark (`benchmarks/test_spark_sessions.py`) has no "
                  f"results file (`{sessions_json.name}`) yet.", ""]
    parts.append(COMMANDS)
    return "\n".join(parts), summary
