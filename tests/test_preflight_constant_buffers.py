"""model.constant_buffers: CORAL rank thresholds kept with register_buffer (zeros the optimizer
never moves) fire BUFFER_NEVER_TRAINED; thresholds as nn.Parameter, BatchNorm's running
statistics and a fixed 0/1 mask buffer stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.constant_buffers import ConstantBuffersCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck

LEVELS = 4


class Coral(nn.Module):
    def __init__(self, thresholds: str):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1, bias=False))
        if thresholds == "buffer":
            self.register_buffer("thresholds", torch.zeros(LEVELS))
        else:
            self.thresholds = nn.Parameter(torch.zeros(LEVELS))
        self.register_buffer("feature_mask", (torch.arange(10) % 3 != 0).float())  # a fixed 0/1 mask: no constant

    def forward(self, x):
        return self.body(x * self.feature_mask) - self.thresholds


def coral_loss(model, batch):
    x, y = batch
    return F.binary_cross_entropy_with_logits(model(x), (y[:, None] > torch.arange(LEVELS)).float())


@pytest.mark.parametrize("thresholds", ["buffer", "parameter"])
def test_thresholds_kept_as_a_buffer_of_zeros_never_train(thresholds):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 10, generator=g)
    y = torch.bucketize(x[:, 0], torch.tensor([-1.0, -0.3, 0.3, 1.0]))
    model = Coral(thresholds)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), loss_fn=coral_loss,
                           checks=[FirstBatchCheck(), ConstantBuffersCheck()])
    issues = report.check("model.constant_buffers").issues
    assert [i.code for i in issues] == (["BUFFER_NEVER_TRAINED"] if thresholds == "buffer" else [])
    if issues:
        assert "'thresholds' (added to the activations)" in issues[0].message and "nn.Parameter" in issues[0].fix


def test_a_library_models_zero_buffer_is_its_design():
    """Hugging Face BART keeps final_logits_bias, a zero buffer added to the logits, on purpose."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BartConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(config)
    ids = torch.randint(3, 40, (64, 10), generator=torch.Generator().manual_seed(0))

    def loss(m, batch):
        return m(input_ids=batch[0], labels=batch[0]).loss

    report = run_preflight(model, torch.optim.AdamW(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids), batch_size=16, shuffle=True), loss_fn=loss,
                           checks=[FirstBatchCheck(), ConstantBuffersCheck()])
    assert report.check("model.constant_buffers").issues == []
