"""The ``statekit`` commands: ``checkpoints list | inspect | verify | gc``, ``state export``,
``savepoint convert``.  Each is a thin layer over :mod:`statekit.inspection`."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from statekit.checkpoint.layout import METADATA
from statekit.cli import output
from statekit.errors import (
    CheckpointNotFoundError,
    ConfigError,
    CorruptCheckpointError,
    MissingFileError,
    StateError,
    StatekitError,
)

#: exit codes: 1 damaged state or a failed check, 2 wrong usage or nothing at the path
DAMAGED, NOT_FOUND = 1, 2


def _storage_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs (values parsed as JSON when they are JSON) as fsspec options."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--storage-option")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def common(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--json`` and ``--storage-option``, and statekit's typed errors as one line + exit code."""

    @click.option("--json", "as_json", is_flag=True, help="Machine output: one JSON document.")
    @click.option("--storage-option", "-o", "storage", multiple=True, metavar="KEY=VALUE",
                  help="fsspec option for the path (e.g. endpoint_url=http://...); repeatable.")
    @functools.wraps(func)
    def wrapper(*args: Any, storage: tuple[str, ...], **kwargs: Any) -> Any:
        try:
            return func(*args, storage_options=_storage_options(storage), **kwargs)
        except MissingFileError as exc:  # a file the metadata names is gone: damage
            state_file = not exc.path.rstrip("/").endswith(METADATA)
            output.error(f"damaged checkpoint: {exc}" if state_file else str(exc))
            sys.exit(DAMAGED if state_file else NOT_FOUND)
        except CheckpointNotFoundError as exc:
            output.error(str(exc))
            sys.exit(NOT_FOUND)
        except CorruptCheckpointError as exc:
            output.error(f"damaged checkpoint: {exc}")
            sys.exit(DAMAGED)
        except (StatekitError, ValueError) as exc:
            output.error(str(exc))
            # a bad option value or a state name that names no state: wrong usage (as a wrong
            # path), not damage
            usage = isinstance(exc, ConfigError) or type(exc) is StateError
            sys.exit(NOT_FOUND if usage else DAMAGED)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="statekit")
def main() -> None:
    """See and fix statekit state: checkpoints, savepoints and Spark query state.

    PATH is a local path or an fsspec URL (s3://bucket/...): a checkpoint directory root, a
    job directory, a chk-<n> directory, a savepoint, or a Spark query's checkpointLocation.
    """


def _open(path: str, **kwargs: Any) -> Any:
    """``open_checkpoint``, an applyInPandasWithState query's carried changes read through a
    local SparkSession started when one is needed (then only: it takes seconds)."""
    from statekit.inspection import open_checkpoint
    from statekit.inspection.views import register_carried_reader

    register_carried_reader(_read_carried)
    return open_checkpoint(path, **kwargs)


def _read_carried(query: Any, batch: int | None, options: dict[str, Any]) -> Any:
    from statekit.spark.committed import allow_local_session, read_carried

    allow_local_session()
    return read_carried(query, batch, options)


_SNAPSHOTS_ONLY = click.option(
    "--snapshots-only", is_flag=True,
    help="applyInPandasWithState: its snapshots alone (they lag), not Spark's carried changes.")


@main.group()
def checkpoints() -> None:
    """List, inspect, verify and clean up checkpoints."""


@main.group()
def state() -> None:
    """Read state out of a checkpoint."""


@main.group()
def savepoint() -> None:
    """Write savepoints from checkpoints."""


# --- checkpoints list ----------------------------------------------------------------------------


@checkpoints.command("list")
@click.argument("path")
@click.option("--partitions", is_flag=True, help="One row per Spark partition version.")
@common
def list_(path: str, as_json: bool, partitions: bool, storage_options: dict[str, Any]) -> None:
    """Checkpoints, savepoints and Spark versions under PATH."""
    from statekit.inspection import list_checkpoints

    infos = list_checkpoints(path, storage_options=storage_options)
    if as_json:
        output.emit_json([i.to_dict() for i in infos])
        return
    rows: dict[tuple[Any, ...], list[Any]] = {}
    for i in infos:
        spark = i.operator is not None and not partitions
        job = f"{i.query}/{i.operator}" if spark else i.job
        key = (job, i.batch if spark else i.id, i.kind, i.status if not spark else "")
        when = i.timestamp.strftime("%Y-%m-%d %H:%M:%S") if i.timestamp else None
        mode = ("changelog" if i.changelog else None if i.incremental is None
                else "incremental" if i.incremental else "full")
        row = rows.get(key)
        if row is None:
            rows[key] = [job, i.batch if spark else i.id, i.kind, i.status, when, i.backend, mode,
                         i.size, i.files, i.partitions or 0]
            continue
        row[3] = row[3] if row[3] == i.status else "mixed"
        row[6] = row[6] if row[6] == mode else "mixed"
        row[4] = max(filter(None, (row[4], when)), default=None)
        row[7], row[8] = (row[7] or 0) + (i.size or 0), (row[8] or 0) + (i.files or 0)
        row[9] += i.partitions or 0
    output.table(f"{_counted(infos, rows, partitions)} under {path}",
                 ["JOB", "ID", "KIND", "STATUS", "TIME (UTC)", "BACKEND", "MODE", "SIZE", "FILES",
                  "PARTS"],
                 [[*r[:7], output.human_bytes(r[7]), *r[8:]] for r in rows.values()])


def _counted(infos: list[Any], rows: dict[tuple[Any, ...], list[Any]], partitions: bool) -> str:
    """What the table's rows are: checkpoints and savepoints, and Spark batches (each a row for
    all its partition versions, unless ``--partitions``)."""
    versions = sum(1 for i in infos if i.operator is not None)
    if partitions or not versions:
        return f"{len(infos)} checkpoint(s)"
    batches = len({(i.query, i.operator, i.batch) for i in infos if i.operator is not None})
    others = len(rows) - batches
    counted = f"{batches} Spark batch(es) ({versions} partition version(s))"
    return f"{others} checkpoint(s), {counted}" if others else counted


# --- checkpoints inspect -------------------------------------------------------------------------


@checkpoints.command()
@click.argument("path")
@click.option("--batch", type=int, help="Spark: each partition's version of this batch.")
@click.option("--checkpoint-id", type=int, help="A job directory's checkpoint (default: newest).")
@click.option("--internal", is_flag=True, help="Also show statekit's internal states.")
@click.option("--count", is_flag=True, help="Count keys exactly (reads every state).")
@_SNAPSHOTS_ONLY
@common
def inspect(path: str, as_json: bool, batch: int | None, checkpoint_id: int | None,
            internal: bool, count: bool, snapshots_only: bool,
            storage_options: dict[str, Any]) -> None:
    """Operators, partitions, key-group ranges and states of one checkpoint (a Spark query:
    as of its last committed batch, unless --batch)."""
    view = _open(path, batch=batch, checkpoint_id=checkpoint_id, storage_options=storage_options,
                 snapshots_only=snapshots_only)
    states: list[Any] = [*view.states(include_internal=internal), *view.operator_states()]
    counted: dict[tuple[str, str], int] = {}
    if count:
        from statekit.backends.structure import reusing_native_dbs

        with reusing_native_dbs():  # a RocksDB partition downloaded once for all its states
            for s in states:
                with output.progress(f"counting {s.name}", s.bytes) as advance:
                    counted[(s.operator, s.name)] = s.count(progress=advance)
    if as_json:
        output.emit_json({
            "checkpoint": view.info.to_dict(),
            "partitions": [p.to_dict() for p in view.partitions],
            "states": [{"operator": s.operator, "name": s.name, "kind": s.kind,
                        "value_type": s.value_type, "user_key_type": s.user_key_type,
                        "ttl": s.ttl, "bytes": s.bytes,
                        "keys": counted.get((s.operator, s.name), s.keys)} for s in states]})
        return
    info = view.info
    output.line(f"{info.kind} {info.path}")
    when = f"  {info.timestamp:%Y-%m-%d %H:%M:%S} UTC" if info.timestamp else ""
    batch_text = f"  batch {info.batch}" if info.batch is not None else ""
    if info.committed_batch is not None:
        batch_text += (" (the query's last committed batch)" if info.batch == info.committed_batch
                       else f" (the query's last committed batch: {info.committed_batch})")
    if info.status == "committed":
        output.line("  the snapshots with the changes carried in Spark's state store")
    output.line(f"  id {info.id}{batch_text}  backend {info.backend}  max parallelism "
                f"{info.max_parallelism}  {'incremental' if info.incremental else 'full'}  "
                f"{output.human_bytes(info.size)} in {info.files} file(s){when}")
    shown = {(s.operator, s.name) for s in states}
    output.table("partitions", ["OPERATOR", "PARTITION", "KEY GROUPS", "VERSION", "FORMAT",
                                "STATE", "KIND", "TYPE", "TTL", "ENCODING", "KEYS", "BYTES"],
                 [[p.operator, p.name, f"{p.key_groups[0]}-{p.key_groups[1]}", p.version,
                   p.format.removeprefix("statekit-"), st.name, st.kind,
                   _type(st.value_type, st.user_key_type), "yes" if st.ttl else "", st.encoding,
                   st.keys, output.human_bytes(st.bytes)]
                  for p in view.partitions for st in p.states if (p.operator, st.name) in shown])
    output.table("states", ["OPERATOR", "STATE", "KIND", "TYPE", "TTL", "PARTS", "KEYS", "BYTES"],
                 [[s.operator, s.name, s.kind, _type(s.value_type, s.user_key_type),
                   "yes" if s.ttl else "", len(s.partitions),
                   counted.get((s.operator, s.name), s.keys), output.human_bytes(s.bytes)]
                  for s in states])


def _type(value: str, user_key: str | None) -> str:
    return value if user_key is None else f"{user_key} -> {value}"


# --- checkpoints verify --------------------------------------------------------------------------


@checkpoints.command()
@click.argument("path")
@click.option("--deep", is_flag=True, help="Also decode every entry of every state.")
@click.option("--latest", is_flag=True, help="Only each job's newest complete checkpoint.")
@common
def verify(path: str, as_json: bool, deep: bool, latest: bool,
           storage_options: dict[str, Any]) -> None:
    """Check every file the checkpoints at PATH reference: present, size, CRC-32.

    Exit code 0 when everything is intact, 1 when anything is damaged or missing, 2 when PATH
    holds no checkpoint to check.
    """
    from statekit.inspection import verify as run

    with output.progress("verifying", None) as advance:
        report = run(path, storage_options=storage_options, deep=deep, latest_only=latest,
                     progress=advance)
    if as_json:
        output.emit_json(report.to_dict())
    else:
        for problem in report.problems:
            output.error(f"{problem.path}: {problem.error}: {problem.message} "
                         f"(in {problem.checkpoint.rsplit('/', 1)[-1]})")
        verdict = "OK" if report.ok else "DAMAGED" if report.problems else "NOTHING TO CHECK"
        output.line(f"{verdict}: {len(report.checkpoints)} checkpoint(s), {report.files} file(s), "
                    f"{output.human_bytes(report.bytes)} checked, {len(report.problems)} problem(s)")
    if not report.ok:
        sys.exit(DAMAGED if report.problems else NOT_FOUND)


# --- checkpoints gc ------------------------------------------------------------------------------


@checkpoints.command()
@click.argument("path")
@click.option("--delete", is_flag=True,
              help="Delete what is found (default: a dry run). Only for stopped jobs.")
@common
def gc(path: str, as_json: bool, delete: bool, storage_options: dict[str, Any]) -> None:
    """Files of checkpoints that never completed and shared files nothing references.

    Only files named as statekit names them are garbage; other files (yours, another job's) and
    links are never deleted."""
    from statekit.inspection import collect_garbage

    report = collect_garbage(path, delete=delete, storage_options=storage_options)
    if as_json:
        output.emit_json(report.to_dict())
        return
    output.table(None, ["REASON", "PATH"], [[g.reason, g.path] for g in report.items])
    for left in report.skipped:
        output.error(f"left alone: {left.path}: {left.reason}")
    if delete:
        output.line(f"{len(report.items) - len(report.skipped)} file(s) deleted"
                    + (f", {len(report.skipped)} left alone" if report.skipped else ""))
    else:
        output.line(f"{len(report.items)} file(s) would delete (dry run; --delete deletes)")


# --- state export --------------------------------------------------------------------------------


_TYPES = click.Choice(["auto", "json", "string", "int64", "int32", "double", "binary", "bool"])


#: the export format a target's suffix names, when --format is not given
_SUFFIX_FORMATS = {"csv": "csv", "jsonl": "jsonl", "json": "jsonl", "ndjson": "jsonl",
                   "parquet": "parquet", "pq": "parquet"}


@state.command()
@click.argument("path")
@click.option("--state", "name", help="The state to export.")
@click.option("--timers", is_flag=True,
              help="Export the timers instead (key, timestamp, domain), both time domains.")
@click.option("--format", "fmt", type=click.Choice(["parquet", "csv", "jsonl"]),
              help="Default: from the --to file's suffix (.csv, .jsonl/.json/.ndjson), else "
                   "parquet.")
@click.option("--to", "target", required=True, help="Output file (a path or fsspec URL).")
@click.option("--operator", help="The operator, when several hold a state of that name.")
@click.option("--batch", type=int, help="Spark: each partition's version of this batch.")
@click.option("--key-type", type=_TYPES, default="auto", show_default=True,
              help="Key column type (untyped keys are inferred; json: JSON text).")
@click.option("--value-type", type=_TYPES, default="auto", show_default=True)
@click.option("--compression", default="snappy", show_default=True, help="Parquet codec.")
@click.option("--target-option", "target_opts", multiple=True, metavar="KEY=VALUE",
              help="fsspec option for the output URL; repeatable.")
@_SNAPSHOTS_ONLY
@common
def export(path: str, as_json: bool, name: str | None, timers: bool, fmt: str | None, target: str,
           operator: str | None, batch: int | None, key_type: str, value_type: str,
           compression: str, target_opts: tuple[str, ...], snapshots_only: bool,
           storage_options: dict[str, Any]) -> None:
    """Export one state (or the timers) to Parquet, CSV or JSON Lines (streamed)."""
    from statekit.inspection import export_state

    if (name is None) == (not timers):
        raise click.UsageError("give --state NAME or --timers (one of them)")
    fmt = fmt or _SUFFIX_FORMATS.get(target.rsplit(".", 1)[-1].lower(), "parquet")
    view = _open(path, batch=batch, storage_options=storage_options, snapshots_only=snapshots_only)
    chosen = view.timers(operator) if timers else view.state(str(name), operator)
    with output.progress(f"exporting {chosen.name}", chosen.bytes) as advance:
        result = export_state(view, name, target, fmt=fmt, operator=operator,
                              target_options=_storage_options(target_opts) or storage_options,
                              key_type=key_type, value_type=value_type,
                              compression=compression, progress=advance, timers=timers)
    if as_json:
        output.emit_json({**result.to_dict(), "batch": view.info.batch})
    else:
        what = "the timers" if timers else f"state {name!r}"
        as_of = "" if view.info.batch is None else f", as of batch {view.info.batch}"
        output.line(f"exported {result.rows} row(s) of {what} to {target} ({fmt}{as_of})")


# --- savepoint convert ---------------------------------------------------------------------------


@savepoint.command()
@click.argument("path")
@click.option("--to", "target", required=True, help="Directory the savepoint is created in.")
@click.option("--backend", help="Backend meant to restore it (hashmap, rocksdb, ...).")
@click.option("--max-parallelism", type=int, help="Key groups of the savepoint (default: unchanged).")
@click.option("--operator", help="The operator to convert, when there are several.")
@click.option("--batch", type=int, help="Spark: each partition's version of this batch.")
@click.option("--internal", is_flag=True, help="Keep statekit's internal states.")
@click.option("--target-option", "target_opts", multiple=True, metavar="KEY=VALUE",
              help="fsspec option for the target; repeatable.")
@_SNAPSHOTS_ONLY
@common
def convert(path: str, as_json: bool, target: str, backend: str | None,
            max_parallelism: int | None, operator: str | None, batch: int | None, internal: bool,
            target_opts: tuple[str, ...], snapshots_only: bool,
            storage_options: dict[str, Any]) -> None:
    """Write a self-contained savepoint of a checkpoint: restorable by any backend, at any
    parallelism, with --max-parallelism key groups."""
    from statekit.inspection import convert_savepoint

    view = _open(path, batch=batch, storage_options=storage_options, snapshots_only=snapshots_only)
    with output.progress("converting", view.info.size) as advance:
        written = convert_savepoint(view, target, backend=backend, max_parallelism=max_parallelism,
                                    operator=operator, include_internal=internal,
                                    target_options=_storage_options(target_opts) or storage_options,
                                    progress=advance)
    if as_json:
        output.emit_json({"savepoint": written, "source": view.path, "batch": view.info.batch})
    else:
        as_of = "" if view.info.batch is None else f" (as of batch {view.info.batch})"
        output.line(f"savepoint written: {written}{as_of}")
