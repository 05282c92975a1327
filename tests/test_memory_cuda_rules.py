"""The CUDA caching allocator's rounding and a replay of its block reuse."""

from __future__ import annotations

from optimus_preflight.memory.cuda_rules import CachingAllocatorModel, round_size, segment_size

MIB = 1 << 20


def test_requests_round_up_to_512_bytes():
    assert [round_size(n) for n in (0, 1, 511, 512, 513, 4096, 4097)] == [0, 512, 512, 512, 1024, 4096, 4608]


def test_segment_sizes_follow_the_small_medium_large_rules():
    assert segment_size(512) == 2 * MIB  # small pool: 2 MiB segments
    assert segment_size(1 * MIB) == 2 * MIB
    assert segment_size(1 * MIB + 512) == 20 * MIB  # 1-10 MiB: a 20 MiB segment to split
    assert segment_size(10 * MIB) == 10 * MIB  # from 10 MiB: rounded up to 2 MiB
    assert segment_size(11 * MIB) == 12 * MIB


def test_small_blocks_share_a_segment_and_freed_blocks_are_reused():
    allocator = CachingAllocatorModel()
    for key in range(4):
        allocator.malloc(key, 1000)
    assert allocator.allocated == 4 * 1024 and allocator.reserved == 2 * MIB
    allocator.free(1)
    allocator.malloc(10, 900)  # fits the freed 1024-byte block: no new segment
    assert allocator.reserved == 2 * MIB and allocator.allocated == 4 * 1024


def test_large_block_remainders_under_1_mib_are_not_split_off():
    allocator = CachingAllocatorModel()
    allocator.malloc(1, 12 * MIB)
    allocator.free(1)
    # 11.5 MiB reuses the 12 MiB block; the 0.5 MiB rest is too small to split, so the
    # whole block counts as allocated (as torch.cuda.memory_allocated reports it).
    allocator.malloc(2, 11 * MIB + MIB // 2)
    assert allocator.allocated == 12 * MIB and allocator.reserved == 12 * MIB


def test_freed_neighbours_merge_so_a_larger_request_fits_without_a_new_segment():
    allocator = CachingAllocatorModel()
    allocator.malloc(1, 2 * MIB)  # carves a 20 MiB segment
    allocator.malloc(2, 2 * MIB)
    assert allocator.reserved == 20 * MIB
    allocator.free(1)
    allocator.free(2)
    allocator.malloc(3, 18 * MIB)
    assert allocator.reserved == 20 * MIB and allocator.peak_reserved == 20 * MIB
    assert allocator.peak_allocated == 18 * MIB
