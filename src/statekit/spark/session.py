"""A local SparkSession for demos, tests and benchmarks: loopback only, quiet, small; and the
driver-side clean-up of what statekit's Spark workers leave behind."""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from statekit import workdirs

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

#: Spark loggers that report a stopped query's interrupted work as ERROR (a broadcast or a
#: transformWithStateInPandas state-server socket cut short by ``query.stop()``)
STOP_NOISE_LOGGERS = (
    "org.apache.spark.broadcast.TorrentBroadcast",
    "org.apache.spark.sql.execution.python.streaming.TransformWithStateInPySparkPythonPreInitRunner",
    "org.apache.spark.sql.execution.python.streaming.TransformWithStateInPySparkStateServer",
    "org.apache.spark.storage.ShuffleBlockFetcherIterator",
)
#: Spark loggers that print a failed task or query with its whole trace; in a local session the
#: failure reaches the user once, through the query's exception (statekit's error on top)
FAILURE_LOGGERS = (
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
)
TWS_DRIVER_WORKER = "pyspark.sql.streaming.transform_with_state_driver_worker"

_roots: set[str] = set()
_roots_lock = threading.Lock()


def local_spark(master: str = "local[2]", app_name: str = "statekit",
                conf: Mapping[str, Any] | None = None, shuffle_partitions: int = 2) -> Any:
    """A local-mode session whose Python workers run this interpreter; nothing leaves 127.0.0.1.

    Its warehouse directory is a temporary one removed when this process ends.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("SPARK_LOCAL_HOSTNAME", "localhost")
    from pyspark.sql import SparkSession

    warehouse = workdirs.create(tempfile.gettempdir(), "statekit-warehouse-")
    builder = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", "2")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.eventLog.enabled", "false")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    quiet_stop_noise(spark, FAILURE_LOGGERS)
    return spark


def quiet_stop_noise(spark: Any, also: tuple[str, ...] = ()) -> None:
    """Raise the few Spark loggers that report ``query.stop()`` as ERROR (and ``also``) to FATAL."""
    jvm = spark.sparkContext._jvm
    try:
        configurator = jvm.org.apache.logging.log4j.core.config.Configurator
        fatal = jvm.org.apache.logging.log4j.Level.FATAL
        for name in (*STOP_NOISE_LOGGERS, *also):
            configurator.setLevel(name, fatal)
    except Exception:  # noqa: S110 - another logging backend: keep Spark's defaults
        pass


def remember_working_roots(roots: list[str]) -> None:
    """Directories where this driver's executors keep working state, swept when it exits."""
    with _roots_lock:
        _roots.update(roots)


def cleanup() -> list[str]:
    """Remove working directories whose owners (stopped Spark workers) are dead; the removed."""
    with _roots_lock:
        roots = sorted(_roots)
    return [str(p) for root in roots for p in workdirs.sweep(root)]


atexit.register(cleanup)


def quiet_tws_driver_worker() -> None:
    """Silence the banner lines Spark's transformWithStateInPandas schema worker prints.

    When a query starts, Spark runs the stateful processor's ``init`` in a Python process on
    the driver; that module prints four long lines per start.  Unpickling statekit's processor
    imports statekit there, which replaces that module's ``print`` (and nothing else).
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if main is not None and getattr(spec, "name", None) == TWS_DRIVER_WORKER:
        main.print = lambda *args, **kwargs: None  # type: ignore[attr-defined]
