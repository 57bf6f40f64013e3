"""A real Spark standalone cluster for tests: a Master and Workers run from the installed pyspark.

``with SparkCluster(workers=2, pythonpath=[repo]) as cluster: spark = cluster.session()`` starts a
Master and Workers (1 core, 1 GiB each, own ``--work-dir`` and ``SPARK_LOCAL_DIRS``, all under one
temporary directory the cluster owns) and connects this process to it as the driver.

Isolation.  As root with ``ip netns``, every Worker runs in its own network namespace, joined by a
veth pair to a bridge the cluster creates on a private ``10.213.<n>.0/24`` no interface or route
here uses: the bridge is ``.1`` (the driver and the Master listen there), Worker ``i`` is
``.(10+i)``.  Executors are then on other hosts than the driver: they reach it, and any server a
test starts, only on the bridge address (127.0.0.1 in a task is the namespace's own loopback), and
without a default route nothing beyond the bridge.  Elsewhere the Workers run on 127.0.0.1;
:attr:`SparkCluster.isolated` says which, and a warning is issued.

Teardown.  Every process the cluster starts carries ``STATEKIT_CLUSTER=<tag>`` in its environment
(Workers also ``STATEKIT_CLUSTER_WORKER=<tag>-<i>``), inherited by executor JVMs and their Python
workers, so :meth:`~SparkCluster.kill_worker` and :meth:`~SparkCluster.stop` find them all, also
after they left the Worker's process group (PySpark's daemon calls ``setpgid``) or were
re-parented.  JVMs run without hsperfdata, with their temp dir in the cluster's directory and a
hosts file of the cluster (never DNS): nothing lands in /tmp, nothing but loopback and the bridge
is contacted.  Masters and Workers die with the thread that started them (``setpriv
--pdeathsig``), and names carry the owner's pid: :func:`sweep_stale` removes what a test run
killed outright left behind.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from statekit.testing.hostprocs import (
    LINK_RE,
    MARKER,
    WORKER_MARKER,
    free_port,
    ip,
    isolation_unavailable,
    kill_all,
    netns_pids,
    pids_with,
    sweep_stale,
)

SUBNET_PREFIX = "10.213"
MASTER_PORT = 7077
_COUNTER = itertools.count()

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


@dataclass
class ClusterWorker:
    """One Worker: its address, namespace (None on loopback), directories and process."""

    index: int
    address: str
    port: int
    namespace: str | None
    directory: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class SparkCluster:
    """A standalone Master and ``workers`` Workers, isolated in network namespaces where possible."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g", isolate: bool | None = None,
                 pythonpath: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 daemon_memory: str = "256m", timeout: float = 120.0) -> None:
        reason = isolation_unavailable()
        if isolate and reason:
            raise RuntimeError(f"cannot isolate the Workers: {reason}")
        self.isolated: bool = reason is None and isolate is not False
        self.fallback_reason = None if self.isolated else (reason or "isolate=False")
        self.cores, self.memory, self.daemon_memory, self.timeout = cores, memory, daemon_memory, timeout
        self.pythonpath, self.extra_env = list(pythonpath), dict(env or {})
        self.tag = f"{os.getpid():x}{next(_COUNTER) % 16:x}"
        self.root = Path(tempfile.gettempdir()) / f"statekit-cluster-{self.tag}-{os.urandom(3).hex()}"
        self.bridge = f"skbr{self.tag}" if self.isolated else None
        if self.isolated:
            self.driver_host = f"{SUBNET_PREFIX}.{self._free_subnet()}.1"
            self.master_port, self.ui_port = MASTER_PORT, 8080
        else:
            self.driver_host = "127.0.0.1"
            self.master_port, self.ui_port = free_port("127.0.0.1"), free_port("127.0.0.1")
        net = self.driver_host.rsplit(".", 1)[0]
        self.workers = [ClusterWorker(
            i, f"{net}.{10 + i}" if self.isolated else "127.0.0.1",
            7078 if self.isolated else free_port("127.0.0.1"),
            f"statekit-{self.tag}-w{i}" if self.isolated else None, self.root / f"worker-{i}")
            for i in range(workers)]
        self.process: subprocess.Popen[bytes] | None = None  # the Master's
        self.timings: dict[str, float] = {}

    @property
    def master_url(self) -> str:
        return f"spark://{self.driver_host}:{self.master_port}"

    def _free_subnet(self) -> int:
        """A third octet whose /24 overlaps no address or route of this machine."""
        used = [ipaddress.ip_network(a, strict=False) for a in re.findall(
            r"\d+\.\d+\.\d+\.\d+(?:/\d+)?", ip("-4", "-o", "addr") + ip("-4", "route"))]
        start = (os.getpid() * 16 + int(self.tag[-1], 16)) % 240
        for n in ((start + k) % 240 + 10 for k in range(240)):
            net = ipaddress.ip_network(f"{SUBNET_PREFIX}.{n}.0/24")
            if not any(net.overlaps(other) for other in used):
                return n
        raise RuntimeError(f"no free /24 in {SUBNET_PREFIX}.0.0/16")


    def start(self) -> SparkCluster:
        """Network, Master, Workers; returns when every Worker registered (~5-10 s)."""
        began = time.monotonic()
        if not self.isolated:
            warnings.warn(f"SparkCluster without network isolation ({self.fallback_reason}): "
                          "Workers run on 127.0.0.1", RuntimeWarning, stacklevel=2)
        try:
            sweep_stale()
            self.root.mkdir(mode=0o700)
            (self.root / "conf").mkdir()
            hosts = [f"127.0.0.1 localhost {socket.gethostname()}", f"{self.driver_host} statekit-master"]
            hosts += [f"{w.address} statekit-worker-{w.index}" for w in self.workers if self.isolated]
            (self.root / "hosts").write_text("\n".join(hosts) + "\n")
            if self.isolated:
                self._create_network()
            self.process = self._spawn("master", self.driver_host, None, {}, [
                "org.apache.spark.deploy.master.Master", "--host", self.driver_host,
                "--port", str(self.master_port), "--webui-port", str(self.ui_port)])
            # a Worker that finds no Master retries only after 5-15 s: start them once it answers
            self._until(lambda: self._check_processes() or self.alive_workers() is not None, "the master")
            self.timings["master"] = time.monotonic() - began
            for worker in self.workers:
                self.start_worker(worker.index, wait=False)
            self.wait_workers()
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Stop this cluster's driver session, kill every process, remove network and directory."""
        began, errors = time.monotonic(), []
        steps: list[Callable[[], None]] = [self._stop_session, lambda: kill_all(self.processes)]
        steps += [lambda w=w: kill_all(lambda: netns_pids(w.namespace or "")) for w in self.workers
                  if w.namespace]
        steps += [self._reap, self._delete_network, lambda: shutil.rmtree(self.root, ignore_errors=True)]
        for step in steps:
            try:
                step()
            except Exception as exc:
                errors.append(exc)
        self.timings["stop"] = time.monotonic() - began
        if errors:
            raise RuntimeError(f"SparkCluster teardown incomplete: {errors}")

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _stop_session(self) -> None:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        from statekit.spark.session import forget_local_dirs

        active = SparkContext._active_spark_context
        if active is not None and active.master == self.master_url:
            (SparkSession.getActiveSession() or active).stop()
        forget_local_dirs()
        if SparkContext._jvm is not None:  # a JVM our session launched keeps its conf as properties
            system, ours = SparkContext._jvm.java.lang.System, [str(self.root), self.master_url]
            ours += [self.driver_host] if self.isolated else []
            for key in list(system.getProperties().stringPropertyNames()):
                if key.startswith("spark.") and any(o in str(system.getProperty(key)) for o in ours):
                    system.clearProperty(key)  # or the driver JVM creates our (removed) local dir again

    def _reap(self) -> None:
        for process in [self.process, *(w.process for w in self.workers)]:
            if process is not None:
                process.wait(10)
        self.process = None
        for worker in self.workers:
            worker.process = None

    def _create_network(self) -> None:
        assert self.bridge is not None
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.driver_host}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for w in self.workers:
            assert w.namespace is not None
            host_end, ns_end = f"skv{self.tag}x{w.index}", f"skp{self.tag}x{w.index}"
            ip("netns", "add", w.namespace)
            ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            ip("link", "set", ns_end, "netns", w.namespace)
            ip("link", "set", host_end, "master", self.bridge, "up")
            ip("-n", w.namespace, "link", "set", ns_end, "name", "eth0")
            ip("-n", w.namespace, "addr", "add", f"{w.address}/24", "dev", "eth0")
            ip("-n", w.namespace, "link", "set", "eth0", "up")
            ip("-n", w.namespace, "link", "set", "lo", "up")

    def _delete_network(self) -> None:
        """Veth pairs (deleting one end deletes both at once; a namespace's deletion is deferred by
        the kernel), then namespaces and the bridge."""
        if not self.isolated:
            return
        links, existing = ip("-o", "link", "show"), set(ip("netns", "list").split())
        for w in self.workers:
            if f"skv{self.tag}x{w.index}@" in links:
                ip("link", "del", f"skv{self.tag}x{w.index}")
            if w.namespace in existing:
                ip("netns", "del", w.namespace)
        if self.bridge and f"{self.bridge}:" in ip("-o", "link", "show"):
            ip("link", "del", self.bridge)


    def _env(self, name: str, address: str, extra: Mapping[str, str]) -> dict[str, str]:
        import pyspark

        tmp = self.root / "tmp" / name
        tmp.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items()  # no stray Spark settings, no proxies
               if not k.startswith(("SPARK_", "PYSPARK_")) and k.lower() not in {"http_proxy",
                                                                                "https_proxy", "all_proxy"}}
        env.update(self.extra_env)
        env.update({
            MARKER: self.tag, "SPARK_HOME": os.path.dirname(pyspark.__file__),
            "SPARK_CONF_DIR": str(self.root / "conf"), "SPARK_LOCAL_IP": address,
            "SPARK_LOCAL_HOSTNAME": address, "SPARK_DAEMON_MEMORY": self.daemon_memory,
            "PYSPARK_PYTHON": sys.executable, "TMPDIR": str(tmp),
            "PYTHONPATH": os.pathsep.join(filter(None, [*self.pythonpath, os.environ.get("PYTHONPATH")])),
            "JAVA_TOOL_OPTIONS": f"-XX:-UsePerfData -Djava.io.tmpdir={tmp} "
                                 f"-Djdk.net.hosts.file={self.root / 'hosts'}",
            **extra})
        return env

    def _spawn(self, name: str, address: str, namespace: str | None, extra: Mapping[str, str],
               args: Sequence[str]) -> subprocess.Popen[bytes]:
        env = self._env(name, address, extra)
        spark_class = os.path.join(env["SPARK_HOME"], "bin", "spark-class")
        # SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG, kept across the execs), so
        # a Master or Worker (and then its executors) never outlives a test run killed outright
        prefix = ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []
        prefix += ["ip", "netns", "exec", namespace] if namespace else []  # these exec: same pid
        with open(self.root / f"{name}.log", "ab") as log:
            return subprocess.Popen([*prefix, spark_class, *args], env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=self.root, start_new_session=True)

    def start_worker(self, i: int, wait: bool = True) -> ClusterWorker:
        """(Re)start Worker ``i`` in its namespace; with ``wait``, until the Master lists it."""
        w = self.workers[i]
        if w.alive:
            raise RuntimeError(f"worker {i} is running")
        for sub in ("work", "local"):
            (w.directory / sub).mkdir(parents=True, exist_ok=True)
        w.process = self._spawn(f"worker-{i}", w.address, w.namespace, {
            WORKER_MARKER: f"{self.tag}-{i}", "SPARK_LOCAL_DIRS": str(w.directory / "local")}, [
            "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", w.address,
            "--port", str(w.port), "--webui-port", "0", "--cores", str(self.cores),
            "--memory", self.memory, "--work-dir", str(w.directory / "work")])
        if wait:
            self.wait_workers()
        return w

    def kill_worker(self, i: int, wait: bool = True) -> None:
        """SIGKILL Worker ``i``, its executor JVM and Python workers (all its namespace's processes);
        with ``wait``, until the Master no longer lists it as alive (immediate: its connection drops)."""
        w = self.workers[i]
        kill_all(lambda: self.processes(i) | (netns_pids(w.namespace) if w.namespace else set()))
        if w.process is not None:
            w.process.wait(10)
            w.process = None
        if wait:
            self._until(lambda: (w.address, w.port) not in (self.alive_workers() or set()),
                        f"worker {i} to go")

    def worker_command(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed to run in Worker ``i``'s namespace (unchanged on loopback)."""
        namespace = self.workers[i].namespace
        return ["ip", "netns", "exec", namespace, *argv] if namespace else list(argv)

    def run_in_worker(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run`` of ``argv`` in Worker ``i``'s network namespace."""
        return subprocess.run(self.worker_command(i, argv), check=kwargs.pop("check", False), **kwargs)


    def master_state(self) -> dict[str, Any]:
        """The Master's JSON status (workers, applications)."""
        url = f"http://{self.driver_host}:{self.ui_port}/json/"
        with _OPENER.open(url, timeout=5) as response:
            return dict(json.load(response))

    def alive_workers(self) -> set[tuple[str, int]] | None:
        """(host, port) of the Workers the Master considers alive (None: the Master does not answer)."""
        try:
            workers = self.master_state().get("workers", [])
        except (OSError, ValueError):  # not listening yet, or not yet serving JSON
            return None
        return {(w["host"], int(w["port"])) for w in workers if w.get("state") == "ALIVE"}

    def wait_workers(self) -> None:
        """Until every running Worker is registered; fails early if a process exited."""
        self._until(lambda: self._check_processes() or
                    {(w.address, w.port) for w in self.workers if w.alive} <= (self.alive_workers() or set()),
                    "the workers to register")

    def _check_processes(self) -> bool:
        """Raise with its log if a started Master or Worker exited; else False."""
        for name, process in [("master", self.process), *((f"worker-{w.index}", w.process)
                                                        for w in self.workers)]:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"{name} exited ({process.returncode}):\n{self.log_tail(name)}")
        return False

    def wait_executors(self, spark: Any, count: int | None = None) -> None:
        """Until the driver of ``spark`` has ``count`` executors (default: one per live Worker)."""
        wanted = sum(w.alive for w in self.workers) if count is None else count
        status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus
        self._until(lambda: status().size() - 1 >= wanted, f"{wanted} executors")

    def _until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {self.timeout} s waiting for {what}")
            time.sleep(0.1)

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.root / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def session(self, app_name: str = "statekit-cluster", conf: Mapping[str, Any] | None = None,
                wait: bool = True) -> Any:
        """The driver: a SparkSession on this cluster (see :func:`statekit.spark.cluster_spark`),
        returned once every live Worker runs an executor for it."""
        from statekit.spark.session import cluster_spark

        (self.root / "driver").mkdir(exist_ok=True)
        spark = cluster_spark(self.master_url, self.driver_host, app_name=app_name, conf=conf,
                              local_dir=str(self.root / "driver"))
        if wait:
            self.wait_executors(spark)
        return spark

    def processes(self, worker: int | None = None) -> set[int]:
        """Pids of this cluster's processes (Master, Workers, executors, Python workers), or of
        Worker ``worker``'s."""
        return pids_with(f"{WORKER_MARKER}={self.tag}-{worker}" if worker is not None
                          else f"{MARKER}={self.tag}")

    def leftovers(self) -> list[str]:
        """What of this cluster still exists (empty after :meth:`stop`)."""
        found = [f"pid {p}" for p in sorted(self.processes())]
        if self.root.exists():
            found.append(str(self.root))
        if isolation_unavailable() is None:
            found += [f"netns {n}" for n in ip("netns", "list").split()
                      if n.startswith(f"statekit-{self.tag}-")]
            links = [line.split(":")[1].strip().split("@")[0] for line in ip("-o", "link").splitlines()]
            found += [f"link {link}" for link in links
                      if (m := LINK_RE.match(link)) and m.group(1) == self.tag]
        return found
