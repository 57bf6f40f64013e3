"""See what a checkpoint holds: list, open, verify, read, export, convert and clean up statekit
checkpoints, savepoints and Spark partition versions (Flink's State Processor API, for statekit).

>>> from statekit.inspection import list_checkpoints, open_checkpoint, verify
>>> view = open_checkpoint("/data/checkpoints/<job id>")          # doctest: +SKIP
>>> for batch in view.state("count").read_batches():              # doctest: +SKIP
...     ...                                                       # pyarrow.RecordBatch

Paths may be local or any fsspec URL (``s3://...``, with ``storage_options``).  Everything reads
through the readers the backends restore with; states are streamed, never loaded whole.
"""

from statekit.inspection.arrow import describe
from statekit.inspection.catalog import list_checkpoints
from statekit.inspection.convert import convert_savepoint
from statekit.inspection.export import FORMATS, ExportResult, export_state
from statekit.inspection.gc import Garbage, GcReport, collect_garbage
from statekit.inspection.model import (
    CheckpointInfo,
    PartitionInfo,
    Problem,
    StateInfo,
    VerifyReport,
)
from statekit.inspection.stateview import StateSplit, StateView
from statekit.inspection.verify import verify
from statekit.inspection.views import CheckpointView, open_checkpoint

__all__ = [
    "FORMATS",
    "CheckpointInfo",
    "CheckpointView",
    "ExportResult",
    "Garbage",
    "GcReport",
    "PartitionInfo",
    "Problem",
    "StateInfo",
    "StateSplit",
    "StateView",
    "VerifyReport",
    "collect_garbage",
    "convert_savepoint",
    "describe",
    "export_state",
    "list_checkpoints",
    "open_checkpoint",
    "verify",
]
