"""step.sample_mixing: a model whose outputs for one sample depend on the other samples of
the batch (the batch axis read as the sequence axis), caught even where the batch size
equals the sequence length and shapes cannot tell; independent samples stay quiet."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.sample_mixing import SampleMixingCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

SIZE = 16  # the batch size and the sequence length: shapes alone cannot say which is which


class Encoder(nn.Module):
    def __init__(self, batch_first: bool, batchnorm: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(50, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.BatchNorm1d(32) if batchnorm else nn.Identity()
        self.head = nn.Linear(32, 4)

    def forward(self, ids):
        return self.head(self.norm(self.encoder(self.embed(ids)).mean(1)))


def mixing(model: nn.Module) -> list:
    ids = torch.randint(0, 50, (256, SIZE), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 4, (256,), generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(ids, labels), batch_size=SIZE, shuffle=True)
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), 1e-3), loader, loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    result = report.check("step.sample_mixing")
    return [issue for issue in result.issues if issue.code == "BATCH_MIXING"], result


def test_a_batch_major_batch_into_a_sequence_first_encoder_mixes_the_samples():
    issues, result = mixing(Encoder(batch_first=False))
    assert issues and "batch_first=True" in issues[0].fix
    assert result.data["moved_share"] > 0.9


def test_independent_samples_are_quiet_with_dropout_and_batchnorm():
    issues, result = mixing(Encoder(batch_first=True, batchnorm=True))
    assert not issues
    assert 0 < result.data["moved_share"] <= 1 / SIZE + 1e-9  # only sample 0's outputs moved


def test_a_time_major_batch_cut_to_as_many_samples_as_positions_is_probed_along_its_batch_axis():
    # (T, B) = (16, 32) batches: cut to the first 16 samples, the time axis is as long as the batch
    # axis. Replacing "sample 0" along dim 0 changed time step 0 of every sample: a false mixing.
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed = nn.Embedding(50, 16)
            self.gru = nn.GRU(16, 16, batch_first=True)
            self.out = nn.Linear(16, 4)

        def forward(self, ids):
            return self.out(self.gru(self.embed(ids))[0])

    def time_major(rows):
        return torch.stack([row[0] for row in rows], 1), torch.stack([row[1] for row in rows], 1)

    def loss(model, batch):
        text, tags = batch
        logits = model(text.t())
        return nn.functional.cross_entropy(logits.reshape(-1, 4), tags.t().reshape(-1))

    ids = torch.randint(0, 50, (256, SIZE), generator=torch.Generator().manual_seed(0))
    tags = ids % 4
    loader = DataLoader(TensorDataset(ids, tags), batch_size=2 * SIZE, shuffle=True, collate_fn=time_major)
    model = Tagger()
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), 1e-3), loader, loss_fn=loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), SampleMixingCheck()])
    result = report.check("step.sample_mixing")
    assert not result.issues
    assert 0 < result.data["moved_share"] <= 1 / SIZE + 1e-9
