"""The ``statekit`` command line (``statekit ...`` or ``python -m statekit ...``): list,
inspect, verify and clean up checkpoints, export state, convert checkpoints into savepoints,
bring a native Spark query's state along (``statekit spark import-state``).

click and rich are imported here only, never by ``import statekit``.
"""

from statekit.cli import spark_commands as _spark_commands  # noqa: F401 (registers ``spark``)
from statekit.cli.commands import main

__all__ = ["main"]
