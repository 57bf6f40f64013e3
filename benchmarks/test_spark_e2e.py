"""Spark end-to-end benchmark: throughput and large map state; the runs themselves are in ``spark_driver``.

Throughput: a per-key running (count, sum) over 10 files x 100k rows / 50k keys through Spark's own
``applyInPandasWithState``, ``transformWithStateInPandas`` and native ``groupBy().agg``, and every
statekit adapter x backend.  The per-key Python paths (Spark's and statekit's ``applyInPandasWithState``
/ ``transformWithStateInPandas``) run at 1-2k rows/s, so they read only the first
``STATEKIT_SPARK_SLOW_FILES`` (default 2) files: still 50k keys; each result records its ``rows``
and ``input`` (``full`` / ``slow``).

Large map state: a MapState of 10k entries per key (20 keys, filled in the first batch, then every event
changes one entry) through statekit's ``apply_in_pandas_with_state`` against Spark's
``applyInPandasWithState`` holding the map (a pickled dict) in its state row: rows/s and the state
bytes written per batch.

``STATEKIT_BENCH_QUICK=1``: tiny inputs, every path, results in ``results/spark-quick.json``; full
mode writes ``results/spark.json``.  ``STATEKIT_BENCH_STRICT=1`` asserts the issue's targets.

    .venv/bin/python -m pytest benchmarks/test_spark_e2e.py -p no:cacheprovider -s
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import spark_driver
from benchmarks._common import QUICK, STRICT, spark_env
from benchmarks.spark_driver import (
    LARGE_MAP_PATHS,
    RUNNING_AGGREGATE_PATHS,
    run,
    save,
    summarize,
)

pytestmark = pytest.mark.spark

RESULTS: list[dict[str, Any]] = []


@pytest.fixture(scope="module")
def env():
    yield from spark_env(spark_driver)


def _record(benchmark: Any, result: dict[str, Any]) -> None:
    RESULTS.append(result)
    target = save(RESULTS, QUICK)
    benchmark.extra_info.update({k: v for k, v in result.items() if not isinstance(v, list | dict)})
    print(f"\n{result['path']}[{result['backend']}, {result['input']}]: {result['rows']} rows in "
          f"{result['wall_s']} s = "
          f"{result['rows_per_s']} rows/s (steady {result['steady_rows_per_s']}), "
          f"state bytes/batch after the first {result['bytes_per_batch']}, correct={result['correct']} "
          f"-> {target}")


def _run(benchmark: Any, env: Any, path: str, backend: str, input_name: str) -> dict[str, Any]:
    spark, inputs = env
    result = benchmark.pedantic(
        run, args=(spark, path, backend, inputs.input_for(path, input_name), inputs.work),
        kwargs={"keys": inputs.keys_for(path, input_name), "input_name": input_name}, rounds=1, iterations=1)
    _record(benchmark, result)
    return result


@pytest.mark.parametrize(("path", "backend", "input_name"), RUNNING_AGGREGATE_PATHS,
                         ids=[f"{p}-{b}-{i}" for p, b, i in RUNNING_AGGREGATE_PATHS])
def test_running_aggregate(benchmark, env, path, backend, input_name):
    result = _run(benchmark, env, path, backend, input_name)
    assert result["correct"], result


@pytest.mark.parametrize(("path", "backend"), LARGE_MAP_PATHS, ids=[f"{p}-{b}" for p, b in LARGE_MAP_PATHS])
def test_large_map_state(benchmark, env, path, backend):
    result = _run(benchmark, env, path, backend, "full")
    assert result["correct"], result


def test_targets():
    summary = next((r for r in summarize(RESULTS) if r["path"] == "summary"), None)
    if summary is None:
        pytest.skip("the throughput paths did not all run")
    print(f"\nfastest statekit path {summary['fastest_statekit_path']}[{summary['backend']}]: "
          f"{summary['ratio_to_apply_in_pandas']}x Spark's applyInPandasWithState (target >= 10), "
          f"{summary['ratio_to_native_count']}x native groupBy count (target >= 0.5)")
    assert summary["all_correct"]
    if STRICT:
        assert summary["ratio_to_apply_in_pandas"] >= summary["target_ratio_to_apply_in_pandas"]
        assert summary["ratio_to_native_count"] >= summary["target_ratio_to_native_count"]
