"""Fault injection for checkpoint storage tests: an fsspec file system that fails, delays,
truncates or kills on chosen operations, and a hook that kills the process at the k-th operation.

Use it as a chained URL, ``faulty::s3://bucket/prefix`` or ``faulty::memory://x``, with the plan
passed as storage options::

    plan = FaultPlan([Fault("pipe_file", action="error", path="*/_metadata", times=2)])
    storage = FileSystemCheckpointStorage("faulty::memory://ckpt",
                                          storage_options={"faulty": {"plan": plan.register()}})

Plans live in this process (registered by name, because storage options must stay picklable).
"""

from __future__ import annotations

import fnmatch
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

import fsspec
from fsspec.implementations.chained import ChainedFileSystem

from statekit.checkpoint.blobstore import set_operation_hook
from statekit.checkpoint.blobstore.retry import TransientStorageError

#: operations a :class:`Fault` can target ("*" matches all of them)
OPERATIONS = ("pipe_file", "cat_file", "open", "rm_file", "find", "exists", "info", "ls")

#: environment variable read by :func:`install_kill_hook_from_env`
KILL_AT_ENV = "STATEKIT_FAULT_KILL_AT"


@dataclass
class Fault:
    """One rule: on matching calls of ``op`` (fnmatch ``path``), do ``action``.

    ``action``: ``error`` (raise ``error``), ``delay`` (sleep ``delay`` s, then run), ``truncate``
    (write or return only ``keep`` bytes, silently), ``kill`` (SIGKILL this process).  The first
    ``skip`` matching calls pass; then ``times`` calls are affected (None: all of them).
    """

    op: str
    action: str = "error"
    path: str = "*"
    times: int | None = 1
    skip: int = 0
    error: BaseException | type[BaseException] = TransientStorageError
    delay: float = 0.0
    keep: int = 0
    seen: int = field(default=0, init=False)
    fired: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.op != "*" and self.op not in OPERATIONS:
            raise ValueError(f"unknown operation {self.op!r}; expected one of {OPERATIONS}")
        if self.action not in ("error", "delay", "truncate", "kill"):
            raise ValueError(f"unknown action {self.action!r}")

    def matches(self, op: str, path: str) -> bool:
        return self.op in ("*", op) and fnmatch.fnmatchcase(path, self.path)


class FaultPlan:
    """An ordered list of faults plus a log of every call (``calls``) and fault fired (``fired``)."""

    _registry: ClassVar[dict[str, FaultPlan]] = {}

    def __init__(self, faults: list[Fault] | None = None) -> None:
        self.faults = list(faults or [])
        self.calls: list[tuple[str, str]] = []
        self.fired: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        self.name: str | None = None

    def register(self, name: str | None = None) -> str:
        """Make the plan findable by name (for storage options); returns the name."""
        self.name = name or f"plan-{uuid.uuid4().hex[:8]}"
        FaultPlan._registry[self.name] = self
        return self.name

    @classmethod
    def lookup(cls, plan: FaultPlan | str | None) -> FaultPlan:
        if isinstance(plan, FaultPlan):
            return plan
        if plan is None:
            return FaultPlan()
        return cls._registry[plan]

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def decide(self, op: str, path: str) -> Fault | None:
        """The fault to apply to this call, if any (counting it)."""
        with self._lock:
            self.calls.append((op, path))
            for fault in self.faults:
                if not fault.matches(op, path):
                    continue
                fault.seen += 1
                if fault.seen <= fault.skip:
                    continue
                if fault.times is not None and fault.fired >= fault.times:
                    continue
                fault.fired += 1
                self.fired.append((op, path, fault.action))
                return fault
        return None

    def count(self, op: str) -> int:
        with self._lock:
            return sum(1 for o, _ in self.calls if o == op)


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class FaultyFileSystem(ChainedFileSystem):
    """Wraps another fsspec file system, injecting the faults of a :class:`FaultPlan`."""

    protocol: ClassVar[str] = "faulty"  # type: ignore[misc]
    root_marker = ""

    def __init__(self, target_protocol: str | None = None, target_options: dict[str, Any] | None = None,
                 fs: Any = None, plan: FaultPlan | str | None = None, fo: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if fs is None:
            fs = fsspec.filesystem(target_protocol or "memory", **(target_options or {}))
        self.target = fs
        self.plan = FaultPlan.lookup(plan)

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        path = str(path)
        return path[len("faulty://"):] if path.startswith("faulty://") else path

    def _apply(self, op: str, path: str) -> Fault | None:
        fault = self.plan.decide(op, str(path))
        if fault is None:
            return None
        if fault.action == "kill":
            _kill()
        if fault.action == "delay":
            time.sleep(fault.delay)
            return None
        if fault.action == "error":
            error = fault.error
            raise error(f"injected fault on {op} {path}") if isinstance(error, type) else error
        return fault  # truncate: the operation applies it

    # --- forwarded operations --------------------------------------------------------------------

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        fault = self._apply("pipe_file", path)
        if fault is not None:
            value = bytes(value)[: fault.keep]
        self.target.pipe_file(path, value, **kwargs)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None,
                 **kwargs: Any) -> bytes:
        fault = self._apply("cat_file", path)
        data = self.target.cat_file(path, start=start, end=end, **kwargs)
        return data[: fault.keep] if fault is not None else data

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        self._apply("open", path)
        return self.target.open(path, mode, **kwargs)

    def rm_file(self, path: str) -> None:
        self._apply("rm_file", path)
        self.target.rm_file(path)

    def find(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self._apply("find", path)
        return self.target.find(path, *args, **kwargs)

    def exists(self, path: str, **kwargs: Any) -> bool:
        self._apply("exists", path)
        return bool(self.target.exists(path, **kwargs))

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self._apply("info", path)
        return dict(self.target.info(path, **kwargs))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        self._apply("ls", path)
        return self.target.ls(path, detail=detail, **kwargs)

    def invalidate_cache(self, path: str | None = None) -> None:
        self.target.invalidate_cache(path)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        self.target.mkdir(path, create_parents=create_parents, **kwargs)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.target.makedirs(path, exist_ok=exist_ok)


fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)


# --- killing the process between two file operations -------------------------------------------


class KillSwitch:
    """An operation hook for :func:`statekit.checkpoint.blobstore.set_operation_hook` that counts
    blob-store file operations and SIGKILLs the process just before operation ``kill_at``
    (1-based; 0 never kills).  ``log`` records the operations seen."""

    def __init__(self, kill_at: int = 0) -> None:
        self.kill_at = kill_at
        self.count = 0
        self.log: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, operation: str, path: str) -> None:
        with self._lock:
            self.count += 1
            self.log.append((operation, path))
            if self.kill_at and self.count >= self.kill_at:
                _kill()

    def install(self) -> KillSwitch:
        set_operation_hook(self)
        return self


def install_kill_hook_from_env() -> KillSwitch | None:
    """Install a :class:`KillSwitch` when ``STATEKIT_FAULT_KILL_AT`` is set (crash tests)."""
    value = os.environ.get(KILL_AT_ENV)
    if value is None:
        return None
    return KillSwitch(int(value)).install()
