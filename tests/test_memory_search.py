"""The largest micro-batch that fits: search against brute force, and batch resizing."""

from __future__ import annotations

import pytest
import torch

from optimus_preflight.memory.search import largest_fitting_batch, resize_batch


def brute_force(need, limit, upper):
    return max((n for n in range(1, upper + 1) if need(n) <= limit), default=0)


@pytest.mark.parametrize("current", [1, 3, 16, 200])
@pytest.mark.parametrize("limit", [50, 1_000, 5_000, 10**9])
def test_search_finds_the_largest_fitting_size(current, limit):
    # Affine with allocator-like steps every 7 samples, as estimated peaks are.
    def need(n):
        return 100 + 10 * n + 64 * (n // 7)

    result = largest_fitting_batch(need, limit, current, upper=8 * current)
    assert result.largest == brute_force(need, limit, 8 * current)
    assert len(result.probes) <= 12
    assert result.at_least == (result.largest == 8 * current)


def test_search_reuses_the_known_need_of_the_current_size():
    calls = []

    def need(n):
        calls.append(n)
        return 10 * n

    result = largest_fitting_batch(need, 455, 64, current_need=640)
    assert result.largest == 45 and 64 not in calls


def test_resize_batch_changes_only_the_batch_dimension_and_allocates_nothing():
    batch = {
        "ids": torch.zeros(8, 128, dtype=torch.long),
        "mask": torch.ones(8, 128, dtype=torch.bool),
        "scale": torch.ones(3),
        "name": "x",
    }
    resized = resize_batch(batch, 3)
    assert resized["ids"].shape == (3, 128) and resized["ids"].dtype == torch.long
    assert resized["mask"].device.type == "meta"
    assert resized["scale"].shape == (3,)  # leading dim 3 != batch size 8: unchanged
    assert resized["name"] == "x"
    assert [t.shape for t in resize_batch((torch.zeros(4, 2), [torch.zeros(4)]), 7)[1]] == [(7,)]
