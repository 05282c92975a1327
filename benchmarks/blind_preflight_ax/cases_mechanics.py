"""Mechanics: the update itself (schedule, precision, loss scale, regularisation) goes wrong."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight_ax.cases_shapes import Embedder, ListScorer
from benchmarks.blind_preflight_ax.cases_trained import EmbMLP, ctr_loaders, ctr_loss
from benchmarks.blind_preflight_ax.registry import PKSampler, case, clusters, gen, loader, ltr, seed


@case("mechanics_steplr_epochs_per_batch", "mechanics",
      "StepLR(step_size=30, gamma=0.1) was sized in epochs but scheduler.step() runs every batch, so the CTR "
      "model's learning rate is 1e-7 of its start after 210 of the 300 steps and training stalls early.",
      r"step_size|StepLR|(scheduler|lr).{0,60}(every|per) (batch|step|iteration)|epochs?.{0,60}(batch|step)|"
      r"(decay|decays|decayed).{0,60}(too (fast|early|quickly)|to (near )?zero)|learning rate.{0,40}(tiny|near zero|"
      r"too small|vanish|collapse)")
def mechanics_steplr_epochs_per_batch(fixed=False):
    seed(0)
    model = EmbMLP([nn.Embedding(v, 8) for v in (50, 20, 8)])
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    sched = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30 * (38 if fixed else 1), gamma=0.1)
    tr, va = ctr_loaders(31)
    return dict(model=model, optimizer=optimizer, scheduler=sched, train_loader=tr, val_loader=va,
                loss_fn=ctr_loss, max_steps=300)


@case("mechanics_ranknet_sum_over_pairs", "mechanics",
      "The RankNet loss sums (reduction='sum') over every document pair of every query in the batch (about 600 "
      "pairs) while the SGD learning rate was tuned for a per-pair mean, so each step is hundreds of times too big "
      "and the scores blow up.",
      r"reduction|sum(med)? over (all |every )?(the )?(document )?pairs|(mean|average).{0,40}(over|of|across"
      r") (the )?pairs|number of pairs|pair count|(scale|normali[sz]e|divide).{0,40}pairs|sum instead of (th"
      r"e )?mean|instead of (a |the )?mean")
def mechanics_ranknet_sum_over_pairs(fixed=False):
    seed(0)
    x, g = ltr(400, 10, s=32)
    i, j = torch.triu_indices(10, 10, 1)

    def ranknet(model, batch):
        xb, gb = batch
        s = model(xb).squeeze(-1)
        keep = gb[:, i] != gb[:, j]
        diff, label = (s[:, i] - s[:, j])[keep], (gb[:, i] > gb[:, j]).float()[keep]
        return F.binary_cross_entropy_with_logits(diff, label, reduction="mean" if fixed else "sum")
    model = ListScorer()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                train_loader=loader(TensorDataset(x[:320], g[:320]), 16),
                val_loader=loader(TensorDataset(x[320:], g[320:]), 40, shuffle=False),
                loss_fn=ranknet, max_steps=300)


class TimeAware(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


@case("mechanics_bf16_raw_timestamp", "mechanics",
      "A raw Unix timestamp (~1.7e9 seconds) is fed as a numeric feature under bf16 autocast; bf16 keeps 8 "
      "significant bits, so every timestamp in the data rounds to the same value and the time signal is lost.",
      r"timestamp|epoch seconds|unix time|(1\.7e9|1e9).{0,60}(bf16|bfloat16|precision)|(bf16|bfloat16).{0,80"
      r"}(8 (significant )?bits|mantissa|round.{0,20}(same|identical)|indistinguishable|collapse)|(subtract|"
      r"offset|rebase).{0,40}(time|reference|start)|days since")
def mechanics_bf16_raw_timestamp(fixed=False):
    seed(0)
    g = gen(33)
    n = 3000
    ts = 1.7e9 + torch.randint(0, 86400 * 60, (n,), generator=g).double()       # 60 days of events
    day = (ts - 1.7e9) / 86400.0
    other = torch.randn(n, 2, generator=g)
    y = (torch.sin(day / 60 * 6.28) + 0.3 * other[:, 0] > 0).float()
    t_feature = ((ts - 1.7e9) / (86400 * 60) if fixed else ts).float()
    x = torch.cat([t_feature[:, None], other], 1)
    model = TimeAware()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2400], y[:2400]), 64),
                val_loader=loader(TensorDataset(x[2400:], y[2400:]), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), precision="bf16", max_steps=300)


@case("mechanics_adam_l2_on_embeddings", "mechanics",
      "torch.optim.Adam(weight_decay=1e-2) on the sparse ID embeddings: the L2 term is added to the gradient and "
      "then normalised by Adam, so every row (also rows absent from the batch) is pulled to zero at the full "
      "learning rate each step, and the rare-category rows collapse before they can learn.",
      r"(weight[_ ]decay|L2).{0,80}(embedding|rows?\b|sparse|rare|absent|not in the batch)|(embedding|rows?\b"
      r"|rare categor).{0,80}(weight[_ ]decay|L2|decay|shrink|collapse|pulled)|no_decay|exclude.{0,40}embedd"
      r"ing|lazy (adam|update)|SparseAdam")
def mechanics_adam_l2_on_embeddings(fixed=False):
    seed(0)
    model = EmbMLP([nn.Embedding(v, 8) for v in (400, 20, 8)])
    if fixed:
        optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=5e-3, weight_decay=1e-2)
    tr, va = ctr_loaders(34, n=4000, vocab=(400, 20, 8), cat_weight=(3.0, 0.5, 0.5))
    return dict(model=model, optimizer=optimizer, train_loader=tr, val_loader=va, loss_fn=ctr_loss, max_steps=300)


@case("mechanics_batch_hard_unnormalised_collapse", "mechanics",
      "Batch-hard triplet mining (hardest positive and hardest negative per anchor) on unnormalised embeddings with "
      "margin 1 from the first step: the hardest negatives drive the embeddings to collapse towards one point, where "
      "the loss sits at the margin.",
      r"collapse|hardest (negative|positive)|batch[- ]hard|semi-?hard|(mining|miner).{0,40}(hard|easy|strate"
      r"gy)|(l2[- ])?normali[sz]e.{0,30}(the )?(embedding|output)|embeddings?.{0,40}(unnormali[sz]ed|not nor"
      r"mali[sz]ed|normali[sz]e)")
def mechanics_batch_hard_unnormalised_collapse(fixed=False):
    seed(0)
    x, y = clusters(2400, n_cls=20, s=35, noise=1.3)

    def triplet(model, batch):
        e = model(batch[0])
        yb = batch[1]
        d = torch.cdist(e, e)
        same = yb[:, None] == yb[None, :]
        if fixed:       # semi-hard: all valid triplets, averaged over the active ones
            tl = F.relu(d[:, :, None] - d[:, None, :] + 0.2)
            valid = same[:, :, None] & ~same[:, None, :]
            tl = tl[valid]
            return tl.sum() / (tl > 0).sum().clamp(min=1)
        hp = (d * same).max(1).values
        hn = (d + 1e6 * same).min(1).values
        return F.relu(hp - hn + 1.0).mean()
    model = Embedder(out=8)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=DataLoader(TensorDataset(x[:1800], y[:1800]), batch_sampler=PKSampler(y[:1800], 8, 8, 37)),
                val_loader=loader(TensorDataset(x[1800:], y[1800:]), 600, shuffle=False),
                loss_fn=triplet, max_steps=300)
