"""Bugs of our own in the same spirit: what nobody listed."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight.registry import case, loader, seed, teacher_classes

ZERO_GRAD = r"zero_grad|accumulat"
PERMUTED = (r"shuffl|permut|misalign|(labels?|targets?)[^.]*(independent|unrelated|random|uncorrelated|not "
            r"(related|aligned|predictable))|no (signal|relation)|cannot (be )?learn|chance")
NORM_STATS = r"normali[sz]|statistic|255|\bstd\b|\bmean\b|scale"
NO_GRAD = (r"no_grad|no grad|detach|(receive|get|got)s? no grad|gradients? (is |are )?(none|missing|zero)|"
           r"\.grad is None|never (updated|trained)|frozen")
LEAK = r"leak|(feature|column)[^.]*(label|target)|(label|target)[^.]*(feature|column)"
SAME_SAMPLE = (r"identical|same (sample|input|window|row|example|batch|item)|duplicat|constant|distinct|"
               r"no variation|(does not|doesn't) (vary|change)|stride|index")


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(24, 96), nn.ReLU(), nn.Linear(96, 6))

    def forward(self, x):
        return self.net(x)


@case("zero_grad_inside_loss_fn", "own",
      "the loss function calls optimizer.zero_grad() before each forward 'to be safe', so with 4 accumulation steps "
      "only the last micro-batch's gradient survives to the optimizer step", ZERO_GRAD)
def zero_grad_inside_loss_fn():
    seed()
    x, y = teacher_classes(1024, 24, 6)
    model = Wide()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    ce = nn.CrossEntropyLoss()

    def loss_fn(model, batch):
        optimizer.zero_grad()
        inputs, targets = batch
        return ce(model(inputs), targets)

    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 32),
                loss_fn=loss_fn, accumulation_steps=4)


@case("labels_permuted_separately", "own",
      "the features are shuffled with a random permutation before saving but the labels are not, so the labels are "
      "unrelated to their inputs", PERMUTED)
def labels_permuted_separately():
    seed()
    x, y = teacher_classes(1024, 16, 4)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(5))
    x = x[perm]                                          # meant: x, y = x[perm], y[perm]
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                loss_fn=nn.CrossEntropyLoss())


class Photos(Dataset):
    """Images already in [0, 1], standardised with CIFAR statistics written for 0..255 pixels."""

    MEAN = torch.tensor([125.3, 123.0, 113.9]).view(3, 1, 1)
    STD = torch.tensor([63.0, 62.1, 66.7]).view(3, 1, 1)

    def __init__(self, n, s=0):
        g = torch.Generator().manual_seed(s)
        self.labels = torch.randint(0, 4, (n,), generator=g)
        palette = torch.rand(4, 3, 1, 1, generator=torch.Generator().manual_seed(3))
        self.images = (palette[self.labels] * 0.7 + 0.3 * torch.rand(n, 3, 16, 16, generator=g)).clamp(0, 1)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return (self.images[i] - self.MEAN) / self.STD, self.labels[i]


@case("images_normalised_with_255_stats", "own",
      "images already scaled to [0,1] are normalised with mean/std written for 0..255 pixels, so every input is "
      "about -1.9 with a within-channel spread of ~0.01: the image content is almost erased", NORM_STATS)
def images_normalised_with_255_stats():
    seed()
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(Photos(512), 32),
                val_loader=loader(Photos(128, s=1), 64, shuffle=False), loss_fn=nn.CrossEntropyLoss())


class FineTuned(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        with torch.no_grad():           # left over from the feature-extraction script
            features = self.backbone(x)
        return self.head(features)


@case("backbone_under_no_grad_while_finetuning", "own",
      "the backbone's forward runs under torch.no_grad() (left from a feature-extraction script) while the "
      "optimizer holds the backbone to fine-tune it: the backbone gets no gradient and never changes", NO_GRAD)
def backbone_under_no_grad_while_finetuning():
    seed()
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 5, (512,), generator=g)
    palette = torch.randn(5, 3, 1, 1, generator=g)
    images = palette[labels] + torch.randn(512, 3, 12, 12, generator=g)
    model = FineTuned()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(images, labels), 32),
                loss_fn=nn.CrossEntropyLoss())


@case("churn_feature_leaks_label", "own",
      "one feature column ('has_cancellation_date') is the churn label itself, recorded after the outcome: the "
      "model learns the leak, not churn", LEAK)
def churn_feature_leaks_label():
    seed()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 12, generator=g)
    churn = ((x[:, :3].sum(1) + torch.randn(1024, generator=g)) > 1.2).long()
    features = torch.cat([x, churn[:, None].float()], 1)
    model = nn.Sequential(nn.Linear(13, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(features, churn), 64),
                loss_fn=nn.CrossEntropyLoss())


class SensorWindows(Dataset):
    def __init__(self, signal, window=64, hop_fraction=0.01, horizon=8):
        self.signal, self.window, self.horizon = signal, window, horizon
        self.stride = int(window * hop_fraction)          # int(0.64) == 0
        self.count = (len(signal) - window - horizon) // max(1, int(window * 0.25))

    def __len__(self):
        return self.count

    def __getitem__(self, idx):
        start = idx * self.stride
        x = self.signal[start: start + self.window]
        y = self.signal[start + self.window + self.horizon - 1, 0]
        return x, y


class ConvForecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(4, 16, 5, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(4), nn.Flatten(),
                                 nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x.transpose(1, 2)).squeeze(-1)


@case("sensor_windows_zero_stride", "own",
      "the window stride int(64 * 0.01) rounds to 0, so every index returns the same first window and target: "
      "the whole epoch is one sample repeated", SAME_SAMPLE)
def sensor_windows_zero_stride():
    seed()
    t = torch.arange(20_000).float()
    g = torch.Generator().manual_seed(0)
    signal = torch.stack([torch.sin(t / 50), torch.cos(t / 31), torch.sin(t / 7), torch.randn(20_000, generator=g)], 1)
    model = ConvForecaster()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(SensorWindows(signal), 64),
                loss_fn=nn.MSELoss())
