"""step.ctc_layout: batch-first (N, T, C) log-probabilities given to a CTC loss that reads
(T, N, C), silent when the batch size equals the frames; time-major log-probabilities, of
any batch size, stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.ctc_layout import CtcLayoutCheck, batch_first
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

FRAMES, FEATURES, SYMBOLS = 16, 8, 5


class Acoustic(nn.Module):
    """Conv1d over (N, T, F) frames, symbol scores per frame: (N, T, C)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv1d(FEATURES, 16, 3, padding=1)
        self.out = nn.Linear(16, SYMBOLS + 1)

    def forward(self, frames):
        return self.out(torch.relu(self.conv(frames.transpose(1, 2))).transpose(1, 2))


def utterances(rows: int = 128) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(rows, FRAMES, FEATURES, generator=g),
                         torch.randint(1, SYMBOLS + 1, (rows, 4), generator=g),
                         torch.full((rows,), FRAMES), torch.full((rows,), 4))


def report(time_major: bool, batch_size: int = FRAMES):
    ctc = nn.CTCLoss(zero_infinity=True)

    def loss_fn(model, batch):
        frames, targets, input_lengths, target_lengths = batch
        log_probs = model(frames).log_softmax(-1)
        if time_major:
            log_probs = log_probs.transpose(0, 1)
        return ctc(log_probs, targets, input_lengths, target_lengths)

    model = Acoustic()
    return run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                         DataLoader(utterances(), batch_size=batch_size, shuffle=True, drop_last=True),
                         loss_fn=loss_fn, checks=[FirstBatchCheck(), FirstStepCheck(), CtcLayoutCheck()])


def test_batch_first_log_probs_into_ctc_with_as_many_samples_as_frames_fire():
    issues = report(time_major=False).check("step.ctc_layout").issues
    assert [i.code for i in issues] == ["CTC_BATCH_FIRST"]
    assert "(16, 16, 6)" in issues[0].message and "transpose(0, 1)" in issues[0].fix


@pytest.mark.parametrize("batch_size", [FRAMES, 8])
def test_time_major_log_probs_are_quiet(batch_size):
    result = report(time_major=True, batch_size=batch_size).check("step.ctc_layout")
    assert not result.issues and "the batch on dim 1" in result.data["summary"]


def test_a_loss_that_mixes_every_position_is_not_read_as_batch_first():
    before = torch.randn(6, 6, 3)
    assert not batch_first(before, before + 1)  # everything moved: another finding's business
    after = before.clone()
    after[0] += 1
    assert batch_first(before, after)
    after = before.clone()
    after[:, 0] += 1
    assert not batch_first(before, after)


def test_no_ctc_loss_says_so():
    model = nn.Linear(FEATURES, 3)
    data = TensorDataset(torch.randn(64, FEATURES), torch.randint(0, 3, (64,)))
    result = run_preflight(model, torch.optim.SGD(model.parameters(), 0.1), DataLoader(data, batch_size=16),
                           loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                           checks=[FirstBatchCheck(), FirstStepCheck(), CtcLayoutCheck()]).check("step.ctc_layout")
    assert not result.issues and result.data["summary"] == "no CTC loss in the step"
