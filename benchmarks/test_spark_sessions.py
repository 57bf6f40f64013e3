"""Spark session windows on timers: statekit's adapters against Spark's own ``transformWithStateInPandas``.

:class:`statekit.testing.workloads.Sessions` through ``transform_with_state`` (``time_mode``
``EventTime`` and ``ProcessingTime``) and ``foreach_batch``, on both backends, against the same
sessions as a native ``StatefulProcessor`` with Spark's list state and timers (``timeMode``
``EventTime`` and ``ProcessingTime``; run before and after statekit's paths, the faster run
counts), at 100k users: rows/s, target >= 2x Spark's of the same time domain.  Each path's
sessions are checked against pandas (and so against Spark's) before its speed counts.  The runs
are in ``spark_sessions_driver`` (its docstring has the method); results in
``results/spark-sessions.json`` (quick mode: ``spark-sessions-quick.json``).

    .venv/bin/python -m pytest benchmarks/test_spark_sessions.py -p no:cacheprovider -s
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import spark_sessions_driver
from benchmarks._common import QUICK, STRICT, spark_env
from benchmarks.spark_sessions_driver import (
    SESSION_PATHS,
    TARGET_RATIO,
    run,
    save,
    summarize,
)

pytestmark = pytest.mark.spark

RESULTS: list[dict[str, Any]] = []


@pytest.fixture(scope="module")
def env():
    yield from spark_env(spark_sessions_driver)


@pytest.mark.parametrize(("path", "backend"), SESSION_PATHS,
                         ids=[f"{p}-{b}" + ("-again" if SESSION_PATHS.index((p, b)) < i else "")
                              for i, (p, b) in enumerate(SESSION_PATHS)])
def test_sessions(benchmark, env, path, backend):
    spark, inputs = env
    benchmark.group = "spark-sessions"
    result = benchmark.pedantic(run, args=(spark, path, backend, inputs.events, inputs.work),
                                kwargs={"keys": inputs.sizes["keys"]}, rounds=1, iterations=1)
    RESULTS.append(result)
    target = save(RESULTS, QUICK)
    benchmark.extra_info.update({k: v for k, v in result.items() if not isinstance(v, list | dict)})
    print(f"\n{path}[{backend}]: {result['rows']} rows in {result['wall_s']} s = "
          f"{result['rows_per_s']} rows/s, batches {result['batch_s']} s, "
          f"{result['sessions']} sessions, correct={result['correct']} -> {target}")
    assert result["correct"], result


def test_sessions_targets():
    rows = [r for r in summarize(RESULTS) if "ratio_to_spark_tws" in r]
    if not rows:
        pytest.skip("the session paths did not run")
    for r in rows:
        print(f"\n{r['path']}[{r['backend']}]: {r['ratio_to_spark_tws']}x Spark's "
              f"transformWithStateInPandas ({r['domain']} time; target >= {TARGET_RATIO}), "
              f"same sessions: {r['same_sessions_as_spark']}")
    assert all(r["same_sessions_as_spark"] for r in rows)
    if STRICT:
        assert all(r["ratio_to_spark_tws"] >= TARGET_RATIO for r in rows)
