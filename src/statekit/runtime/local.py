"""The local runner: kept importable from here; the stream builder lives in
:mod:`statekit.runtime.datastream` and the job in :mod:`statekit.runtime.job`."""

from statekit.runtime.datastream import DataStream, KeyedStream, ProcessedStream
from statekit.runtime.job import OPERATOR, LocalJob
from statekit.runtime.outputs import CollectResult

__all__ = [
    "OPERATOR",
    "CollectResult",
    "DataStream",
    "KeyedStream",
    "LocalJob",
    "ProcessedStream",
]
