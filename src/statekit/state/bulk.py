"""Deprecated location of :class:`BulkState`, which now lives in :mod:`statekit.backends.bulk`.

Bulk access drives a keyed backend, so it belongs to the backends layer.  Importing this module
loads nothing from above the state layer; the name is looked up by its path, with a
:class:`DeprecationWarning`, only when old code asks for it (as the plugin registry loads
classes by path).
"""

import importlib
import warnings
from typing import Any

_MOVED = {"BulkState": "statekit.backends.bulk"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(f"statekit.state.bulk is deprecated; import {name} from {_MOVED[name]}",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
