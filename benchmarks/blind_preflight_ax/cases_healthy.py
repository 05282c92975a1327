"""Healthy: five corrected twins of broken cases and five unusual but correct setups (no warning expected)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight_ax.cases_data import data_label_encoder_per_split
from benchmarks.blind_preflight_ax.cases_mechanics import mechanics_ranknet_sum_over_pairs
from benchmarks.blind_preflight_ax.cases_shapes import (
    Embedder,
    ListScorer,
    TwoTower,
    shapes_query_features_repeat_not_interleave,
    two_tower_data,
)
from benchmarks.blind_preflight_ax.cases_targets import targets_rank_position_as_relevance
from benchmarks.blind_preflight_ax.cases_trained import DeepCross, ctr_loaders, ctr_loss, trained_from_pretrained_frozen
from benchmarks.blind_preflight_ax.registry import PKSampler, clusters, gen, healthy, loader, ltr, seed, twin

healthy("healthy_query_features_repeat_interleave",
        "Twin: query features broadcast to their documents with repeat_interleave.")(
    twin(shapes_query_features_repeat_not_interleave))
healthy("healthy_listnet_on_grades", "Twin: ListNet target is softmax over the relevance grades.")(
    twin(targets_rank_position_as_relevance))
healthy("healthy_pretrained_embeddings_trainable", "Twin: from_pretrained(..., freeze=False) embedding tables.")(
    twin(trained_from_pretrained_frozen))
healthy("healthy_ranknet_mean_over_pairs", "Twin: RankNet BCE averaged over the pairs, SGD with momentum.")(
    twin(mechanics_ranknet_sum_over_pairs))
healthy("healthy_label_encoder_fit_on_train", "Twin: one city vocabulary fitted on train, applied to both splits.")(
    twin(data_label_encoder_per_split))


@healthy("healthy_listnet_ragged_lists_masked",
         "Ragged query lists (4-12 documents) padded and masked with the dtype's minimum before the softmax, "
         "AdamW with a no-decay group for biases, cosine schedule sized to max_steps.")
def healthy_listnet_ragged_lists_masked():
    seed(0)
    x, g = ltr(400, 12, s=61)
    lengths = torch.randint(4, 13, (400,), generator=gen(62))
    mask = torch.arange(12)[None, :] < lengths[:, None]
    x = x * mask[..., None]
    g = g * mask

    def listnet(model, batch):
        xb, mb, gb = batch
        s = model(xb).squeeze(-1).masked_fill(~mb, torch.finfo(torch.float32).min)
        t = torch.softmax(gb.masked_fill(~mb, torch.finfo(torch.float32).min), 1)
        return -(t * torch.log_softmax(s, 1)).masked_fill(~mb, 0.0).sum(1).mean()
    model = ListScorer()
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=3e-3)
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=300),
                train_loader=loader(TensorDataset(x[:320], mask[:320], g[:320]), 16),
                val_loader=loader(TensorDataset(x[320:], mask[320:], g[320:]), 40, shuffle=False),
                loss_fn=listnet, max_steps=300)


@healthy("healthy_pk_batch_hard_normalised_frozen_stem",
         "P x K label-aware batches, batch-hard triplet loss on L2-normalised embeddings (margin 0.2), the first "
         "'pretrained' layer frozen on purpose and left out of the optimizer.")
def healthy_pk_batch_hard_normalised_frozen_stem():
    seed(0)
    x, y = clusters(2400, n_cls=20, s=63, noise=1.0)
    model = Embedder(out=16)
    for p in model.net[0].parameters():
        p.requires_grad_(False)

    def batch_hard(m, batch):
        e = F.normalize(m(batch[0]), dim=1)
        yb = batch[1]
        d = torch.cdist(e, e)
        same = yb[:, None] == yb[None, :]
        hp = (d * same).max(1).values
        hn = d.masked_fill(same, float("inf")).min(1).values
        return F.relu(hp - hn + 0.2).mean()
    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3),
                train_loader=DataLoader(TensorDataset(x[:1800], y[:1800]), batch_sampler=PKSampler(y[:1800], 8, 8, 64)),
                val_loader=loader(TensorDataset(x[1800:], y[1800:]), 600, shuffle=False),
                loss_fn=batch_hard, max_steps=300)


@healthy("healthy_dcn_bf16_clipped",
         "Deep & Cross network on categorical embeddings under bf16 autocast with gradient clipping at 1.0 and a "
         "linear warm-up sized to max_steps.")
def healthy_dcn_bf16_clipped():
    seed(0)
    model = DeepCross()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    warm = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 30))
    tr, va = ctr_loaders(65)
    return dict(model=model, optimizer=optimizer, scheduler=warm, train_loader=tr, val_loader=va, loss_fn=ctr_loss,
                precision="bf16", clip_grad_norm=1.0, max_steps=300)


class LogTargetRegressor(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2 * d, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        missing = torch.isnan(x)
        filled = torch.where(missing, torch.zeros_like(x), x)
        return self.net(torch.cat([filled, missing.to(x.dtype)], 1)).squeeze(-1)


@healthy("healthy_log_target_missing_indicators_accumulated",
         "Heavy-tailed spend regressed as log1p(spend) with train-fitted standardisation, NaNs kept and turned into "
         "zero-fill plus missing indicators inside the model, 4-step gradient accumulation, OneCycleLR over max_steps.")
def healthy_log_target_missing_indicators_accumulated():
    seed(0)
    g = gen(66)
    n = 3000
    x = torch.randn(n, 5, generator=g)
    spend = torch.expm1((x @ torch.tensor([0.8, -0.5, 0.3, 0.0, 0.6]) + 2.0 + 0.2 * torch.randn(n, generator=g))
                        .clamp(min=0))
    x[torch.rand(n, 5, generator=g) < 0.15] = float("nan")
    mu, sd = torch.nanmean(x[:2400], 0), torch.tensor([math.sqrt(float(torch.nanmean((c - torch.nanmean(c)) ** 2)))
                                                       for c in x[:2400].t()])
    x = (x - mu) / sd
    target = torch.log1p(spend)
    model = LogTargetRegressor(5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=300)
    return dict(model=model, optimizer=optimizer, scheduler=sched, accumulation_steps=4,
                train_loader=loader(TensorDataset(x[:2400], target[:2400]), 32),
                val_loader=loader(TensorDataset(x[2400:], target[2400:]), 200, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


class ScaledTwoTower(TwoTower):
    def __init__(self):
        super().__init__(fixed=True)
        self.log_scale = nn.Parameter(torch.tensor(math.log(10.0)))


@healthy("healthy_in_batch_softmax_learned_temperature",
         "Two-tower retrieval with in-batch negatives: cross_entropy over normalised u @ v.T with labels "
         "arange(B) and a learned, clamped logit scale (CLIP-style).")
def healthy_in_batch_softmax_learned_temperature():
    seed(0)
    users, items, y = two_tower_data(s=67, n=12000)
    users, items = users[y > 0], items[y > 0]

    def in_batch(model, batch):
        u, v = F.normalize(model.u(batch[0]), dim=1), F.normalize(model.i(batch[1]), dim=1)
        logits = model.log_scale.clamp(max=math.log(100.0)).exp() * u @ v.t()
        return F.cross_entropy(logits, torch.arange(len(u), device=logits.device))
    model = ScaledTwoTower()
    k = int(len(users) * 0.8)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(users[:k], items[:k]), 64, drop_last=True),
                val_loader=loader(TensorDataset(users[k:], items[k:]), 64, shuffle=False, drop_last=True),
                loss_fn=in_batch, max_steps=300)
