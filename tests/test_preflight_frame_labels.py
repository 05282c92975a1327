"""data.frame_labels: FRAME_LABELS_OTHER_RATE, sound-event labels annotated at a 10 ms hop cut to
the first T entries of 20 ms feature frames; labels resampled to the frames, and labels that do
not show in the features, stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.frame_labels import FrameLabelsCheck, faster_rate

FRAMES, BANDS = 40, 12


def clips(labels: str, visible: bool = True) -> TensorDataset:
    """Log-mel-like (N, BANDS, FRAMES) clips with two events each, their fine (2 * FRAMES) labels."""
    g = torch.Generator().manual_seed(0)
    x, fine = 0.5 * torch.randn(256, BANDS, FRAMES, generator=g), torch.zeros(256, 2 * FRAMES, dtype=torch.long)
    for i in range(256):
        for event in (1, 2):
            start, length = int(torch.randint(0, FRAMES - 8, (1,), generator=g)), int(torch.randint(4, 8, (1,), generator=g))
            if visible:
                x[i, 2 + 5 * (event - 1): 5 + 5 * (event - 1), start:start + length] += 1.5
            fine[i, 2 * start: 2 * (start + length)] = event
    return TensorDataset(x, fine[:, :FRAMES] if labels == "truncated" else fine[:, ::2])


@pytest.mark.parametrize("labels, visible, fires", [("truncated", True, True), ("resampled", True, False),
                                                    ("truncated", False, False)],
                         ids=["cut_to_the_frames", "resampled", "events_not_in_the_features"])
def test_labels_at_a_finer_hop_cut_to_the_frames(labels, visible, fires):
    model = nn.Conv1d(BANDS, 3, 3, padding=1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(clips(labels, visible), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FrameLabelsCheck()])
    found = [i for i in report.check("data.frame_labels").issues if i.code == "FRAME_LABELS_OTHER_RATE"]
    assert bool(found) == fires
    if found:
        assert "2 times their rate" in found[0].message and "labels[:, ::2]" in found[0].fix


def test_faster_rate_reads_channels_last_frames_too():
    x, y = clips("truncated")[:32]
    assert faster_rate(x, y) is not None
