"""Every checkpoint storage through the shared storage conformance suite."""

import pytest

from statekit.testing.conformance import STORAGE_KINDS, StorageConformance, make_storage


class TestStorages(StorageConformance):
    @pytest.fixture(params=STORAGE_KINDS)
    def checkpoint_storage(self, request, tmp_path):
        return make_storage(request.param, tmp_path)
