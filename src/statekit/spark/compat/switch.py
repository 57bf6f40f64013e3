"""The switch: Spark's ``groupBy(...).applyInPandasWithState / transformWithStateInPandas /
transformWithState`` run on statekit state once ``spark.statekit.compat.enabled`` is true.

:func:`enable` sets that key on a session (one line in the driver); setting it in the session's
configuration does the same once this module is imported.  The grouped-data methods are wrapped
once per process; a session without the key keeps Spark's own behaviour, call by call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from statekit import config as cfg
from statekit.spark.adapters import SPARK_PREFIX, active_session
from statekit.spark.compat.bridge import PROVIDER_KEY
from statekit.spark.session import ROCKSDB_PROVIDER

KEY = "compat.enabled"
ENABLED_KEY = SPARK_PREFIX + KEY
#: the grouped-data methods the switch routes, and statekit's drop-in for each
ROUTED = ("applyInPandasWithState", "transformWithStateInPandas", "transformWithState")
_ORIGINALS: dict[str, Callable[..., Any]] = {}


def enable(spark: Any = None) -> None:
    """Run Spark's stateful APIs of ``spark`` (default: the active session) on statekit state.

    statekit runs them through Spark's transformWithState operator, which Spark allows only with
    its RocksDB state store provider (Spark keeps none of the state there): the session is set
    to that provider for queries started from now on.
    """
    install()
    spark = spark or active_session()
    spark.conf.set(PROVIDER_KEY, ROCKSDB_PROVIDER)
    spark.conf.set(ENABLED_KEY, "true")


def disable(spark: Any = None) -> None:
    """Back to Spark's own state store for queries defined from now on."""
    (spark or active_session()).conf.set(ENABLED_KEY, "false")


def enabled(spark: Any) -> bool:
    """Whether ``spark`` routes Spark's stateful APIs to statekit (a malformed value is refused)."""
    value = spark.conf.get(ENABLED_KEY, None)
    if value is None:
        value = spark.sparkContext.getConf().get(ENABLED_KEY, "false")
    checked = cfg.validate({KEY: value}, all_keys_are_statekit=True, prefix=SPARK_PREFIX)
    return bool(cfg.read(checked, KEY))


def _drop_in(name: str) -> Callable[..., Any]:
    from statekit.spark.compat import group_state, processor

    return {"applyInPandasWithState": group_state.apply_in_pandas_with_state,
            "transformWithStateInPandas": processor.transform_with_state_in_pandas,
            "transformWithState": processor.transform_with_state}[name]


def install() -> None:
    """Wrap the grouped-data methods once per process (each asks :func:`enabled` per call)."""
    from pyspark.sql.group import GroupedData

    for name in ROUTED:
        if name in _ORIGINALS or not hasattr(GroupedData, name):
            continue
        original = _ORIGINALS[name] = getattr(GroupedData, name)

        def routed(self: Any, *args: Any, _name: str = name,
                   _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            if enabled(self._df.sparkSession):
                return _drop_in(_name)(self, *args, **kwargs)
            return _original(self, *args, **kwargs)

        setattr(GroupedData, name, functools.wraps(original)(routed))


def uninstall() -> None:
    """Spark's own methods back (the switch's key then does nothing)."""
    from pyspark.sql.group import GroupedData

    for name, original in _ORIGINALS.items():
        setattr(GroupedData, name, original)
    _ORIGINALS.clear()
