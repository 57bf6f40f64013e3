"""Inspecting the state of Spark queries: the adapters' per-partition versions listed, picked by
batch, read with ``spark.read.format("statekit")`` and the CLI, verified; by default the state as
of the query's last committed batch (applyInPandasWithState: with the changes Spark carries in
its state store); the Spark reader on checkpoints of the local runner's layout on the S3
server."""

from __future__ import annotations

import json
import os
import shutil

import pandas as pd
import pytest
from click.testing import CliRunner

from statekit.cli import main
from statekit.errors import CorruptCheckpointError
from statekit.inspection import list_checkpoints, open_checkpoint, verify
from tests.inspection.states import as_model, model, write_job
from tests.spark.jobs import Outputs, RunningCount, expected, run_until_done, write_inputs

pytestmark = pytest.mark.spark


def cli(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.output


def counts(frame: pd.DataFrame) -> dict[str, int]:
    return {k: int(v) for k, v in zip(frame["key"], frame["value"], strict=True)}


def test_foreach_batch_versions_by_batch(spark, tmp_path):
    frame = write_inputs(str(tmp_path / "in"), 0, 3)
    checkpoint = str(tmp_path / "query")
    run_until_done(spark, "foreach_batch", RunningCount(), str(tmp_path / "in"), checkpoint,
                   Outputs(), {"state.backend.type": "rocksdb"})
    infos = list_checkpoints(checkpoint)
    assert {(i.operator, i.partition, i.batch) for i in infos} == {
        ("RunningCount", p, b) for p in (0, 1) for b in (0, 1, 2)}
    assert {i.backend for i in infos} == {"rocksdb"}
    first_two = frame.iloc[:1200]  # write_inputs: 600 rows per file, one file per batch
    view = open_checkpoint(checkpoint, batch=1)
    assert view.info.batch == 1 and len(view.partitions) == 2
    assert counts(view.state("c").to_pandas()) == {k: c for k, (c, _) in expected(first_two).items()}
    df = (spark.read.format("statekit").option("state", "t").option("batch", 1).load(checkpoint))
    assert df.rdd.getNumPartitions() == 2
    assert counts(df.toPandas()) == {k: t for k, (_, t) in expected(first_two).items()}
    latest = spark.read.format("statekit").option("state", "c").load(checkpoint).toPandas()
    assert counts(latest) == {k: c for k, (c, _) in expected(frame).items()}
    # the CLI on the query's checkpointLocation: one row per batch, an export, verify
    table = cli("checkpoints", "list", checkpoint)
    assert "RunningCount" in table and "version" in table
    assert "3 Spark batch(es) (6 partition version(s)) under" in table  # the header counts rows
    assert "6 checkpoint(s) under" in cli("checkpoints", "list", checkpoint, "--partitions")
    cli("state", "export", checkpoint, "--state", "c", "--batch", "2", "--to",
        str(tmp_path / "c.parquet"))
    # nothing is written into the query's checkpointLocation (verify would count it)
    for command in (["savepoint", "convert", checkpoint, "--to", f"{checkpoint}/sp"],
                    ["state", "export", checkpoint, "--state", "c", "--to", f"{checkpoint}/c.csv"]):
        assert "inside the checkpoint directory" in cli(*command, code=2)
    assert not os.path.exists(f"{checkpoint}/sp") and not os.path.exists(f"{checkpoint}/c.csv")
    # a batch after the last committed one is not there (it was shown as the last one)
    assert "last committed batch is 2" in cli("checkpoints", "inspect", checkpoint, "--batch", "9",
                                              code=2)
    assert "--checkpoint-id cannot apply" in cli("checkpoints", "inspect", checkpoint,
                                                 "--checkpoint-id", "1", code=2)
    assert counts(pd.read_parquet(tmp_path / "c.parquet")) == {
        k: c for k, (c, _) in expected(frame).items()}
    assert verify(checkpoint).ok
    shutil.copytree(tmp_path / "query", tmp_path / "pristine")
    # small state lives inline in each version's _metadata: damage one of them
    victim = sorted((tmp_path / "query" / "statekit").rglob("p00001/chk-2/_metadata"))[0]
    victim.write_bytes(victim.read_bytes()[:-7])
    report = json.loads(cli("checkpoints", "verify", checkpoint, "--json", code=1))
    assert [(p["path"], p["error"]) for p in report["problems"]] == [
        (str(victim), "TruncatedCheckpointError")]
    # a damaged, lost or missing newest version is an error, never the older state it hides
    for damage in ("garbage", "no metadata", "no version", "no partition"):
        copy = tmp_path / f"copy-{damage}"
        shutil.copytree(tmp_path / "pristine", copy)
        version = sorted((copy / "statekit").rglob("p00001/chk-2"))[0]
        if damage == "garbage":
            (version / "_metadata").write_bytes(b"not a checkpoint")
        elif damage == "no metadata":
            (version / "_metadata").unlink()
        else:
            shutil.rmtree(version if damage == "no version" else version.parent)
        with pytest.raises(CorruptCheckpointError, match=r"partition 1 of 2|_metadata"):
            open_checkpoint(str(copy))
        assert "damaged checkpoint" in cli("state", "export", str(copy), "--state", "c", "--to",
                                           str(tmp_path / f"{damage}.csv"), code=1)


def as_of_markers(frame: pd.DataFrame, markers: pd.DataFrame) -> dict[str, tuple[int, int]]:
    """Each key's (count, total) after the first ``seq`` batches it appeared in, ``seq`` being its
    applied marker in the snapshot (write_inputs: 600 rows, one batch per file)."""
    batches = frame.assign(batch=frame.index // 600)
    out = {}
    for key, marker in zip(markers["key"], markers["value"], strict=True):
        seq, _attempt = json.loads(marker)  # (sequence number, attempt) of its last applied change
        rows = batches[batches["key"] == key]
        upto = sorted(set(rows["batch"]))[: int(seq)]
        mine = rows[rows["batch"].isin(upto)]
        out[key] = (len(mine), int(mine["v"].sum()))
    return out


def test_apply_in_pandas_snapshots_hide_internal_state(spark, tmp_path):
    frame = write_inputs(str(tmp_path / "in"), 0, 4)
    checkpoint = str(tmp_path / "query")
    # one partition, one snapshot chain; snapshots within every task (every 10 key calls), so
    # one is taken whichever Python worker of the pool runs each batch
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        run_until_done(spark, "apply_in_pandas_with_state", RunningCount(), str(tmp_path / "in"),
                       checkpoint, Outputs(), {"state.changelog.materialize-every-batches": "1",
                                               "state.changelog.materialize-after-calls": "10"})
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
    infos = [i for i in list_checkpoints(checkpoint) if i.status == "retained"]
    assert infos and all(i.id >= 1_000_000 for i in infos)  # snapshot ids, not batch ids
    newest = max(i.batch for i in infos)
    view = open_checkpoint(checkpoint, snapshots_only=True)
    assert view.info.batch == newest
    assert [s.name for s in view.states()] == ["c", "t"]
    assert "__statekit_applied" in [s.name for s in view.states(include_internal=True)]
    # a snapshot holds each key's state as of the change its marker names (a process that did
    # not run every batch, or a snapshot taken within a task, lags for some keys: those changes
    # ride in GroupState), and never more than its batch
    markers = view.state("__statekit_applied").to_pandas()
    assert len(markers) > 0 and max(json.loads(m)[0] for m in markers["value"]) <= newest + 1
    as_of = as_of_markers(frame, markers)
    assert counts(view.state("c").to_pandas()) == {k: c for k, (c, _) in as_of.items()}
    df = (spark.read.format("statekit").option("state", "t").option("batch", newest)
          .option("snapshotsOnly", "true").load(checkpoint))
    assert counts(df.toPandas()) == {k: t for k, (_, t) in as_of.items()}


def as_dicts(frame: pd.DataFrame) -> tuple[dict[str, int], dict[str, int]]:
    want = expected(frame)
    return {k: c for k, (c, _) in want.items()}, {k: t for k, (_, t) in want.items()}


def test_apply_in_pandas_state_is_the_last_committed_batch(spark, tmp_path):
    """The tools read the snapshots and the changes each key carries in Spark's state store:
    the query's exact state, as of its last committed batch, which they name.  (They used to
    read the snapshots alone, which lag: most keys behind, some missing.)"""
    frame = write_inputs(str(tmp_path / "in"), 0, 5, keys=200)
    checkpoint = str(tmp_path / "query")
    run_until_done(spark, "apply_in_pandas_with_state", RunningCount(), str(tmp_path / "in"),
                   checkpoint, Outputs(), {"state.changelog.materialize-every-batches": "4"})
    assert any(i.status == "retained" for i in list_checkpoints(checkpoint))  # snapshots, and
    want_c, want_t = as_dicts(frame)
    # the snapshots alone are never ahead of the query, and usually behind it (whether a
    # partition's newest snapshot holds the last batch depends on which process ran it)
    lagging = counts(open_checkpoint(checkpoint, snapshots_only=True).state("c").to_pandas())
    assert set(lagging) <= set(want_c)
    assert all(lagging.get(key, 0) <= count for key, count in want_c.items())
    view = open_checkpoint(checkpoint)
    assert (view.info.batch, view.info.committed_batch, view.info.status) == (4, 4, "committed")
    assert counts(view.state("c").to_pandas()) == want_c
    df = spark.read.format("statekit").option("state", "t").load(checkpoint)
    assert counts(df.toPandas()) == want_t
    out = cli("state", "export", checkpoint, "--state", "c", "--to", str(tmp_path / "c.parquet"))
    assert "as of batch 4" in out and counts(pd.read_parquet(tmp_path / "c.parquet")) == want_c
    assert "batch 4 (the query's last committed batch)" in cli("checkpoints", "inspect", checkpoint)
    converted = cli("savepoint", "convert", checkpoint, "--to", str(tmp_path / "sp"), "--json")
    savepoint = json.loads(converted)["savepoint"]
    assert counts(open_checkpoint(savepoint).state("t").to_pandas()) == want_t
    # batch 4 ran but Spark did not commit it (as after a crash): the state is batch 3's
    os.remove(tmp_path / "query" / "commits" / "4")
    view = open_checkpoint(checkpoint)
    assert (view.info.batch, view.info.committed_batch) == (3, 3)
    assert counts(view.state("c").to_pandas()) == as_dicts(frame.iloc[:2400])[0]


def test_a_short_apply_in_pandas_run_has_state_to_show(spark, tmp_path):
    """One batch, no snapshot yet: every change is carried in Spark's state store.  The CLI
    said there was no state at all."""
    frame = write_inputs(str(tmp_path / "in"), 0, 1)
    checkpoint = str(tmp_path / "query")
    run_until_done(spark, "apply_in_pandas_with_state", RunningCount(), str(tmp_path / "in"),
                   checkpoint, Outputs())
    assert "carried" in cli("checkpoints", "list", checkpoint)
    assert "batch 0 (the query's last committed batch)" in cli("checkpoints", "inspect", checkpoint)
    report = json.loads(cli("checkpoints", "inspect", checkpoint, "--count", "--json"))
    assert {s["name"]: s["keys"] for s in report["states"]} == {"c": 40, "t": 40}
    assert counts(open_checkpoint(checkpoint).state("c").to_pandas()) == as_dicts(frame)[0]


def test_transform_with_state_reads_the_last_committed_batch(spark, tmp_path):
    """After a crash between statekit's commit of a batch and Spark's, statekit holds a version
    of a batch Spark will run again: the tools show the committed one (they showed the other)."""
    frame = write_inputs(str(tmp_path / "in"), 0, 3)
    checkpoint = str(tmp_path / "query")
    run_until_done(spark, "transform_with_state", RunningCount(), str(tmp_path / "in"),
                   checkpoint, Outputs())
    os.remove(tmp_path / "query" / "commits" / "2")
    view = open_checkpoint(checkpoint)
    assert (view.info.batch, view.info.committed_batch) == (1, 1)
    assert counts(view.state("c").to_pandas()) == as_dicts(frame.iloc[:1200])[0]
    assert "batch 1 (the query's last committed batch)" in cli("checkpoints", "inspect", checkpoint)
    df = spark.read.format("statekit").option("state", "t").load(checkpoint)
    assert counts(df.toPandas()) == as_dicts(frame.iloc[:1200])[1]


def test_spark_reader_on_s3_checkpoints(spark, tmp_path, s3_server, s3_url):
    options = s3_server.storage_options()
    job = write_job(f"{s3_url}/ck", "rocksdb", True, str(tmp_path / "work"), options)
    df = (spark.read.format("statekit").option("state", "bymod").option("keyGroupSplits", 2)
          .option("storageOptions", json.dumps(options)).load(job.path))
    assert df.rdd.getNumPartitions() == 4  # two statekit partitions, two key-group ranges each
    frame = df.toPandas()
    assert as_model(frame, "map") == model()["bymod"]
    seen = (spark.read.format("statekit").option("state", "seen")
            .option("storageOptions", json.dumps(options)).load(job.chk(1)).toPandas())
    assert as_model(seen, "list") == model(1)["seen"]
