"""A second driver process for the teardown test: ``python -m tests.cluster.driver_job MASTER HOST
LOCAL_DIR MARKER_DIR`` runs two tasks that mark their start and then sleep for ten minutes."""

import functools
import sys

from statekit.spark import cluster_spark
from tests.cluster import tasks

if __name__ == "__main__":
    master, host, local_dir, marker_dir = sys.argv[1:5]
    spark = cluster_spark(master, host, app_name="statekit-teardown-probe", local_dir=local_dir)
    job = functools.partial(tasks.locate, peer=host, sleep=600, marker_dir=marker_dir)
    spark.range(0, 2, 1, 2).mapInPandas(job, tasks.LOCATION).collect()
