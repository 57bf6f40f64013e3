"""Bounded RocksDB memory, as Flink's managed memory bounds it: every RocksDB instance of a
process shares one LRU block cache and one write-buffer manager charged to that cache, so
memtables, index and filter blocks and data blocks together stay within one budget however many
states, partitions and timer queues the process holds.

statekit's slot is the Python process running the partitions (the local runner; on Spark each
Python worker, one per running task), so ``state.backend.rocksdb.memory.fixed-per-slot`` is the
budget of one process.  Without it, a managed process gets Flink's managed memory of a 1 GB,
1-slot TaskManager.  The split between cache and write buffers is Flink's
(``RocksDBMemoryControllerUtils``): write buffers may take ``2/3 * ratio`` of the budget and the
cache ``(3 - ratio)/3`` of it, since RocksDB lets memtables overshoot their limit by half.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from rocksdict import BlockBasedOptions, Cache, Options, WriteBufferManager

#: Flink's default managed memory of a 1 GB, 1-slot TaskManager (its RocksDB benchmarks' budget)
DEFAULT_MANAGED_BYTES = 322_122_552
DEFAULT_ARENA_BLOCK = 8 << 20  # RocksDB's: the default 64 MB write buffer / 8
MANAGED_KEY = "state.backend.rocksdb.memory.managed"
FIXED_KEY = "state.backend.rocksdb.memory.fixed-per-slot"
RATIO_KEY = "state.backend.rocksdb.memory.write-buffer-ratio"


@dataclass(frozen=True)
class RocksDBMemoryConfiguration:
    """How much memory the process's RocksDB instances share (Flink's names and defaults)."""

    managed: bool = True
    fixed_per_slot: int | None = None
    write_buffer_ratio: float = 0.5

    def budget(self) -> int | None:
        """Bytes shared by the process's instances; None when memory is not bounded."""
        if self.fixed_per_slot is not None:
            return self.fixed_per_slot
        return DEFAULT_MANAGED_BYTES if self.managed else None


class SharedMemory:
    """The cache and write-buffer manager one budget's instances share."""

    def __init__(self, budget: int, write_buffer_ratio: float) -> None:
        self.budget = budget
        self.cache_capacity = int(budget * (3 - write_buffer_ratio) / 3)
        self.write_buffer_capacity = int(2 * budget * write_buffer_ratio / 3)
        self.cache = Cache(self.cache_capacity)
        self.write_buffers = WriteBufferManager.new_write_buffer_manager_with_cache(
            self.write_buffer_capacity, False, self.cache)

    def usage(self) -> int:
        """Bytes the cache holds now (memtables are charged to it)."""
        return int(self.cache.get_usage())


_shared: dict[tuple[int, float], SharedMemory] = {}
_lock = threading.Lock()


def shared_memory(config: RocksDBMemoryConfiguration) -> SharedMemory | None:
    """This process's shared cache and write-buffer manager for ``config`` (None: unbounded)."""
    budget = config.budget()
    if budget is None:
        return None
    with _lock:
        memory = _shared.get((budget, config.write_buffer_ratio))
        if memory is None:
            memory = _shared[(budget, config.write_buffer_ratio)] = SharedMemory(
                budget, config.write_buffer_ratio)
        return memory


def apply_memory(opts: Options, table: BlockBasedOptions, memory: SharedMemory,
                 write_buffer_size: int = 64 << 20) -> None:
    """Put an instance's block cache, index and filter blocks and memtables in the budget."""
    table.set_block_cache(memory.cache)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    opts.set_block_based_table_factory(table)
    opts.set_write_buffer_manager(memory.write_buffers)
    # a memtable allocates in arena blocks (a write buffer's 1/8: 8 MB by default); a small
    # budget would be spent by the first blocks of a few memtables, so they shrink with it; and
    # never past a write buffer's 1/8 (RocksDB's own): a block larger than the write buffer
    # makes every write switch the memtable (a flush per write with writebuffer.size 1 mb)
    opts.set_arena_block_size(max(4096, min(DEFAULT_ARENA_BLOCK, memory.write_buffer_capacity // 16,
                                             write_buffer_size // 8)))
