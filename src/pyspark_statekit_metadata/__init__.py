"""Spark's hook for the ``statekit-metadata`` data source (Spark registers the ``DefaultSource``
of every importable ``pyspark_*`` module in each session; see :mod:`statekit.spark.datasource`)."""

from statekit.spark.datasource import StatekitMetadataSource as DefaultSource

__all__ = ["DefaultSource"]
