"""Smoke tests of the Spark standalone cluster harness (statekit.testing.sparkcluster)."""

import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path

import pandas as pd
import pytest

from statekit.spark.jobmanager import JobManagerServer, RemoteBlobStore
from tests.cluster import tasks
from tests.cluster.conftest import ROOT, new_cluster

pytestmark = pytest.mark.cluster


def _worker_ids(cluster):
    return {f"{cluster.tag}-{w.index}" for w in cluster.workers}


def _group(pgid):
    """Live processes of process group ``pgid``."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(name))
    return found


def _wait_for(condition, what, timeout=180.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_tasks_run_on_both_workers_on_other_hosts(spark, spark_cluster):
    job = functools.partial(tasks.locate, peer=spark_cluster.driver_host, sleep=0.5)
    out = spark.range(1000).repartition(4).mapInPandas(job, tasks.LOCATION).toPandas()

    assert out.rows.sum() == 1000 and sorted(out.partition) == [0, 1, 2, 3]
    assert set(out.worker) == _worker_ids(spark_cluster)
    assert out.pid.nunique() >= 2 and os.getpid() not in set(out.pid)
    if spark_cluster.isolated:  # each Worker's tasks run in its namespace, on its own address
        assert set(out.address) == {w.address for w in spark_cluster.workers}
        assert spark_cluster.driver_host not in set(out.address)
        assert out.netns.nunique() == 2 and os.readlink("/proc/self/ns/net") not in set(out.netns)
        for worker, address in zip(out.worker, out.address, strict=True):
            assert spark_cluster.workers[int(worker.rsplit("-", 1)[1])].address == address


def test_worker_namespace_has_only_the_bridge(spark_cluster):
    if not spark_cluster.isolated:
        pytest.skip(f"no network namespaces here: {spark_cluster.fallback_reason}")
    worker = spark_cluster.workers[1]
    routes = spark_cluster.run_in_worker(1, ["ip", "-4", "route"], capture_output=True, text=True,
                                         check=True).stdout
    addresses = spark_cluster.run_in_worker(1, ["ip", "-4", "-o", "addr"], capture_output=True,
                                            text=True, check=True).stdout
    subnet = spark_cluster.driver_host.rsplit(".", 1)[0] + ".0/24"
    assert "default" not in routes and routes.split()[0] == subnet
    assert f"inet {worker.address}/24" in addresses and "inet 127.0.0.1/8" in addresses
    assert spark_cluster.master_url == f"spark://{spark_cluster.driver_host}:7077"


def test_worker_killed_mid_job_tasks_move_to_the_other(spark, spark_cluster, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    job = functools.partial(tasks.locate, peer=spark_cluster.driver_host, sleep=1.0, marker_dir=str(marks))
    df = spark.range(0, 16, 1, 16).mapInPandas(job, tasks.LOCATION)
    result: dict = {}

    def run():
        try:
            result["out"] = df.toPandas()
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    victim, survivor = (f"{spark_cluster.tag}-{i}" for i in (0, 1))
    _wait_for(lambda: any(m.name.startswith(victim + "-") for m in marks.iterdir()), "a task on worker 0")
    spark_cluster.kill_worker(0)
    assert not spark_cluster.processes(0) and not spark_cluster.workers[0].alive
    thread.join(300)
    assert "error" not in result, result.get("error")
    out = result["out"]

    assert sorted(out.partition) == list(range(16))  # the job completed, every partition once
    started_on_victim = {int(m.name.split("-")[2]) for m in marks.iterdir()
                         if m.name.startswith(victim + "-")}
    moved = started_on_victim - set(out.partition[out.worker == victim])
    assert moved, "a task running on the killed worker was re-run elsewhere"
    assert set(out.worker[out.partition.isin(moved)]) == {survivor}

    began = time.monotonic()
    spark_cluster.start_worker(0)
    spark_cluster.wait_executors(spark, 2)
    print(f"worker 0 back with an executor in {time.monotonic() - began:.1f} s")
    again = spark.range(0, 4, 1, 4).mapInPandas(
        functools.partial(tasks.locate, peer=spark_cluster.driver_host, sleep=0.5), tasks.LOCATION).toPandas()
    assert set(again.worker) == _worker_ids(spark_cluster)


def test_executors_reach_s3_on_the_bridge(spark, spark_cluster, cluster_s3):
    assert cluster_s3.endpoint_url.startswith(f"http://{spark_cluster.driver_host}:")
    url = cluster_s3.create_bucket(f"cluster-{uuid.uuid4().hex[:12]}")
    job = functools.partial(tasks.write_s3, url=url, options=cluster_s3.storage_options(),
                            peer=spark_cluster.driver_host, sleep=0.5)
    out = spark.range(0, 400, 1, 4).mapInPandas(job, tasks.LOCATION).toPandas()

    assert set(out.worker) == _worker_ids(spark_cluster)
    if spark_cluster.isolated:
        assert spark_cluster.driver_host not in set(out.address)
    fs = cluster_s3.filesystem()
    files = sorted(fs.ls(url.removeprefix("s3://")))
    assert len(files) == 4
    ids = pd.concat(pd.read_csv(fs.open(f)) for f in files)
    assert sorted(ids["id"]) == list(range(400))


def test_driver_http_server_reachable_on_the_bridge_not_on_loopback(spark, spark_cluster, monkeypatch):
    """The driver-side JobManager checkpoint server must bind the bridge address for executors in
    other namespaces: 127.0.0.1 there is the namespace's own loopback."""
    # http.server's bind reverse-resolves the address (socket.getfqdn): a DNS query for the bridge's
    monkeypatch.setattr(socket, "getfqdn", lambda name="": name)
    on_bridge, on_loopback = JobManagerServer(host=spark_cluster.driver_host), JobManagerServer()
    try:
        secret = on_bridge.new_secret()
        stores = {"bridge": RemoteBlobStore(on_bridge.url, secret, "probe"),
                  "loopback": RemoteBlobStore(on_loopback.url, on_loopback.new_secret(), "probe")}
        job = functools.partial(tasks.probe_stores, stores=stores, peer=spark_cluster.driver_host)
        out = spark.range(0, 4, 1, 4).mapInPandas(job, tasks.LOCATION + ", store string, ok boolean, "
                                                  "error string").toPandas()
    finally:
        on_bridge.shutdown()
        on_loopback.shutdown()

    bridge, loopback = out[out.store == "bridge"], out[out.store == "loopback"]
    assert bridge.ok.all(), bridge.error.tolist()
    assert len(on_bridge.store.list(on_bridge.raw_key(secret, "probe/"))) == 4  # the secret's area
    if spark_cluster.isolated:
        assert not loopback.ok.any()
        assert all("Connection refused" in e for e in loopback.error), loopback.error.tolist()
    else:
        assert loopback.ok.all()


@pytest.mark.parametrize("isolate", [None, False], ids=["auto", "loopback"])
def test_teardown_leaves_nothing_also_after_a_failure(isolate, tmp_path):
    """A second cluster with its own driver process, stopped by an exception while executors and
    their Python workers run tasks: no process, namespace, link or directory of it remains."""
    marks = tmp_path / "marks"
    marks.mkdir()
    driver = None
    seen: set[int] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the loopback fallback's warning
        cluster = new_cluster(isolate=isolate)
        with pytest.raises(RuntimeError, match="injected"), cluster:
            with open(tmp_path / "driver.log", "wb") as log:
                driver = subprocess.Popen(
                    [sys.executable, "-m", "tests.cluster.driver_job", cluster.master_url,
                     cluster.driver_host, str(tmp_path / "driver"), str(marks)],
                    cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    env={**os.environ, "PYTHONPATH": ROOT})
            _wait_for(lambda: driver.poll() is not None or len(list(marks.iterdir())) == 2,
                      "two running tasks")
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()
            seen = cluster.processes()
            commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in seen]
            assert any(b"CoarseGrainedExecutorBackend" in c for c in commands)
            assert any(b"pyspark.daemon" in c for c in commands)
            raise RuntimeError("injected failure")
    os.killpg(driver.pid, signal.SIGTERM)  # the driver; its JVM exits when its stdin closes
    driver.wait(60)
    _wait_for(lambda: not _group(driver.pid), "the driver's JVM to exit", 60)

    assert cluster.leftovers() == []
    assert not cluster.root.exists()
    still = [pid for pid in seen if os.path.exists(f"/proc/{pid}")
             and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    assert still == []
    assert not [pid for pid in seen if os.path.exists(f"/tmp/hsperfdata_root/{pid}")]
    if cluster.isolated:
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert f"skbr{cluster.tag}:" not in links and f"skv{cluster.tag}x" not in links
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"statekit-{cluster.tag}-" not in namespaces
    print(f"cluster start {cluster.timings['start']:.1f} s, stop {cluster.timings['stop']:.1f} s "
          f"({len(seen)} processes)")
