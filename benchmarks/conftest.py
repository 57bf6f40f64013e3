"""Benchmark-wide settings: a private temporary directory, and the machine description recorded
into the pytest-benchmark JSON."""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from typing import Any

from benchmarks._common import QUICK, loadavg

# Nothing left behind: the session (pytest's own tmp_path directories, Spark's Python workers,
# the export's child processes) works in a private temporary directory on the same disk, removed
# when the session ends.
_TMP = tempfile.mkdtemp(prefix="statekit-bench-session-")
os.environ["TMPDIR"] = _TMP
tempfile.tempdir = _TMP


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    shutil.rmtree(_TMP, ignore_errors=True)


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
