"""Kept importable from here: what a Spark task does lives in :mod:`statekit.spark.task`."""

from statekit.spark.task import BATCH_ID, QUERY_ID, AdapterSpec, PartitionTask, TaskInfo

__all__ = ["BATCH_ID", "QUERY_ID", "AdapterSpec", "PartitionTask", "TaskInfo"]
