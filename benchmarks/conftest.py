"""Benchmark-wide settings: machine description recorded into the pytest-benchmark JSON."""

from __future__ import annotations

import os
import platform
from typing import Any

from benchmarks._common import QUICK, loadavg


def _meminfo_gib() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        return None
    return None


def pytest_benchmark_update_machine_info(config: Any, machine_info: dict[str, Any]) -> None:
    try:
        import rocksdict

        rocksdict_version = getattr(rocksdict, "__version__", None)
    except ImportError:  # pragma: no cover
        rocksdict_version = None
    if rocksdict_version is None:
        from importlib.metadata import version

        rocksdict_version = version("rocksdict")
    machine_info["statekit"] = {
        "quick": QUICK,
        "cpus": os.cpu_count(),
        "mem_gib": _meminfo_gib(),
        "loadavg_start": loadavg(),
        "kernel": platform.release(),
        "rocksdict": rocksdict_version,
    }
