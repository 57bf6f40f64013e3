"""``statekit spark import-state``: bring a stopped native Spark query's state along to statekit
(:func:`statekit.spark.compat.import_state`), with a local SparkSession."""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

import click

from statekit.cli import output
from statekit.cli.commands import _storage_options, common, main
from statekit.errors import ConfigError


@main.group()
def spark() -> None:
    """Spark queries: bring a native query's state along to statekit."""


def load_function(spec: str) -> Any:
    """``module:name`` as the object the query runs: a ``StatefulProcessor`` (a subclass is
    instantiated without arguments) or an ``applyInPandasWithState`` function."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError("--function", f"expected module:name, got {spec!r}")
    if "" not in sys.path:  # the user's modules, from the directory the command runs in
        sys.path.insert(0, "")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError("--function", f"cannot load {spec}: {exc}") from None
    if inspect.isclass(found) and issubclass(found, StatefulProcessor):
        found = found()
    return found


@spark.command("import-state")
@click.argument("source")
@click.argument("target")
@click.option("--function", "function_spec", required=True, metavar="MODULE:NAME",
              help="The query's StatefulProcessor (class or instance) or applyInPandasWithState "
                   "function, importable from the current directory.")
@click.option("--backend", help="statekit backend (hashmap, rocksdb); default from --conf.")
@click.option("--output-mode", help="applyInPandasWithState: the query's outputMode.")
@click.option("--timeout", "timeout_conf",
              help="applyInPandasWithState: the query's GroupStateTimeout (NoTimeout, "
                   "ProcessingTimeTimeout, EventTimeTimeout).")
@click.option("--state-schema", help="applyInPandasWithState: its stateStructType (DDL); "
                                     "default: the source's.")
@click.option("--conf", "conf_pairs", multiple=True, metavar="KEY=VALUE",
              help="statekit setting (e.g. state.backend.type=rocksdb); repeatable.")
@common
def import_state(source: str, target: str, function_spec: str, backend: str | None,
                 output_mode: str | None, timeout_conf: str | None, state_schema: str | None,
                 conf_pairs: tuple[str, ...], as_json: bool, storage_options: dict[str, Any]
                 ) -> None:
    """Write the state of the stopped query at SOURCE (its checkpointLocation), as of its last
    committed batch, as statekit state into the new checkpoint location TARGET; start the same
    query, switched to statekit, from TARGET."""
    from pyspark.sql import SparkSession

    from statekit.spark.compat import import_state as run_import
    from statekit.spark.session import local_spark

    conf = {key: str(value) for key, value in _storage_options(conf_pairs).items()}
    if backend:
        conf["state.backend.type"] = backend
    function = load_function(function_spec)
    session = SparkSession.getActiveSession() or local_spark(app_name="statekit-import")
    result = run_import(session, source, target, function, stateStructType=state_schema,
                        outputMode=output_mode, timeoutConf=timeout_conf, conf=conf)
    if as_json:
        output.emit_json(result.__dict__)
    else:
        output.line(f"imported {result.keys} keys ({result.entries} entries, {result.timers} "
                    f"timers) of batch {result.batch_id} into {result.target} "
                    f"({result.backend}, operator {result.operator_id}); start the switched "
                    f"query from there")
