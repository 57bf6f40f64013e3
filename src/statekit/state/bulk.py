"""Deprecated location of :class:`BulkState`, which now lives in :mod:`statekit.backends.bulk`.

Bulk access drives a keyed backend, so it sits in the backends layer; this alias keeps imports
written against the old path working and is the one sanctioned upward import of the state layer.
"""

import warnings

from statekit.backends.bulk import BulkState

warnings.warn("statekit.state.bulk is deprecated; import BulkState from statekit.backends.bulk",
              DeprecationWarning, stacklevel=2)

__all__ = ["BulkState"]
