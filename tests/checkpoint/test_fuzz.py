"""Fuzzing real checkpoints of both backends: each mutant of a job's newest checkpoint (byte
flips, truncations, longer files, ``_metadata`` fields of another type or range, swapped and
crossed files, swapped handles, links, FIFOs, directories, missing files, lists recorded as
tuples, paths with a trailing ``/``) is read by the restore, the inspection path and ``savepoint
convert`` (its savepoints restored), and each either gives exactly the state written or raises a
StatekitError subclass, within a time and memory bound.  What the restore refuses, the other two
refuse; a mutant the restore reads exactly still restores exactly after ``gc --delete``.

The mutants run in a subprocess (:mod:`tests.checkpoint.fuzz_worker`), so a crash (SIGSEGV) or a
hang fails the test instead of ending the run.  About a minute per backend in the default run;
``STATEKIT_FUZZ_MUTANTS`` scales it and ``STATEKIT_FUZZ_SEED`` replays a reported seed.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: mutants per backend in the default run (RocksDB reads are slower: each reader downloads and
#: opens the native checkpoint); ``make test-slow`` reads five times as many
MUTANTS = {"hashmap": 120, "rocksdb": 60}
SLOW_FACTOR = 5
SECONDS_PER_MUTANT = 10
MAX_RSS_MIB = 1024


@pytest.mark.parametrize("factor", [1, pytest.param(SLOW_FACTOR, marks=pytest.mark.slow)],
                         ids=["default", "many"])
@pytest.mark.parametrize("kind", ["hashmap", "rocksdb"])
def test_every_mutant_reads_exactly_or_fails_typed(kind, factor, tmp_path):
    seed = int(os.environ.get("STATEKIT_FUZZ_SEED") or random.randrange(1 << 30))
    count = int(os.environ.get("STATEKIT_FUZZ_MUTANTS") or MUTANTS[kind] * factor)
    replay = f"replay: STATEKIT_FUZZ_SEED={seed} STATEKIT_FUZZ_MUTANTS={count}"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.checkpoint.fuzz_worker", kind, str(tmp_path), str(seed),
             str(count)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        last = out.strip().splitlines()[-1:] or ["(nothing)"]
        pytest.fail(f"the fuzz worker hung; last line {last[0]} ({replay})")
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0:
        started = [r for r in records if "start" in r]
        pytest.fail(f"the fuzz worker died with {done.returncode} during "
                    f"{started[-1] if started else 'setup'} ({replay}): {done.stderr[-2000:]}")
    outcomes = [r for r in records if "outcomes" in r]
    assert len(outcomes) == count, replay
    bad = [r for r in outcomes if any(o not in ("exact", "typed") for o in r["outcomes"].values())]
    assert not bad, f"{len(bad)} mutants neither read exactly nor failed typed ({replay}): {bad[:5]}"
    lax = [r for r in outcomes if r["outcomes"]["restore"] == "typed"
           and "exact" in (r["outcomes"]["inspect"], r["outcomes"]["convert"])]
    assert not lax, f"{len(lax)} mutants the restore refuses were read ({replay}): {lax[:5]}"
    slow = [r for r in outcomes if r["seconds"] > SECONDS_PER_MUTANT]
    assert not slow, f"mutants over {SECONDS_PER_MUTANT} s ({replay}): {slow[:5]}"
    assert max(r["max_rss_mib"] for r in outcomes) < MAX_RSS_MIB, replay
    assert sum(r["outcomes"]["restore"] == "typed" for r in outcomes) > count // 2  # damage seen
    # garbage collection of an intact copy is checked by the worker itself, whatever the seed
    assert list(tmp_path.iterdir()) == [tmp_path / "source"]  # each mutant cleaned up after itself
