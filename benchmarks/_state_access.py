"""The flink-benchmarks state access matrix: each operation as (statekit, {baseline name: baseline}).

Shapes (per op, one round = ``OPS`` operations over the same random key sequence for every side):

* statekit: ``backend.set_current_key(k)`` + one state call, exactly as a keyed function does;
* ``raw``: the same logical work on the raw store -- a ``dict`` of Python objects for heap; for
  RocksDB a raw-mode ``rocksdict`` with the backend's options, one column family per state and the
  same key encoding (``key group prefix + msgpack(key)``, computed per op) and value encoding
  (msgpack, decoded on read), i.e. what a hand-written rocksdict user with the same layout writes;
* ``raw_prekeyed`` (RocksDB value ops): raw rocksdict with key bytes built before the loop -- the
  floor of one C call per op, for reference;
* ``*_hot`` rows: the value ops over a cache-resident set of ``HOT_KEYS`` keys, where the raw store
  is fastest and the interpreter overhead of the library shows most;
* bulk rows (``bulk_get``/``bulk_put``): ``statekit.backends.bulk.BulkState`` against the vectorized raw
  call (``dict.update`` / list comprehension; rocksdict multi-get / one ``WriteBatch``);
* bulk list and map rows (``BULK_OPERATIONS``): one ``BulkState`` call over a round's keys against the
  same work key by key through the state API (``set_current_key`` + one state call per key), what a
  vectorized function would otherwise do.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._common import QUICK, interleaved, key_prefix_fn, loadavg, raw_rdict, rocksdb_backend

KEYS = 50_000 if QUICK else 500_000  # existing keys (flink-benchmarks: 500K setup keys)
MAP_KEYS = 10  # user keys per map (flink-benchmarks: 10)
LIST_VALUES = 10  # elements per list (flink-benchmarks: 100; 10 keeps the RocksDB setup short)
OPS = {"heap": 10_000 if QUICK else 100_000, "rocksdb": 5_000 if QUICK else 25_000}
ROUNDS = 2 if QUICK else 6
SEQS = 4

HOT_KEYS = 1_000  # the *_hot rows: a cache-resident key set (the interpreter-overhead floor)

OPERATIONS = ["value_get", "value_update", "value_get_hot", "value_update_hot", "list_get_iterate",
              "list_add", "list_add_all",
              "map_get", "map_contains", "map_iterate", "map_put", "map_remove",
              "bulk_get", "bulk_put"]

#: bulk list and map access against the per-key loop (both through statekit)
BULK_OPERATIONS = ["bulk_list_add", "bulk_list_get", "bulk_map_put", "bulk_map_get"]

Op = tuple[Callable[[int], Any], dict[str, Callable[[int], Any]]]


def _descriptors() -> tuple[Any, Any, Any]:
    from statekit import ListStateDescriptor, MapStateDescriptor, Types, ValueStateDescriptor

    return (ValueStateDescriptor("value", Types.LONG()), ListStateDescriptor("list", Types.LONG()),
            MapStateDescriptor("map", Types.LONG(), Types.LONG()))


def _sequences(ops: int, keys: int = KEYS) -> list[list[int]]:
    return [random.Random(1000 + i).choices(range(keys), k=ops) for i in range(SEQS)]


@dataclass
class Env:
    kind: str
    backend: Any
    descs: tuple[Any, Any, Any]
    states: tuple[Any, Any, Any]
    raw: Any  # heap: (dict, dict, dict); rocksdb: (db, {cf name: cf})
    seqs: list[list[int]]
    hot_seqs: list[list[int]] = field(default_factory=list)
    setup_s: dict[str, float] = field(default_factory=dict)
    cleanup: list[Callable[[], None]] = field(default_factory=list)


# --- setup ----------------------------------------------------------------------------------------


def heap_env() -> Env:
    import time

    from benchmarks._common import heap_backend

    backend = heap_backend()
    descs = _descriptors()
    value, lst, mp = (backend.get_partitioned_state(d) for d in descs)
    vals = list(range(LIST_VALUES))
    umap = {u: u for u in range(MAP_KEYS)}
    t0 = time.perf_counter()
    sk = backend.set_current_key
    for k in range(KEYS):  # through the state API, as a job would build it
        sk(k)
        value.update(k)
        lst.add_all(vals)
        mp.put_all(umap)
    t1 = time.perf_counter()
    raw = ({k: k for k in range(KEYS)}, {k: list(vals) for k in range(KEYS)},
           {k: dict(umap) for k in range(KEYS)})
    t2 = time.perf_counter()
    env = Env("heap", backend, descs, (value, lst, mp), raw, _sequences(OPS["heap"]),
              _sequences(OPS["heap"], HOT_KEYS))
    env.setup_s = {"statekit_load_s": round(t1 - t0, 3), "raw_load_s": round(t2 - t1, 3)}
    env.cleanup.append(backend.dispose)
    return env


def rocksdb_env(workdir: Path) -> Env:
    import time

    from rocksdict import WriteBatch

    from statekit.serde.types import packb

    backend = rocksdb_backend(workdir / "statekit")
    descs = _descriptors()
    value, lst, mp = (backend.get_partitioned_state(d) for d in descs)
    vals = list(range(LIST_VALUES))
    umap = {u: u for u in range(MAP_KEYS)}
    t0 = time.perf_counter()
    sk = backend.set_current_key
    for k in range(KEYS):
        sk(k)
        value.update(k)
        lst.add_all(vals)
        mp.put_all(umap)
    t1 = time.perf_counter()
    db, cfs = raw_rdict(workdir / "raw", ["value", "list", "map"])
    enc = key_prefix_fn()
    handles = {name: db.get_column_family_handle(name) for name in cfs}
    batch = WriteBatch(raw_mode=True)
    for k in range(KEYS):
        p = enc(k)
        batch.put(p, packb(k), handles["value"])
        for i, v in enumerate(vals):
            batch.put(p + i.to_bytes(8, "big"), packb(v), handles["list"])
        for u, v in umap.items():
            batch.put(p + packb(u), packb(v), handles["map"])
        if len(batch) >= 20_000:
            db.write(batch)
            batch = WriteBatch(raw_mode=True)
    db.write(batch)
    t2 = time.perf_counter()
    # same starting shape on both sides: everything flushed and compacted (as flink-benchmarks does)
    for cf in [*backend.cfs.values(), *cfs.values()]:
        cf.flush()
        cf.compact_range(None, None)
    t3 = time.perf_counter()
    env = Env("rocksdb", backend, descs, (value, lst, mp), (db, cfs), _sequences(OPS["rocksdb"]),
              _sequences(OPS["rocksdb"], HOT_KEYS))
    env.setup_s = {"statekit_load_s": round(t1 - t0, 3), "raw_load_s": round(t2 - t1, 3),
                   "compact_s": round(t3 - t2, 3)}

    def close() -> None:
        for cf in cfs.values():
            del cf
        cfs.clear()
        db.close()
        backend.dispose()

    env.cleanup.append(close)
    return env


# --- operations ------------------------------------------------------------------------------------


def heap_op(env: Env, name: str) -> Op:
    from statekit.backends.bulk import BulkState

    b = env.backend
    sk = b.set_current_key
    value, lst, mp = env.states
    rv, rl, rm = env.raw
    seqs = env.hot_seqs if name.endswith("_hot") else env.seqs
    name = name.removesuffix("_hot")
    vals = list(range(LIST_VALUES))

    def seq(i: int) -> list[int]:
        return seqs[i % len(seqs)]

    if name == "value_get":
        get = value.value

        def sk_fn(i: int) -> None:
            for k in seq(i):
                sk(k)
                get()

        def raw_fn(i: int) -> None:
            g = rv.get
            for k in seq(i):
                g(k)

    elif name == "value_update":
        upd = value.update

        def sk_fn(i: int) -> None:
            for k in seq(i):
                sk(k)
                upd(k + i)

        def raw_fn(i: int) -> None:
            for k in seq(i):
                rv[k] = k + i

    elif name == "list_get_iterate":
        lget = lst.get

        def sk_fn(i: int) -> None:
            for k in seq(i):
                sk(k)
                for _ in lget():
                    pass

        def raw_fn(i: int) -> None:
            g = rl.get
            for k in seq(i):
                for _ in g(k, ()):
                    pass

    elif name == "list_add":
        add = lst.add

        def sk_fn(i: int) -> None:
            for k in seq(i):
                sk(k)
                add(i)

        def raw_fn(i: int) -> None:
            g = rl.get
            for k in seq(i):
                cur = g(k)
                if cur is None:
                    rl[k] = [i]
                else:
                    cur.append(i)

    elif name == "list_add_all":
        add_all = lst.add_all

        def sk_fn(i: int) -> None:
            for k in seq(i):
                sk(k)
                add_all(vals)

        def raw_fn(i: int) -> None:
            g = rl.get
            for k in seq(i):
                cur = g(k)
                if cur is None:
                    rl[k] = list(vals)
                else:
                    cur.extend(vals)

    elif name in ("map_get", "map_contains", "map_iterate", "map_put", "map_remove"):
        return _heap_map_op(name, sk, mp, rm, seq)
    elif name == "bulk_get":
        bulk = BulkState(b)
        desc = env.descs[0]

        def sk_fn(i: int) -> None:
            bulk.get(desc, seq(i))

        def raw_fn(i: int) -> None:
            g = rv.get
            [g(k) for k in seq(i)]

    elif name == "bulk_put":
        bulk = BulkState(b)
        desc = env.descs[0]

        def sk_fn(i: int) -> None:
            s = seq(i)
            bulk.put(desc, s, s)

        def raw_fn(i: int) -> None:
            s = seq(i)
            rv.update(zip(s, s, strict=True))

    else:
        raise ValueError(name)
    return sk_fn, {"raw": raw_fn}


def _heap_map_op(name: str, sk: Callable[[Any], None], mp: Any, rm: dict[int, dict[int, int]],
                 seq: Callable[[int], list[int]]) -> Op:
    g = rm.get
    if name == "map_get":
        mget = mp.get

        def sk_fn(i: int) -> None:
            uk = i % MAP_KEYS
            for k in seq(i):
                sk(k)
                mget(uk)

        def raw_fn(i: int) -> None:
            uk = i % MAP_KEYS
            for k in seq(i):
                m = g(k)
                _ = None if m is None else m.get(uk)

    elif name == "map_contains":
        mcont = mp.contains

        def sk_fn(i: int) -> None:
            uk = i % MAP_KEYS
            for k in seq(i):
                sk(k)
                mcont(uk)

        def raw_fn(i: int) -> None:
            uk = i % MAP_KEYS
            for k in seq(i):
                m = g(k)
                _ = m is not None and uk in m

    elif name == "map_iterate":
        mitems = mp.items

        def sk_fn(i: int) -> None:
            for k in seq(i):
                sk(k)
                for _ in mitems():
                    pass

        def raw_fn(i: int) -> None:
            for k in seq(i):
                m = g(k)
                if m:
                    for _ in m.items():
                        pass

    elif name == "map_put":
        mput = mp.put

        def sk_fn(i: int) -> None:
            uk = i % MAP_KEYS
            for k in seq(i):
                sk(k)
                mput(uk, k)

        def raw_fn(i: int) -> None:
            uk = i % MAP_KEYS
            for k in seq(i):
                m = g(k)
                if m is None:
                    rm[k] = {uk: k}
                else:
                    m[uk] = k

    else:  # map_remove: round i removes user key i, which every map still holds
        mrem = mp.remove

        def sk_fn(i: int) -> None:
            uk = i % MAP_KEYS
            for k in seq(i):
                sk(k)
                mrem(uk)

        def raw_fn(i: int) -> None:
            uk = i % MAP_KEYS
            for k in seq(i):
                m = g(k)
                if m is not None:
                    m.pop(uk, None)
                    if not m:
                        del rm[k]

    return sk_fn, {"raw": raw_fn}


def rocksdb_op(env: Env, name: str) -> Op:
    from rocksdict import WriteBatch

    from statekit.backends.bulk import BulkState
    from statekit.serde.types import packb, unpackb

    b = env.backend
    sk = b.set_current_key
    value, lst, mp = env.states
    db, cfs = env.raw
    rv, rl, rm = cfs["value"], cfs["list"], cfs["map"]
    enc = key_prefix_fn()
    seqs = env.hot_seqs if name.endswith("_hot") else env.seqs
    name = name.removesuffix("_hot")
    vals = list(range(LIST_VALUES))
    seq_max = b"\xff" * 8

    def seq(i: int) -> list[int]:
        return seqs[i % len(seqs)]

    baselines: dict[str, Callable[[int], Any]] = {}
    if name == "value_get":
        get = value.value
        prekeyed = [[enc(k) for k in s] for s in seqs]

        def sk_fn(i: int) -> None:
            for k in seq(i):
                sk(k)
                get()

        def raw_fn(i: int) -> None:
            g = rv.get
            for k in seq(i):
                data = g(enc(k))
                _ = None if data is None else unpackb(data)

        def floor_fn(i: int) -> None:
            g = rv.get
            for p in prekeyed[i % len(prekeyed)]:
                data = g(p)
                _ = None if data is None else unpackb(data)

        baselines["raw_prekeyed"] = floor_fn
    elif name == "value_update":
        upd = value.update
        prekeyed = [[enc(k) for k in s] for s in seqs]

        def sk_fn(i: int) -> None:
            for k in seq(i):
                sk(k)
                upd(k + i)

        def raw_fn(i: int) -> None:
            put = rv.put
            for k in seq(i):
                put(enc(k), packb(k + i))

        def floor_fn(i: int) -> None:
            put = rv.put
            for p, k in zip(prekeyed[i % len(prekeyed)], seq(i), strict=True):
                put(p, packb(k + i))

        baselines["raw_prekeyed"] = floor_fn
    elif name == "list_get_iterate":
        lget = lst.get

        def sk_fn(i: int) -> None:
            for k in seq(i):
                sk(k)
                for _ in lget():
                    pass

        def raw_fn(i: int) -> None:
            for k in seq(i):
                p = enc(k)
                it = rl.iter()
                it.seek(p)
                while it.valid():
                    key = it.key()
                    if not key.startswith(p):
                        break
                    unpackb(it.value())
                    it.next()

    elif name in ("list_add", "list_add_all"):
        handle = db.get_column_family_handle("list")

        def next_seq(p: bytes) -> int:
            it = rl.iter()
            it.seek_for_prev(p + seq_max)
            if it.valid():
                key = it.key()
                if key.startswith(p) and len(key) == len(p) + 8:
                    return int.from_bytes(key[-8:], "big") + 1
            return 0

        if name == "list_add":
            add = lst.add

            def sk_fn(i: int) -> None:
                for k in seq(i):
                    sk(k)
                    add(i)

            def raw_fn(i: int) -> None:
                put = rl.put
                for k in seq(i):
                    p = enc(k)
                    put(p + next_seq(p).to_bytes(8, "big"), packb(i))

        else:
            add_all = lst.add_all

            def sk_fn(i: int) -> None:
                for k in seq(i):
                    sk(k)
                    add_all(vals)

            def raw_fn(i: int) -> None:
                for k in seq(i):
                    p = enc(k)
                    batch = WriteBatch(raw_mode=True)
                    for n, v in enumerate(vals, next_seq(p)):
                        batch.put(p + n.to_bytes(8, "big"), packb(v), handle)
                    db.write(batch)

    elif name == "map_get":
        mget = mp.get

        def sk_fn(i: int) -> None:
            uk = i % MAP_KEYS
            for k in seq(i):
                sk(k)
                mget(uk)

        def raw_fn(i: int) -> None:
            g = rm.get
            uk = packb(i % MAP_KEYS)
            for k in seq(i):
                data = g(enc(k) + uk)
                _ = None if not data else unpackb(data)

    elif name == "map_contains":
        mcont = mp.contains

        def sk_fn(i: int) -> None:
            uk = i % MAP_KEYS
            for k in seq(i):
                sk(k)
                mcont(uk)

        def raw_fn(i: int) -> None:
            g = rm.get
            uk = packb(i % MAP_KEYS)
            for k in seq(i):
                _ = g(enc(k) + uk) is not None

    elif name == "map_iterate":
        mitems = mp.items

        def sk_fn(i: int) -> None:
            for k in seq(i):
                sk(k)
                for _ in mitems():
                    pass

        def raw_fn(i: int) -> None:
            for k in seq(i):
                p = enc(k)
                n = len(p)
                it = rm.iter()
                it.seek(p)
                while it.valid():
                    key = it.key()
                    if not key.startswith(p):
                        break
                    v = it.value()
                    _ = (unpackb(key[n:]), unpackb(v) if v else None)
                    it.next()

    elif name == "map_put":
        mput = mp.put

        def sk_fn(i: int) -> None:
            uk = i % MAP_KEYS
            for k in seq(i):
                sk(k)
                mput(uk, k)

        def raw_fn(i: int) -> None:
            put = rm.put
            uk = packb(i % MAP_KEYS)
            for k in seq(i):
                put(enc(k) + uk, packb(k))

    elif name == "map_remove":
        mrem = mp.remove

        def sk_fn(i: int) -> None:
            uk = i % MAP_KEYS
            for k in seq(i):
                sk(k)
                mrem(uk)

        def raw_fn(i: int) -> None:
            delete = rm.delete
            uk = packb(i % MAP_KEYS)
            for k in seq(i):
                delete(enc(k) + uk)

    elif name == "bulk_get":
        bulk = BulkState(b)
        desc = env.descs[0]

        def sk_fn(i: int) -> None:
            bulk.get(desc, seq(i))

        def raw_fn(i: int) -> None:
            [None if d is None else unpackb(d) for d in rv.get([enc(k) for k in seq(i)])]

    elif name == "bulk_put":
        bulk = BulkState(b)
        desc = env.descs[0]
        handle = db.get_column_family_handle("value")

        def sk_fn(i: int) -> None:
            s = seq(i)
            bulk.put(desc, s, s)

        def raw_fn(i: int) -> None:
            batch = WriteBatch(raw_mode=True)
            for k in seq(i):
                batch.put(enc(k), packb(k), handle)
            db.write(batch)

    else:
        raise ValueError(name)
    return sk_fn, {"raw": raw_fn, **baselines}


def bulk_op(env: Env, name: str) -> Op:
    """One bulk list or map call over a round's keys (either backend), and the same work key by
    key (``per_key``): round ``i`` appends ``i`` to each key's list, puts or reads user key
    ``i % MAP_KEYS`` of each key's map."""
    from statekit.backends.bulk import BulkState

    b = env.backend
    sk = b.set_current_key
    _, lst, mp = env.states
    _, ldesc, mdesc = env.descs
    bulk = BulkState(b)
    seqs = env.seqs

    def seq(i: int) -> list[int]:
        return seqs[i % len(seqs)]

    if name == "bulk_list_add":
        add = lst.add

        def bulk_fn(i: int) -> None:
            s = seq(i)
            bulk.add(ldesc, s, [i] * len(s))

        def per_key(i: int) -> None:
            for k in seq(i):
                sk(k)
                add(i)

    elif name == "bulk_list_get":
        get = lst.get

        def bulk_fn(i: int) -> None:
            bulk.get(ldesc, seq(i))

        def per_key(i: int) -> None:
            for k in seq(i):
                sk(k)
                get()

    elif name == "bulk_map_put":
        put = mp.put

        def bulk_fn(i: int) -> None:
            s = seq(i)
            bulk.put_entries(mdesc, s, [i % MAP_KEYS] * len(s), s)

        def per_key(i: int) -> None:
            uk = i % MAP_KEYS
            for k in seq(i):
                sk(k)
                put(uk, k)

    elif name == "bulk_map_get":
        mget = mp.get

        def bulk_fn(i: int) -> None:
            s = seq(i)
            bulk.get_entries(mdesc, s, [i % MAP_KEYS] * len(s))

        def per_key(i: int) -> None:
            uk = i % MAP_KEYS
            for k in seq(i):
                sk(k)
                mget(uk)

    else:
        raise ValueError(name)
    return bulk_fn, {"per_key": per_key}


def run_bulk_vs_per_key(benchmark: Any, env: Env, backend: str, op: str) -> None:
    """One bulk list or map operation against the same work key by key, on ``backend``'s env
    (``ratio_vs_per_key``: how many times the per-key loop's time the bulk call saves)."""
    benchmark.group = f"bulk-vs-per-key-{op}"
    target, baselines = bulk_op(env, op)
    figures = interleaved(benchmark, target, baselines, ops=OPS[backend], rounds=ROUNDS)
    figures.update({"backend": backend, "op": op, "keys": KEYS, "loadavg": loadavg()})
    benchmark.extra_info.update(figures)
    print(f"\n{backend} {op}: {figures}")
