"""The table of keys a Spark query cannot act on: every entry a real key, refused; the keys that
do take effect on Spark (backend, storage, exactly-once) pass."""

import pytest

from statekit import config as cfg
from statekit.errors import ConfigError
from statekit.spark.adapters import LOCAL_ONLY, refuse_local_only


def test_every_entry_names_a_known_key_or_namespace():
    for key in LOCAL_ONLY:
        if key.endswith("."):
            assert any(k.startswith(key) for k in cfg.KEYS), key
        else:
            assert key in cfg.KEYS, key


@pytest.mark.parametrize("key", sorted(k for k in cfg.KEYS if k.startswith("restart-strategy.")))
def test_each_restart_strategy_key_is_refused(key):
    with pytest.raises(ConfigError, match=r"spark\.task\.maxFailures"):
        refuse_local_only({key: "1"})


def test_keys_that_take_effect_on_spark_pass():
    refuse_local_only({"state.backend.type": "rocksdb", "execution.checkpointing.mode": "EXACTLY_ONCE",
                       "state.backend.incremental": "true", "state.partition.versions-retained": "3",
                       "pipeline.max-parallelism": "256"})


def test_at_least_once_is_refused_in_any_spelling():
    for value in ("AT_LEAST_ONCE", "at-least-once"):
        with pytest.raises(ConfigError, match="exactly once"):
            conf = {"execution.checkpointing.mode": value}
            refuse_local_only(conf)


def test_local_copy_root_is_refused_and_local_recovery_passes():
    """Spark executors keep their local copies under their own local directories."""
    refuse_local_only({"state.backend.local-recovery": "true"})
    with pytest.raises(ConfigError, match=r"spark\.local\.dir"):
        refuse_local_only({"taskmanager.state.local.root-dirs": "/x"})


def test_heap_transfer_threads_are_refused_and_rocksdb_transfer_threads_pass():
    """The heap key only paces the local runner's snapshot writers; RocksDB's downloads and
    uploads use its key in every Spark task."""
    refuse_local_only({"state.backend.rocksdb.checkpoint.transfer.thread.num": "4"})
    with pytest.raises(ConfigError, match=r"spark\.executor\.cores"):
        refuse_local_only({"state.backend.heap.transfer.thread.num": "4"})
