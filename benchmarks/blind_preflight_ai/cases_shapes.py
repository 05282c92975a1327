"""Set ai, family shapes: tensors of the right size laid out wrongly (reshape instead of permute, h_n viewed across
the batch, a collated list stacked the wrong way, (B, 1) against (B,) in a hand-written loss)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_ai.registry import (
    acc_of,
    case,
    class_mean_acc,
    fix,
    fixed_of,
    gen,
    loader,
    rmse_of,
    seed,
)

# ---------------------------------------------------------------------------------------------------------------
# ai_hwc_reshape_to_chw: image classification, a custom Dataset over HWC uint8 arrays (as PIL / OpenCV give them)


def bar_images(n: int, s: int, size: int = 12):
    """HWC uint8 images: a horizontal or vertical bar, red or blue, at a random place on grey noise. 4 classes."""
    rng = np.random.default_rng(s)
    imgs = rng.integers(40, 90, size=(n, size, size, 3)).astype(np.uint8)
    labels = rng.integers(0, 4, size=n)
    for i, c in enumerate(labels):
        vertical, blue = divmod(int(c), 2)
        colour = np.array([30, 40, 210] if blue else [210, 40, 30], dtype=np.uint8)
        a, b = rng.integers(0, size - 6), rng.integers(0, size)
        if vertical:
            imgs[i, a:a + 6, b] = colour
        else:
            imgs[i, b, a:a + 6] = colour
    return imgs, labels


class BarImages(Dataset):
    def __init__(self, imgs, labels, fixed):
        self.imgs, self.labels, self.fixed = imgs, labels, fixed

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        img = torch.from_numpy(self.imgs[i]).float().div(255)          # (H, W, 3)
        if self.fixed:
            img = img.permute(2, 0, 1)                                   # (3, H, W)
        else:
            img = img.reshape(3, img.shape[0], img.shape[1])             # BUG: same numel, pixels scrambled
        return (img - 0.3) / 0.25, int(self.labels[i])


def small_cnn(n_out: int = 4):
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, n_out))


@case("ai_hwc_reshape_to_chw", "shapes",
      bug="The Dataset turns each HWC uint8 image (H, W, 3) into the (3, H, W) the Conv2d expects with "
          "img.reshape(3, H, W) instead of img.permute(2, 0, 1): the shape is right but the pixels are scrambled, "
          "channels and rows interleaved, so colour and orientation are no longer where the CNN looks.",
      cause_pattern=r"(reshape|view)\(3|reshap\w*.{0,80}(instead of|not|rather than).{0,30}(permute|transpose)|"
                    r"(permute|transpose)\(2, ?0, ?1\)|HWC|channels?[- ]last.{0,80}(reshape|view|scrambl|interleav)|"
                    r"(scrambl|interleav)\w*.{0,60}(pixel|channel)")
def hwc_reshape_to_chw(fixed: bool = False):
    seed(0)
    imgs, labels = bar_images(1400, 1)
    train = BarImages(imgs[:1000], labels[:1000], fixed)
    val = BarImages(imgs[1000:], labels[1000:], fixed)   # the same pipeline for validation
    model = small_cnn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


fix("ai_hwc_reshape_to_chw", fixed_of(hwc_reshape_to_chw), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy (same pipeline)", steps=200)

# ---------------------------------------------------------------------------------------------------------------
# segmentation data shared by the seg cases of this set


def blob_masks(n: int, s: int, size: int = 12):
    """(N, 1, H, W) float images and (N, H, W) uint8 masks: a bright (class 1) or dark (class 2) rectangle."""
    g = gen(s)
    x = 0.3 * torch.randn(n, 1, size, size, generator=g)
    m = torch.zeros(n, size, size, dtype=torch.uint8)
    for i in range(n):
        for _ in range(2):
            h, w = torch.randint(3, 7, (2,), generator=g).tolist()
            r, c = torch.randint(0, size - h, (1,), generator=g).item(), torch.randint(0, size - w, (1,), generator=g).item()
            cls = torch.randint(1, 3, (1,), generator=g).item()
            x[i, 0, r:r + h, c:c + w] += 1.0 if cls == 1 else -1.0
            m[i, r:r + h, c:c + w] = cls
    return x, m


def seg_net(n_classes: int = 3):
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, n_classes, 1))


def seg_fwd(m, b):
    return m(b[0]).argmax(1), b[1].long()


# ---------------------------------------------------------------------------------------------------------------
# ai_seg_flatten_no_permute


@case("ai_seg_flatten_no_permute", "shapes",
      bug="The segmentation loss flattens the (N, C, H, W) logits with logits.view(-1, C) without first moving the "
          "class axis last (permute(0, 2, 3, 1)), against mask.view(-1): each 'pixel row' of C scores is C "
          "neighbouring pixels of one channel, so the cross-entropy pairs scores and labels of different pixels.",
      cause_pattern=r"permute\(0, ?2, ?3, ?1\)|view\(-1, ?(C|n_classes|num_classes|3)\)|"
                    r"(class|channel) (axis|dim\w*).{0,60}(last|before (the )?(view|reshape|flatten))|"
                    r"(logits|outputs?|scores)\w*.{0,60}(flatten|view|reshape)\w*.{0,60}(without|before|instead of).{0,30}"
                    r"(permute|transpose)|"
                    r"(N, ?C, ?H, ?W).{0,80}(view|flatten|reshape)")
def seg_flatten_no_permute(fixed: bool = False):
    seed(0)
    x, m = blob_masks(600, 2)

    def seg_loss(model, batch):
        img, mask = batch
        logits = model(img)                                   # (N, C, H, W)
        c = logits.shape[1]
        if fixed:
            logits = logits.permute(0, 2, 3, 1)
        return F.cross_entropy(logits.reshape(-1, c), mask.reshape(-1).long())

    model = seg_net()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:450], m[:450]), 16),
                val_loader=loader(TensorDataset(x[450:], m[450:]), 50, shuffle=False),
                loss_fn=seg_loss, max_steps=800)


fix("ai_seg_flatten_no_permute", fixed_of(seg_flatten_no_permute),
    lambda model, kw: class_mean_acc(model, kw["val_loader"], seg_fwd, 3), "val class-mean pixel accuracy", steps=200)

# ---------------------------------------------------------------------------------------------------------------
# ai_bilstm_hn_view: text classification with a bidirectional LSTM


def keyword_texts(n: int, s: int, length: int = 14, vocab: int = 60):
    """Token ids 4..vocab-1; class k (of 3) has 2-3 tokens of its keyword group {4+3k .. 6+3k} among fillers."""
    g = gen(s)
    x = torch.randint(13, vocab, (n, length), generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    for i in range(n):
        pos = torch.randperm(length, generator=g)[: torch.randint(2, 4, (1,), generator=g).item()]
        x[i, pos] = 4 + 3 * y[i] + torch.randint(0, 3, (len(pos),), generator=g)
    return x, y


class BiLSTMClassifier(nn.Module):
    def __init__(self, vocab=60, dim=16, hidden=24, n_classes=3, fixed=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, n_classes)
        self.fixed = fixed

    def forward(self, ids):
        _, (h_n, _) = self.lstm(self.emb(ids))               # h_n: (2, B, hidden)
        if self.fixed:
            feats = torch.cat([h_n[0], h_n[1]], dim=1)
        else:
            feats = h_n.view(ids.shape[0], -1)                # BUG: mixes samples 2i, 2i+1 / the two directions
        return self.fc(feats)


@case("ai_bilstm_hn_view", "shapes",
      bug="The classifier takes the final states of its bidirectional nn.LSTM as h_n.view(batch, -1): h_n is "
          "(num_directions, batch, hidden), so each row of the view holds the states of two different samples "
          "(2i and 2i+1) of one direction, and the head scores sample i from the wrong sentences.",
      cause_pattern=r"h_n|h_?n\.view|hidden\.view|(num_directions|directions?).{0,80}(batch|sample|mix|view)|"
                    r"torch\.cat\(\[?h\w*\[0\], ?h\w*\[1\]|(states?|hidden) of (two )?(different|other) samples")
def bilstm_hn_view(fixed: bool = False):
    seed(0)
    x, y = keyword_texts(1200, 3)
    model = BiLSTMClassifier(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:900], y[:900]), 32),
                val_loader=loader(TensorDataset(x[900:], y[900:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("ai_bilstm_hn_view", fixed_of(bilstm_hn_view), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy (the head scores each sample from its own states)", steps=200)

# ---------------------------------------------------------------------------------------------------------------
# ai_collate_list_targets: two-output tabular regression, targets returned as a Python list per sample


class TwoTargetRows(Dataset):
    """Each row: features and [energy_use, peak_load] as a plain Python list, as a CSV reader gives them."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], [float(self.y[i, 0]), float(self.y[i, 1])]


def two_targets(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    w = torch.randn(10, 2, generator=g) / 3
    y = torch.tanh(x @ w) * 2 + 0.05 * torch.randn(n, 2, generator=g)
    return x, y


@case("ai_collate_list_targets", "shapes",
      bug="The Dataset returns the two regression targets as a Python list, which default_collate turns into a list "
          "of two (B,) tensors (one per target, not one per sample); the loss rebuilds the (B, 2) target with "
          "torch.stack(targets).view(-1, 2) instead of torch.stack(targets, dim=1), so row i pairs target values of "
          "samples 2i and 2i+1 and no row matches its inputs.",
      cause_pattern=r"default_collate|collat\w*.{0,80}(list|transpos)|stack\(\w*\)\.view\(-1, ?2\)|"
                    r"stack\(\w*, ?dim=1\)|torch\.stack.{0,80}(dim|axis|transpos|view)|"
                    r"list of (two )?\(B,?\) tensors|(one|a) tensor per target")
def collate_list_targets(fixed: bool = False):
    seed(0)
    x, y = two_targets(1400, 4)

    def two_target_mse(model, batch):
        feats, targets = batch                        # targets: [tensor(B), tensor(B)] after default_collate
        if fixed:
            target = torch.stack(targets, dim=1)
        else:
            target = torch.stack(targets).view(-1, 2)  # BUG: (2, B) read as (B, 2)
        return F.mse_loss(model(feats), target.float())

    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TwoTargetRows(x[:1000], y[:1000]), 32),
                val_loader=loader(TwoTargetRows(x[1000:], y[1000:]), 100, shuffle=False),
                loss_fn=two_target_mse, max_steps=800)


fix("ai_collate_list_targets", fixed_of(collate_list_targets),
    rmse_of(lambda m, b: (m(b[0]), torch.stack(b[1], dim=1))), "val RMSE (both targets)", steps=250, higher=False)

# ---------------------------------------------------------------------------------------------------------------
# ai_rating_broadcast_loss: explicit-feedback recommender with a hand-written squared error


def ratings(n_users: int, n_items: int, n: int, s: int):
    g = gen(s)
    u_f, i_f = torch.randn(n_users, 4, generator=g), torch.randn(n_items, 4, generator=g)
    u = torch.randint(0, n_users, (n,), generator=g)
    i = torch.randint(0, n_items, (n,), generator=g)
    r = 3.0 + (u_f[u] * i_f[i]).sum(1) * 0.6 + 0.1 * torch.randn(n, generator=g)
    return u, i, r.clamp(0.5, 5.5)


class RatingModel(nn.Module):
    """Biased matrix factorisation; returns (B, 1) like a Linear head would."""

    def __init__(self, n_users, n_items, k=8):
        super().__init__()
        self.user = nn.Embedding(n_users, k)
        self.item = nn.Embedding(n_items, k)
        self.user_bias = nn.Embedding(n_users, 1)
        self.item_bias = nn.Embedding(n_items, 1)
        self.global_bias = nn.Parameter(torch.tensor([3.0]))
        for e in (self.user, self.item):
            nn.init.normal_(e.weight, std=0.3)
        for e in (self.user_bias, self.item_bias):
            nn.init.zeros_(e.weight)

    def forward(self, u, i):
        dot = (self.user(u) * self.item(i)).sum(1, keepdim=True)
        return dot + self.user_bias(u) + self.item_bias(i) + self.global_bias     # (B, 1)


@case("ai_rating_broadcast_loss", "shapes",
      bug="The hand-written rating loss computes ((pred - rating) ** 2).mean() with pred of shape (B, 1) from the "
          "model and rating of shape (B,) from the loader: the subtraction broadcasts to a (B, B) matrix, every "
          "prediction is pushed toward every rating of the batch, and the model only learns the global mean.",
      cause_pattern=r"\(64, ?1\).{0,80}\(64,?\)|\(64, ?64\)|\(B, ?1\).{0,60}\(B,?\).{0,60}rating|"
                    r"rating.{0,80}broadcast|broadcast\w*.{0,80}rating|(hand-?written|custom) (rating )?(loss|"
                    r"squared error).{0,80}(broadcast|shape)|\(pred - rating\)")
def rating_broadcast_loss(fixed: bool = False):
    seed(0)
    u, i, r = ratings(40, 50, 3000, 5)

    def rating_mse(model, batch):
        users, items, rating = batch
        pred = model(users, items)
        if fixed:
            pred = pred.squeeze(-1)
        return ((pred - rating) ** 2).mean()      # BUG when not fixed: (B, 1) - (B,) -> (B, B)

    model = RatingModel(40, 50)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-2),
                train_loader=loader(TensorDataset(u[:2400], i[:2400], r[:2400]), 64),
                val_loader=loader(TensorDataset(u[2400:], i[2400:], r[2400:]), 200, shuffle=False),
                loss_fn=rating_mse, max_steps=1000)


fix("ai_rating_broadcast_loss", fixed_of(rating_broadcast_loss),
    rmse_of(lambda m, b: (m(b[0], b[1]).squeeze(-1), b[2])), "val rating RMSE", steps=300, higher=False)
