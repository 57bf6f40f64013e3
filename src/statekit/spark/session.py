"""SparkSessions for demos, tests and benchmarks: local (loopback only) or on a standalone cluster;
and the driver-side clean-up of what statekit's Spark workers leave behind."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
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
log = logging.getLogger("statekit.spark")
#: seconds a Python worker and the JVM wait for each other's socket (Spark's default is 15 s,
#: which a loaded machine misses: ``CANNOT_OPEN_SOCKET``); a dead peer still fails, later
SOCKET_TIMEOUT = "300s"


def _builder(master: str, app_name: str, driver_host: str, shuffle_partitions: int,
             warehouse_dir: str) -> Any:
    """The settings local and cluster sessions share (RocksDB state store, Arrow, no UI)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.driver.host", driver_host)
        .config("spark.driver.bindAddress", driver_host)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", "2")
        .config("spark.sql.warehouse.dir", warehouse_dir)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.eventLog.enabled", "false")
        .config("spark.python.authenticate.socketTimeout", SOCKET_TIMEOUT)
    )


def _create(builder: Any, conf: Mapping[str, Any] | None) -> Any:
    for key, value in (conf or {}).items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    quiet_stop_noise(spark, FAILURE_LOGGERS)
    return spark


def forget_local_dirs() -> None:
    """A driver JVM keeps the local dirs of its first session for its lifetime (Spark caches them):
    forget them while no session runs, so the next one uses its own ``spark.local.dir`` and a
    removed directory is not created again."""
    from pyspark import SparkContext

    if SparkContext._jvm is not None and SparkContext._active_spark_context is None:
        getattr(getattr(SparkContext._jvm.org.apache.spark.util, "Utils$"), "MODULE$").clearLocalRootDirs()


def local_spark(master: str = "local[2]", app_name: str = "statekit",
                conf: Mapping[str, Any] | None = None, shuffle_partitions: int = 2) -> Any:
    """A local-mode session whose Python workers run this interpreter; nothing leaves 127.0.0.1.

    Its warehouse directory is a temporary one removed when this process ends.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("SPARK_LOCAL_HOSTNAME", "localhost")
    builder = _builder(master, app_name, "127.0.0.1", shuffle_partitions,
                       str(workdirs.create(tempfile.gettempdir(), "statekit-warehouse-")))
    return _create(builder, conf)


def cluster_spark(master_url: str, driver_host: str, app_name: str = "statekit-cluster",
                  conf: Mapping[str, Any] | None = None, shuffle_partitions: int = 2,
                  local_dir: str | None = None, executor_memory: str = "700m",
                  executor_cores: int = 1) -> Any:
    """A client-mode session on a standalone master, with ``local_spark``'s settings.

    The driver binds and advertises ``driver_host`` (the address executors reach it on, e.g. the
    bridge of :class:`statekit.testing.sparkcluster.SparkCluster`); executors run this interpreter
    (``PYSPARK_PYTHON``, so the filesystem must be shared).  Scratch space and the warehouse go to
    ``local_dir`` when given, so whoever owns that directory removes them.  An active session on
    another master is stopped first (one SparkContext per process; getOrCreate would return it).
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkContext._active_spark_context
    if active is not None and active.master != master_url:
        (SparkSession.getActiveSession() or active).stop()
    warehouse = os.path.join(local_dir, "warehouse") if local_dir else str(
        workdirs.create(tempfile.gettempdir(), "statekit-warehouse-"))
    builder = (_builder(master_url, app_name, driver_host, shuffle_partitions, warehouse)
               .config("spark.executor.cores", str(executor_cores))
               .config("spark.executor.memory", executor_memory))
    if local_dir:
        builder = builder.config("spark.local.dir", local_dir)
        forget_local_dirs()
    # A driver JVM launched now must not scan interfaces and reverse-resolve their addresses (a DNS
    # query for an address missing from /etc/hosts): give it its address, for this launch only.
    saved = {k: os.environ.get(k) for k in ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME")}
    os.environ.update(SPARK_LOCAL_IP=driver_host, SPARK_LOCAL_HOSTNAME=driver_host)
    try:
        return _create(builder, conf)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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
    removed: list[str] = []
    try:
        for root in roots:
            removed += [str(p) for p in workdirs.sweep(root)]
    except KeyboardInterrupt:  # Ctrl-C while exiting: the next driver's sweep finishes the job
        pass
    return removed


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


_probed: dict[str, str | None] = {}
_probe_lock = threading.Lock()
_PROBE = "import os, statekit; print(os.path.realpath(statekit.__file__))"


def statekit_worker_python(spark: Any) -> str | None:
    """The interpreter statekit's tasks must run with when Spark's would fail them, else None.

    A plain local ``SparkSession`` starts Python workers with ``PYSPARK_PYTHON`` (default: the
    ``python3`` on the path), which often lacks statekit (a virtual environment's interpreter
    runs the driver): every task would fail at its first batch.  In local mode the workers run
    on this machine, so this is checked here, once per interpreter, and this interpreter is
    used for statekit's tasks when the other cannot import this statekit.  (On a cluster the
    executors' Python is the cluster's to provide.)
    """
    context = spark.sparkContext
    configured = str(context.pythonExec)
    if not str(context.master).startswith("local"):
        return None
    found = shutil.which(configured)
    if found is not None and os.path.abspath(found) == os.path.abspath(sys.executable):
        return None
    with _probe_lock:
        if configured not in _probed:
            _probed[configured] = None if _runs_this_statekit(configured) else sys.executable
            if _probed[configured] is not None:
                log.warning("Spark starts Python workers with %r (PYSPARK_PYTHON), which cannot "
                            "import this statekit; statekit's tasks run with %s instead (set "
                            "PYSPARK_PYTHON before the session starts to choose)",
                            configured, sys.executable)
        return _probed[configured]


def _runs_this_statekit(python: str) -> bool:
    import statekit

    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return False
    mine = os.path.realpath(statekit.__file__)
    return done.returncode == 0 and done.stdout.strip() == mine


@contextlib.contextmanager
def statekit_workers(spark: Any, python: str | None) -> Iterator[None]:
    """Python UDFs created inside run with ``python`` (PySpark reads the worker interpreter
    when it wraps a function); nothing changes when it is None."""
    if python is None:
        yield
        return
    context = spark.sparkContext
    saved = context.pythonExec
    context.pythonExec = python
    try:
        yield
    finally:
        context.pythonExec = saved
