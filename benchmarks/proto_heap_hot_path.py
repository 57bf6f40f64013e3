"""Prototype of the proposed heap ValueState hot-path changes, measured against the current classes.

Not part of statekit and not a pytest benchmark: it subclasses ``HeapValueState`` to show what the
changes proposed in ``docs/benchmarks.md`` ("Findings") would buy on a cache-resident key set, as
interleaved ratios against a raw ``dict`` (the same shape as the ``*_hot`` rows of the matrix).

    python -m benchmarks.proto_heap_hot_path
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks._common import heap_backend
from statekit import Types, ValueStateDescriptor
from statekit.backends.base import NO_KEY
from statekit.backends.heap import HeapValueState
from statekit.state.api import check_value

LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1


class ProtoValue(HeapValueState):
    """Proposal 1: ``immutable``, ``check`` and the dict cached in slots; the key check inlined."""

    __slots__ = ("_data", "_imm", "_valid")

    def __init__(self, inner: HeapValueState) -> None:
        super().__init__(inner._b, inner._t, inner._check)
        self._imm = inner._t.meta.stored_serializer.immutable
        self._valid = inner._check.check
        self._data = inner._t.data

    def value(self) -> Any:
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        value = self._data.get(key)
        if value is not None and not self._imm:
            return super().value()
        return value

    def update(self, value: Any) -> None:
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        if self._t.dirty is not None:
            self._t.dirty.add(key)
        if value is None:
            self._data.pop(key, None)
            return
        if self._valid(value) is not None:
            check_value(self._check, value, self._name)
        self._data[key] = value


class ProtoValueLong(ProtoValue):
    """Proposal 1 + 2: for LONG values the type check is inlined (no Python call on the hot path)."""

    __slots__ = ()

    def update(self, value: Any) -> None:
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        if self._t.dirty is not None:
            self._t.dirty.add(key)
        if type(value) is int and LONG_MIN <= value <= LONG_MAX:
            self._data[key] = value
            return
        ProtoValue.update(self, value)


def main(hot_keys: int = 1000, ops: int = 100_000, rounds: int = 9) -> None:
    backend = heap_backend()
    state = backend.get_partitioned_state(ValueStateDescriptor("v", Types.LONG()))
    for k in range(hot_keys):
        backend.set_current_key(k)
        state.update(k)
    raw = {k: k for k in range(hot_keys)}
    seq = random.Random(1).choices(range(hot_keys), k=ops)
    sk = backend.set_current_key

    def raw_get() -> None:
        g = raw.get
        for k in seq:
            g(k)

    def raw_put() -> None:
        for k in seq:
            raw[k] = k

    def lib_get(st: Any) -> Callable[[], None]:
        get = st.value

        def run() -> None:
            for k in seq:
                sk(k)
                get()

        return run

    def lib_update(st: Any) -> Callable[[], None]:
        upd = st.update

        def run() -> None:
            for k in seq:
                sk(k)
                upd(k)

        return run

    proto, proto_long = ProtoValue(state), ProtoValueLong(state)
    variants = {
        "get: current HeapValueState": (raw_get, lib_get(state)),
        "get: proposal 1": (raw_get, lib_get(proto)),
        "update: current HeapValueState": (raw_put, lib_update(state)),
        "update: proposal 1": (raw_put, lib_update(proto)),
        "update: proposal 1 + 2 (inline LONG check)": (raw_put, lib_update(proto_long)),
    }
    for name, (base, lib) in variants.items():
        ratios = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            base()
            t1 = time.perf_counter()
            lib()
            t2 = time.perf_counter()
            ratios.append((t1 - t0) / (t2 - t1))
        print(f"{name:44s} {statistics.median(ratios):6.1%} of raw dict ops/s ({hot_keys:,} hot keys)")


if __name__ == "__main__":
    main()
