"""The PySpark statekit's Spark adapters work with: checked when :mod:`statekit.spark` is
imported, so a missing or unsupported PySpark is one clear error, not a failure deep in a query.

PySpark is an optional dependency (``statekit[spark]``): a Spark cluster ships its own, and
statekit uses it when its version is in :data:`SUPPORTED` (the adapters rely on PySpark's
``transformWithStateInPandas`` worker internals of that line, pinned by the tests).
"""

from __future__ import annotations

import re
from importlib import metadata

from statekit.errors import MissingDependencyError

#: The PySpark releases the adapters support: (lowest, first unsupported), as in ``statekit[spark]``.
SUPPORTED = ((4, 3), (4, 4))
_INSTALL = "pip install 'statekit[spark]', or use the PySpark of your Spark installation"


def check_pyspark(version: str | None = None) -> str:
    """The installed PySpark's version; MissingDependencyError when it is absent or outside
    :data:`SUPPORTED`."""
    if version is None:
        try:
            version = metadata.version("pyspark")
        except metadata.PackageNotFoundError:
            try:  # a cluster's PySpark on PYTHONPATH (no distribution metadata)
                import pyspark
            except ImportError:
                raise MissingDependencyError(
                    "pyspark", f"statekit.spark needs PySpark {_range()}: {_INSTALL}") from None
            version = str(pyspark.__version__)
    found = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
    low, high = SUPPORTED
    if not low <= found < high:
        raise MissingDependencyError(
            "pyspark", f"statekit.spark supports PySpark {_range()}, found {version}: {_INSTALL}")
    return version


def _range() -> str:
    (a, b), (c, d) = SUPPORTED
    return f">={a}.{b},<{c}.{d}"
