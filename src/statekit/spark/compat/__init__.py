"""Spark's own stateful APIs on statekit state: existing ``applyInPandasWithState`` functions and
``StatefulProcessor`` subclasses run unchanged, with statekit holding every state variable.

The switch is one line in the driver, ``statekit.spark.compat.enable(spark)`` (or
``spark.statekit.compat.enabled=true`` in the session's configuration, with this package
imported); the drop-in functions take Spark's arguments with the grouped data first.
"""

from statekit.spark.compat.group_state import apply_in_pandas_with_state
from statekit.spark.compat.importer import ImportResult, import_state
from statekit.spark.compat.processor import transform_with_state, transform_with_state_in_pandas
from statekit.spark.compat.switch import ENABLED_KEY, disable, enable, enabled, install, uninstall

install()  # inert until a session sets spark.statekit.compat.enabled

__all__ = [
    "ENABLED_KEY",
    "ImportResult",
    "apply_in_pandas_with_state",
    "disable",
    "enable",
    "enabled",
    "import_state",
    "install",
    "transform_with_state",
    "transform_with_state_in_pandas",
    "uninstall",
]
