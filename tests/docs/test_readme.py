"""Every code block of the README runs as written: Python blocks in a fresh interpreter (their
``# prints: ...`` comments must appear in the output), shell blocks' make targets exist."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(language: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [body for lang, body in FENCE.findall(text) if lang == language]


def run_python(code: str, tmp_path: Path) -> str:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for expected in re.findall(r"# prints: (.+)$", code, re.M):
        assert expected.strip() in done.stdout, (expected, done.stdout)
    return done.stdout


def test_readme_has_the_blocks_this_test_runs():
    assert len(blocks("python")) == 2 and len(blocks("bash")) == 2


def test_local_example_runs(tmp_path):
    run_python(blocks("python")[0], tmp_path)


@pytest.mark.spark
def test_spark_example_runs(tmp_path):
    code = blocks("python")[1]
    assert all(name in code for name in ("transform_with_state(", "foreach_batch(",
                                         "apply_in_pandas_with_state(", ".start()"))
    run_python(code, tmp_path)
    assert list(tmp_path.glob("tmp*/q*/statekit/*/*/p*/chk-*/_metadata"))  # state beside each query


@pytest.mark.spark
@pytest.mark.heavy  # the Spark example again, with a failing function (the example itself runs by default)
def test_spark_example_stops_waiting_when_a_query_fails(tmp_path):
    """The example waits for each query's progress: a failed query must end the wait with its
    error, not leave it polling a query that never progresses again."""
    code = blocks("python")[1]
    failing = code.replace("        user, amount = value\n",
                           "        user, amount = value\n        raise RuntimeError('boom')\n", 1)
    assert failing != code
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", failing], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "StreamingQueryException" in done.stderr and "boom" in done.stderr, done.stderr[-3000:]


def test_shell_commands_name_real_make_targets():
    for block in blocks("bash"):
        for line in block.splitlines():
            command = line.split("#")[0].split()
            assert command[:1] == ["make"], line
            subprocess.run(["make", "-n", *command[1:]], cwd=ROOT, check=True,
                           capture_output=True, timeout=60)
