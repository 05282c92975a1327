"""data.split_labels: TRAIN_ONLY_SHORTCUT, a per-sample statistic that separates a class in
training only (noise added to the oversampled minority copies); quiet on plain copies and
on a class that really is noisier, in both splits."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.train_shortcut import rank_auc, train_only_shortcut
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.split_labels import SplitLabelsCheck


def readings(n: int, seed: int, noisy_class: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """~10% leaking valves, told apart by the first three sensors; ``noisy_class``: the extra
    noise a leaking valve really has (in every split)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, generator=g)
    y = (x[:, :3].sum(1) + 0.2 * torch.randn(n, generator=g) > 2.2).long()
    x[y == 1] += noisy_class * torch.randn(int((y == 1).sum()), 12, generator=g)
    return x, y


def balanced_by_copies(x, y, noise: float) -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    copies = x[y == 1].repeat(8, 1)
    copies = copies + noise * torch.randn(copies.shape, generator=g)
    return TensorDataset(torch.cat([x[y == 0], copies]), torch.cat([y[y == 0], torch.ones(len(copies), dtype=torch.long)]))


def shortcut_issues(train: TensorDataset, val: TensorDataset):
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(train, batch_size=64, shuffle=True),
                           val_loader=DataLoader(val, batch_size=256), loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), SplitLabelsCheck()])
    return [issue for issue in report.check("data.split_labels").issues if issue.code == "TRAIN_ONLY_SHORTCUT"]


@pytest.mark.parametrize("noise, fires", [(1.0, True), (0.0, False)], ids=["noisy_minority_copies", "plain_copies"])
def test_noise_on_the_oversampled_minority_only_fires(noise, fires):
    x, y = readings(4096, 0)
    issues = shortcut_issues(balanced_by_copies(x, y, noise), TensorDataset(*readings(1024, 1)))
    assert bool(issues) == fires
    if fires:
        assert "class 1" in issues[0].message and "WeightedRandomSampler" in issues[0].fix


def test_a_class_that_is_noisier_in_every_split_is_quiet():
    x, y = readings(4096, 0, noisy_class=1.5)
    val_x, val_y = readings(1024, 1, noisy_class=1.5)
    assert train_only_shortcut(x, y, val_x, val_y) is None
    assert shortcut_issues(TensorDataset(x, y), TensorDataset(val_x, val_y)) == []


def test_rank_auc_counts_ties_half():
    assert rank_auc(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([False, False, True, True])) == 1.0
    assert rank_auc(torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.tensor([False, True, False, True])) == 0.5
