"""A local S3 API server for tests: moto's server mode in a subprocess on 127.0.0.1.

``with LocalS3Server() as s3: s3.create_bucket("b"); FileSystemCheckpointStorage("s3://b/x",
storage_options=s3.storage_options())``.  The server binds to 127.0.0.1 only, or to the one address
given as ``host`` (e.g. the bridge of a :class:`statekit.testing.sparkcluster.SparkCluster`, which
executors in other network namespaces reach); clients get fixed dummy credentials so botocore never
looks for real ones (no instance-metadata lookups).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from typing import Any

from statekit.testing.hostprocs import free_port

ACCESS_KEY = "statekit-test"
SECRET_KEY = "statekit-test-secret"  # noqa: S105 (dummy, for the local server only)
REGION = "us-east-1"

# never route requests to the local server through a proxy from the environment
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# moto's server; http.server's bind looks its own address up (socket.getfqdn), which for an address
# missing from /etc/hosts (a bridge's) is a reverse DNS query: skip that, so nothing is contacted
_MOTO_MAIN = ("import socket, sys; socket.getfqdn = lambda name='': name or socket.gethostname(); "
              "from moto.server import main; main(sys.argv[1:])")


class LocalS3Server:
    """Start/stop moto's S3 server (``python -m moto.server``) on a free port of ``host``."""

    def __init__(self, port: int | None = None, startup_timeout: float = 30.0,
                 host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port or free_port(host)
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> LocalS3Server:
        """Launch the server and wait until it answers (typically 1-2 s)."""
        env = {**os.environ, **self.client_env()}
        self.process = subprocess.Popen(
            [sys.executable, "-c", _MOTO_MAIN, "-H", self.host, "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto server exited with code {self.process.returncode}")
            try:
                with _OPENER.open(self.endpoint_url + "/moto-api/", timeout=1):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto server did not start within {self.startup_timeout} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> LocalS3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def client_env(self) -> dict[str, str]:
        """Environment for client processes: dummy credentials, this endpoint, no proxies."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_EC2_METADATA_DISABLED": "true", "NO_PROXY": self.host, "no_proxy": self.host,
        }

    def storage_options(self, **extra: Any) -> dict[str, Any]:
        """s3fs options pointing at this server."""
        return {"endpoint_url": self.endpoint_url, "key": ACCESS_KEY, "secret": SECRET_KEY,
                "client_kwargs": {"region_name": REGION}, **extra}

    def filesystem(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options())

    def create_bucket(self, name: str) -> str:
        """Create ``name`` (if missing) and return ``s3://name``."""
        fs = self.filesystem()
        if not fs.exists(name):
            fs.call_s3("create_bucket", Bucket=name)  # no LocationConstraint in us-east-1
        return f"s3://{name}"

    def reset(self) -> None:
        """Forget every bucket and object (moto's reset API)."""
        request = urllib.request.Request(self.endpoint_url + "/moto-api/reset", method="POST")  # noqa: S310
        with _OPENER.open(request, timeout=10):
            pass
