"""Operator state in inspection: ``inspect`` lists it (kind operator-list, operator-union-list or
broadcast), the API and ``export`` read it as rows per element or broadcast entry with the
subtask; from a retained checkpoint and a savepoint, both backends."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from statekit.checkpoint.config import ExternalizedCheckpointCleanup
from statekit.cli import main
from statekit.inspection import export_state, open_checkpoint
from tests.runtime.envs import env_for
from tests.runtime.test_operator_state import B1, CONFIG, E1, Buffering

FIRST = {"a": "3", "b": "2", "c": "4", "d": "5"}


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(params=["hashmap", "rocksdb"])
def job(request, tmp_path):
    env = env_for(tmp_path, request.param)
    env.enable_checkpointing(10)
    env.get_checkpoint_config().enable_externalized_checkpoints(
        ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION)
    stream = env.from_collection(E1).connect(env.from_collection(B1).broadcast(CONFIG))
    return stream.process(Buffering()).execute_and_collect(savepoint_dir=f"{tmp_path}/sp")


@pytest.mark.parametrize("which", ["savepoint", "checkpoint"])
def test_api_reads_operator_state_rows(job, which):
    path = job.savepoint_path if which == "savepoint" else job.latest_checkpoint
    view = open_checkpoint(path)
    states = {s.name: s for s in view.operator_states()}
    assert {n: s.kind for n, s in states.items()} == {
        "buffer": "operator-list", "config": "broadcast", "subtasks": "operator-union-list"}
    buffer = states["buffer"].to_pandas()
    assert list(buffer.columns) == ["subtask", "index", "value"]
    assert buffer.values.tolist() == [[0, 0, 10], [0, 1, 12], [0, 2, 14], [1, 0, 11], [1, 1, 13]]
    config = view.state("config").to_pandas()
    assert list(config.columns) == ["subtask", "user_key", "value"]
    assert {s: dict(zip(g.user_key, g.value, strict=True)) for s, g in config.groupby("subtask")
            } == {0: FIRST, 1: FIRST}
    assert view.state("subtasks").to_pandas().value.tolist() == ["s0:3", "s1:2"]


def test_cli_inspect_and_export(job, tmp_path):
    listed = json.loads(run("checkpoints", "inspect", job.savepoint_path, "--json"))
    kinds = {s["name"]: (s["operator"], s["kind"], s["keys"]) for s in listed["states"]}
    assert kinds["buffer"] == ("operator-state", "operator-list", 5)
    assert kinds["config"] == ("operator-state", "broadcast", 8)
    assert "operator-union-list" in run("checkpoints", "inspect", job.savepoint_path)
    target = str(tmp_path / "config.jsonl")
    run("state", "export", job.savepoint_path, "--state", "config", "--to", target)
    rows = pd.read_json(target, lines=True, dtype=False)
    assert sorted(map(tuple, rows.values.tolist())) == sorted(
        (s, k, v) for s in (0, 1) for k, v in FIRST.items())
    result = export_state(job.savepoint_path, "buffer", str(tmp_path / "b.parquet"))
    assert result.rows == 5
    assert pd.read_parquet(tmp_path / "b.parquet").value.tolist() == [10, 12, 14, 11, 13]


def test_converted_savepoint_keeps_operator_state(job, tmp_path):
    from statekit.inspection import convert_savepoint
    from tests.runtime.test_operator_state import B2, E2
    from tests.runtime.test_operator_state import FIRST as RESTORED_CONFIG

    converted = convert_savepoint(job.savepoint_path, str(tmp_path / "converted"),
                                  backend="rocksdb", max_parallelism=64)
    assert {s.name for s in open_checkpoint(converted).operator_states()} == {
        "buffer", "config", "subtasks"}
    env = env_for(tmp_path, "rocksdb", **{"execution.savepoint.path": converted,
                                          "pipeline.max-parallelism": 64})
    env.set_parallelism(3)
    out = (env.from_collection(E1 + E2).connect(env.from_collection(B1 + B2).broadcast(CONFIG))
           .process(Buffering()).execute_and_collect())
    union = ["s0:3", "s1:2"]
    assert sorted(out) == [(0, (True, [10, 12], union), RESTORED_CONFIG),
                           (1, (True, [14, 11], union), RESTORED_CONFIG),
                           (2, (True, [13], union), RESTORED_CONFIG)]


def test_spark_restores_refuse_operator_state_unless_converted_without(job, tmp_path):
    from statekit.errors import ConfigError
    from statekit.inspection import convert_savepoint
    from statekit.runtime.partition import external_sources

    with pytest.raises(ConfigError, match="keep_operator_state=False"):
        external_sources(job.savepoint_path, "op")
    keyed_only = convert_savepoint(job.savepoint_path, str(tmp_path / "keyed"),
                                   keep_operator_state=False)
    assert open_checkpoint(keyed_only).operator_states() == []
    assert len(external_sources(keyed_only, "op")) == 1
