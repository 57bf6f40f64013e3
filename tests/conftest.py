"""Session-wide fixtures: a private temporary directory checked for leftovers, the S3 server."""

import fcntl
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from statekit import workdirs

# --- nothing left behind ----------------------------------------------------------------------
# The whole session (Spark's Python workers and driver subprocesses included, through TMPDIR)
# works in a private temporary directory.  At the end, after Spark is stopped and this process
# released what it owns (as it would at exit), anything statekit created there is a failure.
# The session holds a lock on ``<dir>.lock`` (the workdirs convention), so a session that was
# killed before it could clean up is swept by the next one.
_BASE = tempfile.gettempdir()
_TMP = Path(tempfile.mkdtemp(prefix="statekit-tests-"))
_pending = f"{_TMP.parent}/.{_TMP.name}.lock.new"  # locked before it gets the name sweepers see
_LOCK_FD = os.open(_pending, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
fcntl.flock(_LOCK_FD, fcntl.LOCK_EX)
os.replace(_pending, f"{_TMP}.lock")
workdirs.sweep(_BASE, "statekit-tests-")
os.environ["TMPDIR"] = str(_TMP)
tempfile.tempdir = str(_TMP)


# Test Spark drivers (this process's and every driver subprocess's) are short-lived JVMs: the
# client compiler only and one GC thread spend about a quarter less CPU on a 2-core machine.
os.environ.setdefault("PYSPARK_SUBMIT_ARGS", '--driver-java-options '
                      '"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData" pyspark-shell')

_WORKER_LEFTOVERS: list[str] = []  # reported by pytest-xdist workers to the controller


def pytest_sessionfinish(session, exitstatus):
    try:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
        from statekit.spark.session import cleanup

        cleanup()
    except ImportError:
        pass
    workdirs.release_all()
    workdirs.sweep(_TMP / "statekit-rocksdb")
    left = sorted(p.name for p in _TMP.iterdir() if not p.name.startswith("pytest-of-")
                  and not (p.name == "statekit-rocksdb" and not any(p.iterdir())))
    shutil.rmtree(_TMP, ignore_errors=True)
    Path(f"{_TMP}.lock").unlink(missing_ok=True)
    os.close(_LOCK_FD)
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:  # an xdist worker: its exit status is not the run's
        worker_output["statekit_leftovers"] = left
        return
    left += _WORKER_LEFTOVERS
    if left:
        session.exitstatus = 1
        print(f"\nFAILED: the test session left these in its temporary directory: {left}")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller of an xdist run collects what each worker's session left behind."""
    _WORKER_LEFTOVERS.extend(getattr(node, "workeroutput", {}).get("statekit_leftovers", []))


# --- order: the longest tests first, so parallel workers finish together ----------------------
_LONGEST_FIRST = ("tests/spark/test_restart.py", "tests/spark/test_adapters.py",
                  "tests/spark/compat/test_import_state.py", "tests/spark/test_apply_in_pandas.py",
                  "tests/spark/compat/test_transform_with_state.py", "tests/docs/test_pages.py",
                  "tests/docs/test_readme.py", "tests/spark/test_worker_reuse.py",
                  "tests/checkpoint/test_crash.py", "tests/checkpoint/test_fuzz.py")


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


# --- hypothesis: no per-example deadline (the machines running the suite are shared) --------
try:
    from hypothesis import settings

    settings.register_profile("statekit", deadline=None)
    settings.load_profile("statekit")
except ImportError:
    pass


# --- local S3 server: moto's server on 127.0.0.1, started once per session -------------------------


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on 127.0.0.1 for the whole session (starts in 1-2 s)."""
    from statekit.testing.s3 import LocalS3Server

    server = LocalS3Server().start()
    saved = {k: os.environ.get(k) for k in server.client_env()}
    os.environ.update(server.client_env())  # dummy credentials: botocore never looks further
    try:
        yield server
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def s3_url(s3_server):
    """``s3://<fresh bucket>`` on the local server."""
    return s3_server.create_bucket(f"t-{uuid.uuid4().hex[:12]}")
