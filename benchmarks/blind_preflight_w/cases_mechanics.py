"""Mechanics: the optimizer, the schedule, the gradient flow or the batching of the step is wrong."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight_w.registry import (
    case,
    fix,
    fixed_of,
    gen,
    knn_acc_of,
    loader,
    rmse_of,
    seed,
    token_sequences,
    val_mean,
    view_data,
)

# ---------------------------------------------------------------------------------------------------------------
# 1. Masked-feature pretraining on lab-test rows (self-supervised tabular): a LambdaLR warm-up written as
#    lambda step: step / warmup_steps, without min(1.0, ...), so after the warm-up the LR keeps growing linearly.


def lab_rows(n, s):
    g = np.random.default_rng(s)
    z = g.normal(size=(n, 4))
    mix = g.normal(size=(4, 24))
    return torch.from_numpy((np.tanh(z @ mix) + 0.05 * g.normal(size=(n, 24))).astype(np.float32))


class MaskedRowModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(48, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 24))

    def forward(self, x, mask):
        return self.net(torch.cat([x * (1 - mask), mask], -1))


def masked_row_loss(model, batch):
    x = batch[0]
    mask = (torch.rand_like(x) < 0.3).to(x.dtype)
    pred = model(x, mask)
    return (((pred - x) ** 2) * mask).sum() / mask.sum().clamp(min=1)


def masked_row_mse(model, batch):
    x = batch[0]
    mask = (torch.rand(x.shape, generator=gen(17)) < 0.3).float().to(x.device)
    pred = model(x, mask)
    return (((pred - x) ** 2) * mask).sum().item(), mask.sum().item()


def build_warmup_unbounded(fixed: bool = False) -> dict:
    seed(0)
    data = lab_rows(3000, 161)
    model = MaskedRowModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    warmup_steps = 10
    if fixed:
        schedule = lambda step: min(1.0, (step + 1) / warmup_steps)  # noqa: E731
    else:
        schedule = lambda step: (step + 1) / warmup_steps  # noqa: E731
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, schedule),
                train_loader=loader(TensorDataset(data[:2500]), batch_size=64),
                val_loader=DataLoader(TensorDataset(data[2500:]), batch_size=500),
                loss_fn=masked_row_loss, max_steps=300)


case("warmup_lambda_never_caps", "mechanics",
     "The LambdaLR warm-up is lambda step: (step + 1) / warmup_steps with no min(1.0, ...), so the multiplier keeps "
     "growing after the 10 warm-up steps: by step 300 the learning rate is 30x the intended 3e-3 and training "
     "diverges.",
     r"min\(1(\.0)?|(lr|learning rate|multiplier|factor|lambda).{0,80}(keeps? (growing|increasing|rising)|grows?|"
     r"increas\w* (linearly|without bound|forever)|never (caps?|plateaus?|stops)|unbounded|exceeds? 1)|warm-?up.{0,80}"
     r"(never ends|no cap|uncapped|not capped|without (a )?cap)|(\d+)x the (intended|base|configured)")(
    build_warmup_unbounded)
fix("warmup_lambda_never_caps", fixed_of(build_warmup_unbounded), val_mean(masked_row_mse), "val masked MSE",
    steps=300, higher=False)


# ---------------------------------------------------------------------------------------------------------------
# 2. SimSiam on tabular rows with SCARF-style feature corruption: the symmetric negative-cosine loss compares the
#    predictor output with the other branch's projection without .detach() - no stop-gradient, so it collapses.


class SimSiamTab(nn.Module):
    def __init__(self, d_in=32):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 32))
        self.predictor = nn.Sequential(nn.Linear(32, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 32))

    def forward(self, x):
        return self.encoder(x)


def scarf_corrupt(x, pool, rate=0.5):
    """Replace a random half of each row's features by the same feature of random other rows of the pool."""
    pool = pool.to(device=x.device, dtype=x.dtype)
    rows = torch.randint(0, pool.size(0), x.shape, device=x.device)
    donor = pool.gather(0, rows)
    return torch.where(torch.rand_like(x) < rate, donor, x)


def simsiam_loss(pool, stop_grad):
    def loss_fn(model, batch):
        x = batch[0]
        z1, z2 = model.encoder(scarf_corrupt(x, pool)), model.encoder(scarf_corrupt(x, pool))
        p1, p2 = model.predictor(z1), model.predictor(z2)
        if stop_grad:
            z1, z2 = z1.detach(), z2.detach()
        return -(F.cosine_similarity(p1, z2, dim=-1).mean() + F.cosine_similarity(p2, z1, dim=-1).mean()) / 2
    return loss_fn


def build_simsiam_no_stopgrad(fixed: bool = False) -> dict:
    seed(0)
    x, y, _ = view_data(2400, 5, 8, 24, 1.0, s=171)
    model = SimSiamTab()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(TensorDataset(x[:1800]), batch_size=128, drop_last=True),
                val_loader=DataLoader(TensorDataset(x[1800:], y[1800:]), batch_size=300),
                loss_fn=simsiam_loss(x[:1800], fixed))


case("simsiam_missing_stop_gradient", "mechanics",
     "The SimSiam loss -cos(p1, z2) - cos(p2, z1) uses the projections z without .detach(), so there is no "
     "stop-gradient on the target branch: both branches are pulled to the same constant vector and the "
     "representation collapses (loss at -1, every row embedded alike).",
     r"stop[- _]?grad|\.detach\(\)|detach.{0,60}(target|z1|z2|projection|branch)|(representation|embedding)s?.{0,60}"
     r"collaps|collaps\w*.{0,80}(constant|same vector|trivial)|(loss|cosine).{0,40}(-1\b|minus one)")(
    build_simsiam_no_stopgrad)
fix("simsiam_missing_stop_gradient", fixed_of(build_simsiam_no_stopgrad),
    knn_acc_of(lambda m, x: m.encoder(x)), "val 5-NN accuracy", steps=250)


# ---------------------------------------------------------------------------------------------------------------
# 3. A VAE on household load curves with KL annealing: the warm-up length is written as
#    warmup_epochs * len(train_set) - samples, not batches - so beta stays near 0 for the whole run.


def load_curves(n, s):
    g = np.random.default_rng(s)
    hours = np.arange(24)
    peak = g.uniform(6, 20, size=(n, 1))
    width = g.uniform(1.5, 4, size=(n, 1))
    base = g.uniform(0.2, 0.6, size=(n, 1))
    curve = base + np.exp(-((hours - peak) ** 2) / (2 * width**2)) + 0.05 * g.normal(size=(n, 24))
    return torch.from_numpy(curve.astype(np.float32))


class CurveVAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 8))
        self.dec = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 24))

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, -1)
        return mu, logvar


class AnnealedELBO:
    """Gaussian-decoder ELBO with a linear KL warm-up over `warmup_steps` calls."""

    def __init__(self, warmup_steps):
        self.warmup_steps = warmup_steps
        self.calls = 0

    def __call__(self, model, batch):
        x = batch[0]
        beta = min(1.0, self.calls / self.warmup_steps)
        self.calls += 1
        mu, logvar = model(x)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        rec = 0.5 * ((model.dec(z) - x) ** 2).sum(-1).mean() / 0.05
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(-1).mean()
        return rec + beta * kl


def curve_neg_elbo(model, batch):
    x = batch[0]
    mu, logvar = model(x)
    g = gen(19)
    z = mu + torch.randn(mu.shape, generator=g).to(mu.device) * torch.exp(0.5 * logvar)
    rec = 0.5 * ((model.dec(z) - x) ** 2).sum(-1) / 0.05
    kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(-1)
    return (rec + kl).sum().item(), x.size(0)


def build_anneal_in_samples(fixed: bool = False) -> dict:
    seed(0)
    data = load_curves(2400, 181)
    train = TensorDataset(data[:2000])
    train_loader = loader(train, batch_size=64)
    warmup_epochs = 2
    steps = warmup_epochs * (len(train_loader) if fixed else len(train))
    model = CurveVAE()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=train_loader, val_loader=DataLoader(TensorDataset(data[2000:]), batch_size=400),
                loss_fn=AnnealedELBO(steps))


case("kl_warmup_counted_in_samples", "mechanics",
     "The KL warm-up length is warmup_epochs * len(train_set), a count of samples, while beta advances once per "
     "batch, so the warm-up is about 60x too long: beta stays below 0.08 for the whole run, the KL term is practically "
     "off and the posterior drifts far from the prior (poor ELBO, unusable samples).",
     r"(beta|kl weight|kl_weight|anneal\w*|warm-?up).{0,120}(samples?|len\((train_?set|dataset|train)\)|"
     r"len\(.{0,20}loader\)|per (batch|step)|too long|never reaches?|stays? (near|close to|below|at) 0|"
     r"(\d+)x)|(samples|examples) (instead of|not) (batches|steps)")(build_anneal_in_samples)
fix("kl_warmup_counted_in_samples", fixed_of(build_anneal_in_samples), val_mean(curve_neg_elbo),
    "val negative ELBO", steps=300, higher=False)


# ---------------------------------------------------------------------------------------------------------------
# 4. A tiny GPT-2 (built from a config) on event-code streams, with the optimizer carried over from a TF script:
#    Adam(eps=1.0) - the value TF's docs suggest for Inception - which divides every step by sqrt(v) + 1.


class EventStreams(torch.utils.data.Dataset):
    def __init__(self, ids):
        self.ids = ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def lm_token_acc(model, batch):
    out = model(input_ids=batch["input_ids"]).logits[:, :-1]
    tgt = batch["labels"][:, 1:]
    return (out.argmax(-1) == tgt).sum().item(), tgt.numel()


def build_adam_eps_one(fixed: bool = False) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    seed(0)
    ids = token_sequences(1500, 16, 40, s=191)
    config = GPT2Config(vocab_size=40, n_positions=16, n_embd=64, n_layer=2, n_head=2, bos_token_id=0,
                        eos_token_id=1, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, eps=1e-8 if fixed else 1.0)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(EventStreams(ids[:1200]), batch_size=32),
                val_loader=DataLoader(EventStreams(ids[1200:]), batch_size=100), loss_fn=None)


case("adam_epsilon_one_from_tf", "mechanics",
     "Adam is created with eps=1.0, copied from a TensorFlow script (the value TF's docs suggest for Inception); "
     "in PyTorch eps is added to sqrt(v) in the denominator, and with gradients far below 1 every update shrinks "
     "to about lr * gradient: the transformer barely moves from its initialisation.",
     r"\beps(ilon)?\b.{0,60}(1(\.0)?\b|too (large|big|high)|large)|eps ?= ?1|(denominator|sqrt\(v\)).{0,60}"
     r"(eps|epsilon)|(adam|optimi[sz]er).{0,80}epsilon")(build_adam_eps_one)
fix("adam_epsilon_one_from_tf", fixed_of(build_adam_eps_one), val_mean(lm_token_acc), "val next-token accuracy",
    steps=200)


# ---------------------------------------------------------------------------------------------------------------
# 5. A DeepSets model of point-cloud spread trained with SGD and accumulation_steps=8: the loss function divides by
#    the accumulation steps itself, as the manual loop it was copied from did, on top of the loop's own division.

ACCUM = 8


def point_sets(n, s):
    g = np.random.default_rng(s)
    scale = g.uniform(0.5, 2.0, size=(n, 1, 1))
    pts = g.normal(size=(n, 16, 3)) * scale + g.normal(size=(n, 1, 3))
    centred = pts - pts.mean(1, keepdims=True)
    y = np.sqrt((centred**2).sum(-1)).mean(-1)
    return torch.from_numpy(pts.astype(np.float32)), torch.from_numpy(y.astype(np.float32))


class DeepSets(nn.Module):
    def __init__(self):
        super().__init__()
        self.phi = nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.rho = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, pts):
        h = self.phi(pts - pts.mean(1, keepdim=True))
        return self.rho(h.mean(1)).squeeze(-1)


def spread_loss(divide_again):
    def loss_fn(model, batch):
        pts, y = batch
        loss = F.mse_loss(model(pts), y)
        if divide_again:
            loss = loss / ACCUM  # scale the loss to account for gradient accumulation
        return loss
    return loss_fn


def build_loss_divided_twice(fixed: bool = False) -> dict:
    seed(0)
    pts, y = point_sets(3000, 201)
    model = DeepSets()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                train_loader=loader(TensorDataset(pts[:2500], y[:2500]), batch_size=16, drop_last=True),
                val_loader=DataLoader(TensorDataset(pts[2500:], y[2500:]), batch_size=500),
                loss_fn=spread_loss(not fixed), accumulation_steps=ACCUM)


case("sgd_loss_divided_by_accumulation_twice", "mechanics",
     "With accumulation_steps=8 the training loop already divides each micro-batch loss by 8, and the loss "
     "function divides by the accumulation steps again, so the accumulated gradient is 1/8 of the batch gradient: "
     "under plain SGD that is an 8x smaller learning rate and the model underfits.",
     r"(divid|scal|normali[sz])\w*.{0,80}(twice|two times|again|double)|(twice|double).{0,60}(divid|scal|"
     r"normali[sz])|accumulation.{0,120}(1/8|8x smaller|/ ?accum|divid\w* (by|again))|loss ?/ ?ACCUM|"
     r"(gradient|lr|learning rate).{0,60}(8x|8 times|1/8)")(build_loss_divided_twice)
fix("sgd_loss_divided_by_accumulation_twice", fixed_of(build_loss_divided_twice),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", steps=150, higher=False)
