"""Reading a checkpoint directory while a job changes it (tests and benchmarks that look from
inside a running job)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def walked(fn: Callable[[], T]) -> T:
    """``fn()``, again while the files it walks vanish under it: a job's cleaner thread deletes
    subsumed checkpoints, and local copies are pruned, while the job runs."""
    while True:
        try:
            return fn()
        except FileNotFoundError:
            continue
