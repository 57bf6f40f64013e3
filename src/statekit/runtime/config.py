"""Kept importable from here: the configuration table lives in :mod:`statekit.config`, on the
ground floor, since every layer reads keys from it."""

from statekit.config import *  # noqa: F403
