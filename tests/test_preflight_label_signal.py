"""LABELS_UNRELATED (data.split_labels): training labels that no predictor can read from their
inputs, the trace of features and labels misaligned on the way (rows filtered from the features
only, one array shuffled on its own) or of preprocessing that erased what carries the label.
Real tasks with a weak, sparse or non-linear signal, and imbalanced ones, stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.label_signal import label_signal
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.split_labels import SplitLabelsCheck


def sensor_table(n: int = 3000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Ten sensor readings per hour; the alarm label depends on three of them; 4% of the rows
    miss a reading (NaN)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    y = (x[:, 0] + 0.8 * x[:, 3] - 0.6 * x[:, 7] + 0.3 * torch.randn(n, generator=g) > 0).long()
    holes = torch.rand(n, generator=g) < 0.04
    x[holes, torch.randint(0, 10, (int(holes.sum()),), generator=g)] = float("nan")
    return x, y


def issues(x: torch.Tensor, y: torch.Tensor) -> tuple[list, dict]:
    torch.manual_seed(0)  # the shuffled loader and the probes draw from the global RNG: results follow no other test
    model = nn.Sequential(nn.Linear(x.shape[1], 32), nn.ReLU(), nn.Linear(32, int(y.max()) + 1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    result = report.check("data.split_labels")
    return [i for i in result.issues if i.code == "LABELS_UNRELATED"], result.data


def test_rows_dropped_from_the_features_only_fire():
    x, y = sensor_table()
    kept = x[~torch.isnan(x).any(1)]
    found, data = issues(kept, y[:len(kept)])  # y cut to the same length: shifted by the rows dropped so far
    assert len(found) == 1, data
    assert "filtered from the features only" in found[0].message
    assert "X[mask], y[mask]" in found[0].fix
    assert data["neighbour_accuracy"] <= data["majority_share"] + 0.02


def test_the_same_rows_dropped_from_both_are_quiet():
    x, y = sensor_table()
    mask = ~torch.isnan(x).any(1)
    found, data = issues(x[mask], y[mask])
    assert not found
    assert data["linear_accuracy"] > 0.9


def test_windows_standardised_each_with_its_own_statistics_fire_when_the_level_is_the_label():
    g = torch.Generator().manual_seed(1)
    level = torch.randn(2000, 1, 1, generator=g) * 2
    windows = level + torch.randn(2000, 24, 3, generator=g)  # 24 steps of 3 sensors
    y = (level.flatten() > 0).long()  # overheating: the level itself
    own = (windows - windows.mean(1, keepdim=True)) / windows.std(1, keepdim=True)
    found, _ = issues(own.flatten(1), y)
    assert found and "its own mean and std" in found[0].message
    train_mean, train_std = windows.mean((0, 1)), windows.std((0, 1))
    assert not issues(((windows - train_mean) / train_std).flatten(1), y)[0]


def test_real_signals_that_are_weak_sparse_or_non_linear_are_related():
    g = torch.Generator().manual_seed(2)
    weak_x = torch.randn(2048, 20, generator=g)
    weak_y = (0.3 * weak_x[:, 0] + torch.randn(2048, generator=g) > 0).long()
    sparse_x = torch.randn(2048, 64, generator=g)
    sparse_y = (sparse_x[:, 0] + sparse_x[:, 1] > 0).long()
    xor_x = torch.randn(2048, 8, generator=g)
    xor_y = ((xor_x[:, 0] > 0) ^ (xor_x[:, 1] > 0)).long()
    for x, y in ((weak_x, weak_y), (sparse_x, sparse_y), (xor_x, xor_y)):
        signal = label_signal(x, y)
        assert signal is not None and not signal.unrelated, signal


def test_what_is_not_judged():
    g = torch.Generator().manual_seed(3)
    y = torch.randint(0, 2, (2048,), generator=g)
    assert label_signal(torch.randn(300, 8, generator=g), y[:300]) is None  # too few samples
    assert label_signal(torch.randn(2048, 3 * 32 * 32, generator=g), y) is None  # images: too wide
    rare = (torch.rand(2048, generator=g) < 0.05).long()
    assert label_signal(torch.randn(2048, 8, generator=g), rare) is None  # 95% one class
    x = torch.randn(2048, 8, generator=g)
    assert label_signal(x, torch.randint(0, 50, (2048,), generator=g)) is None  # too many classes


def swatches(n: int, seed: int, bgr: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """8x8 colour swatches of four colours (red, yellow, green, purple) with noise, channels first."""
    g = torch.Generator().manual_seed(seed)
    colours = torch.tensor([[0.9, 0.1, 0.1], [0.9, 0.9, 0.1], [0.1, 0.8, 0.2], [0.6, 0.1, 0.8]])
    y = torch.randint(0, 4, (n,), generator=g)
    images = colours[y][:, :, None, None] + 0.05 * torch.randn(n, 3, 8, 8, generator=g)
    return (images.flip(1) if bgr else images), y


@pytest.mark.parametrize("val_bgr", [True, False])
def test_validation_images_in_the_other_channel_order(val_bgr):
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(*swatches(1024, 0, bgr=False)), batch_size=64, shuffle=True),
                           val_loader=DataLoader(TensorDataset(*swatches(256, 1, bgr=val_bgr)), batch_size=64),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    codes = [i.code for i in report.check("data.split_labels").issues]
    if val_bgr:
        assert codes == ["VAL_CHANNEL_ORDER"]
        assert "COLOR_BGR2RGB" in report.check("data.split_labels").issues[0].fix
    else:
        assert not codes


def test_chance_labels_are_unrelated_beyond_sampling_noise():
    # The better of two predictors on labels shuffled apart from their inputs lands a binomial
    # spread above the majority share (0.02 was inside it at 1000 samples and 3 classes).
    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(1000, 12, generator=g)
        y = (x @ torch.randn(12, 3, generator=g)).argmax(1)
        signal = label_signal(x, y[torch.randperm(1000, generator=g)])
        assert signal is not None and signal.unrelated, (seed, signal)
        assert not label_signal(x, y).unrelated


def test_what_the_token_ids_show_beside_texts_unrelated_to_their_labels():
    from torch.utils.data import TensorDataset as Rows

    from optimus_preflight.preflight.checks.split_labels import commonest_id, stored_by_length

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 44, (64, 12), generator=g)
    assert commonest_id(ids, None) is None  # every word about as common
    ids[:, 3] = 1  # one <unk> per text, where the label word was
    assert commonest_id(ids, None) == (1, pytest.approx(1 / 12))
    lengths = torch.randint(3, 12, (200,), generator=g)
    padded = torch.where(torch.arange(12) < lengths[:, None], torch.randint(4, 44, (200, 12), generator=g), 0)
    labels = torch.zeros(200, dtype=torch.long)
    assert not stored_by_length(Rows(padded, labels), 0)
    assert stored_by_length(Rows(padded[lengths.argsort()], labels), 0)


def test_texts_sorted_for_bucketing_without_their_labels_say_so():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (1200,), generator=g)
    lengths = torch.randint(4, 17, (1200,), generator=g)
    ids = torch.where(torch.arange(16) < lengths[:, None], torch.randint(10, 60, (1200, 16), generator=g), 0)
    ids[torch.arange(1200), (lengths * torch.rand(1200, generator=g)).long()] = 2 + labels  # the topic word
    ids = ids[lengths.argsort(stable=True)]  # docs.sort(key=len), labels left as they were

    class MeanBag(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(60, 16, padding_idx=0), nn.Linear(16, 4)

        def forward(self, tokens):
            return self.head(self.embed(tokens).mean(1))

    model = MeanBag()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids, labels), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    found = [i for i in report.check("data.split_labels").issues if i.code == "LABELS_UNRELATED"]
    assert found and "stored in order of length" in found[0].message
