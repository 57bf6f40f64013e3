"""docs/conformance.md tells the truth: every statekit test its tables name exists (with the
parameter named in brackets), and its summary counts are those of its tables."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "conformance.md").read_text()
SUITES = {"Kinds": "TestStateKinds", "Snapshots": "TestSnapshots",
          "Keyed": "TestKeyed", "Connected": "TestConnected"}
OTHERS = {"Namespaces": "tests/backends/test_namespaces.py::TestHeapNamespaces",
          "Backend": "tests/backends/test_heap.py::TestHeapAsync"}
NAMED = re.compile(r"`(\w+)\.(test_\w+)(\[[\w-]+\])?`")


def section(title: str) -> list[list[str]]:
    """The rows of the table under the heading ``title``: cells, stripped."""
    text = PAGE.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]


@pytest.fixture(scope="module")
def collected():
    """Every test id of the conformance runs (collected, not run)."""
    files = ["tests/backends/test_flink_state_backend.py", "tests/runtime/test_pyflink_datastream.py",
             *{o.split("::")[0] for o in OTHERS.values()}]
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                           "no:cacheprovider", "-n", "0", *files], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    return done.stdout


def test_every_named_test_exists(collected):
    named = NAMED.findall(PAGE)
    assert len(named) > 60
    for suite, test, param in named:
        where = OTHERS.get(suite) or f"::{SUITES[suite]}::"
        wanted = f"{where}::{test}" if suite in OTHERS else f"{where}{test}"
        ids = [line for line in collected.splitlines() if wanted in line]
        assert ids, (suite, test)
        if param:  # the parameter appears in a collected id: [heap-value], [rocksdb-full-2-4]
            inner = param[1:-1]
            assert any(re.search(rf"[\[-]{re.escape(inner)}\]", line) for line in ids), (
                suite, test, param)


def test_summary_counts_match_the_tables():
    flink = section("Flink's `StateBackendTestBase`")
    pyflink = section("PyFlink's `test_data_stream.py`")
    keyed = [r for r in pyflink if not r[0].startswith(("test_keyed_co", "test_basic_co",
                                                        "test_co_"))]
    connected = [r for r in pyflink if r not in keyed]
    head = PAGE.split("## ", 1)[0]
    for label, rows in (("Flink `StateBackendTestBase`", flink),
                        ("PyFlink `test_data_stream.py`, keyed cases", keyed),
                        ("PyFlink `test_data_stream.py`, connected cases", connected)):
        left_out = sum(r[1] == "left out" for r in rows)
        line = next(x for x in head.splitlines() if x.startswith(f"| {label} |"))
        cases, ported, passing, out = (int(c) for c in line.strip("|").split("|")[1:])
        assert (cases, ported, passing, out) == (len(rows), len(rows) - left_out,
                                                 len(rows) - left_out, left_out), label
        assert all(r[1] == "left out" or NAMED.search(r[1]) for r in rows), label
