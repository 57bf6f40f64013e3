import pytest

from statekit.runtime.partition import drop_local_state


@pytest.fixture(scope="package")
def spark():
    from statekit.spark import local_spark

    session = local_spark(master="local[2,3]", app_name="statekit-tests")
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _fresh_local_state():
    drop_local_state()
    yield
    drop_local_state()
