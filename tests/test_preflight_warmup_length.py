"""model.warmup_length, WARMUP_IN_SAMPLES: a KL warm-up whose length is epochs * len(dataset)
while its counter advances per batch; the same in batches, a closure's ramp and unrelated
integer fields stay quiet or are read the same way."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.warmup_length import WarmupLengthCheck, ramp_lengths

DATA = TensorDataset(torch.randn(1000, 6, generator=torch.Generator().manual_seed(0)))
LOADER = DataLoader(DATA, batch_size=50, shuffle=True)


class AnnealedLoss:
    def __init__(self, warmup_steps: int):
        self.warmup_steps, self.calls, self.latent_dim = warmup_steps, 0, 64

    def __call__(self, model, batch):
        beta = min(1.0, self.calls / self.warmup_steps)
        self.calls += 1
        out = model(batch[0])
        return (out - batch[0]).pow(2).mean() + beta * out.pow(2).mean()


def run(loss_fn):
    model = nn.Linear(6, 6)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), LOADER, loss_fn=loss_fn,
                           checks=[WarmupLengthCheck()])
    return report.check("model.warmup_length")


@pytest.mark.parametrize("warmup, fires", [(3 * len(DATA), True), (3 * len(LOADER), False), (500, False)],
                         ids=["epochs_times_samples", "epochs_times_batches", "a_round_number_of_steps"])
def test_a_warm_up_counted_in_samples_fires(warmup, fires):
    result = run(AnnealedLoss(warmup))
    assert [issue.code for issue in result.issues] == (["WARMUP_IN_SAMPLES"] if fires else [])
    if fires:
        assert "warmup_steps = 3,000 is 3 x len(dataset)" in result.issues[0].message
        assert "lasts 150 epochs instead of 3" in result.issues[0].message
        assert "len(train_loader)" in result.issues[0].fix


def test_a_closure_ramp_is_read_too():
    kl_anneal_steps = 5 * len(DATA)

    def loss_fn(model, batch):
        out = model(batch[0])
        return (out - batch[0]).pow(2).mean() * min(1.0, 1 / kl_anneal_steps)

    assert dict(ramp_lengths(loss_fn)) == {"kl_anneal_steps": 5000}
    assert [issue.code for issue in run(loss_fn).issues] == ["WARMUP_IN_SAMPLES"]
