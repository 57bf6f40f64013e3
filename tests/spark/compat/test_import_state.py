"""Bringing a native query's state along: a query runs natively on Spark's state store for five
micro-batches, its state is imported, and the same unchanged processor or function, switched to
statekit, runs five more from the new location; every key's output equals that of the native
query continued over the same five batches from a copy of its checkpoint, a query that never
switched (both APIs, both backends).  And what the import refuses."""

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from statekit.cli import main
from statekit.errors import CheckpointNotFoundError, ConfigError, ConfigTypeError, StateTypeError
from statekit.spark.compat import disable, enable, import_state
from statekit.spark.compat.bridge import PROVIDER_KEY
from tests.spark.compat import import_jobs as jobs
from tests.spark.compat.conftest import BACKENDS

pytestmark = pytest.mark.spark

HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
NATIVE_PROVIDER = {"pandas": ROCKSDB, "apply": HDFS, "pandas-light": ROCKSDB,
                   "apply-light": HDFS, "row": ROCKSDB}  # Spark's defaults for each API


def native(spark, api):
    disable(spark)
    spark.conf.set(PROVIDER_KEY, NATIVE_PROVIDER[api])


def import_args(api):
    if api == "pandas":
        return (jobs.Sessions(),), {}
    if api == "pandas-light":
        return (jobs.Counts(),), {}
    if api == "row":
        return (jobs.RowSessions(),), {}
    if api == "apply":
        return (jobs.visits,), {"stateStructType": jobs.VISITS_STATE, "outputMode": "update",
                                "timeoutConf": "EventTimeTimeout"}
    return (jobs.count_visits,), {"outputMode": "update", "timeoutConf": "NoTimeout"}


def check_import(spark, tmp_path, api, frame=jobs.batch_frame, imported=None,
                 backends=BACKENDS):
    """Five batches natively; then a copy of that checkpoint runs five more natively (the query
    that never switched: the reference); the first checkpoint is imported into each of
    ``backends`` and the same code, switched, runs the same five batches: every output row
    equal.  The imports' results.  ``imported(backend, location)`` looks at each import before
    the switched batches run."""
    native(spark, api)
    jobs.write_batches(tmp_path / "in", range(5), frame)
    jobs.run(spark, api, str(tmp_path / "in"), str(tmp_path / "native"))
    # (a stopped query's state store may still be writing a snapshot: its temp files come and go)
    shutil.copytree(tmp_path / "native", tmp_path / "reference",
                    ignore=shutil.ignore_patterns("*.tmp", "*.tmp.crc"))
    jobs.write_batches(tmp_path / "in", range(5, 10), frame)
    expected = jobs.run(spark, api, str(tmp_path / "in"), str(tmp_path / "reference"))
    assert expected
    args, kwargs = import_args(api)
    results, rests = [], []
    try:
        for backend in backends:
            native(spark, api)
            spark.conf.set("spark.statekit.state.backend.type", backend)
            moved = tmp_path / f"moved-{backend}"
            result = import_state(spark, str(tmp_path / "native"), str(moved), *args, **kwargs)
            assert result.backend == backend
            assert os.listdir(moved / "statekit") == [result.query_id]
            if imported is not None:
                imported(backend, str(moved))
            # the same code, switched, from the new location over the five more batches
            enable(spark)
            rest = jobs.run(spark, api, str(tmp_path / "in"), str(moved))
            assert sorted(rest) == sorted(expected), backend
            results.append(result)
            rests.append(rest)
    finally:
        disable(spark)
        spark.conf.unset("spark.statekit.state.backend.type")
    return results, rests


@pytest.mark.parametrize(("api", "backend"), [
    ("pandas", "rocksdb"), ("apply", "hashmap"),  # the default run's: each API, each backend
    pytest.param("pandas", "hashmap", marks=pytest.mark.heavy),
    pytest.param("apply", "rocksdb", marks=pytest.mark.heavy)])
def test_switched_query_continues_from_imported_state(spark, tmp_path, api, backend):
    results, rests = check_import(spark, tmp_path, api, backends=[backend])
    for result, rest in zip(results, rests, strict=True):
        assert result.keys == 6 and result.timers in (0, 6)
        assert ("k4", -1) in {row[:2] for row in rest}  # its imported timer fired


@pytest.mark.parametrize("backend", ["rocksdb", pytest.param("hashmap", marks=pytest.mark.heavy)])
def test_row_api_source_with_ttl(spark, tmp_path, backend):
    """A ``transformWithState`` (Row API) query with TTL value and map state: the import keeps
    each entry's TTL expiry as Spark recorded it, and the switched query continues exactly."""
    def same_expiries(backend, location):
        spark_count = (spark.read.format("statestore").option("stateVarName", "count")
                       .load(str(tmp_path / "native")).select("key.user", "value.ttlExpirationMs")
                       .toPandas())
        theirs = dict(zip(spark_count["user"], spark_count["ttlExpirationMs"], strict=True))
        ours = (spark.read.format("statekit").option("stateVarName", "count").load(location)
                .toPandas())
        stamps = {jobs_key(k): int(t.timestamp() * 1000) + jobs.TTL_MS
                  for k, t in zip(ours["key"], ours["ttl_timestamp"], strict=True)}
        assert theirs and stamps == theirs, backend

    results, rests = check_import(spark, tmp_path, "row", imported=same_expiries,
                                  backends=[backend])
    for result, rest in zip(results, rests, strict=True):
        assert result.keys == 6 and result.timers == 6  # k0-k5, each a timer a day ahead
        assert rest and all(row[1] > 0 for row in rest)


def jobs_key(key):
    """A key as the statekit reader shows it (a one-field tuple key may come as a row)."""
    return key[0] if isinstance(key, tuple | list) else getattr(key, "user", key)


@pytest.mark.slow
@pytest.mark.parametrize("api", ["pandas-light", "apply-light"])
def test_import_at_a_million_keys(spark, tmp_path, api):
    """A million keys of state imported into each backend (``make test-slow``: about 52 minutes
    on 2 cores, 32 of them for the processor with a timer per key, most of it in Spark's own
    native batches)."""
    keys = int(os.environ.get("STATEKIT_IMPORT_KEYS", 1_000_000))
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    try:
        results, _ = check_import(spark, tmp_path, api, jobs.many_keys(keys))
    finally:
        spark.conf.unset("spark.sql.shuffle.partitions")
    assert [result.keys for result in results] == [keys] * len(results)


def test_refusals(spark, tmp_path):
    native(spark, "pandas")
    with pytest.raises(CheckpointNotFoundError, match="no committed batch"):
        import_state(spark, str(tmp_path / "nothing"), str(tmp_path / "t0"), jobs.Sessions())
    jobs.write_batches(tmp_path / "in", range(2))
    jobs.run(spark, "pandas", str(tmp_path / "in"), str(tmp_path / "native"))
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "metadata").write_text("{}")
    with pytest.raises(ConfigError, match="already holds"):
        import_state(spark, str(tmp_path / "native"), str(tmp_path / "used"), jobs.Sessions())
    with pytest.raises(ConfigTypeError, match="StatefulProcessor"):
        import_state(spark, str(tmp_path / "native"), str(tmp_path / "t1"), jobs.visits)

    class Narrower(jobs.Sessions):
        def init(self, handle):
            super().init(handle)
            self.count = handle.getValueState("count", "n string")

    with pytest.raises(StateTypeError, match="count"):
        import_state(spark, str(tmp_path / "native"), str(tmp_path / "t2"), Narrower())
    for name in ("t0", "t1", "t2"):
        assert not (tmp_path / name).exists() or not os.listdir(tmp_path / name)
    # not a Python stateful operator: a streaming aggregation
    agg = (jobs.events(spark, str(tmp_path / "in")).groupBy("user").count().writeStream
           .outputMode("update").format("noop").option("checkpointLocation",
                                                       str(tmp_path / "agg"))
           .trigger(availableNow=True).start())
    agg.awaitTermination()
    with pytest.raises(ConfigError, match="operator"):
        import_state(spark, str(tmp_path / "agg"), str(tmp_path / "t3"), jobs.Sessions())


def test_command_line(spark, tmp_path):
    native(spark, "pandas")
    jobs.write_batches(tmp_path / "in", range(2))
    jobs.run(spark, "pandas", str(tmp_path / "in"), str(tmp_path / "native"))
    command = ["spark", "import-state", str(tmp_path / "native"), str(tmp_path / "moved"),
               "--function", "tests.spark.compat.import_jobs:Sessions", "--backend", "rocksdb",
               "--json"]
    done = CliRunner().invoke(main, command)
    assert done.exit_code == 0, done.output
    written = json.loads(done.output[done.output.index("{"):])
    assert written["keys"] == 6 and written["backend"] == "rocksdb" and written["batch_id"] >= 1
    assert os.path.isdir(tmp_path / "moved" / "statekit" / written["query_id"] / "Sessions")
    again = CliRunner().invoke(main, command)  # the target holds a checkpoint now
    assert again.exit_code == 2 and "already holds" in again.output  # wrong usage
    missing = CliRunner().invoke(main, [*command[:2], str(tmp_path / "none"),
                                        str(tmp_path / "t"), *command[4:]])
    assert missing.exit_code == 2 and "no committed batch" in missing.output
