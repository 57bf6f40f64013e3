"""State entries as Arrow record batches: the schema a state's recorded layout implies, and the
conversion of plain (msgpack) entries into rows.

Rows are flat: one per key for a value state, one per element for a list state (``index``), one
per entry for a map state (``user_key``); TTL states add ``ttl_timestamp``, the last-access time
their time-to-live counts from.  Typed serializers map to Arrow types; an untyped (generic)
key or value is inferred from a sample of the state and falls back to JSON text when the sample
mixes types; pickled values stay pickle bytes (never unpickled).
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from statekit.backends.kinds import KINDS
from statekit.errors import SerializationError
from statekit.serde.types import describe_type as describe  # noqa: F401 (a short type name)

Convert = Callable[[Any], Any] | None
#: how a key or value column is chosen: ``"auto"`` (the recorded type; inferred when untyped),
#: ``"json"`` (JSON text), or an explicit Arrow type
TypeChoice = str | pa.DataType

_LISTS = ("list", "basic_array", "object_array", "primitive_array")
_SCALARS: dict[str, tuple[pa.DataType, Convert]] = {
    "STRING": (pa.string(), None), "CHAR": (pa.string(), None), "BYTE": (pa.int8(), None),
    "SHORT": (pa.int16(), None), "INT": (pa.int32(), None), "LONG": (pa.int64(), None),
    "BOOLEAN": (pa.bool_(), None), "FLOAT": (pa.float32(), None), "DOUBLE": (pa.float64(), None),
    "BYTES": (pa.binary(), None), "BIG_INT": (pa.string(), str), "BIG_DEC": (pa.string(), str),
    "SQL_DATE": (pa.date32(), None), "SQL_TIME": (pa.time64("us"), None),
    "SQL_TIMESTAMP": (pa.timestamp("us"), None), "INSTANT": (pa.timestamp("us", tz="UTC"), None),
    "pickle": (pa.binary(), None),
}
NAMES = {"string": pa.string(), "int64": pa.int64(), "int32": pa.int32(), "double": pa.float64(),
         "binary": pa.binary(), "bool": pa.bool_()}


# --- JSON text for values without one Arrow type -------------------------------------------------


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_jsonable(v) for v in value), key=repr)
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _jsonable(v) for k, v in value.items()}
        return [[_jsonable(k), _jsonable(v)] for k, v in value.items()]
    if isinstance(value, _dt.date | _dt.time):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return repr(value)


def to_json(value: Any) -> str | None:
    """JSON text of a plain value (tuples and sets as arrays, bytes as base64); None stays null."""
    if value is None:
        return None
    return json.dumps(_jsonable(value), separators=(",", ":"), ensure_ascii=False)


# --- column types --------------------------------------------------------------------------------


def _spec(config: Any) -> tuple[pa.DataType | None, Convert]:
    """Arrow type and plain-value converter of a serializer config; type None: untyped."""
    if config == "generic":
        return None, None
    if isinstance(config, str) and config in _SCALARS:
        return _SCALARS[config]
    if isinstance(config, list | tuple) and config:
        name = config[0]
        if name in _LISTS and len(config) == 2:
            etype, econv = _nested(config[1])
            return pa.list_(etype), None if econv is None else (lambda v: [econv(x) for x in v])
        if name == "map" and len(config) == 3:
            (ktype, kconv), (vtype, vconv) = _nested(config[1]), _nested(config[2])
            return pa.map_(ktype, vtype), lambda v: [
                (k if kconv is None else kconv(k), x if vconv is None else vconv(x)) for k, x in v]
        if name in ("tuple", "row", "row_named"):
            configs = config[1] if name != "row_named" else config[2]
            names = ([f"f{i}" for i in range(len(configs))] if name != "row_named"
                     else [str(n) for n in config[1]])
            specs = [_nested(c) for c in configs]
            struct = pa.struct([(n, t) for n, (t, _) in zip(names, specs, strict=True)])
            return struct, lambda v: {n: x if c is None else c(x)
                                      for n, (_, c), x in zip(names, specs, v, strict=True)}
    raise SerializationError(f"cannot map the recorded type {config!r} to an Arrow type")


def _nested(config: Any) -> tuple[pa.DataType, Convert]:
    dtype, conv = _spec(config)
    return (pa.string(), to_json) if dtype is None else (dtype, conv)


def infer(sample: list[Any]) -> tuple[pa.DataType, Convert]:
    """An Arrow type for untyped plain values from a sample: pyarrow's own inference when the
    sample has one type, JSON text otherwise."""
    try:
        dtype = pa.array(sample).type
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return pa.string(), to_json
    if pa.types.is_null(dtype):
        return pa.string(), to_json
    return dtype, None


def _choose(choice: TypeChoice, config: Any, sample: Callable[[], list[Any]]) -> tuple[pa.DataType, Convert]:
    if isinstance(choice, pa.DataType):
        return choice, None
    if choice == "json":
        return pa.string(), to_json
    if choice != "auto":
        if choice not in NAMES:
            raise ValueError(f"unknown column type {choice!r}; expected auto, json or one of {sorted(NAMES)}")
        return NAMES[choice], None
    dtype, conv = _spec(config)
    return (dtype, conv) if dtype is not None else infer(sample())


# --- the rows of one state -----------------------------------------------------------------------


@dataclass
class Chunk:
    """Plain entries of one state: keys and stored values (as msgpack decodes them), and the
    bytes they were read from (for batching and progress)."""

    keys: list[Any]
    values: list[Any]
    nbytes: int = 0
    #: the time domain of a timer queue's chunk (``EVENT_TIME`` / ``PROCESSING_TIME``)
    domain: str | None = None


class RowPlan:
    """How a state's chunks become rows: column types and converters, and the Arrow schema."""

    def __init__(self, layout: list[Any], kind: str, sample: Callable[[], Chunk | None], *,
                 key_type: TypeChoice = "auto", value_type: TypeChoice = "auto",
                 user_key_type: TypeChoice = "auto", key_config: Any = "generic") -> None:
        self.kind, self.ttl = kind, bool(layout[3]) if len(layout) > 3 else False
        # how a stored value becomes rows, by the kind table: value / elements / entries
        self.rows = rows = KINDS[kind].rows if kind in KINDS else "value"
        cached: list[Chunk | None] = []

        def first() -> Chunk | None:
            if not cached:
                cached.append(sample())
            return cached[0]

        def keys() -> list[Any]:
            chunk = first()
            return [] if chunk is None else chunk.keys[:1000]

        def parts(index: int | None) -> list[Any]:
            chunk, out = first(), []
            for stored in [] if chunk is None else chunk.values[:1000]:
                items = [stored] if rows == "value" else stored
                for item in items[:100]:
                    pair = item if index is None or rows != "entries" else item[index]
                    stamped = self.ttl and (rows != "entries" or index == 1)
                    if pair is not None:
                        out.append(pair[0] if stamped else pair)
            return out

        self.key = _choose(key_type, key_config, keys)  # key_config: the recorded key type
        self.user_key = (_choose(user_key_type, layout[2], lambda: parts(0)) if rows == "entries"
                         else None)
        self.value = _choose(value_type, layout[1], lambda: parts(1 if rows == "entries" else None))
        fields = [pa.field("key", self.key[0])]
        if rows == "timers":
            fields += [pa.field("timestamp", pa.int64()), pa.field("domain", pa.string())]
            self.value = (pa.int64(), None)
            self.schema = pa.schema(fields)
            return
        if rows == "elements":
            fields.append(pa.field("index", pa.int32()))
        elif rows == "entries" and self.user_key is not None:
            fields.append(pa.field("user_key", self.user_key[0]))
        fields.append(pa.field("value", self.value[0]))
        if self.ttl:
            fields.append(pa.field("ttl_timestamp", pa.timestamp("ms", tz="UTC")))
        self.schema = pa.schema(fields)

    def choices(self) -> dict[str, TypeChoice]:
        """Explicit column choices that rebuild this plan's schema without sampling (for
        readers elsewhere, e.g. Spark executors)."""
        def choice(spec: tuple[pa.DataType, Convert] | None) -> TypeChoice:
            if spec is None:
                return "auto"
            if spec[1] is to_json:
                return "json"
            return spec[0] if spec[1] is None else "auto"  # typed with a converter: no sampling
        out = {"key_type": choice(self.key), "value_type": choice(self.value)}
        if self.user_key is not None:
            out["user_key_type"] = choice(self.user_key)
        return out

    def columns(self, chunk: Chunk) -> dict[str, list[Any]]:
        """The chunk's entries as column lists, before conversion."""
        keys, values, ttl, rows = chunk.keys, chunk.values, self.ttl, self.rows
        cols: dict[str, list[Any]] = {}
        if rows == "timers":
            cols["key"] = [key for key, stamps in zip(keys, values, strict=True) for _ in stamps]
            cols["timestamp"] = [t for stamps in values for t in stamps]
            cols["domain"] = [chunk.domain] * len(cols["key"])
            return cols
        if rows == "value":
            cols["key"] = keys
            cols["value"] = [v[0] for v in values] if ttl else values
            if ttl:
                cols["ttl_timestamp"] = [v[1] for v in values]
            return cols
        out_keys, second, vals, stamps = [], [], [], []
        for key, stored in zip(keys, values, strict=True):
            if rows == "elements":
                for i, element in enumerate(stored):
                    out_keys.append(key)
                    second.append(i)
                    vals.append(element[0] if ttl else element)
                    if ttl:
                        stamps.append(element[1])
            else:
                for user_key, entry in stored:
                    out_keys.append(key)
                    second.append(user_key)
                    vals.append(entry[0] if ttl and entry is not None else entry)
                    if ttl:
                        stamps.append(None if entry is None else entry[1])
        cols["key"] = out_keys
        cols["index" if rows == "elements" else "user_key"] = second
        cols["value"] = vals
        if ttl:
            cols["ttl_timestamp"] = stamps
        return cols

    def batch(self, cols: dict[str, list[Any]]) -> pa.RecordBatch:
        """Convert column lists into a record batch of this plan's schema."""
        arrays = []
        for fld in self.schema:
            spec = {"key": self.key, "value": self.value, "user_key": self.user_key}.get(fld.name)
            data = cols[fld.name]
            conv = spec[1] if spec is not None else None
            if conv is not None:
                data = [None if x is None else conv(x) for x in data]
            try:
                arrays.append(_binary(data) if fld.type == pa.binary() else pa.array(data, type=fld.type))
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                option = {"key": "key_type", "value": "value_type"}.get(fld.name, fld.name)
                raise SerializationError(
                    f"column {fld.name!r} does not fit {fld.type} ({exc}); read it as JSON text "
                    f"({option}='json', --{option.replace('_', '-')} json)") from exc
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _binary(values: list[Any]) -> pa.Array:
    """A binary array built from one join and the lengths (pyarrow's per-object conversion ran
    at a third of the speed for state-sized values); pyarrow's own path for nulls and others."""
    try:
        data = b"".join(values)
    except TypeError:
        return pa.array(values, type=pa.binary())
    if len(data) >= 1 << 31:
        return pa.array(values, type=pa.binary())
    import numpy as np

    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, values), dtype=np.int32, count=len(values)), out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(values), [None, pa.py_buffer(offsets),
                                                            pa.py_buffer(data)])


def record_batches(plan: RowPlan, chunks: Iterator[Chunk], batch_rows: int = 65536,
                   batch_bytes: int = 8 * 1024 * 1024) -> Iterator[pa.RecordBatch]:
    """Record batches of about ``batch_rows`` rows (or ``batch_bytes`` of source data), built
    as chunks arrive: memory holds one batch, never the state."""
    pending: dict[str, list[Any]] = {}
    rows = size = 0
    for chunk in chunks:
        cols = plan.columns(chunk)
        if not cols["key"]:
            continue
        for name, data in cols.items():
            pending.setdefault(name, []).extend(data)
        rows += len(cols["key"])
        size += chunk.nbytes
        while rows >= batch_rows or size >= batch_bytes:
            take = min(rows, batch_rows)
            yield plan.batch({k: v[:take] for k, v in pending.items()})
            pending = {k: v[take:] for k, v in pending.items()}
            size = size * (rows - take) // rows if rows else 0
            rows -= take
    if rows:
        yield plan.batch(pending)
