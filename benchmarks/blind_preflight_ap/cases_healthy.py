"""Set ap, healthy: five corrected twins of broken cases and five unusual-but-correct setups."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from .cases_data import d_gnn_train_mask_long_not_bool
from .cases_mechanics import m_uncertainty_weights_no_log_term
from .cases_shapes import s_ae_recon_broadcast
from .cases_targets import EpsNet, t_diffusion_target_noisy_input, t_infonce_zero_labels
from .registry import (
    T_STEPS,
    Views,
    graph_loader,
    healthy,
    loader,
    lowrank_images,
    manifold,
    sbm_graph,
    seed,
    twin,
)

# ---------------------------------------------------------------------------------------------------------- twins
healthy("h_ae_recon_view_as_fixed",
        "Twin of s_ae_recon_broadcast: the decoder output is reshaped view_as(x), (N, 1, 64) against (N, 1, 64).")(
    twin(s_ae_recon_broadcast))
healthy("h_gnn_bool_mask_fixed",
        "Twin of d_gnn_train_mask_long_not_bool: boolean train/val node masks.")(twin(d_gnn_train_mask_long_not_bool))
healthy("h_infonce_arange_labels_fixed",
        "Twin of t_infonce_zero_labels: InfoNCE with labels = torch.arange(N), positives on the diagonal.")(
    twin(t_infonce_zero_labels))
healthy("h_ddpm_eps_target_fixed",
        "Twin of t_diffusion_target_noisy_input: the DDPM loss regresses the added noise.")(
    twin(t_diffusion_target_noisy_input))
healthy("h_uncertainty_weights_with_log_term_fixed",
        "Twin of m_uncertainty_weights_no_log_term: Kendall weighting with the + log-variance regulariser "
        "(the loss can go negative as the log variances fall).")(twin(m_uncertainty_weights_no_log_term))


# ---------------------------------------------------------------------------------------------------------- unusual
class WarmupVAE(nn.Module):
    """VAE with a Bernoulli decoder returning logits, KL warm-up counted in a buffer and free bits per unit."""

    def __init__(self, d=64, z=8, warmup=100, free_bits=0.05):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 2 * z))
        self.dec = nn.Sequential(nn.Linear(z, 64), nn.ReLU(), nn.Linear(64, d))
        self.register_buffer("step", torch.zeros((), dtype=torch.long))
        self.warmup, self.free_bits = warmup, free_bits

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, -1)
        logvar = logvar.clamp(-8, 8)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training else mu
        return self.dec(z), mu, logvar


@healthy("h_vae_kl_warmup_free_bits",
         "VAE with logits + binary_cross_entropy_with_logits summed over pixels, a KL weight warmed up from 0 over "
         "100 steps (a counter buffer in the model) and free bits per latent unit.")
def h_vae_kl_warmup_free_bits():
    seed(0)
    x, xv = lowrank_images(2048, 31), lowrank_images(512, 32)
    model = WarmupVAE()

    def elbo(model, batch):
        x = batch[0]
        logits, mu, logvar = model(x)
        rec = F.binary_cross_entropy_with_logits(logits, x, reduction="sum") / len(x)
        kl_unit = (-0.5 * (1 + logvar - mu ** 2 - logvar.exp())).mean(0)
        kl = torch.clamp(kl_unit, min=model.free_bits).sum()
        if model.training:
            model.step += 1
        beta = min(1.0, model.step.item() / model.warmup)
        return rec + beta * kl
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x), 128), val_loader=loader(TensorDataset(xv), 256, shuffle=False),
                loss_fn=elbo, max_steps=300)


class SymGCN(nn.Module):
    def __init__(self, d=16, h=32, c=4, p=0.5):
        super().__init__()
        self.lin1, self.lin2, self.drop = nn.Linear(d, h), nn.Linear(h, c), nn.Dropout(p)

    def forward(self, x, adj):
        a = adj + torch.eye(len(adj), device=adj.device)
        dinv = a.sum(1).pow(-0.5)
        a = dinv[:, None] * a * dinv[None, :]
        h = self.drop(F.relu(a @ self.lin1(self.drop(x))))
        return a @ self.lin2(h)


@healthy("h_gcn_symmetric_norm_decay_first_layer",
         "Two-layer Kipf-Welling GCN (A + I, D^-1/2 (A+I) D^-1/2) trained full-batch on one graph per step, "
         "dropout on features, weight decay on the first layer only via parameter groups.")
def h_gcn_symmetric_norm_decay_first_layer():
    seed(0)
    x, adj, y, train, val = sbm_graph(s=9)
    model = SymGCN()

    def node_loss(model, batch):
        x, adj, y, mask = batch
        return F.cross_entropy(model(x, adj)[mask], y[mask])
    opt = torch.optim.Adam([{"params": model.lin1.parameters(), "weight_decay": 5e-4},
                            {"params": model.lin2.parameters(), "weight_decay": 0.0}], lr=1e-2)
    return dict(model=model, optimizer=opt, train_loader=graph_loader(x, adj, y, train),
                val_loader=graph_loader(x, adj, y, val), loss_fn=node_loss, max_steps=200)


@healthy("h_supcon_accumulated_cosine",
         "Supervised contrastive loss (several positives per anchor, tau = 0.1, self-similarity masked) with "
         "2-step gradient accumulation, clip_grad_norm 1.0 and a warm-up + cosine LambdaLR stepped per step.")
def h_supcon_accumulated_cosine():
    seed(0)
    train, val = Views(2048, 33), Views(512, 34)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 16))

    def supcon(model, batch, tau=0.1):
        v1, v2, y = batch
        z = F.normalize(model(torch.cat([v1, v2])), dim=-1)
        y = torch.cat([y, y])
        self_mask = torch.eye(len(y), dtype=torch.bool, device=z.device)
        logits = (z @ z.T / tau).masked_fill(self_mask, float("-inf"))
        pos = (y[:, None] == y[None, :]) & ~self_mask
        log_prob = logits.log_softmax(1).masked_fill(~pos, 0.0)
        return -(log_prob.sum(1) / pos.sum(1).clamp(min=1)).mean()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    steps, warm = 200, 10
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    return dict(model=model, optimizer=opt, train_loader=loader(train, 64, drop_last=True),
                val_loader=loader(val, 256, shuffle=False), loss_fn=supcon, scheduler=sched, max_steps=steps,
                accumulation_steps=2, clip_grad_norm=1.0)


class SimSiam(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 32))
        self.projector = nn.Sequential(nn.Linear(32, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 32),
                                       nn.BatchNorm1d(32))
        self.predictor = nn.Sequential(nn.Linear(32, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 32))

    def forward(self, x):
        return self.backbone(x)


@healthy("h_simsiam_stop_gradient",
         "SimSiam: projector and predictor with BatchNorm, negative-cosine loss (ranges over [-1, 1], goes "
         "negative) with the intended stop-gradient (.detach()) on the target branch, SGD with momentum.")
def h_simsiam_stop_gradient():
    seed(0)
    train, val = Views(2048, 35), Views(512, 36)
    model = SimSiam()

    def simsiam_loss(model, batch):
        v1, v2, _ = batch
        z1, z2 = model.projector(model.backbone(v1)), model.projector(model.backbone(v2))
        p1, p2 = model.predictor(z1), model.predictor(z2)
        return -(F.cosine_similarity(p1, z2.detach(), dim=-1).mean()
                 + F.cosine_similarity(p2, z1.detach(), dim=-1).mean()) / 2
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4),
                train_loader=loader(train, 128, drop_last=True), val_loader=loader(val, 256, shuffle=False),
                loss_fn=simsiam_loss, max_steps=300)


def cosine_alpha_bar(T=T_STEPS, s=0.008):
    t = torch.linspace(0, 1, T + 1)
    f = torch.cos((t + s) / (1 + s) * math.pi / 2) ** 2
    return (f[1:] / f[0]).clamp(min=1e-4, max=0.9999)


@healthy("h_diffusion_v_prediction_bf16",
         "Diffusion with a cosine schedule and v-prediction targets (v = sqrt(ab) * eps - sqrt(1 - ab) * x0) "
         "trained under bf16 with a linear LR warm-up; the target differs from the noise on purpose.")
def h_diffusion_v_prediction_bf16():
    seed(0)
    x0, xv = manifold(4096, 37), manifold(1024, 38)
    model = EpsNet()
    ab_all = cosine_alpha_bar()

    def v_loss(model, batch):
        x0 = batch[0]
        t = torch.randint(0, T_STEPS, (len(x0),), device=x0.device)
        noise = torch.randn_like(x0)
        a = ab_all.to(x0.device)[t].view(-1, 1)
        x_t = a.sqrt() * x0 + (1 - a).sqrt() * noise
        v = a.sqrt() * noise - (1 - a).sqrt() * x0
        return F.mse_loss(model(x_t, t).float(), v)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(x0), 128),
                val_loader=loader(TensorDataset(xv), 256, shuffle=False), loss_fn=v_loss, scheduler=sched,
                precision="bf16", max_steps=300)
