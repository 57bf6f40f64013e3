"""The fuzz worker: write a real job's checkpoints with one backend, then read mutant after
mutant of the newest one through every reader and report the outcomes as a JSON line each.

Run by ``test_fuzz`` in a subprocess (``python -m tests.checkpoint.fuzz_worker KIND DIR SEED N``)
so that a crash is seen as one.  Each mutant is a fresh copy of the job directory with one
damage: a byte flip, a truncation, a file longer than recorded, a ``_metadata`` field of another
type or out of range (with a valid checksum), files swapped within the checkpoint or crossed in
from the older one, a handle swapped, a symbolic link out of the checkpoint, a FIFO, a directory
or nothing in place of a file; or a change a restore reads the same (a list recorded as a
tuple, a path with a trailing ``/``).  Each mutant is read by the restore, by the inspection path
(``open_checkpoint`` and every state's record batches), and by ``savepoint convert`` whose
savepoints are then restored; a mutant the restore reads exactly is then garbage-collected
(``gc --delete``) and restored again.  Outcomes per reader: ``exact`` (the state written),
``typed`` (a StatekitError), ``untyped`` or ``wrong`` (a failure); ``start`` lines name the
mutant being tried.
"""

from __future__ import annotations

import decimal
import json
import os
import random
import resource
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from statekit.errors import StatekitError
from statekit.inspection import collect_garbage
from tests.checkpoint.forge import (
    convert_and_read,
    expected_rows,
    expected_state,
    inspect_state,
    restore_and_read,
    rewrite_metadata,
    write_job,
)

#: values a ``_metadata`` field is replaced with: other types, and integers out of every range
ODD_VALUES: list[Any] = [None, True, -1, 0, 1, 2**31, 2**64, -(2**63), 1.5, float("nan"), "x", "",
                         b"\x00", [], {}, [0], [0, 1, 2], {"type": "file"},
                         decimal.Decimal("1e999999999"), "../../etc/passwd", 127, 128]


def _files(chk: str) -> list[str]:
    return sorted(os.path.join(chk, n) for n in os.listdir(chk) if os.path.isfile(os.path.join(chk, n)))


def _paths(value: Any, trail: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a decoded ``_metadata`` body."""
    found = [trail] if trail else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*trail, key))
    elif isinstance(value, list):
        for n, item in enumerate(value):
            found += _paths(item, (*trail, n))
    return found


def _set(body: Any, path: tuple[Any, ...], value: Any) -> None:
    for step in path[:-1]:
        body = body[step]
    body[path[-1]] = value


def mutate(rng: random.Random, job: str, outside: str) -> str:
    """Damage the copy of the job at ``job`` (its ``chk-2``) in one random way; a description."""
    chk, older = f"{job}/chk-2", f"{job}/chk-1"
    files = _files(chk)
    victim = rng.choice(files)
    name = os.path.basename(victim)
    kind = rng.choice(["flip", "flip", "truncate", "longer", "field", "field", "field", "swap",
                       "cross", "handles", "link", "fifo", "directory", "missing", "tuple", "slash"])
    if kind == "flip":
        data = bytearray(Path(victim).read_bytes())
        if data:
            at = rng.randrange(len(data))
            data[at] ^= rng.randrange(1, 256)
        Path(victim).write_bytes(bytes(data))
        return f"flip {name}"
    if kind == "truncate":
        size = os.path.getsize(victim)
        os.truncate(victim, rng.randrange(size) if size else 0)
        return f"truncate {name}"
    if kind == "longer":
        with open(victim, "ab") as fh:
            fh.write(b"\0" * rng.randrange(1, 64))
        return f"longer {name}"
    if kind in ("tuple", "slash"):
        found = []
        rewrite_metadata(f"{chk}/_metadata", lambda body: found.extend(_paths(body)))
        if kind == "tuple":  # a list, read the same as a tuple
            lists = [p for p in found if isinstance(_get_path(f"{chk}/_metadata", p), list)]
            path = rng.choice(lists)
            rewrite_metadata(f"{chk}/_metadata", lambda body: _set(body, path, tuple(_get(body, path))))
        else:  # a file handle's path with a trailing slash, read as the same file
            paths = [p for p in found if p[-1] == "path"]
            if not paths:
                return "slash (no file handle)"
            path = rng.choice(paths)
            rewrite_metadata(f"{chk}/_metadata", lambda body: _set(body, path, _get(body, path) + "/"))
        return f"{kind} {'.'.join(map(str, path))}"
    if kind == "field":
        found: list[Any] = []
        rewrite_metadata(f"{chk}/_metadata", lambda body: found.extend(_paths(body)))
        path, value = rng.choice(found), rng.choice(ODD_VALUES)
        rewrite_metadata(f"{chk}/_metadata", lambda body: _set(body, path, value))
        return f"field {'.'.join(map(str, path))} = {value!r:.40}"
    if kind == "swap":
        other = rng.choice([f for f in files if f != victim])
        tmp = victim + ".swap"
        os.rename(victim, tmp)
        os.rename(other, victim)
        os.rename(tmp, other)
        return f"swap {name} {os.path.basename(other)}"
    if kind == "cross":
        source = rng.choice(_files(older))
        shutil.copyfile(source, victim)
        return f"cross {os.path.basename(source)} -> {name}"
    if kind == "handles":
        def swap_handles(body: dict[str, Any]) -> None:
            paths = [p for p in _paths(body) if p[-1] in ("data", "key_group_range", "path")]
            pairs = [(p, q) for p in paths for q in paths
                     if p < q and p[:len(q)] != q and q[:len(p)] != p]  # neither holds the other
            if pairs:
                first, second = rng.choice(pairs)
                a, b = _get(body, first), _get(body, second)
                _set(body, first, b)
                _set(body, second, a)
        rewrite_metadata(f"{chk}/_metadata", swap_handles)
        return "handles swapped"
    if kind == "link":
        target = os.path.join(outside, name)
        shutil.copyfile(victim, target)
        os.unlink(victim)
        os.symlink(target, victim)
        return f"link {name}"
    os.unlink(victim)
    if kind == "fifo":
        os.mkfifo(victim)
    elif kind == "directory":
        os.mkdir(victim)
    return f"{kind} {name}"


def _get(body: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        body = body[step]
    return body


def _get_path(metadata: str, path: tuple[Any, ...]) -> Any:
    found: list[Any] = []
    rewrite_metadata(metadata, lambda body: found.append(_get(body, path)))
    return found[0]


def _attempt(read: Callable[[], bool]) -> tuple[str, str]:
    """``(outcome, error)`` of one reader: ``read()`` says whether it read the state written."""
    try:
        return ("exact" if read() else "wrong"), ""
    except StatekitError as exc:
        return "typed", f"{type(exc).__name__}: {exc}"[:200]
    except Exception as exc:  # the failure this test looks for
        return "untyped", f"{type(exc).__name__}: {exc}"[:200]


def read_mutant(kind: str, work: str, expected: dict[Any, Any], rows: dict[str, Any]
                ) -> dict[str, tuple[str, str]]:
    """Each reader's ``(outcome, error)`` for the mutant job at ``work/job``."""
    chk = f"{work}/job/chk-2"
    outcomes = {
        "restore": _attempt(lambda: restore_and_read(kind, chk) == expected),
        "inspect": _attempt(lambda: inspect_state(chk) == rows),
        "convert": _attempt(lambda: convert_and_read(kind, chk, f"{work}/savepoints") == expected),
    }
    if outcomes["restore"][0] == "exact":  # garbage collection keeps what a restore reads
        outcomes["gc"] = _attempt(lambda: collect_garbage(f"{work}/job", delete=True) is not None
                                  and restore_and_read(kind, chk) == expected)
    return outcomes


def run(kind: str, base: str, seed: int, count: int, emit: Callable[[dict[str, Any]], None]) -> None:
    source = write_job(kind, f"{base}/source")
    expected, rows = expected_state(2), expected_rows(2)
    assert restore_and_read(kind, f"{source}/chk-2") == expected
    assert inspect_state(f"{source}/chk-2") == rows
    intact = f"{base}/intact"  # garbage collection keeps what a restore reads, whatever the seed
    shutil.copytree(source, f"{intact}/job", symlinks=True)
    assert collect_garbage(f"{intact}/job", delete=True) is not None
    assert restore_and_read(kind, f"{intact}/job/chk-2") == expected
    shutil.rmtree(intact)
    rng = random.Random(seed)
    for n in range(count):
        work, outside = f"{base}/m{n}", f"{base}/outside{n}"
        os.makedirs(outside)
        shutil.copytree(source, f"{work}/job", symlinks=True)
        what = mutate(rng, f"{work}/job", outside)
        emit({"start": n, "what": what})
        begin = time.monotonic()
        outcomes = read_mutant(kind, work, expected, rows)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        emit({"n": n, "what": what, "outcomes": {k: v[0] for k, v in outcomes.items()},
              "errors": {k: v[1] for k, v in outcomes.items() if v[1]},
              "seconds": round(time.monotonic() - begin, 3), "max_rss_mib": rss})
        shutil.rmtree(work)
        shutil.rmtree(outside)


def main() -> None:
    kind, base, seed, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

    def emit(record: dict[str, Any]) -> None:
        print(json.dumps(record), flush=True)

    run(kind, base, seed, count, emit)


if __name__ == "__main__":
    main()
