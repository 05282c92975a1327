"""Family mechanics: the momentum update, the queue, the temperature, the mining, the symmetric loss."""

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_bg.cases_shapes import triplet_kwargs
from benchmarks.blind_preflight_bg.cases_targets import MoCo, moco_kwargs, moco_loss
from benchmarks.blind_preflight_bg.registry import (DIN, SSLNet, case, fix, fixed_of, knn_accuracy, latent_signal,
                                                    retrieval_top1, seed, ssl_kwargs, augment, loader, mlp, gen)
from torch.utils.data import Dataset


@case("moco_momentum_update_reversed", "mechanics",
      "The MoCo momentum update is written the wrong way round, query = m * query + (1 - m) * key, so the query "
      "encoder is dragged back toward the stale key encoder every step and the key encoder never moves.",
      r"momentum.{0,120}(revers|wrong (way|direction)|swap|backward|query|online)|"
      r"(key|target) (encoder|network).{0,80}(never (moves|updat)|not updat|stale)|"
      r"(query|online) (encoder|network).{0,80}(dragged|pulled|overwrit|toward)")
def moco_momentum_update_reversed(fixed=False):
    seed(0)
    return moco_kwargs(MoCo(), moco_loss(reversed_momentum=not fixed))


fix("moco_momentum_update_reversed", fixed_of(moco_momentum_update_reversed), retrieval_top1, "val retrieval top-1")


@case("triplet_margin_loss_arguments_swapped", "mechanics",
      "F.triplet_margin_loss is called as (anchor, negative, positive) instead of (anchor, positive, negative), so "
      "the loss pulls each anchor toward the other-class sample and pushes its same-class positive away.",
      r"(argument|order|positional)s?.{0,100}(swap|revers|anchor, ?positive, ?negative|wrong)|"
      r"(positive|negative)s? and (negative|positive)s? (are )?(swapped|reversed|exchanged)|"
      r"(anchor, ?negative, ?positive)|push\w* .{0,40}positive.{0,20}away")
def triplet_margin_loss_arguments_swapped(fixed=False):
    seed(0)
    model = nn.Sequential(nn.Linear(DIN, 64), nn.ReLU(), nn.Linear(64, 32))

    def loss_fn(m, batch):
        a, p, n = (F.normalize(m(t), dim=1) for t in batch)
        return F.triplet_margin_loss(a, p, n, margin=0.5) if fixed else F.triplet_margin_loss(a, n, p, margin=0.5)
    return triplet_kwargs(model, loss_fn)


fix("triplet_margin_loss_arguments_swapped", fixed_of(triplet_margin_loss_arguments_swapped), knn_accuracy,
    "val 1-NN accuracy")


@case("infonce_temperature_multiplied", "mechanics",
      "The InfoNCE cosine similarities are multiplied by the temperature 0.1 instead of divided by it, so the logits "
      "lie in [-0.1, 0.1], the softmax is nearly uniform and the contrastive gradient is tiny.",
      r"temperature.{0,100}(multipl|divid|instead|inverted|\* ?0?\.1|/ ?t)|(multipl|divid)\w*.{0,60}temperature|"
      r"(nearly |almost )?uniform softmax|logits?.{0,60}(tiny|too small|\[-0?\.1)")
def infonce_temperature_multiplied(fixed=False):
    seed(0)
    t = 0.1

    def loss_fn(m, batch):
        z1, z2 = F.normalize(m.project(batch[0]), dim=1), F.normalize(m.project(batch[1]), dim=1)
        sim = z1 @ z2.T
        logits = sim / t if fixed else sim * t
        y = torch.arange(len(z1))
        return 0.5 * (F.cross_entropy(logits, y) + F.cross_entropy(logits.T, y))
    return ssl_kwargs(SSLNet(), loss_fn, latent_signal(1024, 0)[0])


fix("infonce_temperature_multiplied", fixed_of(infonce_temperature_multiplied), retrieval_top1, "val retrieval top-1")


class LabelledViews(Dataset):
    def __init__(self, sig, y):
        self.sig, self.y = sig, y

    def __len__(self):
        return len(self.sig)

    def __getitem__(self, i):
        return augment(self.sig[i]), self.y[i]


@case("triplet_hard_negative_mining_unmasked", "mechanics",
      "Batch-hard mining takes the hardest negative as the closest row of the batch without masking same-class rows "
      "and the anchor itself, so the 'negative' is the anchor (distance 0) or a positive and the loss only pulls.",
      r"(mining|hardest negative|negative)s?.{0,120}(mask|same.?class|anchor itself|itself|diagonal|positive)|"
      r"(same.?class|anchor itself|diagonal).{0,80}(excluded|mask|negative)")
def triplet_hard_negative_mining_unmasked(fixed=False):
    seed(0)
    sig, y = latent_signal(1024, 0, classes=12)
    model = nn.Sequential(nn.Linear(DIN, 64), nn.ReLU(), nn.Linear(64, 32))

    def loss_fn(m, batch):
        x, lab = batch
        e = F.normalize(m(x), dim=1)
        d = torch.cdist(e, e)
        same = lab[:, None] == lab[None, :]
        pos = d.masked_fill(~same, -1).max(1).values
        neg_d = d.masked_fill(same, 1e3) if fixed else d
        return F.relu(pos - neg_d.min(1).values + 0.5).mean()
    kw = triplet_kwargs(model, loss_fn)
    kw["train_loader"] = loader(LabelledViews(sig, y), 64, drop_last=True)
    sv, yv = latent_signal(384, 5, classes=12)
    kw["val_loader"] = loader(LabelledViews(sv, yv), 64, shuffle=False)
    return kw


fix("triplet_hard_negative_mining_unmasked", fixed_of(triplet_hard_negative_mining_unmasked), knn_accuracy,
    "val 1-NN accuracy")


class PairedModalities(Dataset):
    """CLIP-style pairs: an 'image' vector and a 'text' vector, two different noisy maps of one latent."""

    def __init__(self, n, s, shuffle_text=False):
        g = gen(s)
        z = torch.randn(n, 6, generator=g)
        self.img = torch.tanh(z @ torch.randn(6, 32, generator=gen(90))) + 0.1 * torch.randn(n, 32, generator=g)
        self.txt = torch.sin(z @ torch.randn(6, 20, generator=gen(91)) / 2) + 0.1 * torch.randn(n, 20, generator=g)
        self.order = torch.randperm(n, generator=gen(92)) if shuffle_text else torch.arange(n)

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        return self.img[i], self.txt[self.order[i]]


class CLIP(nn.Module):
    def __init__(self):
        super().__init__()
        self.img = mlp(32, 64, 24)
        self.txt = mlp(20, 64, 24)
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, img):
        return self.img(img)

    def encode(self, img, txt):
        return F.normalize(self.img(img), dim=1), F.normalize(self.txt(txt), dim=1)


@torch.no_grad()
def clip_retrieval(model, kw):
    """Image -> text top-1 retrieval over the 256 validation pairs."""
    was = model.training
    model.eval()
    ds = kw["val_pairs"]
    a, b = model.encode(ds.img, ds.txt)
    model.train(was)
    return ((a @ b.T).argmax(1) == torch.arange(len(a))).float().mean().item()


def clip_kwargs(model, loss_fn, shuffle_text=False):
    val = PairedModalities(256, 5)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(PairedModalities(1024, 0, shuffle_text), 64, drop_last=True), loss_fn=loss_fn,
                val_loader=loader(val, 64, shuffle=False), val_pairs=val)


@case("infonce_distance_logits_not_negated", "mechanics",
      "The InfoNCE logits are the Euclidean distances torch.cdist(z1, z2) / t instead of their negatives, so the "
      "cross-entropy rewards a large distance to the positive pair and a small one to the negatives.",
      r"(distance|cdist)\w*.{0,100}(negat|sign|minus|instead of (a )?similarit)|"
      r"(negat\w*|minus|sign of) (the )?(distance|cdist)|(larger|large) distance.{0,60}(positive|reward)")
def infonce_distance_logits_not_negated(fixed=False):
    seed(0)

    def loss_fn(m, batch):
        z1, z2 = F.normalize(m.project(batch[0]), dim=1), F.normalize(m.project(batch[1]), dim=1)
        d = torch.cdist(z1, z2)
        logits = -d / 0.2 if fixed else d / 0.2
        return F.cross_entropy(logits, torch.arange(len(z1)))
    return ssl_kwargs(SSLNet(), loss_fn, latent_signal(1024, 0)[0])


fix("infonce_distance_logits_not_negated", fixed_of(infonce_distance_logits_not_negated), retrieval_top1,
    "val retrieval top-1")
