"""A native RocksDB checkpoint's files on local disk: downloaded whole, or only the SST files
that hold a rescaling restore's key groups, and the checks every reader makes once it opens them.

A native checkpoint's MANIFEST records every SST file's first and last key, and every key begins
with its key group: so the files that hold none of a restore's key groups are known from the
MANIFEST alone (a read-only open of the metadata files, no SST read).  A restore that copies keys
out of another partition's checkpoint downloads only the files kept, and RocksDB's repair writes
a MANIFEST of them (the copy reads them read-only; repair puts every file in level 0, which is why
a database restored to be written to is taken whole instead).  A checkpoint with entries in its
logs (changelog checkpoints) is read whole too: repair would replay every log entry, including
those its files already hold in a compacted form.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocksdict import AccessType, Options, Rdict

from statekit.backends.rocksdb.changelog import append_logs, join_pieces
from statekit.backends.rocksdb.encoding import raise_stopped
from statekit.backends.rocksdb.timers import column_families
from statekit.checkpoint.reader import FileCheck, StateReader
from statekit.errors import CorruptCheckpointError
from statekit.serde.keygroups import KeyGroupRange

Bounds = tuple[bytes, bytes]


def _key_group(key: bytes, max_parallelism: int) -> int:
    """The key group a key (or a range tombstone's bound) sorts in, clamped to the job's range."""
    return min(int.from_bytes(key[:2].ljust(2, b"\0"), "big"), max_parallelism - 1)


def _probe(path: Path, options_factory: Callable[[], Options]) -> tuple[dict[str, Bounds], set[str]]:
    """Every live SST file's ``(first key, last key)`` and the column families of the database
    at ``path``, read from its MANIFEST: opened read-only without opening any table file."""
    options = options_factory()
    options.set_max_open_files(64)  # not -1: no table file is opened to list them
    options.set_max_file_opening_threads(1)
    options.set_paranoid_checks(False)  # the table files are absent; the MANIFEST's CRC was checked
    try:
        names = set(Rdict.list_cf(str(path), options))
        db = Rdict(str(path), options, column_families={n: options_factory() for n in names
                                                        if n != "default"},
                   access_type=AccessType.read_only(False))
    except Exception as exc:  # rocksdict raises bare exceptions
        raise CorruptCheckpointError(f"cannot read the MANIFEST of a RocksDB checkpoint: {exc}"
                                     ) from exc
    try:
        files = {f["name"].lstrip("/"): (f["start_key"], f["end_key"]) for f in db.live_files()}
    finally:
        db.close()
    return files, names


class Subset:
    """The SST files of a native handle that a restore of ``want`` needs (:meth:`plan`), and the
    database built of them alone (:meth:`build`)."""

    def __init__(self, families: set[str], keep: set[str],
                 options_factory: Callable[[], Options]) -> None:
        self.families = families
        self.keep = keep
        self.options_factory = options_factory
        self.present: set[str] = set()  # the column families the kept files hold (build)

    @classmethod
    def plan(cls, handle: dict[str, Any], reader: StateReader, want: KeyGroupRange,
             max_parallelism: int, options_factory: Callable[[], Options], probe: Path
             ) -> Subset | None:
        """The files to read for the key groups ``want`` of this handle, or None when the whole
        checkpoint is read (every file needed, or entries in logs).  ``probe`` is
        a scratch directory for the metadata files, removed afterwards."""
        if handle.get("changelog") or any(
                name.endswith(".log") and int(h.get("size", 1)) > 0
                for name, h in handle.get("misc", {}).items()):
            return None  # entries in logs: only a whole open replays them in order
        ssts = set(handle.get("sst", {})) | set(handle.get("pieces", {}))
        try:
            probe.mkdir(parents=True)
            for name, file_handle in handle.get("misc", {}).items():
                if name == "CURRENT" or name.startswith(("MANIFEST-", "OPTIONS-")):
                    reader.read_file(file_handle, probe / name)
            bounds, families = _probe(probe, options_factory)
        finally:
            shutil.rmtree(probe, ignore_errors=True)
        if set(bounds) - ssts:
            missing = sorted(set(bounds) - ssts)[0]
            raise CorruptCheckpointError(
                f"the MANIFEST of a RocksDB checkpoint names {missing}, which its handle lacks")
        keep = {name for name, (first, last) in bounds.items()
                if _key_group(first, max_parallelism) <= want.end
                and _key_group(last, max_parallelism) >= want.start}
        if len(keep) == len(bounds):
            return None
        return cls(families, keep, options_factory)

    def build(self, dest: Path) -> None:
        """Write a MANIFEST for the kept files downloaded in ``dest`` (RocksDB's repair), then
        check that repair kept each of them whole: a file it could not read would otherwise be
        left out silently (the files' own CRC-32 checks are the download's)."""
        try:
            Rdict.repair(str(dest), self.options_factory())
            got, self.present = _probe(dest, self.options_factory)
        except CorruptCheckpointError:
            raise
        except Exception as exc:
            raise CorruptCheckpointError(f"cannot rebuild a RocksDB checkpoint's files: {exc}"
                                         ) from exc
        if set(got) != self.keep:
            odd = sorted(set(got) ^ self.keep)[0]
            raise CorruptCheckpointError(
                f"rebuilding a RocksDB checkpoint's files for a rescale left out or added {odd}")


def download_native(handle: dict[str, Any], reader: StateReader, dest: Path,
                    pool_map: Callable[[Callable[[Any], Any], list[Any]], list[Any]] | None = None,
                    progress: Callable[[int], None] | None = None,
                    deferred: list[FileCheck] | None = None, only: Subset | None = None) -> None:
    """Download the files of a native RocksDB checkpoint handle into ``dest`` (each verified for
    size and CRC-32), on ``pool_map``'s threads when given; ``progress(n)`` per file's bytes.
    With ``deferred``, the CRC-32 checks of hard-linked SST files are appended to it instead.
    SSTs uploaded in pieces are joined, every piece checked as it is read.  With ``only``, just
    the SST files it keeps, and a MANIFEST is built for them."""
    dest.mkdir(parents=True, exist_ok=True)
    files = list(handle.get("sst", {}).items()) + list(handle.get("misc", {}).items())
    pieces = handle.get("pieces", {})
    if not isinstance(pieces, dict):
        raise CorruptCheckpointError("malformed pieces in a RocksDB checkpoint")
    bad = [name for name in [*(name for name, _ in files), *pieces]
           if not isinstance(name, str) or "/" in name or name.startswith(".") or not name]
    bad += [name for name in pieces if isinstance(name, str) and not name.endswith(".sst")]
    if bad:
        raise CorruptCheckpointError(f"unsafe file name {bad[0]!r} in a RocksDB checkpoint")

    def fetch(item: tuple[str, dict[str, Any]]) -> None:
        # SST files are immutable: a local-disk store may hard-link them (Flink's local
        # recovery); MANIFEST, CURRENT, OPTIONS... are copied, RocksDB may rewrite them
        name, file_handle = item
        sst = name.endswith(".sst")
        reader.read_file(file_handle, dest / name, allow_link=sst,
                         deferred=deferred if sst else None)
        if progress is not None:
            progress(int(file_handle.get("size", 0)))

    def join(item: tuple[str, Any]) -> None:
        join_pieces(item[0], item[1], reader, dest)
        if progress is not None:
            progress(int(item[1]["size"]))

    work = [(fetch, item) for item in files] + [(join, item) for item in pieces.items()]
    if only is not None:
        work = [(fn, item) for fn, item in work if item[0] in only.keep]
    if pool_map is None:
        for fn, item in work:
            fn(item)
    else:
        pool_map(lambda job: job[0](job[1]), work)
    if only is not None:
        only.build(dest)
        return
    append_logs(handle, reader, dest)  # a changelog checkpoint: RocksDB replays them on open


def _check_recorded_range(cf: Rdict, name: str, recorded: KeyGroupRange) -> None:
    """CorruptCheckpointError unless the column family's keys lie in the key groups its
    checkpoint records (keys sort by key group: the first and the last one tell)."""
    it = cf.iter()
    try:
        for seek in (it.seek_to_first, it.seek_to_last):
            seek()
            if not it.valid():
                raise_stopped(it)  # (empty, or unreadable)
                return
            key = it.key()
            if len(key) < 2 or int.from_bytes(key[:2], "big") not in recorded:
                raise CorruptCheckpointError(
                    f"state '{name}': the checkpoint holds keys outside the key groups "
                    f"{recorded.start}..{recorded.end} it records")
    finally:
        del it


def check_native_db(db: Rdict, handle: dict[str, Any], only: Subset | None = None) -> None:
    """The checks every reader of a native RocksDB checkpoint makes once it is opened: each
    state the handle records has its column family, holding keys only of the key groups the
    handle records (a handle relabelled with another range, or a state renamed, would otherwise
    read as empty).  With ``only``, a column family its MANIFEST records but the kept files do
    not hold is empty here, and skipped."""
    recorded = KeyGroupRange.of(handle["key_group_range"])
    for name in column_families(handle["states"]):
        if only is not None and name in only.families and name not in only.present:
            continue
        try:
            cf = db.get_column_family(name)
        except Exception:  # rocksdict raises a bare Exception for a missing column family
            raise CorruptCheckpointError(
                f"state '{name}' has no column family in its RocksDB checkpoint") from None
        try:
            _check_recorded_range(cf, name, recorded)
        finally:
            del cf
