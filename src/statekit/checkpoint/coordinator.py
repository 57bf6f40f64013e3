"""Deprecated location of the checkpoint coordinator, which now lives in
:mod:`statekit.runtime.coordinator`.

The coordinator drives backends and storage together, so it sits in the runtime (as Flink's does
in flink-runtime); this alias keeps imports written against the old path working and is the one
sanctioned upward import of the checkpoint layer.
"""

import warnings

from statekit.runtime.coordinator import CheckpointCoordinator, CheckpointStats

warnings.warn("statekit.checkpoint.coordinator is deprecated; import CheckpointCoordinator from "
              "statekit.runtime.coordinator", DeprecationWarning, stacklevel=2)

__all__ = ["CheckpointCoordinator", "CheckpointStats"]
