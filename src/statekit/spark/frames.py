"""pandas in and out of the per-key adapters, without pandas' per-call overhead.

Spark calls the per-key adapters once per key with a few rows, so pandas' generic paths dominate:
``itertuples`` builds a Series per column through ``iloc`` and ``DataFrame(rows, columns=...)``
infers every column through its general machinery (together ~200 µs of a key's call).  These
helpers take the direct route for the common column kinds and fall back to pandas itself for
anything else, so the frames are exactly the ones pandas would build.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

from statekit.errors import StateError
from statekit.runtime.functions import side_output_of

#: Python types of a column's values -> the numpy dtype pandas infers for them
_DTYPES: dict[frozenset[type], Any] = {
    frozenset((int,)): np.int64,
    frozenset((float,)): np.float64,
    frozenset((int, float)): np.float64,
    frozenset((bool,)): np.bool_,
    frozenset((str,)): object,
    frozenset((bytes,)): object,
}


#: numpy dtype kinds whose ``tolist()`` is not what pandas hands out (datetime64, timedelta64)
_TIMES = "Mm"


@functools.cache
def _infers_string() -> bool:
    """Whether pandas builds its own string dtype for str values (then pandas builds frames)."""
    return bool(pd.get_option("future.infer_string"))


def frame_rows(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    """The rows of ``frame`` as tuples of Python values (what ``itertuples(index=False,
    name=None)`` yields), read column by column."""
    width = frame.shape[1]
    if not width or not frame.columns.is_unique:
        return list(frame.itertuples(index=False, name=None))
    column = getattr(frame, "_get_column_array", None)  # the column's values, no Series built
    values = [_column_values(column(i)) for i in range(width)] if column is not None else [None]
    if any(v is None for v in values):
        return list(frame.itertuples(index=False, name=None))
    return list(zip(*values, strict=True))  # type: ignore[arg-type]


def _column_values(array: Any) -> list[Any] | None:
    """A column's values as pandas' own iteration (``itertuples``, a Series) gives them: numpy
    values through ``tolist()``; pandas' extension arrays (datetimes, nullable numbers,
    categoricals, strings) by iterating the array, as a Series does; None for numpy datetimes
    (``tolist()`` gives them as ints) and anything else."""
    if type(array) is np.ndarray:
        return array.tolist() if array.ndim == 1 and array.dtype.kind not in _TIMES else None
    if isinstance(array, pd.api.extensions.ExtensionArray):
        return list(array)
    return None


def rows_frame(rows: Sequence[Sequence[Any]], columns: list[str]) -> pd.DataFrame:
    """``pd.DataFrame(rows, columns=columns)``, built directly when every column holds values
    of one of the plain kinds (int, float, int and float, bool, str, bytes), else by pandas."""
    if not rows or _infers_string():
        return _pandas_frame(rows, columns)
    arrays: list[np.ndarray] = []
    try:
        for values in zip(*rows, strict=True):
            dtype = _DTYPES.get(frozenset(map(type, values)))
            if dtype is None:
                return _pandas_frame(rows, columns)
            arrays.append(np.array(values, dtype=dtype))
    except (ValueError, OverflowError):  # ragged rows, ints beyond int64: pandas decides
        return _pandas_frame(rows, columns)
    index = _columns_index(tuple(columns))
    if len(arrays) != len(columns) or index is None:
        return _pandas_frame(rows, columns)
    # the arrays are 1-D, of equal length and final dtype: nothing for pandas to check or infer
    return pd.DataFrame._from_arrays(arrays, columns=index.copy(), index=pd.RangeIndex(len(rows)),
                                     verify_integrity=False)


def _pandas_frame(rows: Sequence[Sequence[Any]], columns: list[str]) -> pd.DataFrame:
    """The frame pandas builds; a side output among the rows (``yield tag, value``, which only
    the local runner routes) is a StateError, never an odd row (checked here, off the fast path:
    a tag is never a plain value)."""
    for row in rows:
        tag = side_output_of(row)
        if tag is not None:
            raise StateError(f"the function sent a value to the side output {tag.tag_id!r}; "
                             "side outputs are the local runner's: on Spark, emit rows of the "
                             "output schema (e.g. a column that names the output)")
    return pd.DataFrame(rows, columns=columns)


@functools.lru_cache(maxsize=64)
def _columns_index(columns: tuple[str, ...]) -> pd.Index | None:
    """The column index of output frames (each frame gets a copy: a name set on one stays
    there); None when pandas must build them
    (duplicate names, or a pandas without ``DataFrame._from_arrays``)."""
    if len(set(columns)) != len(columns) or not hasattr(pd.DataFrame, "_from_arrays"):
        return None
    return pd.Index(columns, dtype=object)


# --- a key's rows straight from PySpark's chunks ---------------------------------------------------
#
# PySpark 4.3 hands the per-key functions a lazy generator that builds each chunk's DataFrame only
# to pass it on: ``(pd.concat(x, axis=1) for x in value_series_gen)`` (applyInPandasWithState: x
# is the chunk's list of column Series) and ``(df.iloc[:, value_offsets] for _, df in group)``
# (transformWithStateInPandas).  That DataFrame costs more than everything statekit does with the
# key, and the adapters want only its rows, so when ``frames`` is exactly such an unstarted
# generator of PySpark's worker, its source is read directly and each chunk's expression is
# applied only where the direct route does not apply; anything else is iterated as given.

_CONCAT_QUALNAME = "read_udfs.<locals>.apply_udf_to_group.<locals>.<genexpr>"
_ILOC_QUALNAME = "read_udfs.<locals>.transform_with_state_func.<locals>.<genexpr>"


def _pyspark_source(frames: Any) -> tuple[str, Any, Any] | None:
    """``(kind, source iterator, value offsets)`` of PySpark's own per-key chunk generator."""
    code = getattr(frames, "gi_code", None)
    frame = getattr(frames, "gi_frame", None)
    if code is None or frame is None or not code.co_filename.endswith(("pyspark/worker.py",
                                                                         "pyspark\\worker.py")):
        return None
    if inspect.getgeneratorstate(frames) != inspect.GEN_CREATED:
        return None
    local = frame.f_locals
    if (code.co_qualname == _CONCAT_QUALNAME and "concat" in code.co_names
            and set(code.co_names) <= {"pd", "concat"} and ".0" in local
            and local.get("pd", frame.f_globals.get("pd")) is pd):
        return "concat", local[".0"], None
    if (code.co_qualname == _ILOC_QUALNAME and ".0" in local and "value_offsets" in local
            and code.co_names == ("iloc",)):
        return "iloc", local[".0"], local["value_offsets"]
    return None


def _columns_rows(columns: list[Any]) -> list[tuple[Any, ...]] | None:
    """Rows of equally long columns (Series or arrays), their values as :func:`_column_values`
    reads them; None for anything else."""
    values = []
    for c in columns:
        if isinstance(c, pd.Series):  # its values as a Series holds them (datetimes boxed)
            plain = isinstance(c.dtype, np.dtype) and c.dtype.kind not in _TIMES
            c = c.to_numpy() if plain else c.array
        column = _column_values(c)
        if column is None:
            return None
        values.append(column)
    if not values or len({len(v) for v in values}) != 1:
        return None
    return list(zip(*values, strict=True))


def key_chunks(frames: Iterator[Any]) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of each of a key's frames, as :func:`frame_rows` reads them (PySpark's own
    chunk generator read at its source, see above)."""
    source = _pyspark_source(frames)
    if source is None:
        for frame in frames:
            yield frame_rows(frame)
        return
    kind, chunks, offsets = source
    for chunk in chunks:
        rows = None
        if kind == "concat":
            if isinstance(chunk, list) and all(isinstance(s, pd.Series) for s in chunk):
                rows = _columns_rows(chunk)
            yield rows if rows is not None else frame_rows(pd.concat(chunk, axis=1))
        else:
            _, df = chunk
            column = getattr(df, "_get_column_array", None)
            if column is not None and df.columns.is_unique and all(
                    type(i) is int and 0 <= i < df.shape[1] for i in offsets):
                rows = _columns_rows([column(i) for i in offsets])
            yield rows if rows is not None else frame_rows(df.iloc[:, offsets])


def key_rows(frames: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
    """Every row of a key's frames (:func:`key_chunks`, flattened)."""
    for rows in key_chunks(frames):
        yield from rows
