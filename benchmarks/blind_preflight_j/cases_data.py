"""Set j, family data: datasets, samplers, splits, collate, preprocessing and augmentation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks.blind_preflight_j.registry import case, fix, gen, loader, mean_over, seed


def _val_acc(model, kw):
    def fn(m, b):
        x, y = (t.to(next(m.parameters()).device) for t in b)
        return (m(x).argmax(-1) == y).sum().item(), len(y)
    return mean_over(model, kw["val_loader"], fn)


# --------------------------------------------------------------------------------------------------------------------
# 1. collate that cuts every sequence of the batch to the SHORTEST one "to avoid padding"

V_REV, C_REV = 50, 3


class ReviewTokens(Dataset):
    """Variable-length token lists (6-60 tokens); the class keyword (ids 1-3) sits at a random position."""

    def __init__(self, n, s):
        g = gen(s)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(6, 61, (1,), generator=g))
            tok = torch.randint(4, V_REV, (length,), generator=g)
            y = int(torch.randint(0, C_REV, (1,), generator=g))
            tok[int(torch.randint(0, length, (1,), generator=g))] = 1 + y
            self.items.append((tok, y))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _collate(trim_to_shortest):
    def collate_reviews(batch):
        lengths = [len(t) for t, _ in batch]
        width = min(lengths) if trim_to_shortest else max(lengths)
        tok = torch.zeros(len(batch), width, dtype=torch.long)           # 0 = padding
        for k, (t, _) in enumerate(batch):
            tok[k, :min(len(t), width)] = t[:width]
        return tok, torch.tensor([y for _, y in batch])
    return collate_reviews


class BagOfEmbeddings(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.emb = nn.Embedding(V_REV, d, padding_idx=0)
        self.head = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, C_REV))

    def forward(self, tok):
        return self.head(self.emb(tok).max(1).values)


@case("reviews_collate_trims_batch_to_shortest_sequence", "data",
      "the collate_fn builds each batch with width = min(lengths) 'to avoid padding' and cuts every review to it: with "
      "lengths from 6 to 60 the batch is trimmed to about the shortest review's 6-8 tokens, so the keyword that carries "
      "the label is cut off in most reviews (pad to max(lengths) instead)",
      r"truncat|trim|shortest|min\(lengths?\)|cut (off|to)|(tokens?|sequences?|reviews?)[^.]*(cut|dropped|lost|discarded)|"
      r"(batch|sequence) (length|width)[^.]*(short|small|min)")
def reviews_collate_trims_batch_to_shortest_sequence(fixed: bool = False):
    seed(0)
    collate = _collate(trim_to_shortest=not fixed)
    model = BagOfEmbeddings()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(ReviewTokens(2000, 160), 32, collate_fn=collate),
                val_loader=loader(ReviewTokens(500, 161), 100, shuffle=False, collate_fn=collate),
                loss_fn=nn.CrossEntropyLoss(), max_steps=400)


def _fact_trim():
    tok, _ = next(iter(loader(ReviewTokens(64, 0), 32, collate_fn=_collate(True))))
    print(f"  trimmed batch shape {tuple(tok.shape)}; the same batch padded: "
          f"{tuple(next(iter(loader(ReviewTokens(64, 0), 32, collate_fn=_collate(False))))[0].shape)}")


fix("reviews_collate_trims_batch_to_shortest_sequence",
    lambda: reviews_collate_trims_batch_to_shortest_sequence(fixed=True),
    _val_acc, "val accuracy", _fact_trim, steps=400)


# --------------------------------------------------------------------------------------------------------------------
# 2. DataLoader(batch_size=None) from a config whose null meant "the default"

CONFIG = {"batch_size": None, "shuffle": True}        # null: "use the loader's default" (which is 1)


@case("churn_loader_batch_size_none_disables_batching", "data",
      "the training DataLoader gets batch_size=cfg['batch_size'], which is None in the config ('null = default'), but "
      "batch_size=None DISABLES automatic batching: every 'batch' is one unbatched sample (features (20,), target ()), "
      "which the MLP and cross_entropy accept silently, so each optimizer step sees a single example",
      r"batch_size\s*=\s*None|batch.?size[^.]*(none|null|1\b|one)|unbatched|automatic batching|single (sample|example)|"
      r"one (sample|example) per (step|batch)|no batch (dim|dimension|axis)")
def churn_loader_batch_size_none_disables_batching(fixed: bool = False):
    seed(0)
    g = gen(170)
    x = torch.randn(3000, 20, generator=g)
    y = (torch.tanh(x @ torch.randn(20, 32, generator=g) / 20 ** 0.5 * 1.5) @ torch.randn(32, 4, generator=g)).argmax(1)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    batch_size = 64 if fixed else CONFIG["batch_size"]
    train = DataLoader(TensorDataset(x[:2500], y[:2500]), batch_size=batch_size, shuffle=CONFIG["shuffle"],
                       generator=torch.Generator().manual_seed(1234))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), train_loader=train,
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


def _fact_batch_none():
    x, y = next(iter(DataLoader(TensorDataset(torch.randn(10, 20), torch.zeros(10, dtype=torch.long)),
                                batch_size=None)))
    print(f"  batch_size=None yields x {tuple(x.shape)}, y {tuple(y.shape)}; "
          f"cross_entropy on it: {F.cross_entropy(torch.randn(4), y).item():.3f} (no error)")


fix("churn_loader_batch_size_none_disables_batching", lambda: churn_loader_batch_size_none_disables_batching(fixed=True),
    _val_acc, "val accuracy", _fact_batch_none, steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 3. collate that label-encodes the category strings per batch

REGIONS = [f"{side}-{kind}" for side in ("north", "south", "east", "west", "central")
           for kind in ("alpine", "coast", "delta", "plain", "metro", "rural", "island", "valley")]


class PolicyRows(Dataset):
    def __init__(self, n, s):
        g = gen(s)
        self.region = torch.randint(0, len(REGIONS), (n,), generator=g)
        self.num = torch.randn(n, 4, generator=g)
        risk = torch.linspace(-2, 2, len(REGIONS))[torch.randperm(len(REGIONS), generator=gen(0))]
        self.y = ((risk[self.region] + 0.2 * self.num[:, 0]) > 0).long()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"region": REGIONS[self.region[i]], "num": self.num[i], "label": self.y[i]}


GLOBAL_VOCAB = {r: k for k, r in enumerate(sorted(REGIONS))}


def _policy_collate(per_batch):
    def collate_policies(rows):
        names = [r["region"] for r in rows]
        vocab = {c: k for k, c in enumerate(sorted(set(names)))} if per_batch else GLOBAL_VOCAB
        region = torch.tensor([vocab[c] for c in names])
        return (region, torch.stack([r["num"] for r in rows])), torch.stack([r["label"] for r in rows])
    return collate_policies


class PolicyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.region = nn.Embedding(len(REGIONS), 8)
        self.mlp = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, inputs):
        region, num = inputs
        return self.mlp(torch.cat([self.region(region), num], -1))


def _val_policy_acc(model, kw):
    def fn(m, b):
        (region, num), y = b
        dev = next(m.parameters()).device
        return (m((region.to(dev), num.to(dev))).argmax(-1) == y.to(dev)).sum().item(), len(y)
    return mean_over(model, kw["val_loader"], fn)


@case("insurance_collate_label_encodes_regions_per_batch", "data",
      "the collate_fn label-encodes the region strings with {c: i for i, c in enumerate(sorted(set(names)))} built from "
      "the regions present in THAT batch: the id of a region depends on which other regions the batch happens to hold, "
      "so the same region gets different embedding rows from batch to batch and the strongest feature is scrambled "
      "(build the vocabulary once, from the training set)",
      r"per.?batch (vocab|encod|codes?|ids?|mapping)|(vocab\w*|encod\w*|mapping)\b[^.]*\b(per|each|every|that) batch|"
      r"batch to batch|\b(ids?|codes?)\b[^.]*differ\w* (from|between|across) batch|(inconsistent|unstable|changing) "
      r"(ids?|codes?|encoding|mapping)|categor\w*[^.]*\b(encod\w*|ids?|codes?)\b")
def insurance_collate_label_encodes_regions_per_batch(fixed: bool = False):
    seed(0)
    collate = _policy_collate(per_batch=not fixed)
    model = PolicyNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(PolicyRows(2500, 180), 16, collate_fn=collate),
                val_loader=loader(PolicyRows(600, 181), 100, shuffle=False, collate_fn=collate),
                loss_fn=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]), max_steps=300)


def _fact_per_batch_codes():
    collate = _policy_collate(per_batch=True)
    a = collate([{"region": r, "num": torch.zeros(4), "label": torch.tensor(0)} for r in ("west-coast", "north-plain")])
    b = collate([{"region": r, "num": torch.zeros(4), "label": torch.tensor(0)} for r in ("west-coast", "east-delta", "central-metro")])
    print(f"  'west-coast' is encoded as {a[0][0][0].item()} in one batch and {b[0][0][0].item()} in another")


fix("insurance_collate_label_encodes_regions_per_batch",
    lambda: insurance_collate_label_encodes_regions_per_batch(fixed=True),
    _val_policy_acc, "val accuracy", _fact_per_batch_codes, steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 4. STFT features computed with n_fft and hop_length swapped (positional arguments)

SR, CLIP = 8000, 4096
TONES = [800.0, 1200.0, 1600.0, 2000.0, 2400.0, 2800.0]
BURST = 96
N_FFT, HOP = 512, 128


def _tone_clips(n, s):
    g = gen(s)
    y = torch.randint(0, len(TONES), (n,), generator=g)
    t = torch.arange(CLIP) / SR
    f = torch.tensor(TONES)[y] + 20 * torch.randn(n, generator=g)
    phase = torch.rand(n, 1, generator=g) * 6.28
    start = torch.randint(0, CLIP - BURST, (n,), generator=g)
    env = ((torch.arange(CLIP)[None] >= start[:, None]) & (torch.arange(CLIP)[None] < start[:, None] + BURST)).float()
    wav = torch.sin(2 * torch.pi * f[:, None] * t[None] + phase) * env + 0.5 * torch.randn(n, CLIP, generator=g)
    return wav, y


def log_spectrum(wav, swapped):
    """(B, samples) -> (B, n_bins) log-magnitude spectrum averaged over frames (computed once, as preprocessing)."""
    if swapped:
        spec = torch.stft(wav, HOP, N_FFT, return_complex=True)          # positional: n_fft=128, hop_length=512
    else:
        spec = torch.stft(wav, N_FFT, HOP, return_complex=True)
    feats = torch.log1p(spec.abs()).max(-1).values
    return F.interpolate(feats.unsqueeze(1), size=128, mode="linear").squeeze(1)


def _val_tone_acc(model, kw):
    return _val_acc(model, kw)


@case("tones_stft_n_fft_and_hop_length_swapped", "data",
      "the preprocessing calls torch.stft(wav, HOP, N_FFT) with the positional arguments swapped (N_FFT=512, HOP=128 "
      "were meant): torch.stft's second argument is n_fft, so the frames are 128 samples long and hop_length=512 leaves "
      "gaps of 384 samples between them: three quarters of every clip is never analysed and the short tone burst that "
      "carries the label falls between frames in most clips",
      r"n_fft|hop.?length|stft|swapp|frame (length|size)|window (length|size)|frequency resolution|"
      r"(skip|miss|ignor)\w*[^.]*(samples|audio|signal)|positional")
def tones_stft_n_fft_and_hop_length_swapped(fixed: bool = False):
    seed(0)
    wav, y = _tone_clips(1800, 190)
    x = log_spectrum(wav, swapped=not fixed)
    x = (x - x[:1500].mean(0)) / (x[:1500].std(0) + 1e-6)
    model = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, len(TONES)))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1500], y[:1500]), 64),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 300, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


def _fact_stft():
    w = torch.randn(1, CLIP)
    a, b = torch.stft(w, HOP, N_FFT, return_complex=True), torch.stft(w, N_FFT, HOP, return_complex=True)
    print(f"  stft(w, HOP, N_FFT): {a.shape[1]} bins x {a.shape[2]} frames ({SR / HOP:.1f} Hz per bin); "
          f"stft(w, N_FFT, HOP): {b.shape[1]} bins x {b.shape[2]} frames ({SR / N_FFT:.1f} Hz per bin)")


fix("tones_stft_n_fft_and_hop_length_swapped", lambda: tones_stft_n_fft_and_hop_length_swapped(fixed=True),
    _val_tone_acc, "val accuracy", _fact_stft, steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 5. sklearn-style split with test_size=0.8 meant as the training fraction


def train_test_split(x, y, test_size, seed_):
    """The sklearn signature, re-implemented (no sklearn here): a shuffled split with test_size as a fraction."""
    perm = torch.randperm(len(x), generator=gen(seed_))
    n_test = int(round(test_size * len(x)))
    test, train = perm[:n_test], perm[n_test:]
    return x[train], x[test], y[train], y[test]


@case("credit_split_test_size_meant_as_train_fraction", "data",
      "the split is train_test_split(X, y, test_size=0.8) with 0.8 meant as the TRAINING fraction: only 20% of the rows "
      "(500 of 2500) are trained on and 80% are held out, so the MLP overfits a fifth of the data it has",
      r"test_size|train_size|(val\w*|test|held.?out)[^.]*(larger|bigger|more than|80%|four times)|"
      r"(train\w*) (set|split|rows|data)[^.]*(small|only|20%|fifth)|only[^.]*(20%|fifth)[^.]*train")
def credit_split_test_size_meant_as_train_fraction(fixed: bool = False):
    seed(0)
    g = gen(200)
    x = torch.randn(2500, 20, generator=g)
    y = (((x @ torch.randn(20, 20, generator=g)) * x).sum(1) > 0).long()        # feature interactions decide
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.2 if fixed else 0.8, seed_=0)
    model = nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x_train, y_train), 32),
                val_loader=loader(TensorDataset(x_val, y_val), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


def _fact_split():
    x, y = torch.zeros(2500, 1), torch.zeros(2500)
    a = train_test_split(x, y, test_size=0.8, seed_=0)
    print(f"  test_size=0.8: {len(a[0])} training rows, {len(a[1])} held out")


fix("credit_split_test_size_meant_as_train_fraction", lambda: credit_split_test_size_meant_as_train_fraction(fixed=True),
    _val_acc, "val accuracy", _fact_split, steps=500)
