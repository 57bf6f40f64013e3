import os
from pathlib import Path

import pytest

from statekit.runtime.partition import drop_local_state

# Spark's Python workers unpickle the test functions by module name: let them import ``tests``.
_ROOT = str(Path(__file__).resolve().parents[2])
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p)


def session(**conf):
    """A local[2,3] session (task retries allowed) with ``conf``, replacing one with other settings."""
    from pyspark.sql import SparkSession

    from statekit.spark import local_spark

    active = SparkSession.getActiveSession()
    if active is not None:
        current = dict(active.sparkContext.getConf().getAll())
        reuse = "spark.python.worker.reuse"
        if all(current.get(k) == str(v) for k, v in conf.items()) and \
                current.get(reuse, "true") == conf.get(reuse, "true"):
            return active
        active.stop()
    return local_spark(master="local[2,3]", app_name="statekit-tests", conf=conf)


@pytest.fixture
def spark():
    """The shared session, asked for per test: under pytest-xdist tests of modules that need
    other settings (worker reuse off) run in between and replace it."""
    yield session()


@pytest.fixture(autouse=True)
def _fresh_local_state():
    drop_local_state()
    yield
    drop_local_state()
