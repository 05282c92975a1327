"""Healthy: five corrected twins of broken cases (the same builder with the one-line fix) and five unusual but
correct setups. None of them should raise a warning or an error."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight_w import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_w.cases_shapes import collate_graphs, make_molecules
from benchmarks.blind_preflight_w.registry import gen, healthy, loader, seed, twin, view_data

# ---- corrected twins ------------------------------------------------------------------------------------------

healthy("gnn_edge_list_transposed", "The citation GCN with the (E, 2) edge list transposed by .t().contiguous() "
        "into the (2, E) edge_index.")(twin(cases_shapes.build_edge_list_view))
healthy("vae_bce_summed_like_kl", "The sensor-map VAE with the BCE summed over pixels and divided by the batch, "
        "like its KL term.")(twin(cases_targets.build_bce_mean_kl_sum))
healthy("gcn_with_self_loops", "The co-purchase GCN (40% isolated products) with self-loops added before the "
        "symmetric normalisation.")(twin(cases_trained.build_no_self_loops))
healthy("warmup_lambda_capped", "Masked-feature pretraining with the LambdaLR warm-up capped at min(1.0, ...).")(
    twin(cases_mechanics.build_warmup_unbounded))
healthy("category_codes_from_train", "Churn model whose validation regions are encoded with the training "
        "categories.")(twin(cases_data.build_codes_refit_on_val))


# ---- unusual but correct --------------------------------------------------------------------------------------
# 1. A DDPM on 2-D rainfall-station coordinates with a cosine noise schedule, FiLM time conditioning in every
#    block, bf16 autocast, AdamW with a capped warm-up followed by cosine decay, and gradient clipping.


def cosine_alphas_cumprod(steps, s=0.008):
    t = torch.linspace(0, steps, steps + 1) / steps
    f = torch.cos((t + s) / (1 + s) * math.pi / 2) ** 2
    return (f[1:] / f[0]).clamp(min=1e-4)


class FiLMBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)
        self.film = nn.Linear(d, 2 * d)

    def forward(self, h, temb):
        scale, shift = self.film(temb).chunk(2, -1)
        return h + self.fc(F.silu(self.norm(h) * (1 + scale) + shift))


class StationDenoiser(nn.Module):
    def __init__(self, steps=250, d=96):
        super().__init__()
        self.steps = steps
        self.register_buffer("alphas_cumprod", cosine_alphas_cumprod(steps))
        self.time = nn.Sequential(nn.Linear(32, d), nn.SiLU(), nn.Linear(d, d))
        self.inp = nn.Linear(2, d)
        self.blocks = nn.ModuleList(FiLMBlock(d) for _ in range(3))
        self.out = nn.Linear(d, 2)

    def forward(self, x_t, t):
        freqs = torch.exp(-math.log(10000.0) * torch.arange(16, device=x_t.device) / 16)
        ang = t.float()[:, None] * freqs[None]
        temb = self.time(torch.cat([ang.sin(), ang.cos()], -1))
        h = self.inp(x_t)
        for block in self.blocks:
            h = block(h, temb)
        return self.out(h)


def station_loss(model, batch):
    x0 = batch[0]
    t = torch.randint(0, model.steps, (x0.size(0),), device=x0.device)
    noise = torch.randn_like(x0)
    ab = model.alphas_cumprod[t][:, None]
    pred = model(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, t)
    return F.mse_loss(pred.float(), noise)


@healthy("ddpm_cosine_schedule_bf16", "2-D DDPM with a cosine schedule, FiLM time conditioning in every block, bf16, "
         "AdamW, capped warm-up then cosine decay, clip_grad_norm=1.")
def ddpm_cosine_schedule_bf16() -> dict:
    seed(0)
    g = np.random.default_rng(301)
    centres = g.uniform(-2, 2, size=(5, 2))
    pts = centres[g.integers(0, 5, size=3000)] + 0.15 * g.normal(size=(3000, 2))
    data = torch.from_numpy(pts.astype(np.float32))
    model = StationDenoiser()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    total, warm = 400, 20

    def schedule(step):
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / (total - warm))))

    return dict(model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, schedule),
                train_loader=loader(TensorDataset(data[:2500]), batch_size=128),
                val_loader=DataLoader(TensorDataset(data[2500:]), batch_size=500),
                loss_fn=station_loss, precision="bf16", clip_grad_norm=1.0, max_steps=total)


# 2. CLIP-style contrastive learning between two modalities of the same sessions (click vector, dwell vector) with a
#    learnable, clamped logit scale kept out of weight decay.


class TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
        self.b = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, xa, xb):
        return F.normalize(self.a(xa), dim=-1), F.normalize(self.b(xb), dim=-1)


def clip_loss(model, batch):
    xa, xb = batch
    za, zb = model(xa, xb)
    logits = model.logit_scale.clamp(max=math.log(100)).exp() * za @ zb.T
    labels = torch.arange(xa.size(0), device=xa.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


@healthy("clip_two_tower_learned_temperature", "CLIP-style two-tower contrastive loss over paired modalities, "
         "learnable clamped logit scale excluded from weight decay, symmetric cross-entropy.")
def clip_two_tower_learned_temperature() -> dict:
    seed(0)
    x, y, _ = view_data(2400, 6, 8, 24, 1.0, s=311)
    mix = torch.randn(32, 16, generator=gen(312)) / 32 ** 0.5
    xb = torch.tanh(x @ mix) + 0.1 * torch.randn(2400, 16, generator=gen(313))
    model = TwoTower()
    decay = [p for n, p in model.named_parameters() if n != "logit_scale"]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                                   {"params": [model.logit_scale], "weight_decay": 0.0}], lr=1e-3)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:2000], xb[:2000]), batch_size=128, drop_last=True),
                val_loader=DataLoader(TensorDataset(x[2000:], xb[2000:]), batch_size=400),
                loss_fn=clip_loss)


# 3. Rare-event tabular classification (8% positives) from a pandas-style pipeline done right: category codes from
#    the training categories with a reserved unknown bucket, median imputation plus a missing indicator,
#    BCEWithLogitsLoss with pos_weight = negatives / positives, and OneCycleLR.


class RareEventNet(nn.Module):
    def __init__(self, n_codes):
        super().__init__()
        self.emb = nn.Embedding(n_codes + 1, 6)  # index 0: unknown category
        self.mlp = nn.Sequential(nn.Linear(6 + 4, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, code, num):
        return self.mlp(torch.cat([self.emb(code), num], -1)).squeeze(-1)


@healthy("rare_event_tabular_pos_weight", "8%-positive tabular task: train-category codes with an unknown bucket, "
         "median + missing indicator, BCEWithLogitsLoss(pos_weight=neg/pos), OneCycleLR.")
def rare_event_tabular_pos_weight() -> dict:
    seed(0)
    g = np.random.default_rng(321)
    n = 5000
    shop = g.choice(np.array([f"S{i:03d}" for i in range(60)]), size=n)
    effect = dict(zip(sorted(set(shop)), g.normal(0, 1, size=60)))
    a, b = g.normal(size=n), g.normal(size=n)
    logit = np.array([effect[s] for s in shop]) + 1.5 * a - 1.0 * b - 3.2
    y = (g.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    a = np.where(g.random(n) < 0.1, np.nan, a)
    cats = np.unique(shop[:4000])
    code = np.searchsorted(cats, shop) + 1
    code[~np.isin(shop, cats)] = 0
    med = np.nanmedian(a[:4000])
    miss = np.isnan(a).astype(np.float32)
    num = np.stack([np.nan_to_num(a, nan=med), b, miss, np.zeros(n)], 1).astype(np.float32)
    f = torch.from_numpy
    pos = y[:4000].sum()
    criterion = nn.BCEWithLogitsLoss(pos_weight=torch.tensor((4000 - pos) / pos))

    def loss_fn(model, batch):
        c, x, t = batch
        return criterion.to(x.device)(model(c, x), t)

    model = RareEventNet(len(cats))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train_loader = loader(TensorDataset(f(code[:4000]), f(num[:4000]), f(y[:4000])), batch_size=128)
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=400),
                train_loader=train_loader,
                val_loader=DataLoader(TensorDataset(f(code[4000:]), f(num[4000:]), f(y[4000:])), batch_size=500),
                loss_fn=loss_fn, max_steps=400)


# 4. A RealNVP on 4-D sensor readings with alternating masks and a coordinate reversal between blocks, bounded
#    log-scales, two-step gradient accumulation and clipping.


class ReversingRealNVP(nn.Module):
    def __init__(self, n_blocks=3):
        super().__init__()
        self.layers = nn.ModuleList()
        for _ in range(n_blocks):
            for mask in (torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 1.0, 1.0])):
                layer = nn.Module()
                layer.register_buffer("mask", mask)
                layer.net = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 8))
                self.layers.append(layer)

    def forward(self, x):
        logdet = torch.zeros(x.size(0), device=x.device)
        for i, layer in enumerate(self.layers):
            xm = x * layer.mask
            s, t = layer.net(xm).chunk(2, -1)
            s = torch.tanh(s) * (1 - layer.mask)
            x = xm + (1 - layer.mask) * (x * torch.exp(s) + t * (1 - layer.mask))
            logdet = logdet + s.sum(-1)
            if i % 2 == 1:
                x = x.flip(-1)
        return x, logdet


def reversing_flow_nll(model, batch):
    z, logdet = model(batch[0])
    log_pz = -0.5 * (z.float() ** 2).sum(-1) - 2 * math.log(2 * math.pi)
    return -(log_pz + logdet.float()).mean()


@healthy("realnvp_reversal_accumulated", "4-D RealNVP with alternating masks and a reversal between blocks, tanh "
         "log-scales, accumulation_steps=2 and clip_grad_norm=5.")
def realnvp_reversal_accumulated() -> dict:
    seed(0)
    g = np.random.default_rng(331)
    z = g.normal(size=(3000, 2))
    x = np.stack([z[:, 0], z[:, 0] ** 2 * 0.5 + 0.3 * z[:, 1], np.sin(z[:, 1]), z[:, 0] * z[:, 1] * 0.5], 1)
    x = x + 0.05 * g.normal(size=x.shape)
    data = torch.from_numpy(x.astype(np.float32))
    model = ReversingRealNVP()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(data[:2500]), batch_size=64),
                val_loader=DataLoader(TensorDataset(data[2500:]), batch_size=500),
                loss_fn=reversing_flow_nll, accumulation_steps=2, clip_grad_norm=5.0)


# 5. Graph-level regression (fraction of marked atoms) with a collate that offsets every graph's edge_index, a
#    per-graph scatter-mean readout from the batch vector and a Huber loss on a standardised target.


class GraphRegressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Linear(6, 48)
        self.conv2 = nn.Linear(48, 48)
        self.head = nn.Sequential(nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x, edge_index, batch):
        src, dst = edge_index

        def mp(h):
            return h + torch.zeros_like(h).index_add_(0, dst, h[src]) / 2

        h = F.relu(self.conv1(mp(x)))
        h = F.relu(self.conv2(mp(h)))
        n = int(batch.max()) + 1
        pooled = torch.zeros(n, h.size(1), device=h.device, dtype=h.dtype).index_add_(0, batch, h)
        pooled = pooled / torch.bincount(batch, minlength=n).clamp(min=1).to(h.dtype)[:, None]
        return self.head(pooled).squeeze(-1)


@healthy("graph_regression_offset_collate", "Graph-level regression with an offsetting collate, per-graph "
         "scatter-mean readout, Huber loss on a standardised target, accumulation_steps=2.")
def graph_regression_offset_collate() -> dict:
    seed(0)
    graphs = make_molecules(900, 341)
    target = torch.tensor([float(x[:, 0].mean()) for x, _, _ in graphs]) + 0.1 * torch.randn(900, generator=gen(342))
    mu, sd = target[:700].mean(), target[:700].std()
    items = [(x, ei, float((t - mu) / sd)) for (x, ei, _), t in zip(graphs, target)]

    def collate(batch):
        x, ei, b, _ = collate_graphs([(x, ei, 0) for x, ei, _ in batch])
        return x, ei, b, torch.tensor([t for _, _, t in batch])

    def loss_fn(model, batch):
        x, ei, b, t = batch
        return F.huber_loss(model(x, ei, b), t)

    model = GraphRegressor()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(items[:700], batch_size=32, collate_fn=collate),
                val_loader=DataLoader(items[700:], batch_size=100, collate_fn=collate),
                loss_fn=loss_fn, accumulation_steps=2)
