"""Data: preprocessing, encoding and sampling that hand the model the wrong inputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight_ax.cases_shapes import Embedder
from benchmarks.blind_preflight_ax.cases_trained import EmbMLP, ctr_loss
from benchmarks.blind_preflight_ax.registry import PKSampler, case, clusters, gen, loader, seed


class TabMLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


@case("data_target_encoding_in_fold_leak", "data",
      "The merchant id is target-encoded with the mean label of its category computed on the whole training set, "
      "each row's own label included; with 2-4 rows per merchant the encoding nearly equals the row's label, so "
      "the model leans on it and fails on validation, where the encoding carries no such leak.",
      r"target[- ]encod|mean[- ]encod|leak|out[- ]of[- ]fold|k-?fold|leave[- ]one[- ]out|own (label|target)|"
      r"(label|target).{0,40}(included|leak|inside)")
def data_target_encoding_in_fold_leak(fixed=False):
    seed(0)
    g = gen(41)
    n, n_m = 3000, 2400
    merchant = torch.randint(0, n_m, (n,), generator=g)
    x = torch.randn(n, 5, generator=g)
    y = ((x @ torch.randn(5, generator=g)) * 0.5 + torch.randn(n, generator=g) > 0).float()
    tr = torch.arange(2400)
    sums = torch.zeros(n_m).index_add_(0, merchant[tr], y[tr])
    counts = torch.zeros(n_m).index_add_(0, merchant[tr], torch.ones(2400))
    prior, k = y[tr].mean(), 1.0
    if fixed:   # leave-one-out: the row's own label is taken out of its category's mean
        te_train = (sums[merchant[tr]] - y[tr] + prior * k) / (counts[merchant[tr]] - 1 + k)
    else:
        te_train = (sums[merchant[tr]] + prior * k) / (counts[merchant[tr]] + k)
    te_val = (sums[merchant[2400:]] + prior * k) / (counts[merchant[2400:]] + k)
    xtr = torch.cat([x[tr], te_train[:, None]], 1)
    xva = torch.cat([x[2400:], te_val[:, None]], 1)
    model = TabMLP(6)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xtr, y[tr]), 64),
                val_loader=loader(TensorDataset(xva, y[2400:]), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=300)


@case("data_label_encoder_per_split", "data",
      "The city column is label-encoded separately on the training and on the validation frame "
      "(LabelEncoder.fit_transform on each), so the same id means a different city in each split and the learned "
      "city embeddings are applied to the wrong cities.",
      r"LabelEncoder|fit_transform|(encod|vocab|mapping).{0,60}(separately|each split|per split|both splits|"
      r"refit|re-fit|different)|same (id|index|code).{0,40}different|fit.{0,30}(on )?(the )?train.{0,40}transform")
def data_label_encoder_per_split(fixed=False):
    seed(0)
    g = gen(42)
    n, n_city = 3000, 40
    names = torch.randperm(1000, generator=g)[:n_city]            # raw city codes
    city = torch.randint(0, n_city, (n,), generator=g)
    # the validation period sees only the 30 busiest cities: a per-split encoder numbers them differently
    city[2400:] = torch.randint(10, n_city, (600,), generator=g)
    raw = names[city]
    nums = torch.randn(n, 4, generator=g)
    logit = torch.randn(n_city, generator=g)[city] * 2.5 + nums @ torch.randn(4, generator=g) * 0.5
    y = (logit > logit.median()).float()

    def fit_transform(col):
        return torch.searchsorted(col.unique(), col)
    if fixed:
        vocab = raw[:2400].unique()
        enc_tr, enc_va = torch.searchsorted(vocab, raw[:2400]), torch.searchsorted(vocab, raw[2400:])
    else:
        enc_tr, enc_va = fit_transform(raw[:2400]), fit_transform(raw[2400:])
    cats_tr, cats_va = enc_tr[:, None], enc_va[:, None]
    model = EmbMLP([nn.Embedding(n_city, 8)])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(cats_tr, nums[:2400], y[:2400]), 64),
                val_loader=loader(TensorDataset(cats_va, nums[2400:], y[2400:]), 200, shuffle=False),
                loss_fn=ctr_loss, max_steps=300)


@case("data_hash_modulo_embedding_dim", "data",
      "The hashing trick buckets the 5,000 product ids with hash(id) % 16, the embedding dimension, instead of the "
      "number of buckets (4,096), so thousands of products collide into 16 rows and their effects are averaged "
      "away.",
      r"collision|collide|(hash|bucket).{0,60}(too (few|small)|number|count|modulo|%|num_buckets|embedding dim)|"
      r"%.{0,20}(16|dim|embedding)|modulo.{0,40}(dim|wrong)|num_buckets|few buckets")
def data_hash_modulo_embedding_dim(fixed=False):
    seed(0)
    g = gen(43)
    n, n_prod, buckets, dim = 6000, 500, 4096, 16
    prod_raw = torch.randint(0, 10 ** 6, (n_prod,), generator=g)
    prod = torch.randint(0, n_prod, (n,), generator=g)
    nums = torch.randn(n, 4, generator=g)
    logit = torch.randn(n_prod, generator=g)[prod] * 2.5 + nums @ torch.randn(4, generator=g) * 0.5
    y = (logit > logit.median()).float()
    hashed = (prod_raw[prod] * 2654435761) % (2 ** 32)
    ids = hashed % (buckets if fixed else dim)
    model = EmbMLP([nn.Embedding(buckets, dim)], dim=dim)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(ids[:5000, None], nums[:5000], y[:5000]), 64),
                val_loader=loader(TensorDataset(ids[5000:, None], nums[5000:], y[5000:]), 200, shuffle=False),
                loss_fn=ctr_loss, max_steps=500)


@case("data_scaler_fitted_not_applied", "data",
      "A StandardScaler is fitted on the training features, but the training tensor is built from the raw "
      "X_train (income in the 1e4-1e5 range, age, counts) while validation is built from the scaled array, so "
      "the network trains on unscaled inputs and sees a different scale at validation.",
      r"StandardScaler|scaler.{0,60}(fit|not applied|never applied|transform)|x_train_scaled|(fitted|fit).{0"
      r",60}(not|never) (applied|used)|(train|training) (features|tensor|inputs).{0,60}(raw|unscaled|not (sc"
      r"aled|standardi))|(raw|unscaled).{0,40}(train|x_train)|(train|val).{0,60}(different|mismatch\w*).{0,2"
      r"0}scal|scaled.{0,40}(only )?(val|validation)")
def data_scaler_fitted_not_applied(fixed=False):
    seed(0)
    g = gen(44)
    n = 3000
    income = torch.exp(torch.randn(n, generator=g) * 0.6 + 10.5)
    age = torch.randint(18, 80, (n,), generator=g).float()
    visits = torch.poisson(torch.full((n,), 3.0), generator=g)
    tenure = torch.rand(n, generator=g) * 3000
    x_raw = torch.stack([income, age, visits, tenure], 1)
    z = (x_raw - x_raw[:2400].mean(0)) / x_raw[:2400].std(0)
    y = (torch.tanh(z[:, 0]) - 0.8 * z[:, 1] + 0.6 * z[:, 2] * z[:, 3] > 0).float()
    x_train = z[:2400] if fixed else x_raw[:2400]
    model = TabMLP(4)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x_train, y[:2400]), 64),
                val_loader=loader(TensorDataset(z[2400:], y[2400:]), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=300)


@case("data_random_batches_no_positives", "data",
      "The in-batch contrastive (supervised) metric loss uses a plain shuffled DataLoader with batch 32 over 500 "
      "identities, so most anchors have no positive in their batch and the loss is mostly pushing apart; a "
      "label-aware (P x K, MPerClassSampler) batch sampler is needed.",
      r"sampler|MPerClass|P ?x ?K|PK|label-aware|(no|few|without|lack).{0,30}positive|positives?.{0,40}(batch|missing)|"
      r"per class|classes per batch|samples per (class|identity)")
def data_random_batches_no_positives(fixed=False):
    seed(0)
    x, y = clusters(6000, n_cls=500, s=45, noise=0.6)

    def supcon(model, batch):
        e = F.normalize(model(batch[0]), dim=1)
        yb = batch[1]
        sim = e @ e.t() / 0.1
        eye = torch.eye(len(yb), dtype=torch.bool, device=e.device)
        sim = sim.masked_fill(eye, -1e4)
        pos = (yb[:, None] == yb[None, :]) & ~eye
        logp = sim - torch.logsumexp(sim, 1, keepdim=True)
        has = pos.any(1)
        per = -(logp * pos).sum(1) / pos.sum(1).clamp(min=1)
        return per[has].sum() / len(yb)
    model = Embedder(out=16)
    ds = TensorDataset(x[:4800], y[:4800])
    train = (DataLoader(ds, batch_sampler=PKSampler(y[:4800], 8, 4, 46, n_batches=100)) if fixed
             else loader(ds, 32, drop_last=True))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3), train_loader=train,
                val_loader=loader(TensorDataset(x[4800:], y[4800:]), 1200, shuffle=False),
                loss_fn=supcon, max_steps=300)
