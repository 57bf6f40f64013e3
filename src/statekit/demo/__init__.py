"""Runnable demos."""

from __future__ import annotations

import argparse

from statekit.errors import StatekitError


def check_backend_flag(parser: argparse.ArgumentParser, name: str) -> None:
    """Exit with a one-line usage error when ``--backend`` names no backend (a typo fails before
    any work starts, naming the nearest name)."""
    from statekit.runtime.environment import backend_from_config

    try:
        backend_from_config({"state.backend.type": name})
    except StatekitError as exc:
        parser.error(f"--backend: {str(exc).split(': ', 1)[-1]}")
