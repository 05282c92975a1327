"""Data by content (duplicated rows across a disjoint split, per-class sampler weights) and memory."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset, TensorDataset, WeightedRandomSampler, random_split

from benchmarks.blind_preflight.registry import case, loader, seed, teacher_classes

OVERLAP = (r"overlap|leak|duplicat|identical|same (rows|samples|examples|images|inputs)|"
           r"(appear|also|present|occur)\w* in (both|the training|train)|validation[^.]*training (samples|rows|data)")
SAMPLER = (r"WeightedRandomSampler|sampler|per.(class|sample)|distinct|few (samples|indices|examples)|"
           r"same (few )?(samples|indices|examples)|repeat|len\(weights\)|weights? (has|have|of) (length|size)")
MEMORY = r"memory|GiB|\bfit|OOM|too (large|big)"


@case("tabular_concat_self_then_split", "data",
      "the dataset is concatenated with itself (ConcatDataset([ds, ds]) for 'two passes per epoch') before "
      "random_split, so most validation rows are exact copies of training rows despite disjoint indices", OVERLAP)
def tabular_concat_self_then_split():
    seed()
    x, y = teacher_classes(600, 14, 3)
    full = ConcatDataset([TensorDataset(x, y), TensorDataset(x, y)])
    train, val = random_split(full, [960, 240], generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(14, 64), nn.ReLU(), nn.Linear(64, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(train, 64),
                val_loader=loader(val, 64, shuffle=False), loss_fn=nn.CrossEntropyLoss())


class Xray(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                                 nn.Flatten(), nn.Linear(64, 2))

    def forward(self, x):
        return self.net(x)


@case("xray_oversampled_then_split", "data",
      "the minority class is oversampled by repeating its rows (torch.cat) before random_split, so validation "
      "positives are copies of training positives", OVERLAP)
def xray_oversampled_then_split():
    seed()
    g = torch.Generator().manual_seed(0)
    labels = (torch.rand(500, generator=g) < 0.12).long()
    images = torch.rand(500, 1, 20, 20, generator=g) * 0.5
    images[labels == 1, :, 6:14, 6:14] += 0.5
    pos = labels == 1
    images = torch.cat([images] + [images[pos]] * 5)
    labels = torch.cat([labels] + [labels[pos]] * 5)
    data = TensorDataset((images - 0.3) / 0.2, labels)
    n_val = len(data) // 5
    train, val = random_split(data, [len(data) - n_val, n_val], generator=torch.Generator().manual_seed(1))
    model = Xray()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(train, 32),
                val_loader=loader(val, 64, shuffle=False), loss_fn=nn.CrossEntropyLoss())


@case("fraud_sampler_class_weights", "data",
      "WeightedRandomSampler gets one weight per class (len 2) instead of one per sample, so every epoch only "
      "draws dataset indices 0 and 1", SAMPLER)
def fraud_sampler_class_weights():
    seed()
    x, cls = teacher_classes(2048, 16, 8)
    y = (cls == 0).long()
    counts = torch.bincount(y, minlength=2).float()
    class_weights = 1.0 / counts
    sampler = WeightedRandomSampler(class_weights, num_samples=len(y), replacement=True,
                                    generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer,
                train_loader=DataLoader(TensorDataset(x, y), batch_size=64, sampler=sampler),
                loss_fn=nn.CrossEntropyLoss())


class Tickets(Dataset):
    def __init__(self, n, classes=4, length=20, vocab=400, s=0):
        g = torch.Generator().manual_seed(s)
        probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
        self.labels = torch.multinomial(probs, n, replacement=True, generator=g)
        self.tokens = torch.randint(0, vocab, (n, length), generator=g)
        self.tokens[:, :3] = self.labels[:, None] * 50 + torch.randint(0, 5, (n, 3), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.tokens[i], self.labels[i]


class BagClassifier(nn.Module):
    def __init__(self, vocab=400, dim=32, classes=4):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim)
        self.out = nn.Linear(dim, classes)

    def forward(self, tokens):
        return self.out(self.embed(tokens))


@case("tickets_sampler_class_weights", "data",
      "the support-ticket sampler is WeightedRandomSampler(class_weights, len(dataset)) with 4 per-class weights, "
      "so training only ever sees tickets 0-3", SAMPLER)
def tickets_sampler_class_weights():
    seed()
    data = Tickets(1024)
    class_weights = [1.0 / 0.6, 1.0 / 0.25, 1.0 / 0.1, 1.0 / 0.05]
    sampler = WeightedRandomSampler(class_weights, num_samples=len(data), generator=torch.Generator().manual_seed(0))
    model = BagClassifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=DataLoader(data, batch_size=32, sampler=sampler),
                val_loader=loader(Tickets(256, s=1), 64, shuffle=False), loss_fn=nn.CrossEntropyLoss())


class Recommender(nn.Module):
    def __init__(self, items=300_000, dim=256):
        super().__init__()
        self.items = nn.Embedding(items, dim)
        self.users = nn.Sequential(nn.Linear(32, dim), nn.ReLU(), nn.Linear(dim, dim))

    def forward(self, batch):
        user, item = batch
        return (self.users(user) * self.items(item)).sum(-1)


@case("recommender_too_big_for_target_gpu", "memory",
      "a 77M-parameter item embedding trained with Adam needs ~1.2 GiB for weights, gradients and Adam state alone, "
      "more than a 2 GiB GPU (the run's target_gib=2) holds next to its CUDA context", MEMORY)
def recommender_too_big_for_target_gpu():
    seed()
    g = torch.Generator().manual_seed(0)
    users = torch.randn(1024, 32, generator=g)
    items = torch.randint(0, 300_000, (1024,), generator=g)
    clicks = (torch.rand(1024, generator=g) < 0.3).float()

    class Clicks(Dataset):
        def __len__(self):
            return 1024

        def __getitem__(self, i):
            return (users[i], items[i]), clicks[i]

    model = Recommender()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(Clicks(), 128),
                loss_fn=nn.BCEWithLogitsLoss(), target_gib=2.0)
