"""Local recovery for the local runner and the Spark adapters: where each task's local copies
live, who owns them, and a restore that prefers them and falls back to checkpoint storage.

On the local runner a job owns one working directory under ``taskmanager.state.local.root-dirs``
(default ``<temp dir>/statekit-localstate``), removed when the job ends (or by the sweep of dead
owners' directories), so its tasks find their copies after a restart within the job.  On Spark
the executor owns them: they live under the executor's local directories (``spark.local.dir``,
which Spark removes when the executor stops), so a task retried in a new Python worker on the
same executor finds the copy its predecessor kept.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from statekit import config as cfg
from statekit import workdirs
from statekit.backends.base import KeyedStateBackend, RestoreSource
from statekit.backends.transfer import restore_into
from statekit.checkpoint.localstate import FallbackReader, TaskLocalStateStore
from statekit.checkpoint.streams import safe_name
from statekit.errors import StatekitError

log = logging.getLogger("statekit.localrecovery")

ENABLED_KEY = "state.backend.local-recovery"
ROOT_DIRS_KEY = "taskmanager.state.local.root-dirs"
#: the directory statekit makes under a root for its local copies
ROOT_NAME = "statekit-localstate"
#: the name of a job's directory under a root (``job-<pid>-<random>``): a job sweeps those of
#: jobs whose process died
JOB_PREFIX = "job-"


def enabled(conf: Mapping[str, Any]) -> bool:
    """Whether ``state.backend.local-recovery`` is on in the flat configuration ``conf``."""
    return bool(cfg.read(conf, ENABLED_KEY))


def root_dirs(conf: Mapping[str, Any]) -> list[str]:
    """``taskmanager.state.local.root-dirs`` as absolute paths (comma- or OS-separated)."""
    value = conf.get(ROOT_DIRS_KEY)
    if value in (None, ""):
        return [os.path.join(tempfile.gettempdir(), ROOT_NAME)]
    parts = [p.strip() for p in re.split(f"[,;{re.escape(os.pathsep)}]", str(value)) if p.strip()]
    return [os.path.abspath(os.path.expanduser(p)) for p in parts]


class JobLocalState:
    """The local copies of one job's tasks: one owned working directory per root, gone with the
    job."""

    def __init__(self, roots: list[str], job_id: str) -> None:
        self.roots = roots
        self.job_id = job_id
        self.tasks: dict[str, TaskLocalStateStore] = {}
        self._dirs: dict[str, Path] = {}

    def task(self, index: int, name: str, scope: str) -> TaskLocalStateStore:
        """The store of task ``name``, on root ``index`` mod the roots (as Flink spreads
        subtasks over its root directories)."""
        store = self.tasks.get(name)
        if store is None:
            root = self.roots[index % len(self.roots)]
            owned = self._dirs.get(root)
            if owned is None:
                owned = self._dirs[root] = workdirs.create(root, JOB_PREFIX)
            store = self.tasks[name] = TaskLocalStateStore(owned, owned / safe_name(name), scope)
        return store

    def dispose(self) -> None:
        """Delete every copy of the job (it ends)."""
        for store in self.tasks.values():
            store.dispose()
        self.tasks.clear()
        for owned in self._dirs.values():
            workdirs.remove(owned)
        self._dirs.clear()


_process_dir: Path | None = None
_process_lock = threading.Lock()


def executor_root() -> Path:
    """The directory of this Spark executor's local copies: under its first local directory
    (``SPARK_LOCAL_DIRS``, set by Spark for its Python workers), outside Spark a directory this
    process owns."""
    global _process_dir
    spark_dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
    if spark_dirs:
        return Path(spark_dirs[0]) / ROOT_NAME
    with _process_lock:
        if _process_dir is None or not _process_dir.is_dir():
            _process_dir = workdirs.create(os.path.join(tempfile.gettempdir(), ROOT_NAME), "proc-")
        return _process_dir


def partition_store(location: str, query_id: str, operator_id: str,
                    partition: int) -> TaskLocalStateStore:
    """The local store of one partition of one operator of one query on this executor."""
    base = executor_root()
    where = base / safe_name(query_id)[:64] / safe_name(operator_id)[:64] / f"p{partition:05d}"
    return TaskLocalStateStore(base, where, location)


def restore_preferring_local(create: Callable[[], KeyedStateBackend],
                             sources: list[RestoreSource],
                             local: list[Any], **options: Any) -> tuple[KeyedStateBackend, str]:
    """A new backend (``create``) holding ``sources``, reading each from its local reader in
    ``local`` (None: checkpoint storage) when one is given; ``(backend, source)``, source being
    ``"local"``, ``"mixed"`` or ``"remote"``.  A local copy failing anywhere during the restore
    (a checksum, a vanished file) throws the partly restored backend away and restores again
    from checkpoint storage alone, so no state ever comes from a partial local copy; what a
    lazy restore reads after the restore returned falls back read by read, each read checked
    against the same checksums."""
    used = [reader for reader in local if reader is not None]
    if used:
        backend = create()
        readers = [FallbackReader(reader, fallback) if reader is not None else fallback
                   for (_, fallback), reader in zip(sources, local, strict=True)]
        try:
            restore_into(backend, [(handle, reader) for (handle, _), reader
                                   in zip(sources, readers, strict=True)], **options)
            for reader in readers:  # what a lazy restore reads later falls back part by part
                if isinstance(reader, FallbackReader):
                    reader.arm()
            return backend, "local" if len(used) == len(sources) else "mixed"
        except (StatekitError, OSError) as exc:
            backend.dispose()
            log.warning("restoring from the local copy failed (%s); restoring from checkpoint "
                        "storage instead", exc)
    backend = create()
    try:
        restore_into(backend, sources, **options)
    except BaseException:
        backend.dispose()
        raise
    return backend, "remote"
