"""The ``statekit`` command line (``statekit ...`` or ``python -m statekit ...``): list,
inspect, verify and clean up checkpoints, export state, convert checkpoints into savepoints.

click and rich are imported here only, never by ``import statekit``.
"""

from statekit.cli.commands import main

__all__ = ["main"]
