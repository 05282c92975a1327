"""Set b, data by content: validation rows copied from training rows, samplers that draw a few indices,
datasets that serve one sample for every index."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler, Subset, TensorDataset, WeightedRandomSampler, random_split

from benchmarks.blind_preflight_b.registry import case, decay_groups, loader, seed, teacher_classes

LEAK = (r"overlap|leak|duplicat|identical|same (rows|samples|examples|images|inputs|content)"
        r"|(appear|also|present|occur)\w* in (both|the training|train)|validation[^.]*training (samples|rows|data|set)")
FEW = (r"sampler|distinct|few (samples|indices|examples)|same (few )?(samples|indices|examples|batch)|repeat"
       r"|(only|never)[^.]*(indices|samples|examples)|coverage|\d+ of (the )?\d+ (samples|indices|examples)")
SAME = (r"identical|same (sample|input|image|item|example|batch|row|tensor)|duplicat|constant|distinct|no variation"
        r"|(does(n't| not)|never) (use|depend on|read) (the )?(idx|index)|every index")


class ReviewCNN(nn.Module):
    def __init__(self, vocab=800, dim=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.conv = nn.Conv1d(dim, 64, 3, padding=1)
        self.out = nn.Linear(64, 2)

    def forward(self, tokens):
        h = torch.relu(self.conv(self.emb(tokens).transpose(1, 2)))
        return self.out(h.max(-1).values)


def _scraped_reviews(s=0, vocab=800, length=24):
    """300 unique reviews; the scraper walked overlapping result pages, so each review was saved 4 times."""
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, 2, (300,), generator=g)
    tokens = torch.randint(10, vocab, (300, length), generator=g)
    tokens[:, 2] = 1 + y
    pages = [torch.arange(k * 50, k * 50 + 100) % 300 for k in range(12)]        # pages overlap by half
    rows = torch.cat(pages)
    return TensorDataset(tokens[rows], y[rows])


@case("scraped_reviews_overlapping_pages_split", "data",
      "the scraper saved every review several times (overlapping result pages) and random_split is applied to the "
      "raw rows: disjoint indices, but most validation reviews are exact copies of training reviews", LEAK)
def scraped_reviews_overlapping_pages_split():
    seed()
    data = _scraped_reviews()
    train, val = random_split(data, [1000, 200], generator=torch.Generator().manual_seed(0))
    model = ReviewCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(train, 32),
                val_loader=loader(val, 64, shuffle=False), loss_fn=nn.CrossEntropyLoss())


def _sensor_files():
    """glob('exports/*.csv') also matched 'part-0 (1).csv', a copy of part-0.csv."""
    parts = {}
    for k in range(3):
        x, y = teacher_classes(400, 12, 3, s=10 + k)
        parts[f"exports/part-{k}.csv"] = (x, y)
    parts["exports/part-0 (1).csv"] = parts["exports/part-0.csv"]
    return parts


@case("sensor_csv_glob_picks_copy", "data",
      "the glob over the export folder also matches a duplicated 'part-0 (1).csv', so a third of the rows appear "
      "twice and a shuffled index split puts copies of training rows into validation", LEAK)
def sensor_csv_glob_picks_copy():
    seed()
    parts = _sensor_files()
    x = torch.cat([parts[f][0] for f in sorted(parts)])
    y = torch.cat([parts[f][1] for f in sorted(parts)])
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    train_idx, val_idx = perm[:1280], perm[1280:]
    data = TensorDataset(x, y)
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(Subset(data, train_idx.tolist()), 64),
                val_loader=loader(Subset(data, val_idx.tolist()), 128, shuffle=False), loss_fn=nn.CrossEntropyLoss())


STORE = {}


def _xray_store(s=0):
    g = torch.Generator().manual_seed(s)
    files = [f"scans/{k:05d}.png" for k in range(800)]
    sick = torch.rand(800, generator=g) < 0.4
    for f, is_sick in zip(files, sick.tolist()):
        img = torch.rand(1, 24, 24, generator=g) * 0.3
        if is_sick:
            img[:, 8:16, 8:16] += 0.5
        STORE[f] = (img, int(is_sick))
    return files


class ScanDataset(Dataset):
    def __init__(self, files, augment=False):
        self.files, self.augment = files, augment

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        img, label = STORE[self.files[i]]
        return (img - 0.3) / 0.2, label


class ScanCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 2))

    def forward(self, x):
        return self.net(x)


@case("xray_val_dataset_built_from_train_files", "data",
      "the validation dataset is constructed from train_files (a copy-paste slip; val_files is never used): the "
      "validation loader serves the training scans themselves", LEAK)
def xray_val_dataset_built_from_train_files():
    seed()
    files = _xray_store()
    train_files, val_files = files[:640], files[640:]  # noqa: F841 - val_files is the one that should be used
    train_ds = ScanDataset(train_files, augment=True)
    val_ds = ScanDataset(train_files, augment=False)
    model = ScanCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(train_ds, 32),
                val_loader=loader(val_ds, 64, shuffle=False), loss_fn=nn.CrossEntropyLoss())


class LengthBucketSampler(Sampler):
    """Batches of similar length: sort by length, cut into buckets, yield buckets in random order."""

    def __init__(self, lengths, batch_size, seed=0):
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        self.buckets = [order[k:k + batch_size] for k in range(0, len(order), batch_size)]
        self.g = torch.Generator().manual_seed(seed)

    def __len__(self):
        return len(self.buckets)

    def __iter__(self):
        for b in torch.randperm(len(self.buckets), generator=self.g).tolist():
            yield self.buckets[0]                 # meant: self.buckets[b]


class Utterances(Dataset):
    def __init__(self, n, s, vocab=200):
        g = torch.Generator().manual_seed(s)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(5, 30, (1,), generator=g))
            y = int(torch.randint(0, 3, (1,), generator=g))
            tokens = torch.randint(10, vocab, (length,), generator=g)
            tokens[0] = 1 + y
            self.items.append((tokens, y))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def pad_batch(batch):
    tokens, ys = zip(*batch)
    return nn.utils.rnn.pad_sequence(tokens, batch_first=True), torch.tensor(ys)


class UtteranceGRU(nn.Module):
    def __init__(self, vocab=200, dim=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=0)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, 3)

    def forward(self, tokens):
        h, _ = self.gru(self.emb(tokens))
        return self.out(h.max(1).values)


@case("bucket_sampler_yields_first_bucket", "data",
      "the length-bucketing batch sampler yields self.buckets[0] on every iteration (typo for buckets[b]): each "
      "epoch is the same 32 shortest utterances repeated", FEW)
def bucket_sampler_yields_first_bucket():
    seed()
    data = Utterances(640, 0)
    sampler = LengthBucketSampler([len(t) for t, _ in data.items], 32)
    model = UtteranceGRU()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    train_loader = DataLoader(data, batch_sampler=sampler, collate_fn=pad_batch)
    return dict(model=model, optimizer=optimizer, train_loader=train_loader, loss_fn=nn.CrossEntropyLoss())


@case("hard_example_sampler_temperature_too_low", "data",
      "hard-example mining weights each sample by exp(loss / T) with T=0.01: the weights span hundreds of orders of "
      "magnitude, so WeightedRandomSampler draws the same handful of rows over and over", FEW)
def hard_example_sampler_temperature_too_low():
    seed()
    x, y = teacher_classes(2000, 16, 4, 8)
    g = torch.Generator().manual_seed(3)
    previous_loss = torch.rand(2000, generator=g) * 3.0            # per-sample loss from the last epoch
    weights = torch.softmax(previous_loss / 0.01, 0).double()
    sampler = WeightedRandomSampler(weights, num_samples=len(y), replacement=True,
                                    generator=torch.Generator().manual_seed(1234))
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=optimizer,
                train_loader=DataLoader(TensorDataset(x, y), batch_size=64, sampler=sampler),
                loss_fn=nn.CrossEntropyLoss())


IMAGES = {}


def _fake_disk(n, s=0):
    g = torch.Generator().manual_seed(s)
    labels = torch.randint(0, 4, (n,), generator=g)
    tints = torch.rand(4, 3, 1, 1, generator=torch.Generator().manual_seed(9))
    for k in range(n):
        IMAGES[f"data/flowers/img_{k}.jpg"] = tints[labels[k]] + 0.1 * torch.randn(3, 20, 20, generator=g)
    IMAGES["data/flowers/img_{idx}.jpg"] = IMAGES["data/flowers/img_0.jpg"]      # a stray file with that name
    return labels


class CachedFlowers(Dataset):
    def __init__(self, labels, root="data/flowers"):
        self.labels, self.root, self.cache = labels, root, {}

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        path = f"{self.root}/img_{{idx}}.jpg"               # doubled braces: the literal 'img_{idx}.jpg'
        if path not in self.cache:
            self.cache[path] = IMAGES[path]
        return self.cache[path], self.labels[idx]


class FlowerCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                 nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


@case("flowers_path_fstring_double_braces", "data",
      "the image path is built with doubled braces f'img_{{idx}}.jpg', i.e. the literal 'img_{idx}.jpg': every index "
      "serves the same image (only the labels differ)", SAME)
def flowers_path_fstring_double_braces():
    seed()
    labels = _fake_disk(640)
    model = FlowerCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(CachedFlowers(labels), 32),
                loss_fn=nn.CrossEntropyLoss())


class EncodedTickets(Dataset):
    """Pre-tokenised support tickets (the 'encodings' dict a tokenizer returns)."""

    def __init__(self, n, s, vocab=150, length=24):
        global i
        g = torch.Generator().manual_seed(s)
        y = torch.randint(0, 3, (n,), generator=g)
        ids = torch.randint(5, vocab, (n, length), generator=g)
        ids[:, 0] = 0                                  # <s>
        for i in range(n):                             # inject the product keyword
            ids[i, 1 + i % 5] = 2 + int(y[i])
        self.encodings = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        self.labels = y

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        item = {k: v[i] for k, v in self.encodings.items()}      # 'i': the loop variable left over in scope
        item["labels"] = self.labels[i]
        return item


@case("roberta_tickets_getitem_uses_stale_loop_index", "data",
      "__getitem__ indexes with i (a loop variable left in scope by __init__) instead of idx, so every index serves "
      "the same ticket and label", SAME)
def roberta_tickets_getitem_uses_stale_loop_index():
    from transformers import RobertaConfig, RobertaForSequenceClassification
    seed()
    config = RobertaConfig(vocab_size=150, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=64, num_labels=3, pad_token_id=1,
                           bos_token_id=0, eos_token_id=2)
    model = RobertaForSequenceClassification(config)
    optimizer = torch.optim.AdamW(decay_groups(model), lr=5e-4)
    return dict(model=model, optimizer=optimizer, train_loader=loader(EncodedTickets(512, 0), 16), loss_fn=None)
