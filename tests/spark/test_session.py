"""The sessions statekit makes for demos and tests are sized for a loaded machine."""

import os

import pytest

from statekit.spark.session import SOCKET_TIMEOUT

pytestmark = pytest.mark.spark


def test_python_workers_and_the_jvm_wait_long_enough_for_each_others_sockets(spark):
    """Spark's 15 s for a Python worker and the JVM to connect was missed at load 10
    (``CANNOT_OPEN_SOCKET`` failed a query); a dead peer still fails, after this long."""
    seconds = int(SOCKET_TIMEOUT.rstrip("s"))
    assert seconds >= 300
    context = spark.sparkContext
    assert context._jvm.PythonUtils.getPythonAuthSocketTimeout(context._jsc) == seconds
    assert os.environ["SPARK_AUTH_SOCKET_TIMEOUT"] == str(seconds)  # the driver's side
    # each Python worker gets it from its factory: its socket waits as long
    waited = context.parallelize([0], 1).map(
        lambda _: os.environ.get("SPARK_AUTH_SOCKET_TIMEOUT")).collect()
    assert waited == [str(seconds)]
