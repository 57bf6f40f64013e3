"""pandas in and out of the per-key adapters, without pandas' per-call overhead.

Spark calls the per-key adapters once per key with a few rows, so pandas' generic paths dominate:
``itertuples`` builds a Series per column through ``iloc`` and ``DataFrame(rows, columns=...)``
infers every column through its general machinery (together ~200 µs of a key's call).  These
helpers take the direct route for the common column kinds and fall back to pandas itself for
anything else, so the frames are exactly the ones pandas would build.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

#: Python types of a column's values -> the numpy dtype pandas infers for them
_DTYPES: dict[frozenset[type], Any] = {
    frozenset((int,)): np.int64,
    frozenset((float,)): np.float64,
    frozenset((int, float)): np.float64,
    frozenset((bool,)): np.bool_,
    frozenset((str,)): object,
    frozenset((bytes,)): object,
}


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
    arrays = [column(i) for i in range(width)] if column is not None else []
    if column is None or not all(type(a) is np.ndarray for a in arrays):
        # extension arrays (nullable, datetimes, categoricals): iteration and tolist() disagree
        return list(frame.itertuples(index=False, name=None))
    return list(zip(*[a.tolist() for a in arrays], strict=True))


def rows_frame(rows: Sequence[Sequence[Any]], columns: list[str]) -> pd.DataFrame:
    """``pd.DataFrame(rows, columns=columns)``, built directly when every column holds values
    of one of the plain kinds (int, float, int and float, bool, str, bytes), else by pandas."""
    if not rows or _infers_string():
        return pd.DataFrame(rows, columns=columns)
    arrays: list[np.ndarray] = []
    try:
        for values in zip(*rows, strict=True):
            dtype = _DTYPES.get(frozenset(map(type, values)))
            if dtype is None:
                return pd.DataFrame(rows, columns=columns)
            arrays.append(np.array(values, dtype=dtype))
    except (ValueError, OverflowError):  # ragged rows, ints beyond int64: pandas decides
        return pd.DataFrame(rows, columns=columns)
    index = _columns_index(tuple(columns))
    if len(arrays) != len(columns) or index is None:
        return pd.DataFrame(rows, columns=columns)
    # the arrays are 1-D, of equal length and final dtype: nothing for pandas to check or infer
    return pd.DataFrame._from_arrays(arrays, columns=index, index=pd.RangeIndex(len(rows)),
                                     verify_integrity=False)


@functools.lru_cache(maxsize=64)
def _columns_index(columns: tuple[str, ...]) -> pd.Index | None:
    """The (immutable, shared) column index of output frames; None when pandas must build them
    (duplicate names, or a pandas without ``DataFrame._from_arrays``)."""
    if len(set(columns)) != len(columns) or not hasattr(pd.DataFrame, "_from_arrays"):
        return None
    return pd.Index(columns, dtype=object)
