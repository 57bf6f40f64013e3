"""Key groups: stable across processes, contiguous ranges covering every group exactly once."""

import itertools
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from statekit.serde.keygroups import (
    KeyGroupRange,
    key_group_for_bytes,
    key_group_range_for_operator,
    operator_index_for_key_group,
)


@given(st.integers(1, 1 << 15).flatmap(lambda m: st.tuples(st.just(m), st.integers(1, m))))
def test_ranges_partition_the_groups(mp):
    max_parallelism, parallelism = mp
    ranges = [key_group_range_for_operator(max_parallelism, parallelism, i) for i in range(parallelism)]
    assert ranges[0].start == 0 and ranges[-1].end == max_parallelism - 1
    for a, b in itertools.pairwise(ranges):
        assert b.start == a.end + 1
    for index, rng in enumerate(ranges):
        for kg in (rng.start, rng.end):
            if len(rng):
                assert operator_index_for_key_group(max_parallelism, parallelism, kg) == index


def test_key_groups_do_not_depend_on_the_process():
    code = ("from statekit.serde.keygroups import key_group_for_bytes as k;"
            "print([k(str(i).encode(), 128) for i in range(50)])")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={"PYTHONHASHSEED": str(seed)}, check=True).stdout for seed in (1, 2)}
    assert len(runs) == 1
    assert runs.pop().strip() == str([key_group_for_bytes(str(i).encode(), 128) for i in range(50)])


def test_range_helpers():
    rng = KeyGroupRange(10, 20)
    assert 10 in rng and 21 not in rng and len(rng) == 11
    assert len(rng.intersection(KeyGroupRange(30, 40))) == 0
    assert KeyGroupRange.all(128) == KeyGroupRange(0, 127)
