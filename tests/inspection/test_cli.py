"""Every ``statekit`` command on real checkpoints: tables and ``--json``, exit codes, exports read
back with pandas, a converted savepoint restored by the other backend at another parallelism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from statekit import KeyedProcessFunction, StreamExecutionEnvironment, Types, ValueStateDescriptor
from statekit.cli import main
from statekit.inspection import open_checkpoint
from tests.inspection.states import KEYS, REMOVED, as_model, model, write_job

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.output


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli")
    return {kind: write_job(str(base / "ck"), kind, True, str(base / "work"))
            for kind in ("hashmap", "rocksdb")}


def test_console_script_and_module_start(jobs):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-m", "statekit", "--help"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0 and "checkpoints" in done.stdout and "savepoint" in done.stdout
    script = Path(sys.executable).with_name("statekit")
    done = subprocess.run([str(script), "checkpoints", "verify", jobs["hashmap"].path],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("OK: 2 checkpoint(s)")
    assert done.stderr == ""  # no progress bar when stderr is not a terminal


def test_list_tables_and_json(jobs):
    root = jobs["hashmap"].root
    table = run("checkpoints", "list", root)
    assert jobs["hashmap"].job in table and jobs["rocksdb"].job in table and "incremental" in table
    listed = json.loads(run("checkpoints", "list", root, "--json"))
    assert {(i["job"], i["id"], i["backend"]) for i in listed} == {
        (jobs[k].job, n, k) for k in ("hashmap", "rocksdb") for n in (1, 2)}


def test_inspect_shows_partitions_and_states(jobs):
    text = run("checkpoints", "inspect", jobs["rocksdb"].path, "--count")
    assert "0-63" in text and "64-127" in text and "INT -> STRING" in text
    data = json.loads(run("checkpoints", "inspect", jobs["hashmap"].chk(2), "--json", "--count"))
    assert data["checkpoint"]["id"] == 2 and len(data["partitions"]) == 2
    keys = {s["name"]: s["keys"] for s in data["states"]}
    assert keys == dict.fromkeys(model(), len(KEYS) - len(REMOVED))


def test_a_missing_state_file_is_damage_a_missing_checkpoint_is_not_found(tmp_path):
    job = write_job(str(tmp_path / "ck"), "rocksdb", True, str(tmp_path / "work"))
    sst = sorted((tmp_path / "ck" / job.job / "shared").iterdir())[0]
    sst.unlink()
    for args in (("checkpoints", "inspect", job.path, "--count"),
                 ("state", "export", job.path, "--state", "count", "--to",
                  str(tmp_path / "out.csv")),
                 ("savepoint", "convert", job.path, "--to", str(tmp_path / "sp"))):
        out = run(*args, code=1)
        assert "damaged checkpoint" in out and sst.name in out
    assert "damaged" not in run("checkpoints", "inspect", str(tmp_path / "ck" / "nothing"),
                                code=2)


def test_verify_exit_codes_and_damaged_file(tmp_path):
    job = write_job(str(tmp_path / "ck"), "rocksdb", True, str(tmp_path / "work"))
    assert run("checkpoints", "verify", job.path).startswith("OK")
    sst = sorted((tmp_path / "ck" / job.job / "shared").iterdir())[0]
    sst.write_bytes(sst.read_bytes()[:-10])
    out = run("checkpoints", "verify", job.path, code=1)
    assert sst.name in out and "TruncatedCheckpointError" in out and "DAMAGED" in out
    report = json.loads(run("checkpoints", "verify", job.path, "--json", code=1))
    assert report["ok"] is False and any(p["path"] == str(sst) for p in report["problems"])


def test_wrong_path_is_one_clear_line(tmp_path):
    out = run("checkpoints", "inspect", str(tmp_path / "missing"), code=2)
    assert out.strip() == f"error: no such directory: {tmp_path / 'missing'}"
    assert "Traceback" not in run("checkpoints", "verify", str(tmp_path / "missing"), code=2)
    (tmp_path / "empty").mkdir()  # a directory without checkpoints: nothing there, as for list
    assert run("checkpoints", "verify", str(tmp_path / "empty"), code=2).startswith("NOTHING TO CHECK")
    run("checkpoints", "list", str(tmp_path / "empty"), code=2)
    (tmp_path / "file.txt").write_text("not a checkpoint")
    out = run("checkpoints", "inspect", str(tmp_path / "file.txt"), code=2)
    assert out.strip() == f"error: not a directory: {tmp_path / 'file.txt'}"


def test_a_state_name_that_names_no_state_is_wrong_usage(jobs, tmp_path):
    out = run("state", "export", jobs["hashmap"].path, "--state", "nosuch", "--to",
              str(tmp_path / "x.parquet"), code=2)
    assert "no such state" in out and "count" in out and "Traceback" not in out
    assert not (tmp_path / "x.parquet").exists()


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_export_reads_back_equal(jobs, tmp_path, fmt):
    expected = model()
    for name, kind in (("count", "value"), ("bymod", "map"), ("seen", "list"), ("last", "value")):
        target = str(tmp_path / f"{name}.{fmt}")
        run("state", "export", jobs["rocksdb"].path, "--state", name, "--format", fmt, "--to", target)
        frame = (pd.read_parquet(target) if fmt == "parquet" else pd.read_csv(target)
                 if fmt == "csv" else pd.read_json(target, lines=True))
        if fmt == "csv" and "user_key" in frame:
            frame["user_key"] = frame["user_key"].astype(int)
        assert as_model(frame, kind) == expected[name], (name, fmt)
        if name == "last" and fmt == "parquet":
            assert frame["ttl_timestamp"].notna().all()


@pytest.mark.parametrize(("suffix", "read"), [
    ("csv", pd.read_csv), ("jsonl", lambda p: pd.read_json(p, lines=True)),
    ("json", lambda p: pd.read_json(p, lines=True)), ("out", pd.read_parquet)])
def test_export_format_follows_the_target_suffix(jobs, tmp_path, suffix, read):
    target = str(tmp_path / f"count.{suffix}")
    out = run("state", "export", jobs["hashmap"].path, "--state", "count", "--to", target)
    assert as_model(read(target), "value") == model()["count"]
    assert f"({'parquet' if suffix == 'out' else 'csv' if suffix == 'csv' else 'jsonl'}" in out


def test_export_to_s3_with_progress_silent(jobs, s3_server, s3_url):
    options = [f"endpoint_url={s3_server.endpoint_url}", "key=statekit-test",
               "secret=statekit-test-secret"]
    target = f"{s3_url}/out/count.parquet"
    out = run("state", "export", jobs["hashmap"].path, "--state", "count", "--to", target,
              "--json", *(x for o in options for x in ("--target-option", o)))
    assert json.loads(out)["rows"] == len(KEYS) - len(REMOVED)
    frame = pd.read_parquet(target, storage_options=s3_server.storage_options())
    assert as_model(frame, "value") == model()["count"]


class Count(KeyedProcessFunction):
    def open(self, ctx):
        self.c = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value, ctx):
        c = (self.c.value() or 0) + value[1]
        self.c.update(c)
        yield ctx.get_current_key(), c


def _job(conf, items, parallelism, max_parallelism):
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(parallelism)
    env.set_max_parallelism(max_parallelism)
    return env.from_collection(items).key_by(lambda x: x[0]).process(Count())


def test_convert_restores_on_the_other_backend_at_another_parallelism(tmp_path):
    items = [(f"u{i % 37}", i) for i in range(600)]
    conf = {"state.backend.type": "hashmap", "state.backend.incremental": "true",
            "state.checkpoints.dir": str(tmp_path / "ck"), "execution.checkpointing.interval": "10 ms",
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION"}
    first = _job(conf, items[:400], 2, 128).execute_and_collect()
    before = open_checkpoint(first.latest_checkpoint).state("count").to_pandas()
    out = json.loads(run("savepoint", "convert", first.latest_checkpoint, "--to", str(tmp_path / "sp"),
                         "--backend", "rocksdb", "--max-parallelism", "64", "--json"))
    converted = open_checkpoint(out["savepoint"])
    assert converted.info.max_parallelism == 64 and converted.info.backend == "rocksdb"
    after = converted.state("count").to_pandas()
    assert dict(zip(after.key, after.value, strict=True)) == dict(zip(before.key, before.value,
                                                                      strict=True))
    offset = converted.metadata["source"]["offset"]
    resumed = _job({"state.backend.type": "rocksdb", "execution.savepoint.path": out["savepoint"]},
                   items, 3, 64).execute_and_collect()
    assert len(resumed) == len(items) - offset
    totals: dict[str, int] = {}
    for key, value in items:
        totals[key] = totals.get(key, 0) + value
    final = {}
    for key, c in list(first) + list(resumed):
        final[key] = c if key not in final or c > final[key] else final[key]
    assert final == totals


def test_gc_dry_run_then_delete(tmp_path):
    job = write_job(str(tmp_path / "ck"), "hashmap", True, str(tmp_path / "work"))
    orphan = tmp_path / "ck" / job.job / "shared" / "p0-count-base-0123456789ab"  # as statekit names
    orphan.write_bytes(b"z")
    out = run("checkpoints", "gc", job.path)
    assert "unreferenced-shared" in out and "dry run" in out and orphan.exists()
    report = json.loads(run("checkpoints", "gc", job.path, "--delete", "--json"))
    assert report["deleted"] and not orphan.exists()
    assert run("checkpoints", "verify", job.path).startswith("OK")


def test_a_failed_export_or_convert_leaves_no_partial_output(tmp_path, monkeypatch):
    """An export that fails leaves an existing target as it was (never an empty or truncated
    file that reads as a smaller state), and a convert that fails leaves no partial savepoint;
    mistakes in the output are usage errors (exit code 2), not tracebacks."""
    job = write_job(str(tmp_path / "ck"), "rocksdb", True, str(tmp_path / "work"))
    good = tmp_path / "out" / "count.csv"
    run("state", "export", job.path, "--state", "count", "--to", str(good))
    before = good.read_bytes()
    for to, words in ((str(good.parent), "is a directory"), ("", "an output path is needed"),
                      (str(good / "x.csv"), "cannot write")):
        assert words in run("state", "export", job.path, "--state", "count", "--to", to, code=2)
    assert "unknown or unavailable codec" in run(
        "state", "export", job.path, "--state", "count", "--to", str(tmp_path / "c.parquet"),
        "--compression", "nosuch", code=2)
    for args, words in ((["--to", ""], "an output directory is needed"),
                        (["--to", str(tmp_path / "sp"), "--operator", "nope"], "no operator"),
                        (["--to", str(tmp_path / "sp"), "--max-parallelism", "0"], "must be in")):
        assert words in run("savepoint", "convert", job.path, *args, code=2)
    assert good.read_bytes() == before
    sst = sorted((tmp_path / "ck" / job.job / "shared").iterdir())[0]
    sst.write_bytes(sst.read_bytes()[:-100] + bytes(100))  # damaged: the export fails midway
    assert "damaged checkpoint" in run("state", "export", job.path, "--state", "count", "--to",
                                       str(good), code=1)
    assert good.read_bytes() == before and sorted(good.parent.iterdir()) == [good]
    assert "damaged checkpoint" in run("savepoint", "convert", job.path, "--to",
                                       str(tmp_path / "sp"), code=1)
    assert not (tmp_path / "sp").exists() or not any((tmp_path / "sp").iterdir())
    # a convert that fails after writing some states (the last one's file damaged; every state
    # written to a file of its own, none inline in the savepoint's metadata)
    monkeypatch.setattr("statekit.inspection.convert.INLINE_THRESHOLD", 0)
    heap = write_job(str(tmp_path / "heap"), "hashmap", True, str(tmp_path / "work2"))
    last = sorted((tmp_path / "heap" / heap.job / "shared").glob("keyed-process-1-seen-base-*"))[0]
    data = bytearray(last.read_bytes())
    data[len(data) // 2] ^= 0xFF
    last.write_bytes(bytes(data))
    assert "damaged checkpoint" in run("savepoint", "convert", heap.path, "--to",
                                       str(tmp_path / "sp2"), code=1)
    assert not (tmp_path / "sp2").exists() or not any((tmp_path / "sp2").iterdir())


def test_a_selector_that_cannot_apply_is_refused(jobs, tmp_path):
    """--batch picks a Spark query's state and --checkpoint-id a job's checkpoint: given where
    it cannot apply, it is refused (it was ignored, showing another checkpoint than asked)."""
    path = jobs["hashmap"].path
    out = run("checkpoints", "inspect", path, "--batch", "2", code=2)
    assert "--batch cannot apply" in out and "--checkpoint-id" in out
    assert "--batch cannot apply" in run("state", "export", path, "--state", "count", "--batch",
                                         "2", "--to", str(tmp_path / "c.csv"), code=2)
    assert not (tmp_path / "c.csv").exists()
    chk = jobs["hashmap"].chk(2)
    assert "--checkpoint-id cannot apply" in run("checkpoints", "inspect", chk,
                                                 "--checkpoint-id", "1", code=2)
    run("checkpoints", "inspect", path, "--checkpoint-id", "2")  # where it applies
