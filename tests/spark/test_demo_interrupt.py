"""Ctrl-C on a Spark driver waiting inside ``statekit.spark.interruptible``, then a rerun: the
demo job (``python -m statekit.demo.spark_demo``) is interrupted after its first committed
batches, says so in one line (no PySpark or py4j traceback), and a rerun on the same ``--dir``
resumes the query and finds every output and every user's state exact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.heavy]

FLAGS = ["--files", "8", "--rows", "2000", "--users", "100"]


def _demo(work, *more):
    return [sys.executable, "-u", "-m", "statekit.demo.spark_demo", "--dir", str(work),
            *FLAGS, *more]


def test_ctrl_c_then_a_rerun_resumes_exactly(tmp_path):
    work = tmp_path / "work"
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(_demo(work), stdout=subprocess.PIPE, stderr=err, text=True)
        lines = []
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                assert line, f"the demo ended before its second batch: {lines}"
                lines.append(line)
                if line.strip().startswith("batch 1:"):
                    break
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    lines += out.splitlines()
    assert proc.returncode == 130, lines
    assert any("interrupted; the work directory is kept" in line for line in lines), lines
    stderr = err_path.read_text()
    assert "Traceback" not in stderr, stderr[-3000:]  # PySpark's handler printed several
    rerun = subprocess.run(_demo(work), capture_output=True, text=True, timeout=600, check=False)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert "RESULT: OK" in rerun.stdout
    outputs = sorted(os.listdir(work / "output"))
    assert len(outputs) == 8 and all(name.endswith(".parquet") for name in outputs)
