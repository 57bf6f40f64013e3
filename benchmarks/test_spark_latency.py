"""A Spark ``foreach_batch`` micro-batch's latency against the state already held, per backend:
10,000 rows over 10,000 keys read and rewritten (ValueState of 1 KiB) at 10^4, 10^5 and 10^6
keys held (about 0.01, 0.1 and 1 GiB) with incremental checkpoints (RocksDB also with changelog
checkpoints: ``rocksdb+changelog``), and at 10^4 and 10^5 with full ones (the default: every
micro-batch writes the whole state).  Interleaved with each
measured micro-batch: the same micro-batch through a stateless ``foreachBatch`` doing the same
Python work.  Runs in ``benchmarks/spark_latency_driver.py``; marked ``large`` and ``spark``.

``STATEKIT_BENCH_QUICK=1``: 1,000 rows at 2,000 and 20,000 keys (about a minute per case).

Run: ``pytest benchmarks/test_spark_latency.py -m large -s -o testpaths=benchmarks``; the
figures go to ``results/spark-latency[-quick].json``.
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import spark_driver, spark_latency_driver
from benchmarks._common import QUICK, loadavg, spark_workdir

pytestmark = [pytest.mark.large, pytest.mark.spark]

CASES = [("hashmap", True), ("rocksdb", True), ("rocksdb+changelog", True), ("hashmap", False),
         ("rocksdb", False)]
RESULTS: list[dict[str, Any]] = []


def _sizes(incremental: bool) -> list[int]:
    if QUICK:
        return [2_000, 20_000]
    return [10_000, 100_000, 1_000_000] if incremental else [10_000, 100_000]


@pytest.fixture(scope="module")
def env():
    yield from spark_workdir("statekit-spark-latency-",
                             {"spark.sql.streaming.numRecentProgressUpdates": "2000"})


@pytest.mark.parametrize(("backend", "incremental"), CASES,
                         ids=[f"{b}-{'incremental' if i else 'full'}" for b, i in CASES])
def test_latency_against_state_size(benchmark: Any, env: Any, backend: str, incremental: bool) -> None:
    spark, work = env
    benchmark.group = "spark-latency"
    the_plan = spark_latency_driver.plan(QUICK, _sizes(incremental))
    load0 = loadavg()
    result = benchmark.pedantic(spark_latency_driver.run,
                                args=(spark, backend, incremental, the_plan, work),
                                rounds=1, iterations=1)
    result["loadavg_start_end"] = [load0, loadavg()]
    RESULTS.append(result)
    target = spark_driver.save_summary({"runs": RESULTS}, "STATEKIT_SPARK_LATENCY_JSON",
                                       "spark-latency", QUICK)
    benchmark.extra_info.update({"backend": backend, "incremental": incremental,
                                 "sizes": result["sizes"]})
    for row in result["sizes"]:
        print(f"\n{backend} {'incremental' if incremental else 'full'} {row['size']:>9,} keys: "
              f"statekit p50 {row['statekit_trigger_s'].get('p50')} s "
              f"max {row['statekit_trigger_s'].get('max')} s "
              f"(x{row['statekit_ratio_to_smallest']}), baseline p50 "
              f"{row['baseline_trigger_s'].get('p50')} s, checkpoint "
              f"{row['checkpoint_bytes_p50']} B/batch, restored in {row['batches_with_restore']}"
              f"/{row['measured']} batches, load {row['loadavg_1m']}, "
              f"correct={row['correct']}")
    print(f"-> {target}")
    assert all(row["correct"] for row in result["sizes"]), result["sizes"]
