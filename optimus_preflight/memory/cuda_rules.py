"""What a CUDA GPU adds to the bytes of live tensors: allocator rounding, segments, overheads.

The numbers follow PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp) with
its default settings (no ``expandable_segments``, no ``roundup_power2_divisions``, no
``max_split_size_mb``, one stream):

- every request is rounded up to a multiple of 512 bytes (``kMinBlockSize``);
- requests up to 1 MiB come from a small pool carved out of 2 MiB segments, larger
  ones from a large pool; a large request under 10 MiB takes a 20 MiB segment and a
  larger one a segment rounded up to 2 MiB;
- a free block is reused best-fit; it is split when the rest is at least 512 bytes
  (small pool) or more than 1 MiB (large pool); otherwise the whole block is handed
  out, and ``torch.cuda.memory_allocated`` counts the whole block.

``CachingAllocatorModel`` replays the allocations and frees of a traced step through
these rules and reports the peaks of allocated and reserved (segment) bytes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from itertools import count

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
MIN_LARGE_ALLOC = 10 << 20
LARGE_BUFFER = 20 << 20
ROUND_LARGE = 2 << 20

# Not tensor storages, so outside peak_bytes, but they occupy the GPU:
# - the CUDA context with PyTorch's kernels (lazy module loading) is typically
#   300-600 MiB on A100/H100-class GPUs; it is not in torch.cuda.memory_allocated.
# - cuBLAS/cuBLASLt workspaces come from the caching allocator (so they are in
#   memory_allocated): 32 MiB per (handle, stream) on sm90+ GPUs (8.125 MiB before),
#   and the forward thread and the autograd engine's device thread use one each.
CUDA_CONTEXT_BYTES = 512 << 20
CUBLAS_WORKSPACE_BYTES = 32 << 20
CUBLAS_WORKSPACES = 2


def round_size(nbytes: int) -> int:
    """Bytes the allocator hands out for a request (0 stays 0: no block is allocated)."""
    if nbytes <= 0:
        return 0
    return MIN_BLOCK * ((nbytes + MIN_BLOCK - 1) // MIN_BLOCK)


def segment_size(rounded: int) -> int:
    """Size of the cudaMalloc made when no cached block fits a request."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((rounded + ROUND_LARGE - 1) // ROUND_LARGE)


def library_workspace_bytes() -> int:
    return CUBLAS_WORKSPACE_BYTES * CUBLAS_WORKSPACES


@dataclass(eq=False)
class _Block:
    address: int
    size: int
    small: bool
    allocated: bool = False
    prev: _Block | None = None
    next: _Block | None = None


@dataclass
class CachingAllocatorModel:
    """Best-fit block reuse with splitting and merging, per PyTorch's default rules."""

    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    _free: dict[bool, list[tuple[int, int, _Block]]] = field(default_factory=lambda: {True: [], False: []})
    _live: dict[int, _Block] = field(default_factory=dict)
    _addresses: count = field(default_factory=count)

    def malloc(self, key: int, nbytes: int) -> None:
        size = round_size(nbytes)
        if size == 0:
            return
        small = size <= SMALL_SIZE
        block = self._take_free(small, size)
        if block is None:
            segment = segment_size(size)
            block = _Block(next(self._addresses) * (1 << 44), segment, small)
            self.reserved += segment
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        remaining = block.size - size
        if (small and remaining >= MIN_BLOCK) or (not small and remaining > SMALL_SIZE):
            rest = _Block(block.address + size, remaining, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert_free(rest)
        block.allocated = True
        self._live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: int) -> None:
        block = self._live.pop(key, None)
        if block is None:
            return
        self.allocated -= block.size
        block.allocated = False
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._remove_free(neighbour)
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._insert_free(block)

    def _take_free(self, small: bool, size: int) -> _Block | None:
        pool = self._free[small]
        index = bisect.bisect_left(pool, (size, -1))
        if index == len(pool):
            return None
        return pool.pop(index)[2]

    def _insert_free(self, block: _Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.address, block))

    def _remove_free(self, block: _Block) -> None:
        pool = self._free[block.small]
        index = bisect.bisect_left(pool, (block.size, block.address))
        if index < len(pool) and pool[index][2] is block:
            pool.pop(index)
