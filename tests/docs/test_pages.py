"""Every page of docs/ runs as written: its Python blocks, one after another in one fresh
interpreter (later blocks use earlier ones' names), with each ``# prints: ...`` comment found in
the output, in order.  The three adapter pages start Spark, so they run together in one
interpreter (one JVM) under the ``spark`` marker.  Every example removes what it creates: the
temporary directory the run gets is empty afterwards but for RocksDB's shared working root."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
PRINTS = re.compile(r"# prints: (.+)$", re.M)
ADAPTERS = sorted(p.relative_to(DOCS).as_posix() for p in (DOCS / "adapters").glob("*.md"))
#: pages whose examples run in tests of their own (test_inspect_doc)
OWN_TESTS = {"inspect.md"}
#: other pages whose examples start Spark (run on their own, under the ``spark`` marker)
SPARK_PAGES = ["timers.md", "spark-compat.md"]
#: what statekit itself may leave in the temporary directory: the shared root of RocksDB working
#: directories (each instance's directory inside it is removed)
SHARED_ROOTS = {"statekit-rocksdb"}


def python_blocks(page: str) -> list[str]:
    text = (DOCS / page).read_text()
    return [body for lang, body in FENCE.findall(text) if lang == "python"]


def pages_with_examples() -> list[str]:
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    return [p for p in pages if python_blocks(p) and p not in OWN_TESTS and p not in ADAPTERS
            and p not in SPARK_PAGES]


def run_examples(code: str, tmp_path: Path) -> str:
    """Run ``code`` in a fresh interpreter with its temporary files under ``tmp_path``; check its
    ``# prints:`` lines in order and that it left nothing behind.  As a user runs it: no
    ``PYSPARK_PYTHON``, so a plain SparkSession starts Python workers with ``python3``."""
    work = tmp_path / "tmp"
    work.mkdir()
    env = {**os.environ, "TMPDIR": str(work), "PYTHONPATH": str(ROOT / "src")}
    env.pop("PYSPARK_PYTHON", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=work, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = iter(done.stdout.splitlines())
    for expected in PRINTS.findall(code):
        assert any(expected.strip() in line for line in lines), (expected, done.stdout)
    left = [p for p in work.iterdir()
            if not (p.name in SHARED_ROOTS and p.is_dir() and not any(p.iterdir()))]
    assert not left, f"the examples left {left} behind"
    return done.stdout


def test_every_page_with_examples_is_run():
    assert len(ADAPTERS) == 3
    assert {"index.md", "concepts.md", "pyflink.md", "operations.md"} <= {
        p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    for page in ADAPTERS:
        code = "\n".join(python_blocks(page))
        assert ".start()" in code and "availableNow=True" in code and PRINTS.search(code), page


@pytest.mark.parametrize("page", pages_with_examples())
def test_page_examples_run(page, tmp_path):
    run_examples("\n".join(python_blocks(page)), tmp_path)


@pytest.mark.spark
@pytest.mark.heavy  # a Spark query or several per page, 25-55 s each: make test-heavy (CI)
@pytest.mark.parametrize("page", SPARK_PAGES)
def test_spark_page_examples_run(page, tmp_path):
    run_examples("\n".join(python_blocks(page)), tmp_path)


@pytest.mark.spark
@pytest.mark.slow  # three Spark queries per page, 2-3 min: make test-slow (the adapters: tests/spark)
def test_adapter_pages_examples_run(tmp_path):
    """The three adapter pages' examples, each as written, one after another in one interpreter."""
    code = "\n\n".join("\n".join(python_blocks(page)) for page in ADAPTERS)
    run_examples(code, tmp_path)
