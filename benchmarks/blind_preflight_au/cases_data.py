"""Data: weighted samplers, mismatched augmentation views, cached teacher logits and stale pseudo-labels."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset, WeightedRandomSampler

from benchmarks.blind_preflight.fixes import val_acc
from benchmarks.blind_preflight_au.registry import (
    FIX_TABLE,
    balanced_acc,
    blobs,
    case,
    fixed_of,
    gen,
    loader,
    mlp,
    oracle_teacher,
    seed,
)


# 1. WeightedRandomSampler given one weight per class
@case("sampler_class_weights_not_per_sample", "data",
      "WeightedRandomSampler is given the 3 per-class weights instead of one weight per sample, so it only ever "
      "draws dataset indices 0, 1 and 2 and the model trains on three rows.",
      r"WeightedRandomSampler|per[- ]sample weight|one weight per (sample|example|row)|weights?\[labels?\]|"
      r"len\(weights\)|only (draws|samples) (indices|a few)|(sampler|draws).*(indices|index) (0|range)")
def sampler_class_weights_not_per_sample(fixed=False):
    seed(70)
    x, y = blobs(4000, 8, [0.8, 0.15, 0.05], sep=0.7, s=71)
    xt, yt = x[:3200], y[:3200]
    counts = torch.bincount(yt, minlength=3).double()
    class_w = 1.0 / counts
    weights = class_w[yt] if fixed else class_w
    sampler = WeightedRandomSampler(weights, num_samples=len(yt), replacement=True, generator=gen(72))
    model = mlp(8, 3)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=DataLoader(TensorDataset(xt, yt), batch_size=64, sampler=sampler),
                val_loader=loader(TensorDataset(x[3200:], y[3200:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


FIX_TABLE.fix("sampler_class_weights_not_per_sample", fixed_of(sampler_class_weights_not_per_sample), balanced_acc,
              "val balanced acc")


# 2. sampler weights proportional to class counts instead of inverse
@case("sampler_weights_counts_not_inverse", "data",
      "The WeightedRandomSampler's per-sample weights are the class counts (counts[labels]) instead of their "
      "inverse, so the majority class is drawn even more often and the rare classes almost never.",
      r"inverse|1\s*/\s*count|reciprocal|counts\[labels?\]|(weights?|sampler).*(proportional to|equal to) "
      r"(the )?(class )?(count|frequen)|amplif|over-?samples? the majority|WeightedRandomSampler")
def sampler_weights_counts_not_inverse(fixed=False):
    seed(73)
    x, y = blobs(4000, 8, [0.8, 0.15, 0.05], sep=0.6, s=74)
    xt, yt = x[:3200], y[:3200]
    counts = torch.bincount(yt, minlength=3).double()
    weights = (1.0 / counts)[yt] if fixed else counts[yt]
    sampler = WeightedRandomSampler(weights, num_samples=len(yt), replacement=True, generator=gen(75))
    model = mlp(8, 3)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=DataLoader(TensorDataset(xt, yt), batch_size=64, sampler=sampler),
                val_loader=loader(TensorDataset(x[3200:], y[3200:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


FIX_TABLE.fix("sampler_weights_counts_not_inverse", fixed_of(sampler_weights_counts_not_inverse), balanced_acc,
              "val balanced acc")


# 3. weak and strong views of different unlabelled rows (FixMatch-style)
class TwoViews(Dataset):
    """Labelled row, then a weak and a strong view of an unlabelled row; strong views are precomputed."""

    def __init__(self, xl, yl, xu, fixed, s=0):
        g = gen(s)
        self.xl, self.yl, self.xu = xl, yl, xu
        self.weak = xu + 0.1 * torch.randn(xu.shape, generator=g)
        strong_src = xu if fixed else xu[torch.randperm(len(xu), generator=g)]   # cached from a shuffled copy
        self.strong = strong_src + 0.5 * torch.randn(xu.shape, generator=g) * (torch.rand(xu.shape, generator=g) > 0.2)

    def __len__(self):
        return len(self.xu)

    def __getitem__(self, i):
        j = i % len(self.xl)
        return self.xl[j], self.yl[j], self.weak[i], self.strong[i]


@case("fixmatch_views_of_different_rows", "data",
      "The strong augmentations were cached from a shuffled copy of the unlabelled set, so the weak and strong "
      "views in each item come from different rows and the pseudo-label from the weak view is trained onto an "
      "unrelated example.",
      r"(weak|strong).*(different|other|unrelated|another) (row|sample|example|image)|pair(ed|ing)|misalign|"
      r"not the same (row|sample|example)|shuffled (copy|separately|independently)|views? (do not|don't) match")
def fixmatch_views_of_different_rows(fixed=False):
    seed(76)
    x, y = blobs(5000, 10, [0.25] * 4, sep=0.9, s=77)
    model = mlp(10, 4)

    def loss(model, batch):
        xl, yl, weak, strong = batch
        sup = F.cross_entropy(model(xl), yl)
        with torch.no_grad():
            probs = F.softmax(model(weak), 1)
            conf, pseudo = probs.max(1)
            mask = (conf > 0.8).float()
        unsup = (F.cross_entropy(model(strong), pseudo, reduction="none") * mask).mean()
        return sup + 3.0 * unsup

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(TwoViews(x[:100], y[:100], x[100:4100], fixed, s=78), 64),
                val_loader=loader(TensorDataset(x[4100:], y[4100:]), 300, shuffle=False),
                loss_fn=loss, max_steps=300)


FIX_TABLE.fix("fixmatch_views_of_different_rows", fixed_of(fixmatch_views_of_different_rows), val_acc, "val acc")


# 4. cached teacher logits not permuted with the rows
@case("kd_cached_logits_misaligned", "data",
      "The teacher's logits were cached for the transfer set and the rows were shuffled afterwards without the "
      "same permutation, so each input is distilled toward another input's teacher distribution.",
      r"(cached|precomputed|stored|saved) (teacher )?logits|logits.*(misalign|shuffled|permut|do not match|"
      r"don't match|other (row|sample|input))|same permutation|(shuffl|permut).*(logits|teacher)")
def kd_cached_logits_misaligned(fixed=False):
    seed(79)
    teacher = oracle_teacher(12, 6, s=80)
    g = gen(81)
    x = torch.randn(2400, 12, generator=g)
    with torch.no_grad():
        logits = teacher(x)
    y = logits.argmax(1)
    perm = torch.randperm(2000, generator=g)
    xs = x[:2000][perm]                                    # "shuffle the file once"
    ls = logits[:2000][perm] if fixed else logits[:2000]
    model = mlp(12, 6)
    temp = 2.0

    def kd(model, batch):
        xb, lb = batch
        return F.kl_div(F.log_softmax(model(xb) / temp, 1), F.softmax(lb / temp, 1), reduction="batchmean") * temp ** 2

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(TensorDataset(xs, ls), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=kd, max_steps=300)


FIX_TABLE.fix("kd_cached_logits_misaligned", fixed_of(kd_cached_logits_misaligned), val_acc, "val acc vs teacher")


# 5. pseudo-labels computed once from the untrained model
class PseudoLabelled(Dataset):
    def __init__(self, xl, yl, xu, pseudo):
        self.xl, self.yl, self.xu, self.pseudo = xl, yl, xu, pseudo

    def __len__(self):
        return len(self.xu)

    def __getitem__(self, i):
        j = i % len(self.xl)
        return self.xl[j], self.yl[j], self.xu[i], self.pseudo[i]


@case("pseudo_labels_from_untrained_model", "data",
      "The unlabelled rows' pseudo-labels are computed once, when the dataset is built, from the freshly "
      "initialised model (before any training), so half the training signal is the random network's own "
      "guesses.",
      r"pseudo-?labels?.*(untrained|random(ly)? init|initiali[sz]|before (any )?training|stale|once|fixed)|"
      r"(untrained|random) (model|network).*pseudo|recompute.*pseudo|pseudo.*(on the fly|each step|online)")
def pseudo_labels_from_untrained_model(fixed=False):
    seed(82)
    x, y = blobs(5000, 10, [0.25] * 4, sep=0.8, s=83)
    model = mlp(10, 4)
    xu = x[100:4100]
    with torch.no_grad():
        pseudo = model(xu).argmax(1)              # model not trained yet
    ds = PseudoLabelled(x[:100], y[:100], xu, pseudo)

    def loss(model, batch):
        xl, yl, xb_u, pl = batch
        sup = F.cross_entropy(model(xl), yl)
        if fixed:
            with torch.no_grad():
                conf, pl = F.softmax(model(xb_u), 1).max(1)
            return sup + (F.cross_entropy(model(xb_u), pl, reduction="none") * (conf > 0.9)).mean()
        return sup + F.cross_entropy(model(xb_u), pl)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(ds, 64),
                val_loader=loader(TensorDataset(x[4100:], y[4100:]), 300, shuffle=False),
                loss_fn=loss, max_steps=300)


FIX_TABLE.fix("pseudo_labels_from_untrained_model", fixed_of(pseudo_labels_from_untrained_model), val_acc,
              "val acc")
