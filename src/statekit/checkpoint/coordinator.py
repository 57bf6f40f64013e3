"""Deprecated location of the checkpoint coordinator, which now lives in
:mod:`statekit.runtime.coordinator`.

The coordinator drives backends and storage together, so it sits in the runtime (as Flink's does
in flink-runtime).  Importing this module loads nothing from above the checkpoint layer; the
names are looked up by their path, with a :class:`DeprecationWarning`, only when old code asks
for them (as the plugin registry loads classes by path).
"""

import importlib
import warnings
from typing import Any

_MOVED = {"CheckpointCoordinator": "statekit.runtime.coordinator",
          "CheckpointStats": "statekit.runtime.coordinator"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(f"statekit.checkpoint.coordinator is deprecated; import {name} from "
                      f"{_MOVED[name]}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
