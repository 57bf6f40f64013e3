"""Every adapter resolves and checks the whole statekit configuration in the driver, when it is
called: a bad flag is a ConfigError there, naming the key and the nearest known one, before any
query starts."""

import os

import pytest

from statekit.errors import ConfigError, UnknownPluginError
from statekit.spark import apply_in_pandas_with_state, foreach_batch, transform_with_state
from statekit.testing.workloads import RunningCount
from tests.spark.jobs import OUTPUT

pytestmark = pytest.mark.spark


def call(spark, adapter, conf=None):
    source = spark.readStream.format("rate").load().selectExpr("cast(value as string) as key",
                                                               "value as v")
    if adapter == "foreach_batch":
        return foreach_batch(RunningCount(), "key", OUTPUT, lambda df, b: None, conf=conf)
    if adapter == "transform_with_state":
        return transform_with_state(source.groupBy("key"), RunningCount(), OUTPUT, conf=conf)
    return apply_in_pandas_with_state(source.groupBy("key"), RunningCount(), OUTPUT, conf=conf)


ADAPTERS = ["foreach_batch", "transform_with_state", "apply_in_pandas_with_state"]
CASES = [  # (spark.statekit key, value, error type, words the message must hold)
    ("state.backend.type", "rockdb", UnknownPluginError, ["'rockdb'", "did you mean 'rocksdb'"]),
    ("state.checkpoint-storage", "filesytem", UnknownPluginError, ["did you mean 'filesystem'"]),
    ("state.backend.typ", "rocksdb", ConfigError,
     ["spark.statekit.state.backend.typ", "did you mean 'spark.statekit.state.backend.type'"]),
    ("state.partition.versions-retained", "1", ConfigError, ["at least 2"]),
    ("pipeline.max-parallelism", "many", ConfigError, ["expected an integer"]),
    ("state.backend.max-key-size", "-5", ConfigError, ["memory size"]),
    ("execution.checkpointing.interval", "nan", ConfigError, ["duration"]),
    # keys only the local runner acts on: refused, naming what does their job in Spark
    ("execution.checkpointing.interval", "10 s", ConfigError,
     ["spark.statekit.execution.checkpointing.interval", "local runner", "trigger"]),
    ("restart-strategy.type", "fixed-delay", ConfigError, ["spark.task.maxFailures"]),
    ("state.checkpoints.num-retained", "3", ConfigError, ["state.partition.versions-retained"]),
    ("execution.checkpointing.mode", "AT_LEAST_ONCE", ConfigError, ["AT_LEAST_ONCE", "exactly once"]),
    ("parallelism.default", "4", ConfigError, ["spark.sql.shuffle.partitions"]),
]


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize(("key", "value", "error", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_spark_conf_fails_at_the_adapter_call(spark, adapter, key, value, error, words):
    spark.conf.set("spark.statekit." + key, value)
    try:
        with pytest.raises(error) as caught:
            call(spark, adapter)
    finally:
        spark.conf.unset("spark.statekit." + key)
    text = str(caught.value)
    assert all(w in text for w in words), text
    assert spark.streams.active == []


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_bad_conf_argument_fails_at_the_adapter_call(spark, adapter):
    with pytest.raises(ConfigError, match=r"did you mean 'state\.checkpoints\.dir'"):
        call(spark, adapter, conf={"state.checkpoint.dir": "/tmp/x"})
    with pytest.raises(UnknownPluginError, match=r"^state\.backend\.type"):
        call(spark, adapter, conf={"state.backend.type": "nosuch"})


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_statekit_environment_variables_take_effect_on_spark(spark, adapter, monkeypatch):
    """``STATEKIT_*`` variables of the driver are read as on the local runner, below Spark conf
    and ``conf=``; a typo, a bad value or a key Spark cannot act on is refused at the call,
    named as the variable."""
    from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
    from statekit.spark.adapters import resolve, statekit_conf

    monkeypatch.setenv("STATEKIT_STATE_BACKEND_TYPE", "rocksdb")
    assert isinstance(resolve(statekit_conf(spark))[0], EmbeddedRocksDBStateBackend)
    spark.conf.set("spark.statekit.state.backend.type", "hashmap")  # Spark conf wins
    try:
        assert statekit_conf(spark)["state.backend.type"] == "hashmap"
    finally:
        spark.conf.unset("spark.statekit.state.backend.type")
    assert statekit_conf(spark, {"state.backend": "hashmap"})["state.backend.type"] == "hashmap"
    cases = [("STATEKIT_STATE_BACKEND_TYPE", "rockdb", UnknownPluginError,
              r"^STATEKIT_STATE_BACKEND_TYPE.*did you mean 'rocksdb'"),
             ("STATEKIT_STATE_BACKEND_TYP", "rocksdb", ConfigError,
              r"^STATEKIT_STATE_BACKEND_TYP\b.*STATEKIT_STATE_BACKEND_TYPE"),
             ("STATEKIT_STATE_BACKEND_INCREMENTAL", "maybe", ConfigError,
              r"^STATEKIT_STATE_BACKEND_INCREMENTAL"),
             ("STATEKIT_EXECUTION_CHECKPOINTING_INTERVAL", "10 s", ConfigError,
              r"^STATEKIT_EXECUTION_CHECKPOINTING_INTERVAL.*local runner.*trigger")]
    monkeypatch.delenv("STATEKIT_STATE_BACKEND_TYPE")
    for name, value, error, pattern in cases:
        monkeypatch.setenv(name, value)
        with pytest.raises(error, match=pattern):
            call(spark, adapter)
        monkeypatch.delenv(name)
    assert spark.streams.active == []


def test_local_only_keys_in_the_conf_argument_are_named_as_written(spark):
    with pytest.raises(ConfigError, match=r"^execution\.checkpointing\.unaligned.*trigger"):
        call(spark, "transform_with_state", conf={"execution.checkpointing.unaligned": "true"})


def test_an_error_about_two_keys_names_both_as_written(spark):
    spark.conf.set("spark.statekit.state.backend.rocksdb.writebuffer.count", "2")
    try:
        with pytest.raises(ConfigError, match=r"^state\.backend\.rocksdb\.writebuffer\.number-to-"
                           r"merge: must be below spark\.statekit\.state\.backend\.rocksdb\."
                           r"writebuffer\.count \(2\)"):
            call(spark, "transform_with_state", conf={
                "state.backend.type": "rocksdb",
                "state.backend.rocksdb.writebuffer.number-to-merge": "2"})
    finally:
        spark.conf.unset("spark.statekit.state.backend.rocksdb.writebuffer.count")


def test_foreach_batch_checks_its_arguments(spark):
    with pytest.raises(ConfigError, match="num_partitions"):
        foreach_batch(RunningCount(), "key", OUTPUT, lambda df, b: None, num_partitions=0)
    with pytest.raises(ConfigError, match="output_schema"):
        foreach_batch(RunningCount(), "key", "key strin, c long", lambda df, b: None)
    with pytest.raises(TypeError, match="KeyedProcessFunction"):
        foreach_batch(lambda row: row, "key", OUTPUT, lambda df, b: None)


def unusable_directories(tmp_path):
    (tmp_path / "file").write_text("a regular file")
    return {"under a regular file": str(tmp_path / "file" / "statekit"),
            "under /proc": "/proc/statekit-test-dir",
            "under /sys": "/sys/statekit-test-dir"}


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("where", ["under a regular file", "under /proc", "under /sys"])
def test_an_unusable_checkpoint_directory_fails_at_the_adapter_call(spark, tmp_path, adapter, where):
    """Not at the first batch, as a raw NotADirectoryError in every task or a "not found"."""
    directory = unusable_directories(tmp_path)[where]
    with pytest.raises(ConfigError, match=r"^state\.checkpoints\.dir: .*(not a directory|cannot write)"):
        call(spark, adapter, conf={"state.checkpoints.dir": directory})
    spark.conf.set("spark.statekit.state.checkpoints.dir", directory)
    try:
        with pytest.raises(ConfigError, match=r"^spark\.statekit\.state\.checkpoints\.dir: "):
            call(spark, adapter)
    finally:
        spark.conf.unset("spark.statekit.state.checkpoints.dir")
    assert not (tmp_path / "file").is_dir() and not os.path.exists(directory)


def test_local_recovery_is_refused_where_it_cannot_take_effect(spark):
    """apply_in_pandas_with_state restores from checkpoint storage only: the key is refused there,
    at the call, and taken by the other adapters."""
    conf = {"state.backend.local-recovery": "true"}
    with pytest.raises(ConfigError, match="apply_in_pandas_with_state"):
        call(spark, "apply_in_pandas_with_state", conf)
    for adapter in ("foreach_batch", "transform_with_state"):
        call(spark, adapter, conf)
