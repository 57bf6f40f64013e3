"""Fixtures of the cluster tests (``make test-cluster``, ``pytest -m cluster``; not in ``make test``).

One Spark standalone cluster for this package's tests - a Master and two Workers (1 core, 1 GiB),
each Worker in its own network namespace on a bridge where the machine allows it (see
:mod:`statekit.testing.sparkcluster`) - with one driver session and one S3 server on the bridge.
The fixtures are package-scoped: the cluster is gone, and its session stopped, before the Spark
tests of other packages run in the same process.  Every test in this directory is marked ``cluster``;
``STATEKIT_CLUSTER_ISOLATE=0`` runs the Workers on loopback.
"""

import os
import time
from pathlib import Path

import pytest

from statekit.testing.s3 import LocalS3Server
from statekit.testing.sparkcluster import SparkCluster

# The Workers' Python workers unpickle test functions by module name: they must import ``tests``.
ROOT = str(Path(__file__).resolve().parents[2])
_HERE = Path(__file__).resolve().parent
TIMES: dict[str, float] = {}
RECOVERY: dict[str, float] = {}  # case -> seconds from a Worker killed to the next batch committed
ISOLATION: list[str] = []


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.cluster)


def pytest_terminal_summary(terminalreporter):
    if TIMES:
        terminalreporter.write_line(f"spark cluster ({', '.join(ISOLATION)}): "
                                    + ", ".join(f"{k} {v:.1f} s" for k, v in TIMES.items()))
    for case, seconds in sorted(RECOVERY.items()):
        terminalreporter.write_line(f"worker killed -> next batch committed: {case} {seconds:.1f} s")


def new_cluster(isolate: bool | None = None) -> SparkCluster:
    """A cluster like the session's (2 Workers whose Python workers import ``tests``);
    ``STATEKIT_CLUSTER_ISOLATE=0`` runs the Workers on loopback, as where namespaces are unavailable."""
    if isolate is None and os.environ.get("STATEKIT_CLUSTER_ISOLATE") == "0":
        isolate = False
    return SparkCluster(workers=2, pythonpath=[ROOT], env={"AWS_EC2_METADATA_DISABLED": "true"},
                        isolate=isolate)


@pytest.fixture(scope="package")
def spark_cluster():
    """The cluster, started once; stopped (and checked to leave nothing) after this package."""
    cluster = new_cluster()
    cluster.start()
    ISOLATION.append("Workers in network namespaces" if cluster.isolated
                     else f"NOT isolated: {cluster.fallback_reason}")
    TIMES.update(master_up=cluster.timings["master"], cluster_start=cluster.timings["start"])
    try:
        yield cluster
    finally:
        cluster.stop()
        TIMES["cluster_stop"] = cluster.timings["stop"]
        assert cluster.leftovers() == []


@pytest.fixture(scope="package")
def cluster_session(spark_cluster):
    """The driver: this process's SparkSession on the cluster, with an executor on each Worker."""
    began = time.monotonic()
    spark = spark_cluster.session(app_name="statekit-cluster-tests")
    TIMES["session_start"] = time.monotonic() - began
    yield spark
    began = time.monotonic()
    spark.stop()
    TIMES["session_stop"] = time.monotonic() - began


@pytest.fixture
def spark(spark_cluster, cluster_session):
    """The session, with every Worker (re)started and running an executor before each test."""
    for worker in spark_cluster.workers:
        if not worker.alive:
            spark_cluster.start_worker(worker.index)
    spark_cluster.wait_executors(cluster_session)
    return cluster_session


@pytest.fixture(scope="package")
def cluster_s3(spark_cluster):
    """A moto S3 server on the driver's bridge address, which executors in every namespace reach."""
    with LocalS3Server(host=spark_cluster.driver_host) as server:
        yield server
