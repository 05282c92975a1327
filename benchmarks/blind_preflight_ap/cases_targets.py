"""Set ap, family targets: the objective is scored against the wrong target."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from .registry import (
    T_STEPS,
    Views,
    alpha_bar,
    case,
    eps_mse,
    fix,
    fixed_of,
    graph_loader,
    knn_of,
    loader,
    lowrank_images,
    manifold,
    node_acc,
    rmse_of,
    sbm_graph,
    seed,
)


def projector_net():
    return nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16))


# ---------------------------------------------------------------------------------------------------------
@case("t_infonce_zero_labels", "targets",
      "The SimCLR-style InfoNCE builds logits = z1 @ z2.T / tau with the positives on the diagonal but uses MoCo's "
      "labels = torch.zeros(N) (positive in column 0): every view is trained to match the batch's first sample; "
      "the labels must be torch.arange(N).",
      r"zeros|torch\.arange\(N\)|column 0|first (sample|column)|moco|labels? .*all (zero|0)")
def t_infonce_zero_labels(fixed: bool = False):
    seed(0)
    train, val = Views(2048, 5), Views(512, 6)
    model = projector_net()

    def info_nce(model, batch, tau=0.2):
        v1, v2, _ = batch
        z1, z2 = F.normalize(model(v1), dim=-1), F.normalize(model(v2), dim=-1)
        logits = z1 @ z2.T / tau
        n = len(v1)
        labels = torch.arange(n, device=v1.device) if fixed else torch.zeros(n, dtype=torch.long, device=v1.device)
        return F.cross_entropy(logits, labels)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 128, drop_last=True), val_loader=loader(val, 256, shuffle=False),
                loss_fn=info_nce, max_steps=300)


fix("t_infonce_zero_labels", fixed_of(t_infonce_zero_labels), knn_of(), "val 1-NN accuracy")


# ---------------------------------------------------------------------------------------------------------
class EpsNet(nn.Module):
    def __init__(self, d=8, h=128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d + 1, h), nn.SiLU(), nn.Linear(h, h), nn.SiLU(), nn.Linear(h, d))

    def forward(self, xt, t):
        return self.net(torch.cat([xt, (t.float() / T_STEPS).unsqueeze(-1).to(xt.dtype)], -1))


@case("t_diffusion_target_noisy_input", "targets",
      "The DDPM loss is mse_loss(model(x_t, t), x_t): the network is trained to reproduce the noisy input instead of "
      "the noise eps that was added (mse_loss(pred, noise)), so its noise predictions are wrong at sampling time.",
      r"(model|pred)\(.*\bx_t\b.*\), ?x_t\)|regress(es)? .*(x_t|noisy (sample|input))|"
      r"(reproduce|predict|fit)s? .*(noisy input|x_t)|instead of (the (added )?noise|eps)|mse_loss\(pred, noise\)|"
      r"target .*(noise eps|added noise)")
def t_diffusion_target_noisy_input(fixed: bool = False):
    seed(0)
    x0, xv = manifold(4096, 1), manifold(1024, 2)
    model = EpsNet()

    def ddpm_loss(model, batch):
        x0 = batch[0]
        ab = alpha_bar().to(x0.device)
        t = torch.randint(0, T_STEPS, (len(x0),), device=x0.device)
        noise = torch.randn_like(x0)
        a = ab[t].view(-1, 1)
        x_t = a.sqrt() * x0 + (1 - a).sqrt() * noise
        pred = model(x_t, t)
        return F.mse_loss(pred, noise if fixed else x_t)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x0), 128), val_loader=loader(TensorDataset(xv), 256, shuffle=False),
                loss_fn=ddpm_loss, max_steps=300)


fix("t_diffusion_target_noisy_input", fixed_of(t_diffusion_target_noisy_input), eps_mse, "val eps MSE",
    higher=False)


# ---------------------------------------------------------------------------------------------------------
@case("t_denoiser_noisy_target", "targets",
      "The denoising autoencoder is trained with loss(model(noisy), noisy): the target is the corrupted input, not "
      "the clean image, so it learns the identity and never removes the noise.",
      r"(target|reconstruct)\w* .*(noisy|corrupt)|(noisy|corrupt)\w* .*(as|is) (the |its )?(own )?target|"
      r"clean (image|input|target)|learns the identity")
def t_denoiser_noisy_target(fixed: bool = False):
    seed(0)
    g = torch.Generator().manual_seed(9)
    clean, cv = lowrank_images(2048, 7), lowrank_images(512, 8)
    noisy = clean + 0.3 * torch.randn(clean.shape, generator=g)
    nv = cv + 0.3 * torch.randn(cv.shape, generator=g)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))

    def dae_loss(model, batch):
        noisy, clean = batch
        return F.mse_loss(model(noisy), clean if fixed else noisy)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(noisy, clean), 64),
                val_loader=loader(TensorDataset(nv, cv), 256, shuffle=False), loss_fn=dae_loss, max_steps=300)


fix("t_denoiser_noisy_target", fixed_of(t_denoiser_noisy_target), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE to the clean images", higher=False)


# ---------------------------------------------------------------------------------------------------------
class MeanAggGCN(nn.Module):
    """One hand-written mean-aggregation layer (self-loops, row-normalised) and an MLP head."""

    def __init__(self, d=16, h=32, c=4):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(d, h), nn.Linear(h, c)

    def forward(self, x, adj):
        a = adj + torch.eye(len(adj), device=adj.device)
        a = a / a.sum(1, keepdim=True)
        return self.lin2(F.relu(self.lin1(a @ x)))


@case("t_gnn_prefix_vs_train_idx", "targets",
      "The node-classification loss compares out[:n_train] (the first n_train nodes) with y[train_idx] (the labels "
      "of the randomly chosen training nodes): predictions and labels belong to different nodes; both must be "
      "indexed with train_idx (or the train mask).",
      r"out\[:n_train\]|first n_train|different nodes|misalign|labels? .*(wrong|other) nodes|y\[train_idx\]")
def t_gnn_prefix_vs_train_idx(fixed: bool = False):
    seed(0)
    x, adj, y, train, val = sbm_graph(s=1)
    train_idx = train.nonzero().flatten()
    n_train = len(train_idx)
    model = MeanAggGCN()

    def node_loss(model, batch):
        x, adj, y, idx = batch
        out = model(x, adj)
        return F.cross_entropy(out[idx] if fixed else out[:n_train], y[idx])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=5e-4),
                train_loader=graph_loader(x, adj, y, train_idx), val_loader=graph_loader(x, adj, y, val),
                loss_fn=node_loss, max_steps=200)


fix("t_gnn_prefix_vs_train_idx", fixed_of(t_gnn_prefix_vs_train_idx), node_acc, "val node accuracy", steps=200)


# ---------------------------------------------------------------------------------------------------------
@case("t_contrastive_label_convention_flipped", "targets",
      "The pair label is 1 for 'same class' but the contrastive loss uses Hadsell's convention "
      "(1 - y) * d^2 + y * relu(m - d)^2, where y = 0 means similar: matching pairs are pushed apart and "
      "non-matching pairs pulled together.",
      r"convention|flip|invert|\(1 ?- ?y\) ?\* ?d|y ?= ?0 (means )?(for )?similar|similar.*y ?= ?0|"
      r"(matching|similar) pairs (are )?pushed apart|swapped (labels|terms)")
def t_contrastive_label_convention_flipped(fixed: bool = False):
    seed(0)
    train, val = Views(2048, 7), Views(512, 8)
    model = projector_net()

    def contrastive(model, batch, margin=1.0):
        a, b, cls = batch
        perm = torch.randperm(len(cls), device=cls.device)
        y = (cls == cls[perm]).float()                       # 1 = same class
        d = F.pairwise_distance(F.normalize(model(a), dim=-1), F.normalize(model(b[perm]), dim=-1))
        if fixed:
            return (y * d ** 2 + (1 - y) * F.relu(margin - d) ** 2).mean()
        return ((1 - y) * d ** 2 + y * F.relu(margin - d) ** 2).mean()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 64), val_loader=loader(val, 256, shuffle=False),
                loss_fn=contrastive, max_steps=300)


fix("t_contrastive_label_convention_flipped", fixed_of(t_contrastive_label_convention_flipped), knn_of(),
    "val 1-NN accuracy")
