"""LOSS_CLASS_DIM: (B, T, C) logits straight from a linear layer given to cross_entropy, which
reads the classes from dim 1 (silent when T == C); flattened or permuted logits, and a
Conv1d head that puts its channels on dim 1, stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, LossFunctionCheck

T = C = 8  # equal: shapes cannot tell positions from classes


class Tagger(nn.Module):
    def __init__(self, conv_head: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.conv_head = conv_head
        self.embed = nn.Embedding(40, 16)
        self.head = nn.Conv1d(16, C, 1) if conv_head else nn.Linear(16, C)

    def forward(self, ids):
        h = self.embed(ids)
        return self.head(h.transpose(1, 2)) if self.conv_head else self.head(h)


LOSSES = {
    "as_is": (lambda logits, tags: nn.functional.cross_entropy(logits, tags), True, False),
    "flattened": (lambda logits, tags: nn.functional.cross_entropy(logits.reshape(-1, C), tags.reshape(-1)), False, False),
    "permuted": (lambda logits, tags: nn.functional.cross_entropy(logits.permute(0, 2, 1), tags), False, False),
    "conv_head": (lambda logits, tags: nn.functional.cross_entropy(logits, tags), False, True),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_linear_logits_read_along_dim_1_are_an_error(name):
    criterion, fires, conv_head = LOSSES[name]
    ids = torch.randint(0, 40, (256, T))
    model = Tagger(conv_head)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids, ids % C), batch_size=32, shuffle=True),
                           loss_fn=lambda m, batch: criterion(m(batch[0]), batch[1]),
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    issues = [i for i in report.check("step.loss_function").issues if i.code == "LOSS_CLASS_DIM"]
    assert bool(issues) == fires
    if fires:
        assert "Nothing raises" in issues[0].message and "permute(0, 2, 1)" in issues[0].fix


@pytest.mark.parametrize("transposed", [False, True])
def test_an_rnn_heads_logits_whose_bias_is_added_after_the_matmul(transposed):
    """nn.Linear on a GRU's batch-first (non-contiguous) output adds its bias after the matmul."""
    class DayClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.GRU(5, 16, batch_first=True)
            self.out = nn.Linear(16, C)

        def forward(self, x):
            return self.out(self.rnn(x)[0])

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(128, T, 5, generator=g), torch.randint(0, C, (128, T), generator=g)
    model = DayClassifier()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
                           loss_fn=lambda m, b: nn.functional.cross_entropy(
                               m(b[0]).transpose(1, 2) if transposed else m(b[0]), b[1]),
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    issues = [i for i in report.check("step.loss_function").issues if i.code == "LOSS_CLASS_DIM"]
    assert len(issues) == (0 if transposed else 1)


def test_a_linear_output_viewed_into_other_sizes_has_other_features_last():
    from optimus_preflight.preflight.analyses.output_range import features_on_last_dim

    gru, out = nn.GRU(5, 16, batch_first=True), nn.Linear(16, 6)
    logits = out(gru(torch.randn(4, 7, 5))[0])  # (4, 7, 6): the bias is added after the matmul
    assert features_on_last_dim(logits)
    assert not features_on_last_dim(logits.view(4, 6, 7))  # a view to (B, C, T): the positions are last


class FrameTagger(nn.Module):
    """Sound event detection: per-frame class logits (B, T, C) from a linear head, T == C."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.rnn, self.head = nn.GRU(12, 16, batch_first=True), nn.Linear(16, C)

    def forward(self, frames):
        return self.head(self.rnn(frames)[0])


@pytest.mark.parametrize("pool_dim", [-1, 1], ids=["over_classes", "over_time"])
def test_clip_logits_pooled_over_the_class_axis(pool_dim):
    g = torch.Generator().manual_seed(2)
    frames, clip_tags = torch.randn(256, T, 12, generator=g), (torch.rand(256, C, generator=g) < 0.3).float()

    def clip_loss(model, batch):
        clip_logits = model(batch[0]).amax(dim=pool_dim)
        return nn.functional.binary_cross_entropy_with_logits(clip_logits, batch[1])

    model = FrameTagger()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(frames, clip_tags), batch_size=32, shuffle=True), loss_fn=clip_loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    issues = [i for i in report.check("step.loss_function").issues if i.code == "LOSS_POOLED_OVER_CLASSES"]
    assert bool(issues) == (pool_dim == -1)
    if issues:
        assert "amax(dim=-1)" in issues[0].message and "frame_logits.amax(dim=1)" in issues[0].fix
