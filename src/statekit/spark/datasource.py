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
``endpoint_url``).  Spark's ``statestore`` reader names work too (:data:`SPARK_NAMES`,
``snapshotPartitionId``, a change feed with ``readChangeFeed``); ``format("statekit-metadata")``
lists the operators and states of a location.  One Spark partition per statekit partition
(key-group range); the schema comes from the state's recorded descriptor type, untyped columns
inferred from its first entries.

The source is registered in every session by the ``pyspark_statekit`` package (Spark looks up
``pyspark_*`` modules with a ``DefaultSource``); :func:`register_data_source` registers it by hand.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from difflib import get_close_matches
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from statekit.errors import ConfigError
from statekit.inspection.arrow import RowPlan, record_batches
from statekit.inspection.changes import change_feed, feed_schema, pick_state, state_metadata
from statekit.inspection.stateview import StateSplit, StateView, state_chunks
from statekit.inspection.views import CheckpointView, open_checkpoint
from statekit.serde.keygroups import KeyGroupRange

FORMAT = "statekit"
METADATA_FORMAT = "statekit-metadata"


#: Spark's ``statestore`` reader option names, and statekit's name for the same option.
SPARK_NAMES = {"batchId": "batch", "operatorId": "operator", "stateVarName": "state",
               "readRegisteredTimers": "timers"}
_OWN = ("path", "state", "timers", "operator", "batch", "checkpointId", "keyType", "valueType",
        "keyGroupSplits", "snapshotsOnly", "includeTentative", "storageOptions")
_SPARK_ONLY = ("readChangeFeed", "changeStartBatchId", "changeEndBatchId", "snapshotStartBatchId",
               "snapshotPartitionId")
_NOT_HERE = {"joinSide": "stream-stream joins keep their state in Spark, not in statekit",
             "storeName": "statekit names a state by stateVarName (or state)"}


def read_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The reader's options by statekit's names (Spark's ``statestore`` names mapped; option
    names are case-insensitive, as Spark's), checked: an unknown or conflicting option is a
    ConfigError naming it."""
    known = {n.lower(): n for n in (*_OWN, *_SPARK_ONLY, *SPARK_NAMES)}
    out: dict[str, Any] = {}
    for key, value in options.items():
        name = known.get(key.lower())
        if name is None:
            reason = next((r for k, r in _NOT_HERE.items() if k.lower() == key.lower()), None)
            hint = get_close_matches(key, list(known.values()), 1)
            raise ConfigError(key, f"not an option of format({FORMAT!r})" + (
                f": {reason}" if reason else f"; did you mean {hint[0]!r}?" if hint else ""))
        own = SPARK_NAMES.get(name, name)
        if own in out and str(out[own]) != str(value):
            raise ConfigError(key, f"conflicts with the option naming the same thing ({own}="
                                   f"{out[own]!r})")
        out[own] = value
    if _flag(out, "readChangeFeed"):
        for clash in ("batch", "snapshotStartBatchId", "checkpointId"):
            if clash in out:
                raise ConfigError(clash, "cannot be combined with readChangeFeed (name the batches "
                                         "with changeStartBatchId / changeEndBatchId)")
        if "changeStartBatchId" not in out:
            raise ConfigError("changeStartBatchId", "readChangeFeed needs changeStartBatchId")
    elif "changeStartBatchId" in out or "changeEndBatchId" in out:
        raise ConfigError("readChangeFeed", 'changeStartBatchId / changeEndBatchId need '
                                            '.option("readChangeFeed", "true")')
    if "snapshotStartBatchId" in out:
        if "snapshotPartitionId" not in out:
            raise ConfigError("snapshotStartBatchId", "needs snapshotPartitionId, as in Spark")
        if "batch" in out and int(out["snapshotStartBatchId"]) > int(out["batch"]):
            raise ConfigError("snapshotStartBatchId", "must not be after batchId")
    return out


def _flag(options: Mapping[str, Any], name: str) -> bool:
    return str(options.get(name, "false")).lower() == "true"


def _int(options: Mapping[str, Any], name: str) -> int | None:
    value = options.get(name)
    try:
        return None if value is None else int(value)
    except ValueError:
        raise ConfigError(name, f"expected an integer, got {value!r}") from None


def _state(options: dict[str, Any]) -> StateView:
    path, name, timers = options.get("path"), options.get("state"), _flag(options, "timers")
    if not path:
        raise ConfigError("path", 'spark.read.format("statekit").load(PATH) needs a path')
    if bool(name) == timers:
        raise ConfigError("state", 'name the state to read: .option("state", NAME), or read the '
                                   'timers: .option("timers", "true") (one of them)')
    view = open_checkpoint(
        str(path), batch=_int(options, "batch"), checkpoint_id=_int(options, "checkpointId"),
        storage_options=_storage(options), include_tentative=_flag(options, "includeTentative"),
        snapshots_only=_flag(options, "snapshotsOnly"))
    return pick_state(view, name, timers, _operator(view, options.get("operator")))


def _storage(options: Mapping[str, Any]) -> dict[str, Any] | None:
    storage = options.get("storageOptions")
    return json.loads(storage) if storage else None


def _operator(view: CheckpointView, operator: Any) -> str | None:
    """An operator's name, or its index among the view's operators (Spark's ``operatorId``)."""
    if operator is None or str(operator) in view.operators:
        return None if operator is None else str(operator)
    if str(operator).isdigit() and int(operator) < len(view.operators):
        return view.operators[int(operator)]
    raise ConfigError("operator", f"no operator {operator!r} (operators: "
                                  f"{', '.join(view.operators) or 'none'})")


def _partition_splits(state: StateView, splits: list[StateSplit], partition: int
                      ) -> list[StateSplit]:
    """The splits of one partition (splits come per partition, in the order of its partitions;
    a Spark partition's key-group range need not tell it apart)."""
    groups: list[list[StateSplit]] = []
    for split in splits:
        if not groups or groups[-1][0].source is not split.source:
            groups.append([])
        groups[-1].append(split)
    chosen = [g for p, g in zip(state.partitions, groups, strict=True) if p.index == partition]
    if not chosen:
        raise ConfigError("snapshotPartitionId", f"no partition {partition} (partitions: "
                                                 f"{sorted(p.index for p in state.partitions)})")
    return chosen[0]


def _plan(state: StateView, options: Mapping[str, Any]) -> RowPlan:
    return state.plan(options.get("keyType", "auto"), options.get("valueType", "auto"))


def _schema(options: dict[str, Any]) -> Any:
    """The Arrow schema the options read: a state, or its change feed."""
    schema = _plan(_state(options), options).schema
    return feed_schema(schema) if _flag(options, "readChangeFeed") else schema


class StatekitDataSource(DataSource):
    """A batch data source reading one statekit state (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(_schema(read_options(self.options)))

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
        self.options = read_options(options)
        self.schema = schema
        self.feed = _flag(self.options, "readChangeFeed")
        if self.feed:  # one task computes the feed, batch by batch
            self.splits: list[StateSplit] = []
            return
        state = _state(self.options)
        plan = _plan(state, self.options)
        self.layout, self.kind, self.key_config = state.layout, state.kind, state.key_config
        self.choices = plan.choices()  # executors rebuild the plan without sampling
        self.splits = state.splits(int(self.options.get("keyGroupSplits", 1)))
        partition = _int(self.options, "snapshotPartitionId")
        if partition is not None:  # Spark's one-partition read
            self.splits = _partition_splits(state, self.splits, partition)

    def partitions(self) -> list[InputPartition]:
        if self.feed:
            return [InputPartition(0)]
        return [StatekitPartition(split) for split in self.splits]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from pyspark.sql.pandas.types import to_arrow_schema

        target = to_arrow_schema(self.schema, timezone="UTC")
        if self.feed:
            o = self.options
            batches = change_feed(
                str(o["path"]), int(o["changeStartBatchId"]), _int(o, "changeEndBatchId"),
                state=o.get("state"), timers=_flag(o, "timers"), operator=o.get("operator"),
                storage_options=_storage(o), key_type=o.get("keyType", "auto"),
                value_type=o.get("valueType", "auto"))
        else:
            assert isinstance(partition, StatekitPartition)
            split = partition.split
            plan = RowPlan(self.layout, self.kind, lambda: None, key_config=self.key_config,
                           **self.choices)
            rng = None if split.key_groups is None else KeyGroupRange.of(split.key_groups)
            batches = record_batches(plan, state_chunks(split.source, split.state, rng))
        for batch in batches:
            yield batch.cast(target) if batch.schema != target else batch


class StatekitMetadataSource(DataSource):
    """``spark.read.format("statekit-metadata").load(PATH)``: one row per operator and state
    under a location (Spark's ``state-metadata`` counterpart): ``operatorId``, ``operatorName``,
    ``stateName``, ``kind``, ``valueType``, ``numPartitions``, ``minBatchId``, ``maxBatchId``."""

    @classmethod
    def name(cls) -> str:
        return METADATA_FORMAT

    def schema(self) -> str:
        return ("operatorId int, operatorName string, stateName string, kind string, "
                "valueType string, numPartitions int, minBatchId long, maxBatchId long")

    def reader(self, schema: Any) -> DataSourceReader:
        return StatekitMetadataReader(self.options)


class StatekitMetadataReader(DataSourceReader):
    """Lists the location once, on the driver; one task returns the rows."""

    def __init__(self, options: dict[str, str]) -> None:
        known = {k.lower(): v for k, v in options.items()}
        extra = sorted(set(known) - {"path", "storageoptions"})
        if extra:
            raise ConfigError(extra[0], f"not an option of format({METADATA_FORMAT!r}) (it takes "
                                        "a path and storageOptions)")
        if not known.get("path"):
            raise ConfigError("path", f'spark.read.format("{METADATA_FORMAT}").load(PATH) needs '
                                      "a path")
        storage = known.get("storageoptions")
        self.rows = [tuple(r.values()) for r in state_metadata(
            known["path"], storage_options=json.loads(storage) if storage else None)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        yield from self.rows


def register_data_source(spark: Any) -> None:
    """Make ``spark.read.format("statekit")`` and ``format("statekit-metadata")`` available in
    ``spark`` (sessions normally find them themselves through the ``pyspark_statekit`` and
    ``pyspark_statekit_metadata`` packages)."""
    spark.dataSource.register(StatekitDataSource)
    spark.dataSource.register(StatekitMetadataSource)
