"""PySpark adapters: run statekit keyed functions inside Structured Streaming queries."""
# ruff: noqa: E402 (PySpark is checked before anything imports it)

from statekit.spark.requires import check_pyspark

check_pyspark()  # before anything imports pyspark: a missing or unsupported one, said plainly

from statekit.spark.adapters import statekit_conf
from statekit.spark.apply_in_pandas import apply_in_pandas_with_state
from statekit.spark.committed import install_reader, read_carried
from statekit.spark.datasource import StatekitDataSource, register_data_source
from statekit.spark.foreach import foreach_batch
from statekit.spark.reporting import statekit_error
from statekit.spark.session import cluster_spark, local_spark, quiet_stop_noise, quiet_tws_driver_worker
from statekit.spark.stopping import interruptible
from statekit.spark.transform import transform_with_state

quiet_tws_driver_worker()
install_reader()  # spark.read.format("statekit") on applyInPandasWithState queries, in the driver

__all__ = [
    "StatekitDataSource",
    "apply_in_pandas_with_state",
    "cluster_spark",
    "foreach_batch",
    "interruptible",
    "local_spark",
    "quiet_stop_noise",
    "read_carried",
    "register_data_source",
    "statekit_conf",
    "statekit_error",
    "transform_with_state",
]
