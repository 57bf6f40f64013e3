"""Spark's hook for the ``statekit`` data source: Spark registers the ``DefaultSource`` of every
importable ``pyspark_*`` module in each session, so ``spark.read.format("statekit")`` works
wherever statekit is installed (see :mod:`statekit.spark.datasource`)."""

from statekit.spark.datasource import StatekitDataSource as DefaultSource

__all__ = ["DefaultSource"]
