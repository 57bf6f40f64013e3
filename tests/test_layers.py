"""The layering: no module of statekit imports one from a layer above its own.

The layers are the import-linter contract in ``pyproject.toml`` (also run by ``make lint``);
running it here makes the default test run fail on an upward import too.
"""

from __future__ import annotations

from pathlib import Path

from importlinter import cli

ROOT = Path(__file__).resolve().parent.parent


def test_imports_only_point_down(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the contract is read from pyproject.toml here
    code = cli.lint_imports(no_cache=True, no_logo=True)
    assert code == 0, capsys.readouterr().out
