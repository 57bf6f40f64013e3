"""The configuration reference (``docs/configuration.md``), generated from the option table."""

from __future__ import annotations

from statekit.config import OPTIONS


def reference_markdown() -> str:
    """The configuration reference (``docs/configuration.md``), generated from :data:`OPTIONS`."""
    lines = [
        "# Configuration reference",
        "",
        "Every key statekit reads, generated from the code.",
        "A key is given as written here (its Flink name; Flink 1.x and 2 aliases are accepted) in the",
        "dict passed to `StreamExecutionEnvironment.get_execution_environment` or `env.configure`, on",
        "Spark as `spark.statekit.<key>` (Spark conf, or the adapters' `conf=`), or as an environment",
        "variable. Malformed values, and unknown keys in statekit's namespaces, raise",
        "`statekit.errors.ConfigError` naming the key (or the variable: every `STATEKIT_*` variable",
        "is checked, also one the job's configuration overrides). A Spark adapter refuses the keys",
        "only the local runner acts on (the checkpoint interval and its siblings,",
        "`state.checkpoints.num-retained`, `restart-strategy.*`, `parallelism.default`,",
        "`AT_LEAST_ONCE`), naming the Spark setting that does their job. A key of the other state",
        "backend (`state.backend.rocksdb.*` with the heap backend, `state.backend.heap.*` with",
        "RocksDB) is refused too: it could not take effect.",
        "",
        "| key | default | aliases | environment variable | meaning |",
        "|---|---|---|---|---|",
    ]
    for option in OPTIONS:
        aliases = ", ".join(f"`{a}`" for a in option.aliases) or ""
        lines.append(f"| `{option.key}` | {option.default} | {aliases} | `{option.env_var}` | "
                     f"{option.doc} |")
    return "\n".join(lines) + "\n"
