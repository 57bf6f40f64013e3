"""docs/conformance.md tells the truth: every statekit test its tables name exists (with the
parameter named in brackets), and its summary counts are those of its tables."""

import re
from pathlib import Path

from statekit.testing import conformance

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "conformance.md").read_text()
SUITES = {"Kinds": conformance.StateKindConformance, "Snapshots": conformance.SnapshotConformance,
          "Keys": conformance.KeyEnumerationConformance,
          "Namespaces": conformance.NamespaceConformance, "Backend": conformance.BackendConformance,
          "Keyed": conformance.DataStreamConformance,
          "Connected": conformance.ConnectedStreamConformance}
NAMED = re.compile(r"`(\w+)\.(test_\w+)(?:\[([\w-]+)\])?`")


def section(title: str) -> list[list[str]]:
    """The rows of the table under the heading ``title``: cells, stripped."""
    text = PAGE.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]


def param_ids(test) -> set[str]:
    """The ids pytest gives the parameters of ``test`` (its own, or joined values)."""
    ids = set()
    for mark in getattr(test, "pytestmark", []):
        if mark.name == "parametrize":
            values = mark.args[1]
            ids.update(mark.kwargs.get("ids") or [
                "-".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in values])
    return ids


def test_every_named_test_exists():
    named = NAMED.findall(PAGE)
    assert len(named) > 60
    for suite, name, param in named:
        test = getattr(SUITES[suite], name, None)
        assert callable(test), (suite, name)
        if param:
            assert param in param_ids(test), (suite, name, param)


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
