"""The configuration reference in docs/ is the one the code generates."""

from pathlib import Path

from statekit.configdoc import reference_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_reference_is_current():
    assert DOC.read_text() == reference_markdown(), (
        "docs/configuration.md is out of date: run tools/config-reference")
