"""StorageTracker: live storage bytes, views, frees, and re-labelling at the peak."""

from __future__ import annotations

import torch

from optimus_preflight.memory.cuda_rules import round_size
from optimus_preflight.memory.tracker import StorageTracker


def test_views_share_their_storage_and_frees_are_seen():
    tracker = StorageTracker()
    with tracker:
        a = torch.zeros(256)  # 1 KiB
        view = a.view(16, 16)[2:]
        assert tracker.live_bytes() == 1024
        b = a * 2
        assert tracker.live_bytes() == 2048
        del b
        assert tracker.live_bytes() == 1024
        del a
        assert tracker.live_bytes() == 1024  # the view keeps the storage alive
        del view
    assert tracker.live_bytes() == 0 and tracker.peak == 2048


def test_tensors_kept_alive_only_by_autograd_stay_counted():
    w = torch.randn(64, 64, requires_grad=True)
    tracker = StorageTracker()
    tracker.track(w, "params")
    with tracker:
        tracker.phase = "activations"
        loss = torch.tanh(torch.randn(8, 64) @ w).sum()  # tanh saves its output for backward
        saved = tracker.live_bytes("activations")
        assert saved >= 8 * 64 * 4
        tracker.phase = "backward_temporaries"
        loss.backward()
        tracker.relabel(w.grad, "grads")
        del loss
    assert tracker.live_bytes("activations") == 0  # freed with the graph
    assert tracker.live_bytes("grads") == 64 * 64 * 4


def test_relabel_fixes_the_breakdown_recorded_at_the_peak():
    tracker = StorageTracker()
    with tracker:
        tracker.phase = "backward_temporaries"
        grad = torch.zeros(1000)
        temp = torch.zeros(500)
        del temp  # the peak (6000 bytes) had both alive
        tracker.relabel(grad, "grads")
    assert tracker.peak == 6000
    assert tracker.peak_detail() == {"grads": 4000, "backward_temporaries": 2000}
    assert tracker.peak_breakdown()["grads"] == 4000 and tracker.peak_breakdown()["other"] == 2000


def test_cuda_rounding_applies_per_storage():
    tracker = StorageTracker(round_bytes=round_size)
    with tracker:
        tensors = [torch.zeros(3) for _ in range(4)]  # 12 bytes each
    assert tracker.live_bytes() == 4 * 512
    del tensors
