"""Runnable demos."""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from statekit.errors import StatekitError


def at_least(low: int):  # type: ignore[no-untyped-def]
    """An argparse type: an integer of at least ``low`` (a bad count fails before any work)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    return parse


def check_work_dir(parser: argparse.ArgumentParser, path: str | None) -> None:
    """``--dir``: a directory or a path still free, not an existing file."""
    if path and os.path.exists(path) and not os.path.isdir(path):
        parser.error(f"--dir: {path} exists and is not a directory")


def statekit_command() -> str:
    """How to run the ``statekit`` command from this shell: by name when this environment's
    script is on PATH, else by its path (a virtualenv nobody activated)."""
    script = os.path.join(os.path.dirname(sys.executable), "statekit")
    found = shutil.which("statekit")
    if found and os.path.realpath(found) == os.path.realpath(script):
        return "statekit"
    if os.path.exists(script):
        relative = os.path.relpath(script)
        return script if relative.startswith("..") else relative
    return f"{sys.executable} -m statekit"


def check_flags(parser: argparse.ArgumentParser, backend: str) -> None:
    """Exit with a one-line usage error when ``--backend`` names no backend or a ``STATEKIT_*``
    variable is unknown or malformed (a typo fails before any work starts, naming the nearest
    name)."""
    from statekit.config import from_env
    from statekit.runtime.environment import backend_from_config

    try:
        backend_from_config({"state.backend.type": backend})
    except StatekitError as exc:
        parser.error(f"--backend: {str(exc).split(': ', 1)[-1]}")
    try:
        from_env()
    except StatekitError as exc:
        parser.error(str(exc))
