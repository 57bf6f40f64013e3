"""``spark.read.format("statekit")``: one state of a checkpoint, savepoint or stopped query as a
DataFrame, through PySpark's Python Data Source API.

.. code-block:: python

    df = (spark.read.format("statekit")
          .option("state", "count")            # required: the state to read
          .option("batch", 7)                  # Spark query state: the version of batch 7
          .load("/checkpoints/q1"))            # any path `statekit checkpoints inspect` takes

Options: ``state``, or ``timers`` (``"true"``: the operator's timers of both domains, as
``key``, ``timestamp`` and ``domain`` columns); ``operator`` (when several hold a state of that
name); ``batch``, ``checkpointId``; ``keyType`` / ``valueType`` (``auto``, ``json`` or an Arrow type name);
``keyGroupSplits`` (Spark partitions per statekit partition, cut by key-group range; default 1);
``snapshotsOnly`` and ``includeTentative`` (applyInPandasWithState: its snapshots alone);
``storageOptions`` (a JSON object of fsspec options, e.g. an S3
``endpoint_url``).  One Spark partition per statekit partition (key-group range); the schema
comes from the state's recorded descriptor type, untyped columns inferred from its first entries.

The source is registered in every session by the ``pyspark_statekit`` package (Spark looks up
``pyspark_*`` modules with a ``DefaultSource``); :func:`register_data_source` registers it by hand.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from statekit.errors import ConfigError
from statekit.inspection.arrow import RowPlan, record_batches
from statekit.inspection.views import StateSplit, StateView, open_checkpoint, state_chunks
from statekit.serde.keygroups import KeyGroupRange

FORMAT = "statekit"


def _option(options: dict[str, str], name: str, default: Any = None) -> Any:
    for key, value in options.items():  # Spark lower-cases option names on some paths
        if key.lower() == name.lower():
            return value
    return default


def _state(options: dict[str, str]) -> StateView:
    path = _option(options, "path")
    name = _option(options, "state")
    if not path:
        raise ConfigError("path", 'spark.read.format("statekit").load(PATH) needs a path')
    timers = str(_option(options, "timers", "false")).lower() == "true"
    if bool(name) == timers:
        raise ConfigError("state", 'name the state to read: .option("state", NAME), or read the '
                                   'timers: .option("timers", "true") (one of them)')
    storage = _option(options, "storageOptions")
    batch, checkpoint = _option(options, "batch"), _option(options, "checkpointId")
    view = open_checkpoint(
        str(path), batch=None if batch is None else int(batch),
        checkpoint_id=None if checkpoint is None else int(checkpoint),
        storage_options=json.loads(storage) if storage else None,
        include_tentative=str(_option(options, "includeTentative", "false")).lower() == "true",
        snapshots_only=str(_option(options, "snapshotsOnly", "false")).lower() == "true")
    if timers:
        return view.timers(_option(options, "operator"))
    return view.state(str(name), _option(options, "operator"))


def _plan(state: StateView, options: dict[str, str]) -> RowPlan:
    return state.plan(_option(options, "keyType", "auto"), _option(options, "valueType", "auto"))


class StatekitDataSource(DataSource):
    """A batch data source reading one statekit state (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(_plan(_state(self.options), self.options).schema)

    def reader(self, schema: Any) -> DataSourceReader:
        return StatekitReader(self.options, schema)


class StatekitPartition(InputPartition):
    """One statekit partition (or key-group range of one) of the state being read."""

    def __init__(self, split: StateSplit) -> None:
        super().__init__(split.key_groups)
        self.split = split


class StatekitReader(DataSourceReader):
    """Plans the read on the driver (splits and the resolved column types) and reads one split
    per task, streaming Arrow record batches."""

    def __init__(self, options: dict[str, str], schema: Any) -> None:
        state = _state(options)
        plan = _plan(state, options)
        self.layout, self.kind, self.key_config = state.layout, state.kind, state.key_config
        self.choices = plan.choices()  # executors rebuild the plan without sampling
        self.splits = state.splits(int(_option(options, "keyGroupSplits", 1)))
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        return [StatekitPartition(split) for split in self.splits]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from pyspark.sql.pandas.types import to_arrow_schema

        assert isinstance(partition, StatekitPartition)
        split = partition.split
        plan = RowPlan(self.layout, self.kind, lambda: None, key_config=self.key_config,
                       **self.choices)
        target = to_arrow_schema(self.schema, timezone="UTC")
        rng = None if split.key_groups is None else KeyGroupRange.of(split.key_groups)
        for batch in record_batches(plan, state_chunks(split.source, split.state, rng)):
            yield batch.cast(target) if batch.schema != target else batch


def register_data_source(spark: Any) -> None:
    """Make ``spark.read.format("statekit")`` available in ``spark`` (sessions normally find it
    themselves through the ``pyspark_statekit`` package)."""
    spark.dataSource.register(StatekitDataSource)
