"""Data: Dataset, sampler, collate_fn and precomputed tensors feeding the density models."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, SubsetRandomSampler, TensorDataset, DataLoader

from benchmarks.blind_preflight_bh.common import (
    MDN, N_TRAIN, VAE, Flow, adam, cond_prior_bce, flow_loss, flow_nll, gen, kl_normal, loader, mdn_data, mdn_loss,
    mdn_nll, protos, seed)
from benchmarks.blind_preflight_bh.cases_targets import Dequant, dequant_val, grid_data
from benchmarks.blind_preflight_bh.registry import register


def cvae_loss(m, batch):
    x, c = batch[0], F.one_hot(batch[1], 8).float()
    logits, mu, logvar = m(x, c)
    return F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(1).mean() + kl_normal(mu, logvar).mean()


def cvae_val():
    x, y = protos(N_TRAIN + 400)
    return loader(TensorDataset(x[N_TRAIN:], y[N_TRAIN:]), 200, shuffle=False)


class LabelledRows(Dataset):
    def __init__(self, x, y, fixed):
        self.x, self.y, self.fixed = x, y, fixed

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        j = i if self.fixed else (i + 1) % len(self.y)      # the bug: the label of the next row
        return self.x[i], self.y[j]


@register("cvae_labels_off_by_one", "data",
          "The conditional VAE's Dataset returns self.y[(i + 1) % n] with self.x[i], so every conditioning label "
          "belongs to another row and the decoder learns to ignore the condition.",
          r"(label|condition|class).*(off.?by.?one|misalign|another (row|sample)|next (row|sample|index)|wrong (row|"
          r"index|sample)|shifted|mismatch|do(es)? not (match|belong))|\(i ?\+ ?1\) ?% ?n",
          cond_prior_bce, "val conditional BCE/dim at z=0")
def cvae_labels_off_by_one(fixed=False):
    seed(0)
    x, y = protos(N_TRAIN)
    model = VAE(z=2, cond=8)
    return dict(model=model, optimizer=adam(model), train_loader=loader(LabelledRows(x, y, fixed), 64),
                val_loader=cvae_val(), loss_fn=cvae_loss)


@register("mdn_inputs_sorted_without_targets", "data",
          "The MDN's inputs are sorted with x.sort(0) for plotting but the targets are not reindexed with the same "
          "indices (y = y[idx] is missing), so the (x, y) pairs are scrambled.",
          r"(sort|reorder|permut).*(without|not|never).*(target|y\b|pairs|reindex|same ind)|(pairs?|x.?y).*"
          r"(scrambl|broken|misalign|mismatch|decoupl)|y ?= ?y\[idx\]",
          mdn_nll, "val NLL")
def mdn_inputs_sorted_without_targets(fixed=False):
    seed(0)
    (x, t), (xv, tv) = mdn_data()
    x, idx = x.sort(0)
    t = t[idx[:, 0]] if fixed else t          # the bug: targets keep their old order
    model = MDN()
    return dict(model=model, optimizer=adam(model), train_loader=loader(TensorDataset(x, t), 64),
                val_loader=loader(TensorDataset(xv, tv), 200, shuffle=False), loss_fn=mdn_loss)


@register("cvae_subset_from_label_sorted_order", "data",
          "The SubsetRandomSampler draws its half-size training subset from torch.argsort(labels)[:n // 2] instead of "
          "a random permutation, so the conditional VAE only ever sees the first half of the classes.",
          r"(subset|sampler|indices).*(sorted|argsort|first half|only (some|half|the first)|classes? (never|missing|"
          r"absent))|(classes?|labels?).*(never (seen|sampled)|missing from|absent from).*(train|sampler|subset)|"
          r"argsort",
          cond_prior_bce, "val conditional BCE/dim at z=0")
def cvae_subset_from_label_sorted_order(fixed=False):
    seed(0)
    x, y = protos(N_TRAIN)
    order = torch.randperm(N_TRAIN, generator=gen(3)) if fixed else torch.argsort(y)
    sampler = SubsetRandomSampler(order[: N_TRAIN // 2].tolist(), generator=gen(4))
    model = VAE(z=2, cond=8)
    return dict(model=model, optimizer=adam(model), train_loader=DataLoader(TensorDataset(x, y), 64, sampler=sampler),
                val_loader=cvae_val(), loss_fn=cvae_loss)


@register("flow_dequant_noise_wrong_scale", "data",
          "The Dataset adds uniform dequantisation noise after dividing the 16 grid levels to the unit scale "
          "(k / 16 + U(0, 1) instead of (k + U(0, 1)) / 16), so the noise is 16 times wider than a grid cell and "
          "swamps the data.",
          r"(dequanti[sz]\w*|uniform) noise.*(scale|wide|large|after (divid|scal|normali)|swamp|cell|16)|"
          r"(noise|U\(0, ?1\)).*(not (divided|scaled)|before (divid|scal))|\(k ?\+ ?u",
          flow_nll, "val dequantised NLL/dim")
def flow_dequant_noise_wrong_scale(fixed=False):
    seed(0)
    k = grid_data(N_TRAIN, 0)
    model = Flow()
    tr = loader(Dequant(k, 1.0) if fixed else WideDequant(k), 64)
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=dequant_val(), loss_fn=flow_loss)


class WideDequant(Dequant):
    def __init__(self, k):
        super().__init__(k, 16.0)      # k / 16 + U(0, 1) on the unit scale: noise 16 cells wide


class RelabelCollate:
    """Stacks (x, y) rows; the broken version re-indexes the labels with torch.unique within each batch."""

    def __init__(self, fixed):
        self.fixed = fixed

    def __call__(self, rows):
        x = torch.stack([r[0] for r in rows])
        y = torch.stack([r[1] for r in rows])
        if not self.fixed:
            y = torch.unique(y, return_inverse=True)[1]     # the bug: ids depend on which classes the batch has
        return x, y


@register("cvae_collate_relabels_per_batch", "data",
          "The collate_fn re-indexes the class labels with torch.unique(return_inverse=True) inside each batch, so a "
          "class's id depends on which classes the batch happens to contain and the conditioning is inconsistent "
          "across batches.",
          r"(unique|re.?index|re.?label|remap).*(per|each|every|within (the|each)) batch|"
          r"(label|class) ids?.*(depend|change|inconsistent|vary).*batch|return_inverse",
          cond_prior_bce, "val conditional BCE/dim at z=0")
def cvae_collate_relabels_per_batch(fixed=False):
    seed(0)
    x, y = protos(N_TRAIN)
    model = VAE(z=2, cond=8)
    tr = loader(TensorDataset(x, y), 16, collate_fn=RelabelCollate(fixed))
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=cvae_val(), loss_fn=cvae_loss)
