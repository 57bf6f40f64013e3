"""PySpark adapters: run statekit keyed functions inside Structured Streaming queries."""

from statekit.spark.adapters import foreach_batch, statekit_conf, transform_with_state
from statekit.spark.apply_in_pandas import apply_in_pandas_with_state
from statekit.spark.session import cluster_spark, local_spark

__all__ = [
    "apply_in_pandas_with_state",
    "cluster_spark",
    "foreach_batch",
    "local_spark",
    "statekit_conf",
    "transform_with_state",
]
