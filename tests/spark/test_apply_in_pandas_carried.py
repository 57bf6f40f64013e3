"""The carried-log cache rebuilds exactly the bytes ``packb`` makes and trusts only equal bytes."""

import pytest

from statekit.serde.msgpack import packb, unpackb
from statekit.spark.apply_in_pandas.carried import EMPTY, CarriedLog, LogCache


def _entry(seq):
    return [seq, seq // 2, f"t{seq}", [["m", 6, b"k" * seq, b"v"], ["c", 0, (seq, "x")]]]


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 40])
@pytest.mark.parametrize("drop", [0, 1, 15, "all"])
@pytest.mark.parametrize("append", [False, True])
def test_rewrite_makes_the_bytes_packb_makes(n, drop, append):
    entries = [_entry(i) for i in range(1, n + 1)]
    log = CarriedLog.decode(packb(entries)) if entries else EMPTY
    assert log.entries == entries
    k = n if drop == "all" else min(drop, n)
    new = _entry(n + 1) if append else None
    out = log.rewrite(k, new)
    expected = entries[k:] + ([new] if append else [])
    assert out.entries == expected
    if append:
        assert out.last_size == len(packb(new))
    if expected:
        assert out.blob == packb(expected)
        assert CarriedLog.decode(out.blob) == out
    else:
        assert out is EMPTY


def test_cache_reuses_only_the_bytes_it_wrote():
    cache = LogCache()
    written = CarriedLog.decode(packb([_entry(1)])).rewrite(0, _entry(2))
    cache.put("k", written)
    assert cache.get("k", bytes(written.blob)) is written
    other = packb([_entry(1), _entry(3)])
    assert cache.get("k", other).entries == unpackb(other)
    assert cache.get("j", written.blob).entries == written.entries  # another key: decoded
    assert cache.hits == 1
    cache.forget("k")
    assert cache.get("k", written.blob) is not written
