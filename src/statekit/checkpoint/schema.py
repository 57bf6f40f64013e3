"""The schema pass over a ``_metadata`` body, run before anything uses it.

A body that decodes is still untrusted: a field of the wrong type or out of range used to reach
``int()``, indexing and allocation as a plain ``TypeError``, a minutes-long conversion or a
gigabyte buffer.  Every field statekit reads is checked here (strict integers, bounded sizes,
offsets and lengths inside their file's recorded size, key-group ranges inside max parallelism and
disjoint across tasks, the checkpoint id matching its directory), and any violation is a
:class:`CorruptCheckpointError`, which the restart strategy and the fall-back to an older
checkpoint handle.  The reader checks each file's real size against the recorded one before it
reads, so nothing is sized by an unchecked field.

Task handles of a backend's snapshot format are checked by the function the backend registers
for it (:func:`register_format`); handles of unknown formats get the generic checks.
"""

from __future__ import annotations

import itertools
import reprlib
from collections.abc import Callable
from typing import Any

from statekit.checkpoint.blobstore.base import check_key
from statekit.checkpoint.handles import walk_handles
from statekit.errors import CorruptCheckpointError
from statekit.serde.keygroups import (
    UPPER_BOUND_MAX_PARALLELISM,
    KeyGroupRange,
    key_group_range_for_operator,
)
from statekit.serde.types import serializer_from_config
from statekit.state.descriptors import state_name_problem

#: the largest file or chunk a handle may record (256 TiB)
MAX_BLOB_SIZE = 1 << 48
_INT64 = 1 << 63
_U32 = 1 << 32
#: layouts whose body must hold task handles
_WITH_TASKS = ("checkpoint", "savepoint")


class Invalid(CorruptCheckpointError):
    """A field of a ``_metadata`` body has the wrong type or is out of range."""


def fail(path: str, why: str) -> Invalid:
    return Invalid(f"{path}: {why}")


def integer(value: Any, path: str, low: int = -_INT64, high: int = _INT64 - 1) -> int:
    """``value`` when it is an ``int`` (not a bool, not a Decimal) within ``low..high``."""
    if type(value) is not int:
        raise fail(path, f"expected an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise fail(path, f"{value} is outside {low}..{high}")
    return value


def text(value: Any, path: str) -> str:
    if type(value) is not str:
        raise fail(path, f"expected a string, got {type(value).__name__}")
    return value


def mapping(value: Any, path: str) -> dict[Any, Any]:
    if type(value) is not dict:
        raise fail(path, f"expected a map, got {type(value).__name__}")
    return value


def sequence(value: Any, path: str) -> list[Any]:
    if type(value) not in (list, tuple):
        raise fail(path, f"expected a list, got {type(value).__name__}")
    return value


def boolean(value: Any, path: str) -> bool:
    if type(value) is not bool:
        raise fail(path, f"expected true or false, got {type(value).__name__}")
    return value


def state_name(value: Any, path: str) -> str:
    problem = state_name_problem(value)
    if problem is not None:
        raise fail(path, problem)
    return value


def handle(value: Any, path: str) -> int:
    """Check an inline or file handle; its recorded size."""
    blob = mapping(value, path)
    size = integer(blob.get("size"), f"{path}.size", 0, MAX_BLOB_SIZE)
    integer(blob.get("crc"), f"{path}.crc", 0, _U32 - 1)
    kind = blob.get("type")
    if kind == "inline":
        data = blob.get("data")
        if type(data) is not bytes or len(data) != size:
            raise fail(f"{path}.data", f"expected {size} bytes")
    elif kind == "file":
        check_key(text(blob.get("path"), f"{path}.path"))
    else:
        raise fail(f"{path}.type", f"unknown state handle type {kind!r}")
    return size


def file_name(value: Any, path: str) -> str:
    """A plain file name: not empty, no directories, not hidden."""
    name = text(value, path)
    if not name or "/" in name or name.startswith(".") or "\x00" in name:
        raise fail(path, f"unsafe file name {name!r}")
    return name


def files(value: Any, path: str) -> dict[str, Any]:
    """Check a mapping of plain file names (no directories, not hidden) to handles."""
    found = mapping(value, path)
    for name, blob in found.items():
        handle(blob, f"{path}.{file_name(name, path)}")
    return found


def locations(value: Any, path: str, size: int) -> list[list[int]]:
    """``[offset, length, crc]`` triples in ascending order, each inside ``size`` bytes."""
    end = 0
    for n, loc in enumerate(sequence(value, path)):
        where = f"{path}[{n}]"
        if type(loc) not in (list, tuple) or len(loc) != 3:
            raise fail(where, "expected [offset, length, crc]")
        offset = integer(loc[0], where, end, size)
        integer(loc[1], where, 0, size - offset)
        integer(loc[2], where, 0, _U32 - 1)
        end = offset + loc[1]
    return value


def tiling(value: list[list[int]], path: str, size: int) -> None:
    """Check that the ``[offset, length, crc]`` triples (in ascending order) cover all ``size``
    bytes without a gap: a part left out of the index would be state silently dropped."""
    end = 0
    for offset, length, _ in value:
        if offset != end:
            raise fail(path, f"a gap at byte {end}: the parts do not cover the file")
        end = offset + length
    if end != size:
        raise fail(path, f"the parts cover {end} of the file's {size} bytes")


def key_type(value: Any, path: str) -> Any:
    """A recorded key type: the config of a serializer statekit has."""
    try:
        serializer_from_config(value)
    except (ValueError, TypeError, RecursionError):
        raise fail(path, f"unknown key type {reprlib.repr(value)}") from None
    return value


def location(value: Any, path: str, size: int) -> list[int]:
    """One ``[offset, length, crc]`` inside ``size`` bytes."""
    return locations([value], path, size)[0]


#: ``check(handle, path, recorded key groups)`` for each registered snapshot format
FormatCheck = Callable[[dict[str, Any], str, KeyGroupRange], None]
_FORMATS: dict[str, FormatCheck] = {}


def register_format(fmt: str, check: FormatCheck) -> None:
    """Have the schema pass check task handles of format ``fmt`` with ``check`` (which raises
    :class:`CorruptCheckpointError`; the helpers of this module do)."""
    _FORMATS[fmt] = check


def recorded_key_groups(task: Any, path: str = "task handle") -> KeyGroupRange:
    """The key groups a task handle records, for choosing the handles a partition restores; a
    handle without a valid range (the schema pass lets handles of unknown formats through) is
    corrupt rather than a ``KeyError``."""
    bounds = mapping(task, path).get("key_group_range")
    if type(bounds) not in (list, tuple) or len(bounds) != 2:
        raise fail(f"{path}.key_group_range", "expected [first, last]")
    start = integer(bounds[0], f"{path}.key_group_range", 0, UPPER_BOUND_MAX_PARALLELISM - 1)
    return KeyGroupRange(start, integer(bounds[1], f"{path}.key_group_range", start,
                                        UPPER_BOUND_MAX_PARALLELISM - 1))


#: the metadata key of the subtasks' operator state handles (a list in subtask order)
OPERATOR_STATE = "operator_state"


#: how a Spark partition's rows were routed to it, where not by Spark's hash of the key
#: (``routing`` of a version's metadata): by the key group, each partition owning a range
KEY_GROUP_ROUTING = "key-groups"
ROUTINGS = (KEY_GROUP_ROUTING,)


def check_metadata(body: Any, where: str, checkpoint_id: int | None = None) -> dict[str, Any]:
    """``body`` after checking every field statekit reads (see the module docstring)."""
    body = mapping(body, where)
    for key in ("layout", "job_id", "job_name", "backend", "query_id", "operator_id"):
        if key in body:
            text(body[key], f"{where}: {key}")
    if "checkpoint_id" in body:
        found = integer(body["checkpoint_id"], f"{where}: checkpoint_id", 0)
        if checkpoint_id is not None and found != checkpoint_id:
            raise fail(where, f"holds checkpoint {found}, but lies in the directory of "
                              f"checkpoint {checkpoint_id} (copied from another checkpoint?)")
    maxp = None
    if "max_parallelism" in body:
        maxp = integer(body["max_parallelism"], f"{where}: max_parallelism", 1,
                       UPPER_BOUND_MAX_PARALLELISM)
    if "parallelism" in body:
        integer(body["parallelism"], f"{where}: parallelism", 1, maxp or UPPER_BOUND_MAX_PARALLELISM)
    for key in ("timestamp", "batch", "partition", "first_batch", "spark_partition", "spark_attempt"):
        if key in body:
            integer(body[key], f"{where}: {key}")
    for key in ("num_partitions", "base"):
        if body.get(key) is not None:
            integer(body[key], f"{where}: {key}", 0)
    if body.get("attempt") is not None:
        text(body["attempt"], f"{where}: attempt")
    if "routing" in body and body["routing"] not in ROUTINGS:
        raise fail(f"{where}: routing", f"unknown routing {body['routing']!r} (this statekit "
                                        f"knows {', '.join(ROUTINGS)})")
    if "source" in body:
        source = mapping(body["source"], f"{where}: source")
        if "offset" in source:
            integer(source["offset"], f"{where}: source.offset", 0)
    if "attempts" in body:
        for n, attempt in enumerate(sequence(body["attempts"], f"{where}: attempts")):
            if type(attempt) not in (list, tuple) or len(attempt) != 2:
                raise fail(f"{where}: attempts[{n}]", "expected [batch, token]")
            integer(attempt[0], f"{where}: attempts[{n}]")
            text(attempt[1], f"{where}: attempts[{n}]")
    if "tasks" in body or body.get("layout") in _WITH_TASKS:
        _check_tasks(body.get("tasks"), f"{where}: tasks", maxp, _owned(body, where, maxp))
    if OPERATOR_STATE in body:
        _check_operator_state(body, f"{where}: {OPERATOR_STATE}")
    return body


def _check_operator_state(body: dict[Any, Any], path: str) -> None:
    """One entry per subtask (a handle, or None for a subtask without operator state)."""
    entries = sequence(body[OPERATOR_STATE], path)
    if "parallelism" in body and len(entries) != body["parallelism"]:
        raise fail(path, f"{len(entries)} entries for {body['parallelism']} subtasks")
    for n, entry in enumerate(entries):
        if entry is not None:
            handle(mapping(entry, f"{path}[{n}]"), f"{path}[{n}]")


def _owned(body: dict[str, Any], where: str, maxp: int | None) -> KeyGroupRange | None:
    """The key groups a Spark partition routed by key group owns (None: every group)."""
    if body.get("routing") != KEY_GROUP_ROUTING:
        return None
    if maxp is None or not isinstance(body.get("num_partitions"), int) or "partition" not in body:
        raise fail(where, "routed by key group without max_parallelism, num_partitions and "
                          "partition")
    count, partition = body["num_partitions"], body["partition"]
    if not 0 <= partition < count <= maxp:
        raise fail(where, f"partition {partition} of {count} cannot own key groups of {maxp}")
    return key_group_range_for_operator(maxp, count, partition)


def _check_tasks(value: Any, path: str, maxp: int | None,
                 owned: KeyGroupRange | None = None) -> None:
    """Every task handle, their key-group ranges disjoint and together covering every key group
    of their max parallelism, or ``owned`` (a Spark partition routed by key group): every
    writer's handles do (a job's tasks split the key groups, a Spark partition and a savepoint
    hold them all), so a lost handle is an error, never a restore into empty state.  The
    coverage rests on the handles alone, no optional field."""
    tasks = mapping(value, path)
    if not tasks:
        raise fail(path, "no task handles (a checkpoint always holds at least one)")
    ranges: list[tuple[KeyGroupRange, str]] = []
    parallelisms: set[int] = set()
    for name, task in tasks.items():
        where = f"{path}.{text(name, path)}"
        recorded = _check_task(mapping(task, where), where, maxp)
        if recorded is not None:
            ranges.append((recorded, where))
            parallelisms.add(task["max_parallelism"])
    ranges.sort(key=lambda item: item[0].start)
    for (first, _), (second, where) in itertools.pairwise(ranges):
        if second.start <= first.end:
            raise fail(where, "its key groups overlap another task's")
    if len(parallelisms) > 1:
        raise fail(path, f"the task handles disagree on max_parallelism ({sorted(parallelisms)})")
    if ranges and len(ranges) == len(tasks):
        whole = len(owned) if owned is not None else maxp or parallelisms.pop()
        covered = sum(len(r) for r, _ in ranges)
        outside = owned is not None and (ranges[0][0].start != owned.start
                                         or ranges[-1][0].end != owned.end)
        if covered != whole or outside:
            raise fail(path, f"the task handles cover {covered} of the job's {whole} key groups "
                             "(a task's state is missing)")


def _check_task(task: dict[Any, Any], path: str, maxp: int | None) -> KeyGroupRange | None:
    """Check one task handle; its key-group range when it records one."""
    _check_handles(task, path)
    if "format" not in task:
        return None
    fmt = text(task["format"], f"{path}.format")
    if "backend" in task:
        text(task["backend"], f"{path}.backend")
    if "key_type" in task:
        key_type(task["key_type"], f"{path}.key_type")
    own = integer(task.get("max_parallelism"), f"{path}.max_parallelism", 1,
                  UPPER_BOUND_MAX_PARALLELISM)
    if maxp is not None and own != maxp:
        raise fail(f"{path}.max_parallelism", f"{own}, but the checkpoint's is {maxp}")
    bounds = task.get("key_group_range")
    if type(bounds) not in (list, tuple) or len(bounds) != 2:
        raise fail(f"{path}.key_group_range", "expected [first, last]")
    start = integer(bounds[0], f"{path}.key_group_range", 0, own - 1)
    end = integer(bounds[1], f"{path}.key_group_range", start, own - 1)
    recorded = KeyGroupRange(start, end)
    check = _FORMATS.get(fmt)
    if check is not None:
        check(task, path, recorded)
    return recorded


def _check_handles(value: Any, path: str) -> None:
    """Every inline or file handle nested in ``value``, found by the walk every other reader of
    handles uses (:func:`~statekit.checkpoint.handles.walk_handles`: maps, lists and tuples).
    Paths are only spelled out for the error."""
    for trail, item in walk_handles(value):
        handle(item, path + "".join(f".{step}" for step in trail))
