"""Set r, healthy cases: 5 corrected twins of broken cases and 5 unusual but correct setups. None should warn."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_r import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_r.registry import gen, healthy, loader, seed, twin

healthy("har_lstm_batch_first_fixed", "Twin: the activity LSTM built with batch_first=True.")(twin(cases_shapes.har_lstm))
healthy("lesion_mask_scaled_fixed", "Twin: lesion masks scaled to {0, 1} for BCEWithLogitsLoss.")(twin(cases_targets.lesion))
healthy("xray_head_before_optimizer_fixed", "Twin: the new head is in place before the optimizer is built.")(
    twin(cases_trained.xray))
healthy("house_lambdalr_factor_fixed", "Twin: LambdaLR returning a multiplicative factor.")(twin(cases_mechanics.house))
healthy("claims_dummies_reindexed_fixed", "Twin: validation one-hot columns reindexed to the training columns.")(
    twin(cases_data.claim))


# --- A. shopping sessions: GRU over variable-length click sequences, packed, lengths on the CPU ---------------------


class Sessions(Dataset):
    def __init__(self, n, s):
        g = gen(s)
        self.lengths = torch.randint(3, 16, (n,), generator=g)
        self.items = torch.randint(1, 50, (n, 16), generator=g)
        for i in range(n):
            self.items[i, self.lengths[i]:] = 0
        self.y = torch.tensor([int((self.items[i, :self.lengths[i]] < 10).sum() >= 2) for i in range(n)])

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.items[i], self.lengths[i], self.y[i]


class SessionGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16, padding_idx=0)
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.out = nn.Linear(32, 2)

    def forward(self, items, lengths):
        packed = pack_padded_sequence(self.emb(items), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h = self.gru(packed)
        return self.out(h[-1])


def session_loss(model, batch):
    items, lengths, y = batch
    return F.cross_entropy(model(items, lengths), y)


@healthy("sessions_packed_gru", "GRU over variable-length sessions with pack_padded_sequence(enforce_sorted=False), "
         "a loss_fn(model, batch) on 3-tuple batches.")
def sessions():
    seed(0)
    model = SessionGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(Sessions(1000, 81), 32), val_loader=loader(Sessions(300, 82), 100, shuffle=False),
                loss_fn=session_loss, max_steps=300)


# --- B. satellite scene tags: multi-label BCEWithLogitsLoss with pos_weight for rare tags --------------------------


def scenes(n, s):
    g = gen(s)
    x = torch.randn(n, 30, generator=g)
    w = torch.randn(30, 5, generator=gen(83))
    thresholds = torch.tensor([0.0, 1.0, 2.0, 3.0, 3.5])
    return x, ((x @ w) / 30 ** 0.5 * 2 > thresholds).float()


@healthy("scene_tags_bce_pos_weight", "Multi-label scene tagging with BCEWithLogitsLoss(pos_weight=neg/pos per tag).")
def scene_tags():
    seed(0)
    x, y = scenes(1500, 84)
    vx, vy = scenes(400, 85)
    pos = y.mean(0).clamp_min(0.02)
    model = nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 5))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-2),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(pos_weight=(1 - pos) / pos), max_steps=300)


# --- C. face-embedding metric learning: triplets, an embedding net, TripletMarginLoss ------------------------------


def triplets(n, s):
    g = gen(s)
    protos = torch.randn(20, 24, generator=gen(86))
    a_id = torch.randint(0, 20, (n,), generator=g)
    n_id = (a_id + torch.randint(1, 20, (n,), generator=g)) % 20
    noise = lambda: 1.3 * torch.randn(n, 24, generator=g)   # noqa: E731
    return protos[a_id] + noise(), protos[a_id] + noise(), protos[n_id] + noise()


class Embedder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 16))

    def forward(self, x):
        return F.normalize(self.net(x), dim=-1)


def triplet_loss(model, batch):
    a, p, n = batch
    return F.triplet_margin_loss(model(a), model(p), model(n), margin=0.5)


@healthy("faces_triplet_margin", "Metric learning on (anchor, positive, negative) batches with an L2-normalised "
         "embedding and triplet_margin_loss; no labels, no classifier.")
def faces():
    seed(0)
    return dict(model=(model := Embedder()), optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(*triplets(2000, 87)), 64),
                val_loader=loader(TensorDataset(*triplets(400, 88)), 100, shuffle=False), loss_fn=triplet_loss, max_steps=300)


# --- D. wind-power regression: Huber loss, bf16, accumulation 2, OneCycleLR over max_steps, clipping ---------------


def wind(n, s):
    g = gen(s)
    speed = torch.rand(n, 1, generator=g) * 25
    direction = torch.rand(n, 1, generator=g) * 2 * math.pi
    temp = torch.randn(n, 1, generator=g)
    power = torch.sigmoid((speed - 10) / 2) * (speed < 22).float() * 3
    x = torch.cat([speed / 12.5 - 1, torch.sin(direction), torch.cos(direction), temp], 1)
    return x, power + 0.05 * torch.randn(n, 1, generator=g)


@healthy("wind_power_huber_bf16_onecycle", "Turbine power curve with HuberLoss, precision='bf16', "
         "accumulation_steps=2, clip_grad_norm=1.0 and OneCycleLR(total_steps=max_steps).")
def wind_power():
    seed(0)
    x, y = wind(2000, 89)
    vx, vy = wind(400, 90)
    model = nn.Sequential(nn.Linear(4, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=300),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.HuberLoss(delta=0.5), precision="bf16", accumulation_steps=2, clip_grad_norm=1.0, max_steps=300)


# --- E. bike rentals: counts with PoissonNLLLoss on log-rates ------------------------------------------------------


def rentals(n, s):
    g = gen(s)
    hour = torch.randint(0, 24, (n,), generator=g).float()
    temp = torch.randn(n, generator=g)
    rain = (torch.rand(n, generator=g) < 0.2).float()
    rate = torch.exp(1.5 + torch.sin(hour / 24 * 2 * math.pi) + 0.4 * temp - 1.0 * rain)
    x = torch.stack([torch.sin(hour / 24 * 2 * math.pi), torch.cos(hour / 24 * 2 * math.pi), temp, rain], 1)
    return x, torch.poisson(rate, generator=g)[:, None]


@healthy("bike_rentals_poisson_nll", "Hourly rental counts with PoissonNLLLoss(log_input=True): the model outputs "
         "log-rates (negative outputs are expected), targets are raw counts.")
def bikes():
    seed(0)
    x, y = rentals(2000, 91)
    vx, vy = rentals(400, 92)
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.PoissonNLLLoss(log_input=True), max_steps=300)
