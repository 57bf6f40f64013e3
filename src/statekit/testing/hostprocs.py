"""What test clusters leave on this host, found and removed: network namespaces and links named
after their owner's pid, and processes marked in their environment (``STATEKIT_CLUSTER=<tag>``),
found through /proc even after they left their process group."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

MARKER = "STATEKIT_CLUSTER"
WORKER_MARKER = "STATEKIT_CLUSTER_WORKER"
NS_RE = re.compile(r"^statekit-([0-9a-f]+)-w\d+$")
LINK_RE = re.compile(r"^sk(?:br|v|p)([0-9a-f]+)(?:x\d+)?$")  # skbr<tag>, skv<tag>x<i>


def ip(*args: str, check: bool = True) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def isolation_unavailable() -> str | None:
    """Why Workers cannot get network namespaces here (None: they can)."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "no `ip` command"
    try:
        ip("netns", "list")
    except RuntimeError as exc:
        return str(exc)
    return None


def pids_with(entry: str) -> set[int]:
    """Pids of live processes whose environment holds ``entry`` (``NAME=value``)."""
    needle, pids = entry.encode(), set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:  # empty for zombies
                    if needle in f.read().split(b"\0"):
                        pids.add(int(name))
            except OSError:
                pass
    return pids


def netns_pids(namespace: str) -> set[int]:
    return {int(p) for p in ip("netns", "pids", namespace, check=False).split()}


def kill_all(find: Callable[[], set[int]], timeout: float = 15.0) -> None:
    """SIGKILL whatever ``find`` returns until it returns nothing (new children included)."""
    deadline = time.monotonic() + timeout
    while pids := find() - {os.getpid()}:
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {sorted(pids)} survive SIGKILL")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def pid_alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def sweep_stale() -> list[str]:
    """Remove namespaces, links, processes and directories of clusters whose owner process died."""
    removed: list[str] = []
    if isolation_unavailable() is None:
        for namespace in ip("netns", "list").split():
            if (m := NS_RE.match(namespace)) and not pid_alive(int(m.group(1)[:-1], 16)):
                kill_all(lambda ns=namespace: netns_pids(ns))
                ip("netns", "del", namespace, check=False)
                removed.append(namespace)
        for line in ip("-o", "link", "show").splitlines():
            link = line.split(":")[1].strip().split("@")[0]
            if (m := LINK_RE.match(link)) and not pid_alive(int(m.group(1)[:-1], 16)):
                ip("link", "del", link, check=False)
                removed.append(link)
    for path in Path(tempfile.gettempdir()).glob("statekit-cluster-*"):
        tag = path.name.split("-")[2]
        if re.fullmatch(r"[0-9a-f]{2,}", tag) and not pid_alive(int(tag[:-1], 16)):
            kill_all(lambda t=tag: pids_with(f"{MARKER}={t}"))
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed
