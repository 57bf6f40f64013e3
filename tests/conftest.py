# --- local S3 server: moto's server on 127.0.0.1, started once per session ------------------------

import os as _os
import uuid as _uuid

import pytest as _pytest


@_pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on 127.0.0.1 for the whole session (starts in 1-2 s)."""
    from statekit.testing.s3 import LocalS3Server

    server = LocalS3Server().start()
    saved = {k: _os.environ.get(k) for k in server.client_env()}
    _os.environ.update(server.client_env())  # dummy credentials: botocore never looks further
    try:
        yield server
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                _os.environ.pop(key, None)
            else:
                _os.environ[key] = value


@_pytest.fixture
def s3_url(s3_server):
    """``s3://<fresh bucket>`` on the local server."""
    return s3_server.create_bucket(f"t-{_uuid.uuid4().hex[:12]}")
