"""The tools around restore on checkpoints a restore refuses or that hold hostile names: the
inspection path and ``savepoint convert`` refuse what a restore refuses, with the same typed
error; the CLI shows names as they are and interprets nothing; ``export`` never writes into the
checkpoint it reads; odd directory names, many partition directories and a tight address-space
limit are handled."""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from statekit.backends.structure import reusing_native_dbs
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.cli import main
from statekit.errors import ChecksumMismatchError, ConfigError, CorruptCheckpointError
from statekit.inspection import (
    catalog,
    collect_garbage,
    convert_savepoint,
    export_state,
    list_checkpoints,
    open_checkpoint,
    verify,
)
from statekit.serde.keygroups import key_group_for_bytes
from statekit.serde.msgpack import packb
from statekit.serde.types import Types
from statekit.state.descriptors import ValueStateDescriptor
from statekit.testing.cluster import KeyedCluster
from tests.checkpoint.forge import (
    KEYS,
    MAXP,
    backend_factory,
    expected_rows,
    inspect_state,
    restore_and_read,
    rewrite_metadata,
    write_job,
)

ROOT = Path(__file__).resolve().parents[2]
WRITERS = ["hashmap", "rocksdb"]


def run(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.output


def _crossed(body):
    first, second = body["tasks"]["p0"], body["tasks"]["p1"]
    first["key_group_range"], second["key_group_range"] = (second["key_group_range"],
                                                           first["key_group_range"])


def _shifted(body):
    """The boundary between the two tasks moved down by one key group that holds keys."""
    last = max(g for g in (key_group_for_bytes(packb(k), MAXP) for k in KEYS) if g < 64)
    body["tasks"]["p0"]["key_group_range"] = [0, last - 1]
    body["tasks"]["p1"]["key_group_range"] = [last, 127]


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("change", [_crossed, _shifted])
def test_inspection_and_convert_refuse_what_restore_refuses(tmp_path, writer, change):
    """With crossed or shifted key groups, RocksDB checkpoints read as 0 rows and converted into
    savepoints that restored with every key's state gone (heap: 240 of 500 keys wrong)."""
    job = write_job(writer, str(tmp_path / "ck"))
    rewrite_metadata(f"{job}/chk-2/_metadata", change)
    chk = f"{job}/chk-2"
    with pytest.raises(CorruptCheckpointError) as restored:
        restore_and_read(writer, chk)
    # keys outside their task's key groups; heap parts record their own key groups, so there
    # the metadata check finds the parts' labels outside the task's range first
    message = r"outside the key groups|groups\[\d+\]: \d+ is outside"
    assert re.search(message, str(restored.value))
    with pytest.raises(type(restored.value), match=message):
        inspect_state(chk)
    try:
        view = open_checkpoint(chk)
    except CorruptCheckpointError as exc:
        assert re.search(message, str(exc))
    else:
        with pytest.raises(type(restored.value), match=message):  # the job's operators, in turn
            for op in view.operators:
                convert_savepoint(view, str(tmp_path / "sp"), operator=op)
        assert len(list((tmp_path / "sp").glob("*/_metadata"))) < len(view.operators)
    result = CliRunner().invoke(main, ["state", "export", chk, "--state", "count", "--to",
                                       str(tmp_path / "out.jsonl"), "--format", "jsonl",
                                       "--operator", "p0"])
    assert result.exit_code == 1 and "damaged checkpoint" in result.output


@pytest.mark.parametrize("stamp", [-(2**63), 2**63 - 1, 10**18])
def test_a_commit_time_no_date_can_hold_shows_as_unknown(tmp_path, stamp):
    """A restore ignores the commit time; the tools failed with ``ValueError: year -292275055 is
    out of range`` on such a checkpoint instead of showing the state it holds."""
    job = write_job("hashmap", str(tmp_path / "ck"))
    chk = f"{job}/chk-2"
    rewrite_metadata(f"{chk}/_metadata", lambda body: body.__setitem__("timestamp", stamp))
    assert [c.timestamp for c in list_checkpoints(job) if c.id == 2] == [None]
    assert inspect_state(chk) == expected_rows(2)
    convert_savepoint(open_checkpoint(chk), str(tmp_path / "sp"), operator="p0")
    assert "2 checkpoint(s)" in run("checkpoints", "list", job)
    assert "count" in run("checkpoints", "inspect", chk)


def test_export_and_convert_never_write_inside_the_checkpoint(tmp_path):
    """``export --to`` the checkpoint's own ``_metadata`` overwrote it."""
    job = write_job("hashmap", str(tmp_path / "ck"))
    chk = f"{job}/chk-2"
    before = Path(chk, "_metadata").read_bytes()
    for target in (f"{chk}/_metadata", f"{job}/shared/out.parquet", f"file://{chk}/x.csv"):
        with pytest.raises(ConfigError, match="inside the checkpoint directory"):
            export_state(chk, "count", target, fmt="csv")
    out = run("state", "export", chk, "--state", "count", "--operator", "p0", "--to",
              f"{chk}/_metadata", code=2)  # wrong usage
    assert "inside the checkpoint directory" in out
    with pytest.raises(ConfigError, match="inside the checkpoint directory"):
        convert_savepoint(open_checkpoint(chk), job, operator="p0")
    assert Path(chk, "_metadata").read_bytes() == before
    assert restore_and_read("hashmap", chk) and verify(job).ok
    export_state(chk, "count", str(tmp_path / "count.csv"), fmt="csv", operator="p0")  # fine


EVIL = "n\x1b[2J\x1b]8;;http://evil/\x07[link=http://evil/]click[/link]:smile:\u202e\r"
#: a directory name (no ``/``) with terminal escapes and markup
EVIL_DIR = "job\x1b[2J\x1b]8;;x\x07[bold red]loud[/bold red]\u202e\r"


def test_the_cli_shows_names_escaped_and_interprets_no_markup(tmp_path):
    """State and directory names were printed raw (terminal escapes) and ``inspect`` interpreted
    rich markup in them, links included."""
    storage = FileSystemCheckpointStorage(str(tmp_path / "ck"), file_state_size_threshold=64)
    cluster = KeyedCluster(backend_factory("hashmap"), storage, 2, 128)
    cluster.access = storage.create_access(EVIL_DIR)  # the job directory's name
    descriptor = ValueStateDescriptor(EVIL, Types.LONG())
    try:
        for key in range(20):
            cluster.state(key, descriptor).update(key)
        cluster.checkpoint()
    finally:
        cluster.close()
    job = cluster.access.location
    Path(job, "chk-5").mkdir()
    Path(job, "chk-5", "p0-count-0123456789ab").write_bytes(b"x")  # garbage under an evil path
    outputs = [run("checkpoints", "list", str(tmp_path / "ck")),
               run("checkpoints", "inspect", job), run("checkpoints", "gc", job),
               run("checkpoints", "verify", f"{job}/chk-1")]
    Path(job, "chk-1", "_metadata").write_bytes(b"broken")
    outputs.append(run("checkpoints", "verify", job, code=1))
    for text in outputs:
        assert not any(c in text for c in "\x1b\x07\u202e\r"), text
    assert all("\\x1b" in outputs[n] for n in (0, 1, 2, 4))  # shown escaped
    inspected = outputs[1]
    assert "[link=http://evil/]click[/link]:smile:" in inspected
    data = json.loads(run("checkpoints", "list", str(tmp_path / "ck"), "--json"))
    assert data[0]["job"] == EVIL_DIR  # JSON keeps the name exactly (escaped by JSON)
    assert "[bold red]loud[/bold red]" in outputs[0]


def test_directories_named_with_double_colons_are_directories(tmp_path):
    """A directory named with ``::`` broke list / verify / gc untyped (fsspec read the name as a
    chain of file systems)."""
    root = tmp_path / "we::ird"
    job = write_job("hashmap", str(root / "a::b"))
    Path(job, "chk-9").mkdir()
    Path(job, "chk-9", "p0-count-0123456789ab").write_bytes(b"x")
    assert {i.id for i in list_checkpoints(str(root)) if i.status == "retained"} == {1, 2}
    assert verify(str(root)).ok
    assert [posixpath.basename(g.path) for g in collect_garbage(str(root), delete=True).items] == [
        "p0-count-0123456789ab"]
    assert inspect_state(f"{job}/chk-2") == expected_rows(2)
    assert run("checkpoints", "verify", str(root)).startswith("OK")


def test_listing_is_linear_in_partition_directories(tmp_path, monkeypatch):
    """Without an operator manifest, each ``p<n>`` directory was compared with every other one
    (2,000 of them took 20 s); the listing now does a bounded number of path operations per
    directory (timings: benchmarks/test_inspection_bench.py)."""
    count = 300
    for n in range(count):
        Path(tmp_path, "query", "op", f"p{n}", "chk-1").mkdir(parents=True)
        Path(tmp_path, "query", "op", f"p{n}", "chk-1", "p0-count-0123456789ab").write_bytes(b"x")
    calls = [0]

    class Counting:
        def __getattr__(self, name):
            target = getattr(posixpath, name)

            def counted(*args, **kwargs):
                calls[0] += 1
                return target(*args, **kwargs)

            return counted

    monkeypatch.setattr(catalog, "posixpath", Counting())
    listed = list_checkpoints(str(tmp_path))
    assert len(listed) == count and all(i.partition is not None for i in listed)
    assert calls[0] < 20 * count


def test_inspecting_rocksdb_under_an_address_space_limit_never_aborts(tmp_path):
    """Opening a RocksDB checkpoint started up to 16 threads per column family to open its
    files; with little address space left one failed thread start aborted the process (SIGABRT,
    ~5 % of inspections of a healthy checkpoint under a 1 GiB limit, every one here)."""
    from tests.inspection.states import write_job as write_states_job

    job = write_states_job(str(tmp_path / "ck"), "rocksdb", False, str(tmp_path / "work"))
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "tests.inspection.limited_reader", job.path,
                               "200"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout)["count"] == 57


def test_gc_goes_on_past_a_planted_link(tmp_path):
    """One planted symbolic link aborted every ``gc --delete`` part-way."""
    job = write_job("hashmap", str(tmp_path / "ck"))
    outside = tmp_path / "outside"
    outside.write_text("keep")
    Path(job, "chk-9").mkdir()  # an incomplete checkpoint: garbage, and a link listed first
    os.symlink(outside, f"{job}/chk-9/p0-count-0123456789ab")
    Path(job, "chk-9", "p1-count-0123456789ab").write_bytes(b"x")
    out = run("checkpoints", "gc", job, "--delete")
    assert "1 file(s) deleted" in out and outside.read_text() == "keep"
    assert not Path(job, "chk-9", "p1-count-0123456789ab").exists()
    shutil.rmtree(tmp_path / "ck")


def test_a_reused_rocksdb_download_is_never_stale(tmp_path):
    """Inside ``reusing_native_dbs`` each partition of a RocksDB checkpoint is downloaded once for
    all its states; a file changed meanwhile is read (and refused) anew, and nothing is left
    behind when the block ends."""
    job = write_job("rocksdb", str(tmp_path / "ck"))
    view = open_checkpoint(f"{job}/chk-2")
    before = set(os.listdir(tempfile.gettempdir()))
    with reusing_native_dbs():
        assert sum(s.count() for s in view.states()) == 4 * len(KEYS)
        sst = next(p for p in Path(job, "chk-2").iterdir() if p.name.startswith("p0-") and ".sst" in p.name)
        data = bytearray(sst.read_bytes())
        data[len(data) // 2] ^= 0xFF
        sst.write_bytes(bytes(data))
        with pytest.raises(ChecksumMismatchError):
            view.state("count", "p0").count()
        assert view.state("count", "p1").count() > 0
    assert {n for n in set(os.listdir(tempfile.gettempdir())) - before
            if n.startswith("statekit-inspect")} == set()
