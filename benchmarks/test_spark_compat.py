"""Spark's own stateful APIs through statekit's switch against Spark running the same code itself.

The same unchanged ``StatefulProcessor`` (``transformWithStateInPandas``) and
``applyInPandasWithState`` function, natively with Spark's RocksDB state store provider and with
``statekit.spark.compat.enable(spark)`` on each statekit backend, on the running-count and the
session workloads at 100k keys (``STATEKIT_COMPAT_KEYS``): rows/s over Spark's own, measured in
one run; targets >= 1.5x (``transformWithStateInPandas``) and >= 1.0x
(``applyInPandasWithState``).  Each run's output is checked against pandas before its speed
counts.  The runs are in ``spark_compat_driver`` (its docstring has the method); results in
``results/spark-compat.json`` (quick mode: ``spark-compat-quick.json``).

    .venv/bin/python -m pytest benchmarks/test_spark_compat.py -p no:cacheprovider -s -o testpaths=benchmarks
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import spark_compat_driver
from benchmarks._common import QUICK, STRICT, spark_env
from benchmarks.spark_compat_driver import (
    NATIVE,
    PATHS,
    run_path,
    save,
    summarize,
)

pytestmark = pytest.mark.spark

RESULTS: list[dict[str, Any]] = []


@pytest.fixture(scope="module")
def env():
    yield from spark_env(spark_compat_driver)


@pytest.mark.parametrize(("workload", "api", "backend"), PATHS,
                         ids=["-".join(p) for p in PATHS])
def test_compat(benchmark, env, workload, api, backend):
    spark, inputs = env
    benchmark.group = "spark-compat"
    result = benchmark.pedantic(run_path, args=(spark, inputs, workload, api, backend),
                                rounds=1, iterations=1)
    RESULTS.append(result)
    target = save(RESULTS, QUICK)
    benchmark.extra_info.update({k: v for k, v in result.items() if not isinstance(v, list | dict)})
    print(f"\n{workload}/{api}[{backend}]: {result['rows']} rows in {result['wall_s']} s = "
          f"{result['rows_per_s']} rows/s, correct={result['correct']} -> {target}")
    assert result["correct"], result


def test_compat_targets():
    rows = [r for r in summarize(RESULTS) if "ratio_to_spark" in r]
    if not rows:
        pytest.skip("the compat paths did not run")
    for r in rows:
        print(f"\n{r['workload']}/{r['api']}[{r['backend']}]: {r['ratio_to_spark']}x Spark's own "
              f"({NATIVE}; target >= {r['target_ratio']})")
    assert all(r.get("same_sessions_as_spark", True) for r in rows)
    if STRICT:
        assert all(r["ratio_to_spark"] >= r["target_ratio"] for r in rows)
