"""Fuzzing real checkpoints of both backends: each mutant of a job's newest checkpoint (byte
flips, truncations, ``_metadata`` fields of another type or range, swapped and crossed files,
swapped handles, links, FIFOs, directories, missing files) either restores exactly the state
written or raises a StatekitError subclass, within a time and memory bound.

The mutants run in a subprocess (:mod:`tests.checkpoint.fuzz_worker`), so a crash (SIGSEGV) or a
hang fails the test instead of ending the run.  Under a minute in the default run;
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
#: mutants per backend in the default run (the RocksDB restore is slower)
MUTANTS = {"hashmap": 1000, "rocksdb": 600}
SECONDS_PER_MUTANT = 10
MAX_RSS_MIB = 1024


@pytest.mark.parametrize("kind", ["hashmap", "rocksdb"])
def test_every_mutant_restores_exactly_or_fails_typed(kind, tmp_path):
    seed = int(os.environ.get("STATEKIT_FUZZ_SEED") or random.randrange(1 << 30))
    count = int(os.environ.get("STATEKIT_FUZZ_MUTANTS") or MUTANTS[kind])
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
    outcomes = [r for r in records if "outcome" in r]
    assert len(outcomes) == count, replay
    bad = [r for r in outcomes if r["outcome"] not in ("exact", "typed")]
    assert not bad, f"{len(bad)} mutants neither restored exactly nor failed typed ({replay}): {bad[:5]}"
    slow = [r for r in outcomes if r["seconds"] > SECONDS_PER_MUTANT]
    assert not slow, f"mutants over {SECONDS_PER_MUTANT} s ({replay}): {slow[:5]}"
    assert max(r["max_rss_mib"] for r in outcomes) < MAX_RSS_MIB, replay
    assert sum(r["outcome"] == "typed" for r in outcomes) > count // 2  # the damage was seen
    assert list(tmp_path.iterdir()) == [tmp_path / "source"]  # each mutant cleaned up after itself
